//! `lock = "lease"`: the lock for PostgreSQL behind a transaction pooler (PgBouncer
//! `pool_mode = transaction`, and the poolers managed platforms put first). A session advisory
//! lock is no lock there: the pooler hands the backend that holds it to another client between
//! transactions. This lock keeps no session state at all. The status row is the lease
//! (grade C): a holder writes its `expires_at` when it takes it and on every heartbeat, each in
//! one short transaction; a new holder takes it only when core's takeover judge finds it
//! stale by the server's clock, and bumps the fencing token, which every write of the old
//! holder checks (docs/engines.md, "Behind a transaction pooler"; docs/design.md §6).
//!
//! Runners on the advisory lock (a direct URL) and on the lease exclude each other on one
//! database: an advisory runner that finds a live lease in the row gives its advisory lock back
//! and waits (`tables::bump_and_claim`), and a lease runner that finds the advisory lock held
//! in `pg_locks`, with the row locked, waits too. Both claims lock the status row, so whichever
//! commits second sees the other's claim.
//!
//! Through a pooler, no statement is prepared under a name (the next client of that backend
//! would find it, or miss it), and every statement with parameters runs inside a transaction,
//! the one span a pooler keeps a backend for; everything else goes in the simple protocol.

mod held;
mod unlock;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dbwarden_core::error::BusyInfo;
use dbwarden_core::lock::{Snapshot, SnapshotRead};
use dbwarden_core::unlock::{Broke, Sighting};
use dbwarden_core::{
    Attempt, AuditRecord, Error, FencingToken, Grade, Grant, HistoryRow, HolderInfo, MigrationLock,
    Observation,
};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection, Row};

use self::held::{LeaseBeat, LeaseHeld};
use crate::PgLock;
use crate::held::Kept;
use crate::literal::literal;
use crate::lock::{self, Target};
use crate::store::PgStore;
use crate::tables::{self, LEASE_SESSION, db_err};
use dbwarden_core::lock::DEFAULT_TTL;

/// How often a waiter looks again: a pooler has no LISTEN, so releases are not heard.
const POLL: Duration = Duration::from_millis(500);

/// The pooler-safe lock of one namespace of one PostgreSQL database.
pub struct PgLeaseLock {
    pg: PgLock,
    /// A connection kept between attempts (and after a clean release) for the next one.
    kept: Kept,
}

impl std::fmt::Debug for PgLeaseLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLeaseLock")
            .field("target", &self.pg.target.shown)
            .field("namespace", &self.pg.namespace)
            .finish()
    }
}

impl PgLeaseLock {
    /// The lease of `pg`'s database and namespace, with its tables and timeouts.
    pub fn new(pg: PgLock) -> Self {
        PgLeaseLock {
            pg,
            kept: Kept::default(),
        }
    }

    fn ms(&self) -> u128 {
        self.pg.ms()
    }

    fn target(&self) -> &Target {
        &self.pg.target
    }

    fn ns(&self) -> &str {
        self.pg.namespace.as_str()
    }

    /// The kept connection, else a new one (checked to be a primary: a replica cannot hold a
    /// lease the primary's runners see).
    async fn conn(&self) -> Result<PgConnection, Error> {
        if let Some(c) = self.kept.take().await {
            return Ok(c);
        }
        let mut c = self.target().connect().await?;
        self.target()
            .bounded("checking the server", self.target().check_primary(&mut c))
            .await?;
        Ok(c)
    }

    async fn keep(&self, conn: PgConnection) {
        keep_in(&self.kept, conn).await;
    }

    /// `f` on the kept connection (else a new one), bounded; the connection is kept again when
    /// `f` succeeds.
    async fn on_conn<T>(
        &self,
        what: &str,
        f: impl AsyncFnOnce(&mut PgConnection) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut conn = self.conn().await?;
        let r = self.target().bounded(what, f(&mut conn)).await;
        if r.is_ok() {
            self.keep(conn).await;
        }
        r
    }

    /// One transaction: lock the status row, look at both primitives, and claim the lease if
    /// nothing live holds the namespace. `Ok(Err(busy))`: held.
    async fn take(
        &self,
        conn: &mut PgConnection,
        holder: &HolderInfo,
    ) -> Result<Result<tables::Claimed, BusyInfo>, Error> {
        let t = &self.pg.tables;
        let ms = self.ms();
        let settings = tables::ensure_tables(conn, t, ms).await?;
        tables::begin_claim(conn, ms).await.map_err(db_err)?;
        let r = async {
            let previous = tables::lock_row(conn, t, self.ns()).await?;
            let now = tables::server_now(conn).await?;
            // A runner on the advisory lock (a direct URL) holds it: wait for it.
            if let Some(pid) = advisory_holder(conn, self.pg.key).await? {
                let row = previous.as_ref().filter(|p| {
                    p.state.is_active() && p.db_connection_id.as_deref() == Some(&pid.to_string())
                });
                return Ok(Err(BusyInfo {
                    holder: row.and_then(|p| tables::lease_holder(p, now)),
                    fencing_token: previous.as_ref().map(|p| p.fencing_token),
                    age: row
                        .and_then(|p| p.acquired_at)
                        .and_then(|t| (now - t).to_std().ok()),
                    note: Some(format!(
                        "backend pid {pid} holds the advisory lock (a runner on a direct URL)"
                    )),
                    server_full: false,
                }));
            }
            let mut broken = None;
            if let Some(p) = previous.as_ref().filter(|p| p.state.is_active()) {
                let age = match tables::judge_lease(p, now) {
                    Ok(age) => age,
                    Err(busy) => return Ok(Err(*busy)),
                };
                // Not a lease: an advisory holder's row, and nobody holds the advisory lock: the
                // server freed it when that holder's session ended.
                broken = Some(tables::takeover_reason(
                    p,
                    tables::is_lease(p).then_some(age),
                ));
            }
            let ttl_ms = holder.lock_ttl().unwrap_or(DEFAULT_TTL).as_millis();
            let recorded = if settings {
                format!(
                    ", lock_ttl_ms = {ttl_ms}, heartbeat_interval_ms = {}",
                    holder
                        .heartbeat_interval_ms
                        .map_or("NULL".to_owned(), |ms| ms.to_string())
                )
            } else {
                String::new()
            };
            let row = sqlx::raw_sql(AssertSqlSafe(format!(
                "UPDATE {lock} SET execution_id = {eid}, owner_id = {owner}, fencing_token = fencing_token + 1,
                   host = {host}, pid = {pid}, db_connection_id = '{LEASE_SESSION}', state = 'RUNNING',
                   acquired_at = clock_timestamp(), last_heartbeat_at = clock_timestamp(),
                   expires_at = clock_timestamp() + {ttl_ms} * interval '1 millisecond',
                   migration_version = NULL, migration_checksum = NULL{recorded}
                 WHERE namespace = {ns} RETURNING fencing_token",
                lock = t.lock,
                ns = literal(self.ns())?,
                eid = literal(&holder.execution_id.to_string())?,
                owner = literal(&holder.owner)?,
                host = literal(&holder.host)?,
                pid = holder.pid as i32,
            )))
            .fetch_one(&mut *conn)
            .await
            .map_err(db_err)?;
            let token: i64 = row.try_get(0).map_err(db_err)?;
            Ok(Ok((FencingToken(token as u64), previous, broken)))
        }
        .await;
        tables::finish_tx(conn, r).await
    }

    async fn snapshot_on(&self, conn: &mut PgConnection) -> Result<Snapshot, Error> {
        let t = &self.pg.tables;
        sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *conn)
            .await
            .map_err(db_err)?;
        let r = async {
            let status = tables::status_if_any(conn, t, self.ns()).await?;
            let history = tables::history_if_any(conn, t).await?;
            Ok(Snapshot { status, history })
        }
        .await;
        tables::finish_tx(conn, r).await
    }
}

async fn keep_in(kept: &Kept, conn: PgConnection) {
    if let Some(conn) = kept.offer(conn).await {
        let _ = conn.close().await;
    }
}

/// The backend holding the namespace's advisory lock in this database, if any (the simple
/// protocol: the key parts are numbers).
async fn advisory_holder(conn: &mut PgConnection, key: i64) -> Result<Option<i32>, Error> {
    let (hi, lo) = lock::key_parts(key);
    let sql = lock::HOLDER_SQL
        .replace("$1", &hi.to_string())
        .replace("$2", &lo.to_string());
    let row = sqlx::raw_sql(AssertSqlSafe(sql))
        .fetch_optional(conn)
        .await
        .map_err(db_err)?;
    row.map(|r| r.try_get(0)).transpose().map_err(db_err)
}

#[async_trait]
impl SnapshotRead for PgLeaseLock {
    async fn read_snapshot(&self) -> Result<Snapshot, Error> {
        self.on_conn("reading the history", async |c| self.snapshot_on(c).await)
            .await
    }
}

#[async_trait]
impl dbwarden_core::adopt::OtherTools for PgLeaseLock {
    async fn other_tools(&self) -> Result<Vec<dbwarden_core::adopt::ForeignHistory>, Error> {
        let schema = &self.pg.tables.schema;
        self.on_conn("reading other tools' history", async |conn| {
            // One transaction per tool: a table of that name that is not the tool's fails
            // its read, which must not abort the reads of the others.
            let mut all = Vec::new();
            for tool in dbwarden_core::adopt::Tool::ALL {
                tables::begin_bounded(conn, self.ms())
                    .await
                    .map_err(db_err)?;
                let r = crate::other_tools::read_tools(conn, schema, &[tool]).await;
                all.extend(tables::finish_tx(conn, r).await?);
            }
            Ok(all)
        })
        .await
    }
}

#[async_trait]
impl MigrationLock for PgLeaseLock {
    fn identity(&self) -> dbwarden_core::Identity<'_> {
        dbwarden_core::Identity {
            engine: "postgres",
            grade: Grade::C,
            namespace: &self.pg.namespace,
            reach: self.pg.reach(),
        }
    }

    async fn try_acquire(&self, holder: &HolderInfo) -> Result<Attempt, Error> {
        let mut conn = self.conn().await?;
        let mut taken = self
            .target()
            .bounded("taking the lease", self.take(&mut conn, holder))
            .await;
        if let Err(e) = &taken
            && e.is_unreachable()
        {
            // A kept connection may have been cut while we waited: one fresh try.
            tracing::debug!("taking the lease failed ({e}); reconnecting once");
            drop(conn);
            conn = self.conn().await?;
            taken = self
                .target()
                .bounded("taking the lease", self.take(&mut conn, holder))
                .await;
        }
        let taken = match taken {
            // The status row stayed locked past lock_timeout: a holder is inside one of its
            // fenced writes (paused there, or slow). Busy: wait for it, as for any holder.
            Err(e) if tables::row_locked(&e) => Ok(Err(tables::row_locked_busy())),
            other => other,
        };
        match taken? {
            Err(busy) => {
                self.keep(conn).await;
                Ok(Attempt::Busy(busy))
            }
            Ok((token, previous, why)) => {
                let ttl_ms = holder.lock_ttl().unwrap_or(DEFAULT_TTL).as_millis() as u64;
                let beat = Arc::new(LeaseBeat {
                    target: self.target().clone(),
                    conn: Default::default(),
                    lock_table: self.pg.tables.lock.clone(),
                    namespace: self.ns().to_owned(),
                    token,
                    ttl_ms,
                });
                let held = LeaseHeld {
                    store: Some(PgStore {
                        conn,
                        tables: self.pg.tables.clone(),
                        namespace: self.ns().to_owned(),
                        pid: 0,
                        ms: self.ms(),
                        touched: false,
                        sqlx: Default::default(),
                        pooled: true,
                        tx_bounds: String::new(),
                        bounds_set: None,
                        tx: None,
                    }),
                    beat: beat.clone(),
                    keep: self.kept.clone(),
                };
                let grant = Grant::new(token, previous, beat, held).broke(why, None);
                Ok(Attempt::Acquired(grant))
            }
        }
    }

    async fn stop_waiting(&self) {
        if let Some(conn) = self.kept.take().await {
            let _ = tokio::time::timeout(self.target().statement_timeout, conn.close()).await;
        }
    }

    fn snapshot(&self) -> Option<&dyn SnapshotRead> {
        Some(self)
    }

    async fn observe(&self) -> Result<Observation, Error> {
        let view = self
            .on_conn("reading the lock", async |c| self.pg.read_view(c).await)
            .await?;
        Ok(view.observation(self.grade(), self.ns(), self.pg.key, &self.pg.tables.lock))
    }

    async fn sight(&self) -> Result<Sighting, Error> {
        let mut conn = self.conn().await?;
        let r = self
            .target()
            .bounded("reading the lock", self.sight_on(&mut conn))
            .await;
        let _ = conn.close().await;
        r
    }

    async fn break_lock(
        &self,
        seen: &Sighting,
        _expected: Option<uuid::Uuid>,
        record: AuditRecord,
    ) -> Result<Broke, Error> {
        let mut conn = self.conn().await?;
        let r = self
            .target()
            .bounded("unlocking", self.break_on(&mut conn, seen, record))
            .await;
        let _ = conn.close().await;
        r
    }

    async fn audit(&self, record: &AuditRecord) -> Result<(), Error> {
        let t = &self.pg.tables;
        self.on_conn("writing an audit row", async |conn| {
            tables::ensure_tables(conn, t, self.ms()).await?;
            tables::insert_audit(conn, t, record).await
        })
        .await
    }

    async fn read_history(&self) -> Result<Vec<HistoryRow>, Error> {
        Ok(self.read_snapshot().await?.history)
    }

    async fn invalid_indexes(&self) -> Result<Vec<dbwarden_core::InvalidIndex>, Error> {
        self.pg.invalid_indexes().await
    }

    fn other_tools(&self) -> Option<&dyn dbwarden_core::adopt::OtherTools> {
        Some(self)
    }

    fn dialect(&self) -> Option<dbwarden_core::migration::Dialect> {
        Some(dbwarden_core::migration::Dialect::Postgres)
    }

    fn max_poll_interval(&self) -> Duration {
        POLL
    }
}
