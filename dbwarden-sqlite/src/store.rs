//! SQLite status, history and audit tables. Every write by a holder runs inside
//! `BEGIN IMMEDIATE` and first checks that the namespace's fencing token is still the holder's,
//! so a holder that lost its lock cannot write.

use async_trait::async_trait;
use dbwarden_core::adopt::ForeignRow;
use dbwarden_core::migration::Migration;
use dbwarden_core::{
    AuditRecord, Error, Fence, FencingToken, HistoryRow, HolderInfo, JournalSession, SqlxCompat,
    StatusRow, Tx, Within, Write,
};
use dbwarden_sql::{HistoryWrite, binds};
use sqlx::sqlite::SqliteConnection;
use sqlx::{AssertSqlSafe, Connection};

/// Server time in SQLite, as RFC 3339 with milliseconds.
pub const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ','now')";

/// SQLITE_BUSY / SQLITE_LOCKED: another connection held the write lock past busy_timeout.
pub fn is_busy(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("5") | Some("6") | Some("517") | Some("261")))
}

pub fn db_err(e: sqlx::Error) -> Error {
    if is_busy(&e) {
        return Error::database_from(
            "the database stayed write-locked by another connection longer than busy_timeout: raise busy_timeout or stop the long writer",
            e,
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

/// The status row names `m` as the migration in hand, inside the caller's transaction.
async fn set_version(conn: &mut SqliteConnection, ns: &str, m: &Migration) -> Result<(), Error> {
    let q = binds::status_update::<sqlx::Sqlite>(None, Some(m), false);
    q.bind(ns.to_owned()).execute(conn).await.map_err(db_err)?;
    Ok(())
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

/// The journal itself is core's ([`dbwarden_core::journal`]); this is SQLite's side of it.
/// Every transaction is `BEGIN IMMEDIATE`: the file's write lock is taken at once, so a fence
/// checked inside holds until the commit.
#[async_trait]
impl JournalSession for SqliteStore {
    async fn begin(&mut self, _kind: Tx) -> Result<(), Error> {
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut self.conn)
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn end(&mut self, outcome: Result<(), Error>) -> Result<(), Error> {
        dbwarden_sql::finish_tx(&mut self.conn, outcome, db_err).await
    }

    async fn check_fence(&mut self, token: FencingToken, _hold: bool) -> Result<(), Error> {
        check_fence(&mut self.conn, &self.namespace, token).await
    }

    async fn execute(
        &mut self,
        m: &Migration,
        range: std::ops::Range<usize>,
        _within: Within,
    ) -> Result<(), Error> {
        dbwarden_sql::run_range(&mut self.conn, m, range).await
    }

    async fn write(&mut self, row: Write<'_>, fence: Fence) -> Result<(), Error> {
        if let Write::Audit(record) = row {
            return binds::insert_audit(&mut self.conn, record, db_err).await;
        }
        if let Some(token) = fence.token() {
            check_fence(&mut self.conn, &self.namespace, token).await?;
        }
        let (c, ns, table) = (&mut self.conn, &self.namespace, &self.history_table);
        match row {
            Write::Working(m) => set_version(c, ns, m).await,
            Write::State(state, m) => {
                let q = binds::status_update::<sqlx::Sqlite>(Some(state), m, false);
                q.bind(ns.clone()).execute(c).await.map_err(db_err)?;
                Ok(())
            }
            Write::History(e) => {
                let w = HistoryWrite::of(&e);
                binds::put_history(c, table, w, e.token, e.duration_ms, db_err).await
            }
            Write::Done { m, done } => set_done(c, table, m, done).await,
            Write::End {
                m,
                state,
                duration_ms,
                done,
            } => {
                sqlx::query(AssertSqlSafe(format!(
                    "UPDATE \"{table}\" SET state = ?, finished_at = {NOW}, duration_ms = ?, statements_done = COALESCE(?, statements_done) WHERE version = ?"
                )))
                .bind(state.as_str())
                .bind(duration_ms)
                .bind(done.map(|d| d as i64))
                .bind(m.version)
                .execute(c)
                .await
                .map_err(db_err)?;
                Ok(())
            }
            Write::Mirror { m, nanos, ran } => binds::mirror_row(c, m, nanos, ran, db_err).await,
            Write::Forget(version) => binds::forget(c, table, version, db_err).await,
            Write::Audit(_) => unreachable!("written above: never fenced"),
        }
    }

    async fn history(&mut self) -> Result<Vec<HistoryRow>, Error> {
        binds::read_history(&mut self.conn, &self.history_table, db_err).await
    }

    /// The write lock is the whole file's anyway, and the heartbeat is the sidecar's.
    fn names_migration_in_its_transaction(&self) -> bool {
        true
    }

    fn text_limit(&self) -> Option<(usize, usize)> {
        Some((CHUNK_STATEMENTS, CHUNK_BYTES))
    }

    fn mirrors_to_sqlx(&self) -> bool {
        self.sqlx_mirror
    }

    fn sqlx_compat(&mut self) -> Option<&mut dyn SqlxCompat> {
        Some(self)
    }
}

impl SqliteStore {
    pub(crate) async fn close(self) {
        let _ = self.conn.close().await;
    }
}

#[async_trait]
impl dbwarden_core::adopt::OtherTools for crate::SqliteLock {
    async fn other_tools(&self) -> Result<Vec<dbwarden_core::adopt::ForeignHistory>, Error> {
        if !self.db_path.exists() {
            return Ok(Vec::new());
        }
        let busy = self.busy_timeout.min(std::time::Duration::from_secs(1));
        let mut conn = self.open(busy, false).await?;
        let r = binds::read_tools(&mut conn, &dbwarden_core::adopt::Tool::ALL, db_err).await;
        let _ = conn.close().await;
        r
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
