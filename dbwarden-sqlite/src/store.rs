//! SQLite status, history and audit tables. Every write by a holder runs inside
//! `BEGIN IMMEDIATE` and first checks that the namespace's fencing token is still the holder's,
//! so a holder that lost its lock cannot write.

use async_trait::async_trait;
use dbwarden_core::adopt::ForeignRow;
use dbwarden_core::migration::Migration;
use dbwarden_core::{
    AuditRecord, Error, FencingToken, HistoryRow, HistoryState, HolderInfo, LockState, LostSignal,
    MigrationStore, SqlxCompat, StatusRow,
};
use dbwarden_sql::{HistoryWrite, binds};
use sqlx::sqlite::SqliteConnection;
use sqlx::{AssertSqlSafe, Connection};
use uuid::Uuid;

/// Server time in SQLite, as RFC 3339 with milliseconds.
pub const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ','now')";

/// SQLITE_BUSY / SQLITE_LOCKED: another connection held the write lock past busy_timeout.
pub fn is_busy(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("5") | Some("6") | Some("517") | Some("261")))
}

pub fn db_err(e: sqlx::Error) -> Error {
    if is_busy(&e) {
        return Error::database(
            "the database stayed write-locked by another connection longer than busy_timeout: raise busy_timeout or stop the long writer",
        );
    }
    Error::database_from(e.to_string(), e)
}

/// During acquisition a write-locked database means "try again later", not a failure.
pub fn busy_or_db(e: sqlx::Error) -> Error {
    if is_busy(&e) {
        return Error::Busy(Box::new(dbwarden_core::error::BusyInfo {
            note: Some(
                "the database is write-locked by another connection (longer than busy_timeout)"
                    .into(),
            ),
            ..Default::default()
        }));
    }
    db_err(e)
}

/// The tables, on one connection.
pub struct SqliteStore {
    pub(crate) conn: SqliteConnection,
    pub(crate) namespace: String,
    /// Validated identifier (see `dbwarden_core::config::validate_identifier`).
    pub(crate) history_table: String,
    /// `sqlx_compat`: migrations recorded APPLIED also get their `_sqlx_migrations` row.
    pub(crate) sqlx_mirror: bool,
}

pub(crate) async fn create_tables(conn: &mut SqliteConnection, history: &str) -> Result<(), Error> {
    let sql = format!(
        r#"CREATE TABLE IF NOT EXISTS dbwarden_lock (
    namespace TEXT PRIMARY KEY NOT NULL,
    execution_id TEXT, owner_id TEXT, migration_version INTEGER, migration_checksum TEXT,
    fencing_token INTEGER NOT NULL DEFAULT 0,
    host TEXT, pid INTEGER, db_connection_id TEXT,
    state TEXT NOT NULL DEFAULT 'AVAILABLE',
    acquired_at TEXT, last_heartbeat_at TEXT, expires_at TEXT,
    lock_ttl_ms INTEGER, heartbeat_interval_ms INTEGER);
CREATE TABLE IF NOT EXISTS "{history}" (
    version INTEGER PRIMARY KEY NOT NULL,
    description TEXT NOT NULL, checksum TEXT NOT NULL, state TEXT NOT NULL,
    statements_total INTEGER NOT NULL, statements_done INTEGER NOT NULL,
    execution_id TEXT, fencing_token INTEGER NOT NULL,
    started_at TEXT, finished_at TEXT, duration_ms INTEGER);
CREATE TABLE IF NOT EXISTS dbwarden_lock_audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    namespace TEXT NOT NULL, action TEXT NOT NULL, actor TEXT NOT NULL,
    holder_execution_id TEXT, holder TEXT, reason TEXT NOT NULL);"#
    );
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(conn)
        .await
        .map_err(busy_or_db)?;
    Ok(())
}

/// Inside the claim's transaction: a status table an older version created gets the
/// holder-settings columns.
async fn upgrade_status_table(conn: &mut SqliteConnection) -> Result<(), Error> {
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pragma_table_info('dbwarden_lock') WHERE name IN ('lock_ttl_ms', 'heartbeat_interval_ms')",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db_err)?;
    if n < 2 {
        sqlx::raw_sql(
            "ALTER TABLE dbwarden_lock ADD COLUMN lock_ttl_ms INTEGER; ALTER TABLE dbwarden_lock ADD COLUMN heartbeat_interval_ms INTEGER",
        )
        .execute(&mut *conn)
        .await
        .map_err(db_err)?;
    }
    Ok(())
}

pub(crate) async fn read_status(
    conn: &mut SqliteConnection,
    namespace: &str,
) -> Result<Option<StatusRow>, Error> {
    binds::read_status(conn, namespace, "", db_err).await
}

/// Bump the fencing token and write our status row, in one `BEGIN IMMEDIATE` transaction.
/// Returns the new token and the row as it was before.
pub(crate) async fn bump_and_claim(
    conn: &mut SqliteConnection,
    namespace: &str,
    holder: &HolderInfo,
    audits: &[AuditRecord],
) -> Result<(FencingToken, Option<StatusRow>), Error> {
    dbwarden_sql::transaction(conn, "BEGIN IMMEDIATE", busy_or_db, db_err, async |conn| {
        upgrade_status_table(conn).await?;
        let previous = read_status(conn, namespace).await?;
        let token: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "INSERT INTO dbwarden_lock (namespace, execution_id, owner_id, fencing_token, host, pid, state, acquired_at, last_heartbeat_at, migration_version, migration_checksum, lock_ttl_ms, heartbeat_interval_ms)
             VALUES (?1, ?2, ?3, 1, ?4, ?5, 'RUNNING', {NOW}, {NOW}, NULL, NULL, ?6, ?7)
             ON CONFLICT(namespace) DO UPDATE SET
               execution_id = ?2, owner_id = ?3, fencing_token = fencing_token + 1, host = ?4, pid = ?5,
               state = 'RUNNING', acquired_at = {NOW}, last_heartbeat_at = {NOW},
               migration_version = NULL, migration_checksum = NULL, lock_ttl_ms = ?6,
               heartbeat_interval_ms = ?7
             RETURNING fencing_token"
        )))
        .bind(namespace)
        .bind(holder.execution_id.to_string())
        .bind(&holder.owner)
        .bind(&holder.host)
        .bind(i64::from(holder.pid))
        .bind(holder.lock_ttl_ms.map(|ms| ms as i64))
        .bind(holder.heartbeat_interval_ms.map(|ms| ms as i64))
        .fetch_one(&mut *conn)
        .await
        .map_err(db_err)?;
        for rec in audits {
            binds::insert_audit(conn, rec, db_err).await?;
        }
        Ok((FencingToken(token as u64), previous))
    })
    .await
}

/// Inside a transaction: fail unless the stored token is still `token`.
pub(crate) async fn check_fence(
    conn: &mut SqliteConnection,
    namespace: &str,
    token: FencingToken,
) -> Result<(), Error> {
    token.check(binds::stored_token(conn, namespace, "", db_err).await?)
}

/// `statements_done = done` for `m`, inside the caller's transaction.
async fn set_done(
    conn: &mut SqliteConnection,
    table: &str,
    m: &Migration,
    done: usize,
) -> Result<(), Error> {
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{table}\" SET statements_done = ? WHERE version = ?"
    )))
    .bind(done as i64)
    .bind(m.version)
    .execute(conn)
    .await
    .map_err(db_err)?;
    Ok(())
}

/// Most statements (and bytes) sent to SQLite in one call when a whole migration runs in one
/// transaction: SQLite's own parser cuts each call's text, ours only cuts between calls.
const CHUNK_STATEMENTS: usize = 256;
const CHUNK_BYTES: usize = 256 * 1024;

/// The whole migration in chunks of whole statements.
fn chunks(m: &Migration) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    let mut bytes = 0;
    for (i, s) in m.statements.iter().enumerate() {
        match out.last_mut() {
            Some(last) if last.len() < CHUNK_STATEMENTS && bytes + s.span.len() <= CHUNK_BYTES => {
                last.end = i + 1;
                bytes += s.span.len();
            }
            _ => {
                out.push(i..i + 1);
                bytes = s.span.len();
            }
        }
    }
    out
}

impl SqliteStore {
    /// Inside the file's own transaction: `statements_done = done`, after a fence check, without
    /// opening or committing a transaction.
    async fn record_in_place(
        &mut self,
        token: FencingToken,
        m: &Migration,
        done: usize,
    ) -> Result<(), Error> {
        check_fence(&mut self.conn, &self.namespace, token).await?;
        set_done(&mut self.conn, &self.history_table, m, done).await
    }

    /// `statements_done = done` in a fenced transaction of its own.
    async fn record_done(
        &mut self,
        token: FencingToken,
        m: &Migration,
        done: usize,
    ) -> Result<(), Error> {
        self.fenced(token, async |c, n| set_done(c, &n.table, m, done).await)
            .await
    }

    /// A statement inside (or opening, or ending) a transaction the file opened: it runs as
    /// written, and its record is written in that transaction (before a COMMIT).
    async fn own_transaction_statement(
        &mut self,
        token: FencingToken,
        m: &Migration,
        index: usize,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        let commits = m.commits_own_transaction(index);
        if commits {
            lost.check()?;
            self.record_in_place(token, m, index + 1).await?;
        }
        dbwarden_sql::run_range(&mut self.conn, m, index..index + 1).await?;
        if commits {
            return Ok(());
        }
        lost.check()?;
        if m.inside_own_transaction_after(index) {
            self.record_in_place(token, m, index + 1).await
        } else {
            self.record_done(token, m, index + 1).await
        }
    }

    /// `f` in a `BEGIN IMMEDIATE` transaction that first checks the fence, committed when it
    /// succeeds; `f` gets the connection and what it names: the namespace and the history table.
    async fn fenced<T>(
        &mut self,
        token: FencingToken,
        f: impl AsyncFnOnce(&mut SqliteConnection, &Names) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let names = Names {
            ns: self.namespace.clone(),
            table: self.history_table.clone(),
            mirror: self.sqlx_mirror,
        };
        dbwarden_sql::transaction(
            &mut self.conn,
            "BEGIN IMMEDIATE",
            db_err,
            db_err,
            async |c| {
                check_fence(&mut *c, &names.ns, token).await?;
                f(c, &names).await
            },
        )
        .await
    }
}

/// What a fenced transaction's writes name.
struct Names {
    ns: String,
    table: String,
    /// `sqlx_compat`: migrations recorded APPLIED also get their `_sqlx_migrations` row.
    mirror: bool,
}

/// The status row names `m` as the migration in hand, inside the caller's transaction.
async fn set_version(conn: &mut SqliteConnection, ns: &str, m: &Migration) -> Result<(), Error> {
    let q = binds::status_update::<sqlx::Sqlite>(None, Some(m), false);
    q.bind(ns.to_owned()).execute(conn).await.map_err(db_err)?;
    Ok(())
}

/// Inside a fenced transaction: the history row `w`, with the token and duration.
async fn put_history(
    c: &mut SqliteConnection,
    n: &Names,
    w: HistoryWrite<'_>,
    token: FencingToken,
    duration_ms: Option<i64>,
) -> Result<(), Error> {
    binds::put_history(c, &n.table, w, token, duration_ms, db_err).await
}

#[async_trait]
impl SqlxCompat for SqliteStore {
    async fn sqlx_table_exists(&mut self) -> Result<bool, Error> {
        binds::table_exists(&mut self.conn, "_sqlx_migrations", db_err).await
    }

    /// sqlx takes no lock on SQLite (its migrator's `lock()` does nothing): the file's own
    /// write lock and the sidecar are all there is.
    async fn try_lock_sqlx(&mut self) -> Result<bool, Error> {
        Ok(true)
    }

    async fn sqlx_rows(&mut self) -> Result<Vec<ForeignRow>, Error> {
        binds::sqlx_rows(&mut self.conn, db_err).await
    }

    async fn mirror_to_sqlx(&mut self) -> Result<(), Error> {
        sqlx::raw_sql(binds::CREATE_SQLX_TABLE)
            .execute(&mut self.conn)
            .await
            .map_err(busy_or_db)?;
        self.sqlx_mirror = true;
        Ok(())
    }
}

#[async_trait]
impl MigrationStore for SqliteStore {
    fn transactional(&self) -> bool {
        true
    }

    fn sqlx_compat(&mut self) -> Option<&mut dyn SqlxCompat> {
        Some(self)
    }

    async fn history(&mut self) -> Result<Vec<HistoryRow>, Error> {
        binds::read_history(&mut self.conn, &self.history_table, db_err).await
    }

    async fn set_state(
        &mut self,
        token: FencingToken,
        state: LockState,
        migration: Option<&Migration>,
    ) -> Result<(), Error> {
        self.fenced(token, async |c, n| {
            let q = binds::status_update::<sqlx::Sqlite>(Some(state), migration, false);
            q.bind(n.ns.clone()).execute(c).await.map_err(db_err)?;
            Ok(())
        })
        .await
    }

    async fn apply_in_transaction(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        let t0 = std::time::Instant::now();
        self.fenced(token, async |c, n| {
            set_version(&mut *c, &n.ns, m).await?;
            for chunk in chunks(m) {
                lost.check()?;
                dbwarden_sql::run_range(&mut *c, m, chunk).await?;
            }
            lost.check()?;
            let state = m.done_state();
            let w = HistoryWrite::new(m, state, m.statements.len(), execution_id);
            let ms = t0.elapsed().as_millis() as i64;
            put_history(&mut *c, n, w, token, Some(ms)).await?;
            if !n.mirror || state != HistoryState::Applied {
                return Ok(());
            }
            let nanos = t0.elapsed().as_nanos() as i64;
            binds::mirror_row(&mut *c, m, nanos, true, db_err).await
        })
        .await
    }

    async fn journal_begin(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
        from: usize,
    ) -> Result<(), Error> {
        self.fenced(token, async |c, n| {
            set_version(&mut *c, &n.ns, m).await?;
            let w = HistoryWrite::new(m, HistoryState::Running, from, execution_id);
            put_history(c, n, w, token, None).await
        })
        .await
    }

    async fn journal_statement(
        &mut self,
        token: FencingToken,
        m: &Migration,
        index: usize,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        if m.inside_own_transaction(index) || m.inside_own_transaction_after(index) {
            let r = self.own_transaction_statement(token, m, index, lost).await;
            if r.is_err() {
                // Nothing of the file's transaction may stay open on the session.
                let _ = sqlx::raw_sql("ROLLBACK").execute(&mut self.conn).await;
            }
            return r;
        }
        if m.statements[index].refuses_transaction.is_some() {
            // VACUUM, PRAGMA foreign_keys, ATTACH: on their own, then recorded.
            check_fence(&mut self.conn, &self.namespace, token).await?;
            dbwarden_sql::run_range(&mut self.conn, m, index..index + 1).await?;
            lost.check()?;
            return self.record_done(token, m, index + 1).await;
        }
        // Each statement commits on its own, together with its journal entry.
        self.journal_batch(token, m, index..index + 1, lost).await
    }

    async fn journal_batch(
        &mut self,
        token: FencingToken,
        m: &Migration,
        range: std::ops::Range<usize>,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        self.fenced(token, async |c, n| {
            dbwarden_sql::run_range(&mut *c, m, range.clone()).await?;
            // Lost while the statements ran: roll them back with their record.
            lost.check()?;
            set_done(c, &n.table, m, range.end).await
        })
        .await
    }

    async fn journal_end(
        &mut self,
        token: FencingToken,
        m: &Migration,
        state: HistoryState,
        duration_ms: i64,
    ) -> Result<(), Error> {
        self.fenced(token, async |c, n| {
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE \"{}\" SET state = ?, finished_at = {NOW}, duration_ms = ? WHERE version = ?",
                n.table
            )))
            .bind(state.as_str())
            .bind(duration_ms)
            .bind(m.version)
            .execute(&mut *c)
            .await
            .map_err(db_err)?;
            if !n.mirror || state != HistoryState::Applied {
                return Ok(());
            }
            let nanos = duration_ms.saturating_mul(1_000_000);
            binds::mirror_row(&mut *c, m, nanos, true, db_err).await
        })
        .await
    }

    async fn mark_applied(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
    ) -> Result<(), Error> {
        self.fenced(token, async |c, n| {
            let (state, done) = (HistoryState::Applied, m.statements.len());
            let w = HistoryWrite::new(m, state, done, execution_id);
            put_history(&mut *c, n, w, token, Some(0)).await?;
            if !n.mirror {
                return Ok(());
            }
            binds::mirror_row(&mut *c, m, 0, false, db_err).await
        })
        .await
    }

    async fn record_adopted(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        applied: &[&Migration],
        halted: Option<&Migration>,
    ) -> Result<(), Error> {
        self.fenced(token, async |c, n| {
            let (t, ns) = (&n.table, &n.ns);
            binds::record_adopted(c, t, ns, token, execution_id, applied, halted, db_err).await
        })
        .await
    }

    async fn forget(&mut self, token: FencingToken, version: i64) -> Result<(), Error> {
        self.fenced(token, async |c, n| {
            binds::forget(c, &n.table, version, db_err).await
        })
        .await
    }

    async fn audit(&mut self, record: &AuditRecord) -> Result<(), Error> {
        binds::insert_audit(&mut self.conn, record, db_err).await
    }
}

impl SqliteStore {
    pub(crate) async fn close(self) {
        let _ = self.conn.close().await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_driver_error_is_kept_as_the_source() {
        use std::error::Error as _;
        let e = super::db_err(sqlx::Error::RowNotFound);
        assert!(e.source().is_some_and(|s| s.is::<sqlx::Error>()), "{e:?}");
    }
}
