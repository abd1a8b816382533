//! What MySQL/MariaDB and SQLite send the same way: both take `?` binds in prepared statements,
//! so the audit insert, the history read, the check for a table, the other tools' tables and
//! the `_sqlx_migrations` mirror are written here once, and a dialect only says how it spells
//! them ([`Spelling`]). PostgreSQL is not one of them: it sends these statements through the
//! simple protocol, with literals, so that a transaction-mode pooler can carry them.

use dbwarden_core::adopt::{ForeignHistory, ForeignRow, Tool};
use dbwarden_core::migration::Migration;
use dbwarden_core::{
    AuditRecord, Error, FencingToken, HistoryRow, HistoryState, LockState, StatusRow,
};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Database, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use crate::{Columns, HistoryWrite};

/// How a `?`-bind dialect spells what differs.
pub trait Spelling: Database<Arguments: IntoArguments<Self>, Row: Columns> {
    /// `name`, a validated identifier, quoted.
    fn quoted(name: &str) -> String;
    /// One row whose first column counts the tables named by the one bind, in the connection's
    /// database.
    const COUNT_TABLES: &'static str;
    /// The server's UTC time now, as an audit row's `at` holds it.
    const NOW: &'static str;
    /// An `INSERT` that leaves a row already there as it is.
    const INSERT_IGNORE: &'static str;
    /// `tool`'s table `quoted`, read as `(version, description, checksum, ok)` in order.
    fn foreign_select(tool: Tool, quoted: &str) -> String;
}

/// `_sqlx_migrations` as sqlx creates it on MySQL/MariaDB and on SQLite (the same text).
pub const CREATE_SQLX_TABLE: &str = "CREATE TABLE IF NOT EXISTS _sqlx_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL, installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, success BOOLEAN NOT NULL, checksum BLOB NOT NULL, execution_time BIGINT NOT NULL)";

/// The columns of the history table, in the order `history_row` reads them.
const HISTORY_COLUMNS: &str = "version, description, checksum, state, statements_total, statements_done, execution_id, fencing_token, started_at, finished_at, duration_ms";

/// Whether `table` exists in the connection's database (without creating anything).
pub async fn table_exists<C>(
    conn: &mut C,
    table: &str,
    err: fn(sqlx::Error) -> Error,
) -> Result<bool, Error>
where
    C: sqlx::Connection,
    C::Database: Spelling,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'t> &'t str: Encode<'t, C::Database> + Type<C::Database>,
{
    let row = sqlx::query::<C::Database>(<C::Database as Spelling>::COUNT_TABLES)
        .bind(table)
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    Ok(row.int_at(0).map_err(err)?.unwrap_or(0) > 0)
}

/// The status row of `namespace` (the table must exist), with `lock` after the `WHERE` (MySQL's
/// ` FOR UPDATE`, or nothing). Every column: a table an older version created, without the
/// holder-settings columns, still reads.
pub async fn read_status<C>(
    conn: &mut C,
    namespace: &str,
    lock: &'static str,
    err: fn(sqlx::Error) -> Error,
) -> Result<Option<StatusRow>, Error>
where
    C: sqlx::Connection,
    C::Database: Spelling,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'t> &'t str: Encode<'t, C::Database> + Type<C::Database>,
{
    let sql = format!("SELECT * FROM dbwarden_lock WHERE namespace = ?{lock}");
    let row = sqlx::query::<C::Database>(AssertSqlSafe(sql))
        .bind(namespace)
        .fetch_optional(&mut *conn)
        .await
        .map_err(err)?;
    row.as_ref().map(crate::status_row).transpose()
}

/// The fencing token stored for `namespace`, with `lock` after the `WHERE` as in
/// [`read_status`]; `None` without a status row.
pub async fn stored_token<C>(
    conn: &mut C,
    namespace: &str,
    lock: &'static str,
    err: fn(sqlx::Error) -> Error,
) -> Result<Option<i64>, Error>
where
    C: sqlx::Connection,
    C::Database: Spelling,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'t> &'t str: Encode<'t, C::Database> + Type<C::Database>,
{
    let sql = format!("SELECT fencing_token FROM dbwarden_lock WHERE namespace = ?{lock}");
    let row = sqlx::query::<C::Database>(AssertSqlSafe(sql))
        .bind(namespace)
        .fetch_optional(&mut *conn)
        .await
        .map_err(err)?;
    Ok(row.map(|r| r.int_at(0)).transpose().map_err(err)?.flatten())
}

/// Every row of the history table `table` (which must exist), by version.
pub async fn read_history<C>(
    conn: &mut C,
    table: &str,
    err: fn(sqlx::Error) -> Error,
) -> Result<Vec<HistoryRow>, Error>
where
    C: sqlx::Connection,
    C::Database: Spelling,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
{
    let sql = format!(
        "SELECT {HISTORY_COLUMNS} FROM {} ORDER BY version",
        <C::Database as Spelling>::quoted(table)
    );
    let rows = sqlx::query::<C::Database>(AssertSqlSafe(sql))
        .fetch_all(&mut *conn)
        .await
        .map_err(err)?;
    rows.iter().map(|r| crate::history_row(r, table)).collect()
}

/// One audit row, stamped with the server's time.
pub async fn insert_audit<C>(
    conn: &mut C,
    rec: &AuditRecord,
    err: fn(sqlx::Error) -> Error,
) -> Result<(), Error>
where
    C: sqlx::Connection,
    C::Database: Spelling,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'t> String: Encode<'t, C::Database> + Type<C::Database>,
    for<'t> Option<String>: Encode<'t, C::Database> + Type<C::Database>,
{
    let sql = format!(
        "INSERT INTO dbwarden_lock_audit (at, namespace, action, actor, holder_execution_id, holder, reason) VALUES ({}, ?, ?, ?, ?, ?, ?)",
        <C::Database as Spelling>::NOW
    );
    sqlx::query::<C::Database>(AssertSqlSafe(sql))
        .bind(rec.namespace.clone())
        .bind(rec.action.clone())
        .bind(rec.actor.clone())
        .bind(rec.holder_execution_id.map(|u| u.to_string()))
        .bind(rec.holder_desc.clone())
        .bind(rec.reason.clone())
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    Ok(())
}

/// The tables of `tools` present, with their rows. A table of a tool's name without the tool's
/// columns (Rails also has a `schema_migrations`) is not the tool's: it is skipped.
pub async fn read_tools<C>(
    conn: &mut C,
    tools: &[Tool],
    err: fn(sqlx::Error) -> Error,
) -> Result<Vec<ForeignHistory>, Error>
where
    C: sqlx::Connection,
    C::Database: Spelling,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'t> &'t str: Encode<'t, C::Database> + Type<C::Database>,
{
    let mut out = Vec::new();
    for &tool in tools {
        let table = tool.table();
        if !table_exists(conn, table, err).await? {
            continue;
        }
        let quoted = <C::Database as Spelling>::quoted(table);
        let sql = <C::Database as Spelling>::foreign_select(tool, &quoted);
        let rows = match sqlx::query::<C::Database>(AssertSqlSafe(sql))
            .fetch_all(&mut *conn)
            .await
        {
            Ok(rows) => rows,
            Err(sqlx::Error::Database(e)) => {
                tracing::info!(
                    "{quoted} is not {}'s table ({}); ignored",
                    tool.name(),
                    e.message()
                );
                continue;
            }
            Err(e) => return Err(err(e)),
        };
        let rows = rows
            .iter()
            .map(crate::foreign_row)
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(err)?;
        out.push(ForeignHistory { tool, rows });
    }
    Ok(out)
}

/// The rows of `_sqlx_migrations`, if it is there.
pub async fn sqlx_rows<C>(
    conn: &mut C,
    err: fn(sqlx::Error) -> Error,
) -> Result<Vec<ForeignRow>, Error>
where
    C: sqlx::Connection,
    C::Database: Spelling,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'t> &'t str: Encode<'t, C::Database> + Type<C::Database>,
{
    Ok(read_tools(conn, &[Tool::Sqlx], err)
        .await?
        .into_iter()
        .flat_map(|h| h.rows)
        .collect())
}

/// Inside a transaction, when mirroring: `m`'s `_sqlx_migrations` row as sqlx writes it. A row
/// already there is an error when the migration just `ran`, and left as it is when only
/// recording.
pub async fn mirror_row<C>(
    conn: &mut C,
    m: &Migration,
    nanos: i64,
    ran: bool,
    err: fn(sqlx::Error) -> Error,
) -> Result<(), Error>
where
    C: sqlx::Connection,
    C::Database: Spelling,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'t> i64: Encode<'t, C::Database> + Type<C::Database>,
    for<'t> String: Encode<'t, C::Database> + Type<C::Database>,
    for<'t> Vec<u8>: Encode<'t, C::Database> + Type<C::Database>,
{
    let verb = if ran {
        "INSERT"
    } else {
        <C::Database as Spelling>::INSERT_IGNORE
    };
    sqlx::query::<C::Database>(AssertSqlSafe(format!(
        "{verb} INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (?, ?, TRUE, ?, ?)"
    )))
    .bind(m.version)
    .bind(m.sqlx_description())
    .bind(m.sqlx_checksum()?)
    .bind(nanos)
    .execute(&mut *conn)
    .await
    .map_err(err)?;
    Ok(())
}

/// `UPDATE dbwarden_lock` setting `state` and/or naming `m` as the migration in hand, both
/// bound here; the caller binds the namespace, and with `fenced` the token after it.
pub fn status_update<'q, DB: Spelling>(
    state: Option<LockState>,
    m: Option<&Migration>,
    fenced: bool,
) -> Query<'q, DB, DB::Arguments>
where
    for<'t> i64: Encode<'t, DB> + Type<DB>,
    for<'t> String: Encode<'t, DB> + Type<DB>,
    for<'t> &'static str: Encode<'t, DB> + Type<DB>,
{
    let set: Vec<&str> = [
        state.map(|_| "state = ?"),
        m.map(|_| "migration_version = ?, migration_checksum = ?"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let fence = if fenced { " AND fencing_token = ?" } else { "" };
    let sql = format!(
        "UPDATE dbwarden_lock SET {} WHERE namespace = ?{fence}",
        set.join(", ")
    );
    let q = sqlx::query::<DB>(AssertSqlSafe(sql));
    let q = match state {
        Some(state) => q.bind(state.as_str()),
        None => q,
    };
    match m {
        Some(m) => q.bind(m.version).bind(m.checksum.clone()),
        None => q,
    }
}

/// Inside the caller's fenced transaction: `w` as the whole history row of its version, with
/// `token` and `duration_ms`; started now, and finished now when it ends APPLIED or REVERTED.
pub async fn put_history<C>(
    conn: &mut C,
    table: &str,
    w: HistoryWrite<'_>,
    token: FencingToken,
    duration_ms: Option<i64>,
    err: fn(sqlx::Error) -> Error,
) -> Result<(), Error>
where
    C: sqlx::Connection,
    C::Database: Spelling,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'t> i64: Encode<'t, C::Database> + Type<C::Database>,
    for<'t> Option<i64>: Encode<'t, C::Database> + Type<C::Database>,
    for<'t> String: Encode<'t, C::Database> + Type<C::Database>,
    for<'t> &'static str: Encode<'t, C::Database> + Type<C::Database>,
{
    let now = <C::Database as Spelling>::NOW;
    let finished = match w.state {
        HistoryState::Applied | HistoryState::Reverted => now,
        _ => "NULL",
    };
    let sql = format!(
        "REPLACE INTO {} ({HISTORY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, {now}, {finished}, ?)",
        <C::Database as Spelling>::quoted(table)
    );
    w.bind(sqlx::query::<C::Database>(AssertSqlSafe(sql)))
        .bind(token.0 as i64)
        .bind(duration_ms)
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    Ok(())
}

/// Inside the caller's fenced transaction: `applied` recorded APPLIED, and `halted` RUNNING
/// with the status row of `namespace` halted for review on it.
#[allow(clippy::too_many_arguments)]
pub async fn record_adopted<C>(
    conn: &mut C,
    table: &str,
    namespace: &str,
    token: FencingToken,
    execution_id: Uuid,
    applied: &[&Migration],
    halted: Option<&Migration>,
    err: fn(sqlx::Error) -> Error,
) -> Result<(), Error>
where
    C: sqlx::Connection,
    C::Database: Spelling,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'t> i64: Encode<'t, C::Database> + Type<C::Database>,
    for<'t> Option<i64>: Encode<'t, C::Database> + Type<C::Database>,
    for<'t> String: Encode<'t, C::Database> + Type<C::Database>,
    for<'t> &'static str: Encode<'t, C::Database> + Type<C::Database>,
{
    let rows = applied
        .iter()
        .map(|m| (*m, HistoryState::Applied, m.statements.len(), Some(0)))
        .chain(halted.map(|m| (m, HistoryState::Running, 0, None)));
    for (m, state, done, ms) in rows {
        let w = HistoryWrite::new(m, state, done, execution_id);
        put_history(conn, table, w, token, ms, err).await?;
    }
    if let Some(m) = halted {
        status_update::<C::Database>(Some(LockState::NeedsReview), Some(m), false)
            .bind(namespace.to_owned())
            .execute(&mut *conn)
            .await
            .map_err(err)?;
    }
    Ok(())
}

/// The history row of `version` deleted (inside the caller's fenced transaction).
pub async fn forget<C>(
    conn: &mut C,
    table: &str,
    version: i64,
    err: fn(sqlx::Error) -> Error,
) -> Result<(), Error>
where
    C: sqlx::Connection,
    C::Database: Spelling,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    for<'t> i64: Encode<'t, C::Database> + Type<C::Database>,
{
    let t = <C::Database as Spelling>::quoted(table);
    sqlx::query::<C::Database>(AssertSqlSafe(format!("DELETE FROM {t} WHERE version = ?")))
        .bind(version)
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    Ok(())
}

/// MySQL/MariaDB: the connection's `DATABASE()`, backquoted names, `DATETIME(6)` in UTC.
#[cfg(feature = "mysql")]
impl Spelling for sqlx::MySql {
    fn quoted(name: &str) -> String {
        format!("`{name}`")
    }
    const COUNT_TABLES: &'static str = "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?";
    const NOW: &'static str = "UTC_TIMESTAMP(6)";
    const INSERT_IGNORE: &'static str = "INSERT IGNORE";
    fn foreign_select(tool: Tool, t: &str) -> String {
        match tool {
            Tool::Sqlx => format!(
                "SELECT CAST(version AS SIGNED), CAST(description AS CHAR), checksum, CAST(success AS SIGNED) FROM {t} ORDER BY version"
            ),
            Tool::GolangMigrate => format!(
                "SELECT CAST(version AS SIGNED), CAST(NULL AS CHAR), CAST(NULL AS BINARY), CAST(NOT dirty AS SIGNED) FROM {t} ORDER BY version"
            ),
            Tool::Goose => format!(
                "SELECT CAST(version_id AS SIGNED), CAST(NULL AS CHAR), CAST(NULL AS BINARY), CAST(is_applied AS SIGNED) FROM {t} ORDER BY id"
            ),
        }
    }
}

/// SQLite: the file's own tables, double-quoted names, RFC 3339 text times.
#[cfg(any(test, feature = "sqlite"))]
impl Spelling for sqlx::Sqlite {
    fn quoted(name: &str) -> String {
        format!("\"{name}\"")
    }
    const COUNT_TABLES: &'static str =
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?";
    const NOW: &'static str = "strftime('%Y-%m-%dT%H:%M:%fZ','now')";
    const INSERT_IGNORE: &'static str = "INSERT OR IGNORE";
    fn foreign_select(tool: Tool, t: &str) -> String {
        match tool {
            Tool::Sqlx => format!(
                "SELECT CAST(version AS INTEGER), CAST(description AS TEXT), CAST(checksum AS BLOB), CAST(success AS INTEGER) FROM {t} ORDER BY version"
            ),
            Tool::GolangMigrate => format!(
                "SELECT CAST(version AS INTEGER), NULL, NULL, CAST(NOT dirty AS INTEGER) FROM {t} ORDER BY version"
            ),
            Tool::Goose => format!(
                "SELECT CAST(version_id AS INTEGER), NULL, NULL, CAST(is_applied AS INTEGER) FROM {t} ORDER BY id"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dbwarden_core::migration::Dialect;
    use sqlx::{Connection, SqliteConnection};

    fn err(e: sqlx::Error) -> Error {
        Error::database_from(e.to_string(), e)
    }

    async fn db(sql: &str) -> SqliteConnection {
        let mut c = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(&mut c)
            .await
            .unwrap();
        c
    }

    #[tokio::test]
    async fn other_tools_tables_are_found_read_and_a_look_alike_is_skipped() {
        let mut c = db(&format!(
            "{CREATE_SQLX_TABLE};
             INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
               VALUES (1, 'init', TRUE, x'0102', 5), (2, 'more', FALSE, x'03', 6);
             CREATE TABLE schema_migrations (version TEXT PRIMARY KEY);
             INSERT INTO schema_migrations VALUES ('20240101000000');
             CREATE TABLE goose_db_version (id INTEGER PRIMARY KEY, version_id BIGINT, is_applied BOOLEAN);
             INSERT INTO goose_db_version (version_id, is_applied) VALUES (0, TRUE), (7, TRUE);"
        ))
        .await;
        assert!(table_exists(&mut c, "goose_db_version", err).await.unwrap());
        assert!(!table_exists(&mut c, "no_such", err).await.unwrap());

        let found = read_tools(&mut c, &Tool::ALL, err).await.unwrap();
        // Rails' `schema_migrations` has no `dirty` column: not golang-migrate's, so skipped.
        let tools: Vec<Tool> = found.iter().map(|h| h.tool).collect();
        assert_eq!(tools, vec![Tool::Sqlx, Tool::Goose]);
        let sqlx_rows: Vec<(i64, bool)> = found[0].rows.iter().map(|r| (r.version, r.ok)).collect();
        assert_eq!(sqlx_rows, vec![(1, true), (2, false)]);
        assert_eq!(found[0].rows[0].description.as_deref(), Some("init"));
        assert_eq!(found[0].rows[0].checksum.as_deref(), Some(&[1u8, 2][..]));
        let goose: Vec<i64> = found[1].rows.iter().map(|r| r.version).collect();
        assert_eq!(goose, vec![0, 7]);
    }

    #[tokio::test]
    async fn a_mirrored_row_is_written_once_and_recording_leaves_one_there() {
        let mut c = db(CREATE_SQLX_TABLE).await;
        let m = Migration::from_sql(3, "add users", "CREATE TABLE u (id INT);", Dialect::Sqlite)
            .unwrap();
        mirror_row(&mut c, &m, 9, true, err).await.unwrap();
        // Ran again: sqlx's own primary key refuses a second row.
        assert!(mirror_row(&mut c, &m, 9, true, err).await.is_err());
        // Only recording: the row already there stays as it was.
        mirror_row(&mut c, &m, 0, false, err).await.unwrap();
        let rows = sqlx_rows(&mut c, err).await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(
            rows[0].checksum.as_deref(),
            Some(&m.sqlx_checksum().unwrap()[..])
        );
    }

    const TABLES: &str = "CREATE TABLE dbwarden_lock (namespace TEXT PRIMARY KEY, state TEXT,
           migration_version INTEGER, migration_checksum TEXT, fencing_token INTEGER);
         INSERT INTO dbwarden_lock VALUES ('ns', 'RUNNING', NULL, NULL, 5);
         CREATE TABLE \"h\" (version INTEGER PRIMARY KEY NOT NULL, description TEXT NOT NULL,
           checksum TEXT NOT NULL, state TEXT NOT NULL, statements_total INTEGER NOT NULL,
           statements_done INTEGER NOT NULL, execution_id TEXT, fencing_token INTEGER NOT NULL,
           started_at TEXT, finished_at TEXT, duration_ms INTEGER);";

    /// `(version, state, statements_done, fencing_token, finished_at is set)` by version.
    async fn history_rows(c: &mut SqliteConnection) -> Vec<(i64, String, i64, i64, bool)> {
        sqlx::query_as(
            "SELECT version, state, statements_done, fencing_token, finished_at IS NOT NULL
             FROM \"h\" ORDER BY version",
        )
        .fetch_all(c)
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_history_write_replaces_its_row_and_finishes_only_what_ended() {
        let mut c = db(TABLES).await;
        let m = Migration::from_sql(4, "two", "SELECT 1;\nSELECT 2;\n", Dialect::Sqlite).unwrap();
        let exec = Uuid::new_v4();
        let w = |state, done| HistoryWrite::new(&m, state, done, exec);
        put_history(
            &mut c,
            "h",
            w(HistoryState::Running, 1),
            FencingToken(5),
            None,
            err,
        )
        .await
        .unwrap();
        assert_eq!(
            history_rows(&mut c).await,
            vec![(4, "RUNNING".into(), 1, 5, false)]
        );
        // The same version again: one row, rewritten whole.
        put_history(
            &mut c,
            "h",
            w(HistoryState::Applied, 2),
            FencingToken(6),
            Some(3),
            err,
        )
        .await
        .unwrap();
        assert_eq!(
            history_rows(&mut c).await,
            vec![(4, "APPLIED".into(), 2, 6, true)]
        );
        put_history(
            &mut c,
            "h",
            w(HistoryState::Reverted, 2),
            FencingToken(6),
            Some(1),
            err,
        )
        .await
        .unwrap();
        assert_eq!(
            history_rows(&mut c).await,
            vec![(4, "REVERTED".into(), 2, 6, true)]
        );
        put_history(
            &mut c,
            "h",
            w(HistoryState::Failed, 1),
            FencingToken(6),
            None,
            err,
        )
        .await
        .unwrap();
        assert_eq!(
            history_rows(&mut c).await,
            vec![(4, "FAILED".into(), 1, 6, false)]
        );
        let h = read_history(&mut c, "h", err).await.unwrap();
        assert_eq!(
            (h[0].execution_id, h[0].checksum.as_str()),
            (Some(exec), m.checksum.as_str())
        );

        forget(&mut c, "h", 4, err).await.unwrap();
        assert!(history_rows(&mut c).await.is_empty());
    }

    #[tokio::test]
    async fn an_adoption_records_its_rows_and_a_halt_names_the_migration_for_review() {
        let mut c = db(TABLES).await;
        let a = Migration::from_sql(1, "a", "SELECT 1;\n", Dialect::Sqlite).unwrap();
        let b = Migration::from_sql(2, "b", "SELECT 1;\nSELECT 2;\n", Dialect::Sqlite).unwrap();
        let exec = Uuid::new_v4();
        record_adopted(
            &mut c,
            "h",
            "ns",
            FencingToken(5),
            exec,
            &[&a],
            Some(&b),
            err,
        )
        .await
        .unwrap();
        assert_eq!(
            history_rows(&mut c).await,
            vec![
                (1, "APPLIED".into(), 1, 5, true),
                (2, "RUNNING".into(), 0, 5, false)
            ]
        );
        let (state, version, checksum): (String, i64, String) = sqlx::query_as(
            "SELECT state, migration_version, migration_checksum FROM dbwarden_lock",
        )
        .fetch_one(&mut c)
        .await
        .unwrap();
        assert_eq!((state.as_str(), version), ("NEEDS_REVIEW", 2));
        assert_eq!(checksum, b.checksum);
    }

    #[tokio::test]
    async fn a_fenced_status_update_matches_only_the_current_token() {
        let mut c = db(TABLES).await;
        let m = Migration::from_sql(3, "x", "SELECT 1;\n", Dialect::Sqlite).unwrap();
        let update = |token: i64| {
            status_update::<sqlx::Sqlite>(Some(LockState::Complete), Some(&m), true)
                .bind("ns".to_owned())
                .bind(token)
        };
        let stale = update(4).execute(&mut c).await.unwrap();
        assert_eq!(stale.rows_affected(), 0);
        let current = update(5).execute(&mut c).await.unwrap();
        assert_eq!(current.rows_affected(), 1);
        let row: (String, i64) =
            sqlx::query_as("SELECT state, migration_version FROM dbwarden_lock")
                .fetch_one(&mut c)
                .await
                .unwrap();
        assert_eq!(row, ("COMPLETE".into(), 3));
        // Only the migration, unfenced: the state stays as it is.
        let next = Migration::from_sql(7, "y", "SELECT 1;\n", Dialect::Sqlite).unwrap();
        status_update::<sqlx::Sqlite>(None, Some(&next), false)
            .bind("ns".to_owned())
            .execute(&mut c)
            .await
            .unwrap();
        let row: (String, i64) =
            sqlx::query_as("SELECT state, migration_version FROM dbwarden_lock")
                .fetch_one(&mut c)
                .await
                .unwrap();
        assert_eq!(row, ("COMPLETE".into(), 7));
    }

    #[tokio::test]
    async fn an_audit_row_is_stamped_by_the_server_and_history_reads_by_version() {
        let mut c = db(
            "CREATE TABLE dbwarden_lock_audit (id INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL,
               namespace TEXT NOT NULL, action TEXT NOT NULL, actor TEXT NOT NULL,
               holder_execution_id TEXT, holder TEXT, reason TEXT NOT NULL);
             CREATE TABLE \"h\" (version INTEGER PRIMARY KEY, description TEXT, checksum TEXT,
               state TEXT, statements_total INTEGER, statements_done INTEGER, execution_id TEXT,
               fencing_token INTEGER, started_at TEXT, finished_at TEXT, duration_ms INTEGER);
             INSERT INTO \"h\" VALUES (2, 'b', 'c2', 'FAILED', 3, 1, NULL, 4, NULL, NULL, NULL),
               (1, 'a', 'c1', 'APPLIED', 1, 1, NULL, 4, NULL, NULL, 12);",
        )
        .await;
        let rec = AuditRecord {
            namespace: "ns".into(),
            action: "force_unlock".into(),
            actor: "me".into(),
            holder_execution_id: None,
            holder_desc: Some("them".into()),
            reason: "stuck".into(),
        };
        insert_audit(&mut c, &rec, err).await.unwrap();
        let (at, holder): (String, Option<String>) =
            sqlx::query_as("SELECT at, holder FROM dbwarden_lock_audit")
                .fetch_one(&mut c)
                .await
                .unwrap();
        assert!(chrono::DateTime::parse_from_rfc3339(&at).is_ok(), "{at}");
        assert_eq!(holder.as_deref(), Some("them"));

        let h = read_history(&mut c, "h", err).await.unwrap();
        let seen: Vec<(i64, &str)> = h.iter().map(|r| (r.version, r.state.as_str())).collect();
        assert_eq!(seen, vec![(1, "APPLIED"), (2, "FAILED")]);
        assert_eq!(h[0].duration_ms, Some(12));
    }
}
