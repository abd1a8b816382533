//! The history tables of other migration tools in the configured schema — sqlx-cli's
//! `_sqlx_migrations`, golang-migrate's `schema_migrations`, goose's `goose_db_version` — read
//! for `migrate`'s refusal and for `dbwarden adopt`. What the rows mean is decided in
//! `dbwarden_core::adopt`.

use async_trait::async_trait;
use dbwarden_core::Error;
use dbwarden_core::adopt::{ForeignHistory, Tool};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgConnection;

use crate::PgLock;

/// `_sqlx_migrations` as sqlx creates it (in the first schema of the search path, as sqlx does).
pub(crate) const CREATE_SQLX_TABLE: &str = "CREATE TABLE IF NOT EXISTS _sqlx_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL, installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT NULL, checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL)";

/// Where the table of `tool` is: as the tools find it (through the search path), or in the
/// configured `schema`; the server's own spelling of the name (quoted where needed).
pub(crate) async fn locate(
    conn: &mut PgConnection,
    schema: &str,
    tool: Tool,
) -> Result<Option<String>, Error> {
    sqlx::query_scalar("SELECT COALESCE(to_regclass($1), to_regclass($2))::text")
        .bind(tool.table())
        .bind(format!("\"{schema}\".\"{}\"", tool.table()))
        // Unnamed: a read once per run, and safe inside a pooler's transaction.
        .persistent(false)
        .fetch_one(conn)
        .await
        // A connection that dropped is "cannot reach" (exit 2), not a failed migration (exit 1).
        .map_err(crate::tables::db_err)
}

/// Whether a failed read says the table is not the tool's (its columns or their types differ),
/// as against a failure to read it at all (permissions, a timeout), which must not pass for
/// "no such tool here".
fn not_the_tools(e: &sqlx::Error) -> bool {
    let code = e.as_database_error().and_then(|d| d.code());
    // undefined_column, datatype_mismatch, undefined_function, invalid_text_representation
    matches!(code.as_deref(), Some("42703" | "42804" | "42883" | "22P02"))
}

/// The table of each of `tools` present in `schema`, with its rows. A table of that name that
/// does not have the tool's columns (Rails also has a `schema_migrations`) is not the tool's:
/// it is skipped.
pub(crate) async fn read_tools(
    conn: &mut PgConnection,
    schema: &str,
    tools: &[Tool],
) -> Result<Vec<ForeignHistory>, Error> {
    let mut out = Vec::new();
    for &tool in tools {
        let Some(table) = locate(conn, schema, tool).await? else {
            continue;
        };
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
        let rows = match sqlx::query(AssertSqlSafe(sql))
            .persistent(false)
            .fetch_all(&mut *conn)
            .await
        {
            Ok(rows) => rows,
            Err(e) if not_the_tools(&e) => {
                tracing::info!(
                    "{table} is not {}'s table ({}); ignored",
                    tool.name(),
                    crate::lock::describe(&e)
                );
                continue;
            }
            Err(e) if crate::lock::session_ended(&e) => return Err(crate::tables::db_err(e)),
            Err(e) => {
                return Err(Error::database(format!(
                    "reading {table} ({}'s history): {}",
                    tool.name(),
                    crate::lock::describe(&e)
                )));
            }
        };
        let rows = rows
            .iter()
            .map(dbwarden_sql::foreign_row)
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(|e| Error::database(crate::lock::describe(&e)))?;
        out.push(ForeignHistory { tool, rows });
    }
    Ok(out)
}

#[async_trait]
impl dbwarden_core::adopt::OtherTools for PgLock {
    async fn other_tools(&self) -> Result<Vec<dbwarden_core::adopt::ForeignHistory>, Error> {
        // On the kept waiting session when there is one (`migrate` asks right after its look):
        // a new connection costs the server a process, and a full server refuses it.
        let kept = self.candidate.take().await;
        if let Some((mut conn, pid)) = kept {
            let read = self
                .target
                .bounded(
                    "reading other tools' history",
                    read_tools(&mut conn, &self.tables.schema, &Tool::ALL),
                )
                .await;
            match read {
                Ok(theirs) => {
                    self.candidate.put((conn, pid)).await;
                    return Ok(theirs);
                }
                // The kept session may have ended meanwhile: a fresh one below.
                Err(e) => tracing::debug!("reading other tools' history on the kept session: {e}"),
            }
        }
        let mut conn = self.target.connect().await?;
        read_tools(&mut conn, &self.tables.schema, &Tool::ALL).await
    }
}

#[cfg(test)]
mod tests {
    /// A connection cut while reading another tool's table (a link reset during the look) is
    /// "cannot reach" (exit 2), never a failed migration (exit 1): the reads map their errors
    /// with `tables::db_err`, pinned here. The network-fault chaos campaign found `locate`
    /// reporting such a cut as a database error (exit 1, seed 1796222838165192621).
    #[test]
    fn a_dropped_connection_while_reading_is_unreachable_not_a_failed_migration() {
        let e = sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "peer closed connection without sending TLS close_notify",
        ));
        let e = crate::tables::db_err(e);
        assert!(e.is_unreachable(), "{e}");
        assert_eq!(e.exit_code().code(), 2);
    }
}
