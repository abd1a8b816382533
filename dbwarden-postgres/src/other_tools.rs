//! The history tables of other migration tools in the configured schema — sqlx-cli's
//! `_sqlx_migrations`, golang-migrate's `schema_migrations`, goose's `goose_db_version` — read
//! for `migrate`'s refusal and for `dbwarden adopt`. What the rows mean is decided in
//! `dbwarden_core::adopt`.

use dbwarden_core::Error;
use dbwarden_core::adopt::{ForeignHistory, ForeignRow, Tool};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Row};

use crate::tables::table_exists;

/// sqlx's table in `schema`, quoted.
pub(crate) fn sqlx_table(schema: &str) -> String {
    format!("\"{schema}\".\"{}\"", Tool::Sqlx.table())
}

/// `_sqlx_migrations` as sqlx creates it.
pub(crate) fn create_sqlx_table(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
         installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT NULL, \
         checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL)",
        sqlx_table(schema)
    )
}

/// Every other tool's table present in `schema`, with its rows. A table of that name that does
/// not have the tool's columns (Rails also has a `schema_migrations`) is not the tool's: it is
/// skipped.
pub(crate) async fn read(
    conn: &mut PgConnection,
    schema: &str,
) -> Result<Vec<ForeignHistory>, Error> {
    read_tools(conn, schema, &Tool::ALL).await
}

/// [`read`] for some tools only.
pub(crate) async fn read_tools(
    conn: &mut PgConnection,
    schema: &str,
    tools: &[Tool],
) -> Result<Vec<ForeignHistory>, Error> {
    let mut out = Vec::new();
    for &tool in tools {
        let table = format!("\"{schema}\".\"{}\"", tool.table());
        if !table_exists(conn, &table).await? {
            continue;
        }
        let sql = match tool {
            Tool::Sqlx => format!(
                "SELECT version::bigint, description::text, checksum::bytea, success::int FROM {table} ORDER BY version"
            ),
            Tool::GolangMigrate => format!(
                "SELECT version::bigint, NULL::text, NULL::bytea, (NOT dirty)::int FROM {table} ORDER BY version"
            ),
            Tool::Goose => format!(
                "SELECT version_id::bigint, NULL::text, NULL::bytea, is_applied::int FROM {table} ORDER BY id"
            ),
        };
        let rows = match sqlx::query(AssertSqlSafe(sql)).fetch_all(&mut *conn).await {
            Ok(rows) => rows,
            Err(sqlx::Error::Database(e)) => {
                tracing::info!(
                    "{table} is not {}'s table ({}); ignored",
                    tool.name(),
                    e.message()
                );
                continue;
            }
            Err(e) => return Err(Error::database(crate::lock::describe(&e))),
        };
        let rows = rows
            .iter()
            .map(|r| {
                Ok(ForeignRow {
                    version: r.try_get(0)?,
                    description: r.try_get(1)?,
                    checksum: r.try_get(2)?,
                    ok: r.try_get::<i32, _>(3)? != 0,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(|e| Error::database(crate::lock::describe(&e)))?;
        out.push(ForeignHistory { tool, rows });
    }
    Ok(out)
}
