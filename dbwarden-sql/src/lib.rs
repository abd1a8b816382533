//! The rows of dbwarden's own tables (docs/design.md §4), read once for every sqlx dialect,
//! and what every dialect does the same way around them: ending a fenced transaction, binding a
//! history row, sending migration text and naming the statement that failed.
//!
//! PostgreSQL, MySQL/MariaDB and SQLite keep the same status, history and audit columns; only
//! the column types differ (a `TIMESTAMPTZ`, a UTC `DATETIME(6)`, an RFC 3339 `TEXT`). A dialect
//! says how to read one column as text, as an integer, as bytes and as a UTC time ([`Columns`]);
//! what a row means — its state, a malformed state named with its row, the holder settings an
//! older table lacks — is decided here, once.
//!
//! This crate holds no engine: each engine crate turns on the one feature of its driver, and no
//! engine depends on another.

use chrono::{DateTime, Utc};
use dbwarden_core::adopt::ForeignRow;
use dbwarden_core::migration::Migration;
use dbwarden_core::{Error, HistoryRow, HistoryState, LockState, StatusRow};
use futures_util::StreamExt;
#[allow(unused_imports)] // used by the dialects' impls, each behind its feature
use sqlx::Row;
use sqlx::query::Query;
use uuid::Uuid;

#[cfg(any(test, feature = "mysql", feature = "sqlite"))]
pub mod binds;

/// One row of a result, as a dialect reads its columns. Every getter reads SQL `NULL` as `None`.
pub trait Columns {
    fn text(&self, col: &str) -> Result<Option<String>, sqlx::Error>;
    fn int(&self, col: &str) -> Result<Option<i64>, sqlx::Error>;
    fn time(&self, col: &str) -> Result<Option<DateTime<Utc>>, sqlx::Error>;
    /// By position: the other tools' tables are read through `SELECT`s whose column names
    /// differ per tool.
    fn int_at(&self, i: usize) -> Result<Option<i64>, sqlx::Error>;
    fn text_at(&self, i: usize) -> Result<Option<String>, sqlx::Error>;
    fn bytes_at(&self, i: usize) -> Result<Option<Vec<u8>>, sqlx::Error>;
}

/// A column that failed to decode: the database answered, so this is a database error (exit 1),
/// with the driver's error kept as its source.
pub fn decode_err(e: sqlx::Error) -> Error {
    Error::database_from(e.to_string(), e)
}

fn required<T>(v: Option<T>, col: &str) -> Result<T, Error> {
    v.ok_or_else(|| Error::database(format!("the column `{col}` is NULL")))
}

fn text(r: &impl Columns, col: &str) -> Result<Option<String>, Error> {
    r.text(col).map_err(decode_err)
}

fn int(r: &impl Columns, col: &str) -> Result<Option<i64>, Error> {
    r.int(col).map_err(decode_err)
}

fn time(r: &impl Columns, col: &str) -> Result<Option<DateTime<Utc>>, Error> {
    r.time(col).map_err(decode_err)
}

fn uuid(r: &impl Columns, col: &str) -> Result<Option<Uuid>, Error> {
    Ok(text(r, col)?.and_then(|s| Uuid::parse_str(&s).ok()))
}

/// A holder-settings column, absent in a status table an older version created and no claim
/// has upgraded yet: read as "not recorded".
fn settings(r: &impl Columns, col: &str) -> Result<Option<u64>, Error> {
    match r.int(col) {
        Ok(v) => Ok(v.filter(|&ms| ms > 0).map(|ms| ms as u64)),
        Err(sqlx::Error::ColumnNotFound(_)) => Ok(None),
        Err(e) => Err(decode_err(e)),
    }
}

/// A status row (`SELECT *` of the status table). A state this version does not know is an
/// error naming the row, never a free lock.
pub fn status_row(r: &impl Columns) -> Result<StatusRow, Error> {
    let namespace = required(text(r, "namespace")?, "namespace")?;
    let state = required(text(r, "state")?, "state")?;
    Ok(StatusRow {
        state: LockState::read(&namespace, &state)?,
        namespace,
        execution_id: uuid(r, "execution_id")?,
        owner_id: text(r, "owner_id")?,
        migration_version: int(r, "migration_version")?,
        migration_checksum: text(r, "migration_checksum")?,
        fencing_token: required(int(r, "fencing_token")?, "fencing_token")? as u64,
        host: text(r, "host")?,
        pid: int(r, "pid")?.map(|p| p as u32),
        db_connection_id: text(r, "db_connection_id")?,
        acquired_at: time(r, "acquired_at")?,
        last_heartbeat_at: time(r, "last_heartbeat_at")?,
        expires_at: time(r, "expires_at")?,
        lock_ttl_ms: settings(r, "lock_ttl_ms")?,
        heartbeat_interval_ms: settings(r, "heartbeat_interval_ms")?,
    })
}

/// A row of the history table `table`. A state this version does not know is an error naming
/// the table and the version, so that nothing runs on a misread history.
pub fn history_row(r: &impl Columns, table: &str) -> Result<HistoryRow, Error> {
    let version = required(int(r, "version")?, "version")?;
    let state = required(text(r, "state")?, "state")?;
    Ok(HistoryRow {
        state: HistoryState::read(table, version, &state)?,
        version,
        description: required(text(r, "description")?, "description")?,
        checksum: required(text(r, "checksum")?, "checksum")?,
        statements_total: required(int(r, "statements_total")?, "statements_total")?,
        statements_done: required(int(r, "statements_done")?, "statements_done")?,
        execution_id: uuid(r, "execution_id")?,
        fencing_token: required(int(r, "fencing_token")?, "fencing_token")? as u64,
        started_at: time(r, "started_at")?,
        finished_at: time(r, "finished_at")?,
        duration_ms: int(r, "duration_ms")?,
    })
}

/// A row of another tool's history, read as `(version, description, checksum, ok)` by
/// position (`dbwarden_core::adopt` decides what the rows mean).
pub fn foreign_row(r: &impl Columns) -> Result<ForeignRow, sqlx::Error> {
    Ok(ForeignRow {
        version: r
            .int_at(0)?
            .ok_or_else(|| sqlx::Error::Decode("the version is NULL".into()))?,
        description: r.text_at(1)?,
        checksum: r.bytes_at(2)?,
        ok: r
            .int_at(3)?
            .ok_or_else(|| sqlx::Error::Decode("the applied flag is NULL".into()))?
            != 0,
    })
}

/// End the transaction `r` ran in: commit on success, roll back on error. A failed `COMMIT` is
/// followed by a `ROLLBACK` too, so that no transaction stays open on the session whatever the
/// server did (SQLite keeps it open after a busy `COMMIT`; on PostgreSQL the `ROLLBACK` finds
/// none and does nothing), and the `COMMIT`'s error, read through `err`, is the result.
pub async fn finish_tx<C, T>(
    conn: &mut C,
    r: Result<T, Error>,
    err: impl FnOnce(sqlx::Error) -> Error,
) -> Result<T, Error>
where
    C: sqlx::Connection,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
{
    match r {
        Ok(v) => match sqlx::raw_sql("COMMIT").execute(&mut *conn).await {
            Ok(_) => Ok(v),
            Err(e) => {
                let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
                Err(err(e))
            }
        },
        Err(e) => {
            let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
            Err(e)
        }
    }
}

/// `begin` (read through `begin_err` when it fails), then `f`, ended by [`finish_tx`].
pub async fn transaction<C, T>(
    conn: &mut C,
    begin: &'static str,
    begin_err: fn(sqlx::Error) -> Error,
    err: fn(sqlx::Error) -> Error,
    f: impl AsyncFnOnce(&mut C) -> Result<T, Error>,
) -> Result<T, Error>
where
    C: sqlx::Connection,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
{
    sqlx::raw_sql(begin)
        .execute(&mut *conn)
        .await
        .map_err(begin_err)?;
    let r = f(&mut *conn).await;
    finish_tx(conn, r, err).await
}

/// A history row as a holder writes it: what every dialect's upsert binds first.
pub struct HistoryWrite<'a> {
    pub m: &'a Migration,
    pub state: HistoryState,
    pub done: usize,
    pub execution_id: Uuid,
}

impl<'a> HistoryWrite<'a> {
    pub fn new(m: &'a Migration, state: HistoryState, done: usize, execution_id: Uuid) -> Self {
        HistoryWrite {
            m,
            state,
            done,
            execution_id,
        }
    }

    /// The row of a journal entry.
    pub fn of(e: &dbwarden_core::Entry<'a>) -> Self {
        HistoryWrite::new(e.m, e.state, e.done, e.execution_id)
    }

    /// Binds, in this order: version, description, checksum, state, statements_total,
    /// statements_done, execution_id. The dialect binds the rest (token, duration, fence).
    pub fn bind<'q, DB>(&self, q: Query<'q, DB, DB::Arguments>) -> Query<'q, DB, DB::Arguments>
    where
        DB: sqlx::Database,
        for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> String: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> &'static str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    {
        q.bind(self.m.version)
            .bind(self.m.description.clone())
            .bind(self.m.checksum.clone())
            .bind(self.state.as_str())
            .bind(self.m.statements.len() as i64)
            .bind(self.done as i64)
            .bind(self.execution_id.to_string())
    }
}

/// Sends `text` (one statement or more) in one call. On failure: how many statements the
/// server reported complete before the one that failed, and its error.
pub async fn run_counted<C>(conn: &mut C, text: &str) -> Result<(), (usize, sqlx::Error)>
where
    C: sqlx::Connection,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
{
    let mut done = 0;
    let mut results = sqlx::raw_sql(sqlx::AssertSqlSafe(text)).fetch_many(&mut *conn);
    while let Some(item) = results.next().await {
        match item {
            Ok(sqlx::Either::Left(_)) => done += 1,
            Ok(sqlx::Either::Right(_)) => {}
            Err(e) => return Err((done, e)),
        }
    }
    Ok(())
}

/// Statements `range` of `m` sent in one call; a failure names the statement it stopped at
/// (`range.start` plus the statements the server reported complete before it).
pub async fn run_range<C>(
    conn: &mut C,
    m: &Migration,
    range: std::ops::Range<usize>,
) -> Result<(), Error>
where
    C: sqlx::Connection,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
{
    let Some((_, text)) = m.text_of(range.clone()) else {
        return Ok(());
    };
    run_counted(conn, text).await.map_err(|(done, e)| {
        // A piece may hold more statements than one (a goose block, a DELIMITER block): never
        // name one past the range.
        m.failure((range.start + done).min(range.end - 1), &e.to_string())
    })
}

/// The integer column `col` of a row, whatever its width.
#[allow(unused_macros)] // used by the dialects behind their features
macro_rules! int_any {
    ($r:expr, $col:expr) => {{
        match $r.try_get::<Option<i64>, _>($col) {
            Err(sqlx::Error::ColumnDecode { .. }) => {
                $r.try_get::<Option<i32>, _>($col).map(|v| v.map(i64::from))
            }
            other => other,
        }
    }};
}

#[allow(unused_macros)]
macro_rules! by_position {
    () => {
        fn int_at(&self, i: usize) -> Result<Option<i64>, sqlx::Error> {
            int_any!(self, i)
        }
        fn text_at(&self, i: usize) -> Result<Option<String>, sqlx::Error> {
            self.try_get(i)
        }
        fn bytes_at(&self, i: usize) -> Result<Option<Vec<u8>>, sqlx::Error> {
            self.try_get(i)
        }
    };
}

/// PostgreSQL: `TIMESTAMPTZ`; the status row's `pid` is an `INTEGER`.
#[cfg(feature = "postgres")]
impl Columns for sqlx::postgres::PgRow {
    fn text(&self, col: &str) -> Result<Option<String>, sqlx::Error> {
        self.try_get(col)
    }
    fn int(&self, col: &str) -> Result<Option<i64>, sqlx::Error> {
        int_any!(self, col)
    }
    fn time(&self, col: &str) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        self.try_get(col)
    }
    by_position!();
}

/// MySQL/MariaDB: `DATETIME(6)` holding UTC (written with `UTC_TIMESTAMP(6)`).
#[cfg(feature = "mysql")]
impl Columns for sqlx::mysql::MySqlRow {
    fn text(&self, col: &str) -> Result<Option<String>, sqlx::Error> {
        self.try_get(col)
    }
    fn int(&self, col: &str) -> Result<Option<i64>, sqlx::Error> {
        int_any!(self, col)
    }
    fn time(&self, col: &str) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        let t: Option<chrono::NaiveDateTime> = self.try_get(col)?;
        Ok(t.map(|t| t.and_utc()))
    }
    by_position!();
}

/// SQLite: times are RFC 3339 text (see `strftime('%Y-%m-%dT%H:%M:%fZ','now')`); text that is
/// not one reads as no time.
#[cfg(any(test, feature = "sqlite"))]
impl Columns for sqlx::sqlite::SqliteRow {
    fn text(&self, col: &str) -> Result<Option<String>, sqlx::Error> {
        self.try_get(col)
    }
    fn int(&self, col: &str) -> Result<Option<i64>, sqlx::Error> {
        int_any!(self, col)
    }
    fn time(&self, col: &str) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        let s: Option<String> = self.try_get(col)?;
        Ok(s.and_then(|s| DateTime::parse_from_rfc3339(&s).ok())
            .map(|d| d.with_timezone(&Utc)))
    }
    by_position!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::{Connection, SqliteConnection};

    async fn rows(sql: &str, select: &str) -> Vec<sqlx::sqlite::SqliteRow> {
        let mut c = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut c)
            .await
            .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(select.to_owned()))
            .fetch_all(&mut c)
            .await
            .unwrap()
    }

    const STATUS: &str = "CREATE TABLE s (namespace TEXT, execution_id TEXT, owner_id TEXT,
        migration_version INTEGER, migration_checksum TEXT, fencing_token INTEGER, host TEXT,
        pid INTEGER, db_connection_id TEXT, state TEXT, acquired_at TEXT,
        last_heartbeat_at TEXT, expires_at TEXT";

    #[tokio::test]
    async fn a_status_row_reads_whole_and_an_older_table_lacks_only_the_settings() {
        let id = Uuid::new_v4();
        let r = rows(
            &format!(
                "{STATUS}, lock_ttl_ms INTEGER, heartbeat_interval_ms INTEGER);
                 INSERT INTO s VALUES ('ns', '{id}', 'me', 7, 'abc', 3, 'h', 42, '9', 'RUNNING',
                   '2026-12-03T10:00:00.250Z', '2026-12-03T10:00:01Z', NULL, 6000, 0);"
            ),
            "SELECT * FROM s",
        )
        .await;
        let s = status_row(&r[0]).unwrap();
        assert_eq!(s.state, LockState::Running);
        assert_eq!(s.execution_id, Some(id));
        assert_eq!(
            (s.fencing_token, s.pid, s.migration_version),
            (3, Some(42), Some(7))
        );
        assert_eq!(
            s.acquired_at.unwrap().to_rfc3339(),
            "2026-12-03T10:00:00.250+00:00"
        );
        // 0 is "not recorded", as NULL is.
        assert_eq!((s.lock_ttl_ms, s.heartbeat_interval_ms), (Some(6000), None));

        let old = rows(
            &format!("{STATUS}); INSERT INTO s (namespace, state, fencing_token) VALUES ('ns', 'AVAILABLE', 1);"),
            "SELECT * FROM s",
        )
        .await;
        let s = status_row(&old[0]).unwrap();
        assert_eq!((s.lock_ttl_ms, s.heartbeat_interval_ms), (None, None));
    }

    #[tokio::test]
    async fn a_range_runs_as_one_call_and_a_failure_names_its_statement_and_line() {
        use dbwarden_core::migration::Dialect;
        let sql = "CREATE TABLE t (id INTEGER PRIMARY KEY);\nINSERT INTO t VALUES (1);\n-- a note\nINSERT INTO t VALUES (1);\nINSERT INTO t VALUES (2);\n";
        let m = Migration::from_sql(1, "x", sql, Dialect::Sqlite).unwrap();
        let mut c = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        run_range(&mut c, &m, 0..2).await.unwrap();
        // An empty range sends nothing.
        run_range(&mut c, &m, 2..2).await.unwrap();
        match run_range(&mut c, &m, 2..4).await {
            Err(Error::MigrationFailed {
                file,
                statement,
                total,
                message,
                ..
            }) => {
                assert_eq!((file.as_str(), statement, total), ("1_x.sql:4", 3, 4));
                assert!(message.contains("UNIQUE"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // SQLite stops at the failing statement: the one after it never ran.
        let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM t ORDER BY id")
            .fetch_all(&mut c)
            .await
            .unwrap();
        assert_eq!(ids, vec![1]);
    }

    #[tokio::test]
    async fn a_history_write_binds_its_columns_in_the_documented_order() {
        use dbwarden_core::migration::Dialect;
        let m = Migration::from_sql(7, "add_x", "SELECT 1;\nSELECT 2;\n", Dialect::Sqlite).unwrap();
        let mut c = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        sqlx::raw_sql(
            "CREATE TABLE h (version INTEGER, description TEXT, checksum TEXT, state TEXT,
             statements_total INTEGER, statements_done INTEGER, execution_id TEXT,
             fencing_token INTEGER, started_at TEXT, finished_at TEXT, duration_ms INTEGER)",
        )
        .execute(&mut c)
        .await
        .unwrap();
        let execution_id = Uuid::new_v4();
        let w = HistoryWrite {
            m: &m,
            state: HistoryState::Running,
            done: 1,
            execution_id,
        };
        w.bind(sqlx::query(
            "INSERT INTO h VALUES (?, ?, ?, ?, ?, ?, ?, ?, '2026-12-03T10:00:00Z', NULL, ?)",
        ))
        .bind(5i64)
        .bind(None::<i64>)
        .execute(&mut c)
        .await
        .unwrap();
        let r = sqlx::query("SELECT * FROM h")
            .fetch_one(&mut c)
            .await
            .unwrap();
        let h = history_row(&r, "h").unwrap();
        assert_eq!((h.version, h.description.as_str()), (7, "add_x"));
        assert_eq!(h.checksum, m.checksum);
        assert_eq!(h.state, HistoryState::Running);
        assert_eq!((h.statements_total, h.statements_done), (2, 1));
        assert_eq!((h.execution_id, h.fencing_token), (Some(execution_id), 5));
    }

    #[tokio::test]
    async fn an_unknown_state_is_an_error_naming_its_row() {
        let r = rows(
            &format!("{STATUS}); INSERT INTO s (namespace, state, fencing_token) VALUES ('billing', 'RUNNNING', 1);"),
            "SELECT * FROM s",
        )
        .await;
        let e = status_row(&r[0]).unwrap_err().to_string();
        assert!(e.contains("billing") && e.contains("RUNNNING"), "{e}");

        let h = rows(
            "CREATE TABLE h (version INTEGER, description TEXT, checksum TEXT, state TEXT,
               statements_total INTEGER, statements_done INTEGER, execution_id TEXT,
               fencing_token INTEGER, started_at TEXT, finished_at TEXT, duration_ms INTEGER);
             INSERT INTO h VALUES (20260101, 'add', 'c', 'APPLIEDX', 1, 1, NULL, 1, NULL, NULL, NULL);",
            "SELECT * FROM h",
        )
        .await;
        let e = history_row(&h[0], "my_history").unwrap_err().to_string();
        assert!(
            e.contains("my_history") && e.contains("20260101") && e.contains("APPLIEDX"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn another_tools_rows_read_by_position() {
        let r = rows(
            "CREATE TABLE t (v BIGINT, d TEXT, c BLOB, ok BOOLEAN);
             INSERT INTO t VALUES (1, 'init', x'0102', TRUE), (2, NULL, NULL, FALSE);",
            "SELECT v, d, c, ok FROM t ORDER BY v",
        )
        .await;
        let a = foreign_row(&r[0]).unwrap();
        let b = foreign_row(&r[1]).unwrap();
        assert_eq!(
            (a.version, a.description.as_deref(), a.checksum, a.ok),
            (1, Some("init"), Some(vec![1, 2]), true)
        );
        assert_eq!((b.version, b.description, b.ok), (2, None, false));
    }
}
