//! The history tables of other migration tools in this database — sqlx-cli's
//! `_sqlx_migrations`, golang-migrate's `schema_migrations`, goose's `goose_db_version` — read
//! for `migrate`'s refusal and for `dbwarden adopt`. What the rows mean is decided in
//! `dbwarden_core::adopt`.

use dbwarden_core::Error;
use dbwarden_core::adopt::{ForeignHistory, Tool};
use sqlx::AssertSqlSafe;
use sqlx::mysql::MySqlConnection;

use crate::tables::{db_err, table_exists};

/// `_sqlx_migrations` as sqlx creates it.
pub(crate) const CREATE_SQLX_TABLE: &str = "CREATE TABLE IF NOT EXISTS _sqlx_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL, installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, success BOOLEAN NOT NULL, checksum BLOB NOT NULL, execution_time BIGINT NOT NULL)";

/// Every other tool's table present, with its rows. A table of that name without the tool's
/// columns (Rails also has a `schema_migrations`) is not the tool's: it is skipped.
pub(crate) async fn read(conn: &mut MySqlConnection) -> Result<Vec<ForeignHistory>, Error> {
    read_tools(conn, &Tool::ALL).await
}

/// [`read`] for some tools only.
pub(crate) async fn read_tools(
    conn: &mut MySqlConnection,
    tools: &[Tool],
) -> Result<Vec<ForeignHistory>, Error> {
    let mut out = Vec::new();
    for &tool in tools {
        let table = tool.table();
        if !table_exists(conn, table).await? {
            continue;
        }
        let sql = match tool {
            Tool::Sqlx => format!(
                "SELECT CAST(version AS SIGNED), CAST(description AS CHAR), checksum, CAST(success AS SIGNED) FROM `{table}` ORDER BY version"
            ),
            Tool::GolangMigrate => format!(
                "SELECT CAST(version AS SIGNED), CAST(NULL AS CHAR), CAST(NULL AS BINARY), CAST(NOT dirty AS SIGNED) FROM `{table}` ORDER BY version"
            ),
            Tool::Goose => format!(
                "SELECT CAST(version_id AS SIGNED), CAST(NULL AS CHAR), CAST(NULL AS BINARY), CAST(is_applied AS SIGNED) FROM `{table}` ORDER BY id"
            ),
        };
        let rows = match sqlx::query(AssertSqlSafe(sql)).fetch_all(&mut *conn).await {
            Ok(rows) => rows,
            Err(sqlx::Error::Database(e)) => {
                tracing::info!(
                    "`{table}` is not {}'s table ({}); ignored",
                    tool.name(),
                    e.message()
                );
                continue;
            }
            Err(e) => return Err(db_err(e)),
        };
        let rows = rows
            .iter()
            .map(dbwarden_sql::foreign_row)
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(db_err)?;
        out.push(ForeignHistory { tool, rows });
    }
    Ok(out)
}
