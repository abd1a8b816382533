//! The history tables of other migration tools in the database file — sqlx-cli's
//! `_sqlx_migrations`, golang-migrate's `schema_migrations`, goose's `goose_db_version` — read
//! for `migrate`'s refusal and for `dbwarden adopt`. What the rows mean is decided in
//! `dbwarden_core::adopt`.

use dbwarden_core::Error;
use dbwarden_core::adopt::{ForeignHistory, Tool};
use sqlx::AssertSqlSafe;
use sqlx::sqlite::SqliteConnection;

use crate::store::db_err;

/// Every other tool's table present, with its rows. A table of that name without the tool's
/// columns is not the tool's: it is skipped.
pub(crate) async fn read(conn: &mut SqliteConnection) -> Result<Vec<ForeignHistory>, Error> {
    read_tools(conn, &Tool::ALL).await
}

/// [`read`] for some tools only.
pub(crate) async fn read_tools(
    conn: &mut SqliteConnection,
    tools: &[Tool],
) -> Result<Vec<ForeignHistory>, Error> {
    let mut out = Vec::new();
    for &tool in tools {
        let table = tool.table();
        let present: Option<String> =
            sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?")
                .bind(table)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db_err)?;
        if present.is_none() {
            continue;
        }
        let sql = match tool {
            Tool::Sqlx => format!(
                "SELECT CAST(version AS INTEGER), CAST(description AS TEXT), CAST(checksum AS BLOB), CAST(success AS INTEGER) FROM \"{table}\" ORDER BY version"
            ),
            Tool::GolangMigrate => format!(
                "SELECT CAST(version AS INTEGER), NULL, NULL, CAST(NOT dirty AS INTEGER) FROM \"{table}\" ORDER BY version"
            ),
            Tool::Goose => format!(
                "SELECT CAST(version_id AS INTEGER), NULL, NULL, CAST(is_applied AS INTEGER) FROM \"{table}\" ORDER BY id"
            ),
        };
        let rows = match sqlx::query(AssertSqlSafe(sql)).fetch_all(&mut *conn).await {
            Ok(rows) => rows,
            Err(sqlx::Error::Database(e)) => {
                tracing::info!(
                    "\"{table}\" is not {}'s table ({}); ignored",
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
