//! The lock on a Galera cluster (MariaDB with `wsrep_on`, Percona XtraDB Cluster): a lease in
//! the status row, decided by the cluster's certification.
//!
//! `GET_LOCK` holds on one node only (MDEV-31325): two runners on two nodes both get it. The
//! status row is replicated, and every claim writes it: a runner takes the lease in one
//! transaction that reads the row (with `wsrep_sync_wait`, so a lagging node answers with what
//! the cluster committed), lets core's takeover judge decide whether the last holder's lease
//! ran out by the server's clock, and bumps the fencing token. Two claims on two nodes at once
//! write the same primary key: certification commits one and refuses the other (1213), which
//! is then simply busy. The holder renews `expires_at` on every heartbeat and gives it back by
//! clearing it; a holder that dies is taken over after its ttl (grade C, as every lease).
//!
//! Every journal commit of the holder writes the status row while it carries the holder's token
//! (`MySqlStore::touch_lease`), so a holder fenced out by a takeover on another node cannot
//! commit after it: certification orders the two and refuses the later one. A statement that
//! commits on its own (DDL runs in total order isolation) follows such a proof committed alone.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dbwarden_core::error::BusyInfo;
use dbwarden_core::lock::DEFAULT_TTL;
use dbwarden_core::takeover::{self, Decision, Freed, Probe, judge};
use dbwarden_core::unlock::{Broke, Sighting};
use dbwarden_core::{
    Attempt, AuditRecord, Beat, Error, FencingToken, Grade, Grant, Heartbeat, HeldLock, HolderInfo,
    MigrationStore, Observation, StatusRow,
};
use dbwarden_sql::binds;
use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, Connection};

use crate::MySqlLock;
use crate::lock::{Endpoint, bounded};
use crate::status::holder_of;
use crate::store::MySqlStore;
use crate::tables::{self, db_err, refused};

/// The `db_connection_id` a lease holder records: no session holds anything for it.
const LEASE_SESSION: &str = "lease";

/// How often a waiter looks again: no named lock to block in, so releases are not heard.
pub(crate) const POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// A status row that records a lease not given back.
fn is_lease(row: &StatusRow) -> bool {
    row.state.is_active() && row.expires_at.is_some()
}

/// A status row whose run may still go on: active, and not a lease given back (a release
/// clears `expires_at` and leaves the state to the journal, which a run that never started
/// did not write). A named-lock holder's row (a run inside an outer lease) has no expiry and
/// is judged by its heartbeat.
fn live(row: &StatusRow) -> bool {
    row.state.is_active()
        && (row.expires_at.is_some() || row.db_connection_id.as_deref() != Some(LEASE_SESSION))
}

async fn server_now(conn: &mut MySqlConnection) -> Result<DateTime<Utc>, Error> {
    let now: chrono::NaiveDateTime = sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
        .fetch_one(&mut *conn)
        .await
        .map_err(db_err)?;
    Ok(now.and_utc())
}

/// The three tables, created only when one is missing (a `CREATE TABLE` on Galera is a DDL in
/// total order on every node, too costly for every attempt). Whether the status table has the
/// holder-settings columns.
async fn ensure_tables(lock: &MySqlLock, conn: &mut MySqlConnection) -> Result<bool, Error> {
    let n: i64 = sqlx::query_scalar(
        "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ('dbwarden_lock', 'dbwarden_lock_audit', ?)",
    )
    .bind(&lock.history_table)
    .fetch_one(&mut *conn)
    .await
    .map_err(db_err)?;
    if n < 3 {
        return tables::create_tables(conn, &lock.history_table, &lock.status_upgraded).await;
    }
    // Even a `CREATE TABLE IF NOT EXISTS` of a table that exists runs in total order and
    // aborts every transaction on any node that holds the table (the holder's journal): only
    // a table that lacks the holder-settings columns gets its one `ALTER`.
    if lock
        .status_upgraded
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        return Ok(true);
    }
    let has = tables::upgrade_status_table(conn).await?;
    lock.status_upgraded
        .store(has, std::sync::atomic::Ordering::Relaxed);
    Ok(has)
}

/// One claim: `Ok(Err(busy))` while a live lease holds the namespace.
async fn take(
    lock: &MySqlLock,
    conn: &mut MySqlConnection,
    holder: &HolderInfo,
) -> Result<Result<(FencingToken, Option<StatusRow>, Option<Freed>), BusyInfo>, Error> {
    let ns = lock.namespace.as_str();
    let settings = ensure_tables(lock, conn).await?;
    // The row is made once, only when missing: on Galera even an `INSERT IGNORE` that finds
    // the row certifies as a write to it, and would refuse the holder's own writes.
    let present: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM dbwarden_lock WHERE namespace = ?")
            .bind(ns)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db_err)?;
    if present.is_none() {
        sqlx::query(
            "INSERT IGNORE INTO dbwarden_lock (namespace, fencing_token, state) VALUES (?, 0, 'AVAILABLE')",
        )
        .bind(ns)
        .execute(&mut *conn)
        .await
        .map_err(db_err)?;
    }
    dbwarden_sql::transaction(conn, "START TRANSACTION", db_err, db_err, async |conn| {
        let previous = tables::read_status(conn, ns, true).await?;
        let now = server_now(conn).await?;
        let mut broken = None;
        if let Some(p) = previous.as_ref().filter(|p| live(p)) {
            // A row without a lease was a named-lock holder's (a run inside an outer lease):
            // judged by its heartbeat too, which that holder also writes.
            let probe = Probe::lease_row(p, now, DEFAULT_TTL);
            match judge(&probe) {
                Decision::Break { age } => {
                    broken = Some(Freed::LeaseExpired {
                        silent: age,
                        ttl: Some(takeover::lease_ttl(p, DEFAULT_TTL)),
                        state: Some(p.state),
                    });
                }
                other => {
                    let note = match other {
                        Decision::Refuse(r) => format!(
                            "holds the lease in dbwarden_lock (Galera), which is never broken automatically ({r:?})"
                        ),
                        _ => "holds the lease in dbwarden_lock (Galera)".to_owned(),
                    };
                    return Ok(Err(busy(p, now, Some(note))));
                }
            }
        }
        let ttl_ms = holder.lock_ttl().unwrap_or(DEFAULT_TTL).as_millis() as i64;
        let set = if settings {
            ", lock_ttl_ms = ?, heartbeat_interval_ms = ?"
        } else {
            ""
        };
        let mut q = sqlx::query(AssertSqlSafe(format!(
            "UPDATE dbwarden_lock SET execution_id = ?, owner_id = ?, fencing_token = fencing_token + 1,
               host = ?, pid = ?, db_connection_id = '{LEASE_SESSION}', state = 'RUNNING',
               acquired_at = UTC_TIMESTAMP(6), last_heartbeat_at = UTC_TIMESTAMP(6),
               expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
               migration_version = NULL, migration_checksum = NULL{set}
             WHERE namespace = ?"
        )))
        .bind(holder.execution_id.to_string())
        .bind(&holder.owner)
        .bind(&holder.host)
        .bind(i64::from(holder.pid))
        .bind(ttl_ms * 1000);
        if settings {
            q = q
                .bind(holder.lock_ttl_ms.map(|ms| ms as i64))
                .bind(holder.heartbeat_interval_ms.map(|ms| ms as i64));
        }
        q.bind(ns).execute(&mut *conn).await.map_err(db_err)?;
        let token = binds::stored_token(conn, ns, "", db_err).await?;
        let token = token.ok_or_else(|| Error::database("the status row vanished"))?;
        Ok(Ok((FencingToken(token as u64), previous, broken)))
    })
    .await
}

/// What a waiter reports of a live lease.
fn busy(row: &StatusRow, now: DateTime<Utc>, note: Option<String>) -> BusyInfo {
    BusyInfo {
        holder: holder_of(row),
        fencing_token: Some(row.fencing_token),
        age: row.acquired_at.and_then(|t| (now - t).to_std().ok()),
        note,
        server_full: false,
    }
}

/// One attempt at the lease.
pub(crate) async fn try_acquire(lock: &MySqlLock, holder: &HolderInfo) -> Result<Attempt, Error> {
    let limit = lock.endpoint.statement_timeout;
    let mut conn = lock.endpoint.connect().await?;
    let taken = bounded(limit, "taking the lease", async {
        // Read before the claim: once it commits, nothing may fail before the grant.
        let id = crate::lock::connection_id(&mut conn)
            .await
            .map_err(db_err)?;
        let taken = match take(lock, &mut conn, holder).await {
            Err(e) if refused(&e) => Err(BusyInfo {
                note: Some(
                    "another node's runner claimed the lease at the same moment (certification chose it)"
                        .into(),
                ),
                ..BusyInfo::default()
            }),
            other => other?,
        };
        Ok((taken, id))
    })
    .await;
    let (taken, id) = taken?;
    let (token, previous, why) = match taken {
        Err(busy) => {
            let _ = conn.close().await;
            return Ok(Attempt::Busy(busy));
        }
        Ok(claimed) => claimed,
    };
    let ttl_ms = holder.lock_ttl().unwrap_or(DEFAULT_TTL).as_millis() as u64;
    let beat = Arc::new(LeaseBeat {
        endpoint: lock.endpoint.clone(),
        namespace: lock.namespace.as_str().to_owned(),
        token,
        ttl_ms,
        conn: Default::default(),
    });
    let store = MySqlStore::new(conn, id, lock, Some(token));
    let held = LeaseHeld {
        store: Some(store),
        beat: beat.clone(),
    };
    let grant = Grant::new(token, previous, beat, held).broke(why, None);
    Ok(Attempt::Acquired(grant))
}

/// Renews the lease while the token is ours, on a connection of its own.
struct LeaseBeat {
    endpoint: Endpoint,
    namespace: String,
    token: FencingToken,
    ttl_ms: u64,
    conn: dbwarden_core::kept::Kept<MySqlConnection>,
}

#[async_trait]
impl Heartbeat for LeaseBeat {
    async fn beat(&self) -> Result<Beat, Error> {
        let mut conn = self.conn.checkout(self.endpoint.connect()).await?;
        let n = sqlx::query(
            "UPDATE dbwarden_lock SET last_heartbeat_at = GREATEST(UTC_TIMESTAMP(6), last_heartbeat_at + INTERVAL 1 MICROSECOND), \
               expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
             WHERE namespace = ? AND fencing_token = ? AND expires_at IS NOT NULL",
        )
        .bind((self.ttl_ms * 1000) as i64)
        .bind(&self.namespace)
        .bind(self.token.0 as i64)
        .execute(&mut *conn)
        .await
        .map_err(db_err)?
        .rows_affected();
        if n == 1 {
            conn.keep();
            return Ok(Beat::Alive);
        }
        let now = binds::stored_token(&mut *conn, &self.namespace, "", db_err).await?;
        conn.keep();
        Ok(Beat::Gone(match self.token.check(now) {
            Err(e) => e.to_string(),
            Ok(()) => "the lease was given back (unlock?) while this run held it".to_owned(),
        }))
    }
}

impl LeaseBeat {
    async fn close(&self) {
        if let Some(c) = self.conn.take().await {
            let _ = c.close().await;
        }
    }
}

/// A held lease: the store's session runs the migrations; the heartbeat renews the lease.
struct LeaseHeld {
    store: Option<MySqlStore>,
    beat: Arc<LeaseBeat>,
}

#[async_trait]
impl HeldLock for LeaseHeld {
    fn store(&mut self) -> Option<&mut (dyn MigrationStore + 'static)> {
        self.store.as_mut().map(|s| s as _)
    }

    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        self.beat.close().await;
        match self.store.take() {
            Some(store) => {
                let (r, _) = store.release().await;
                if let Err(e) = &r {
                    tracing::warn!(
                        "release: {e}; the lease stays until it expires (ttl {} ms)",
                        self.beat.ttl_ms
                    );
                }
                r
            }
            None => Ok(()),
        }
    }
}

impl Drop for LeaseHeld {
    fn drop(&mut self) {
        // Dropped without a release (a panic, a cancelled task): give the lease back when a
        // runtime is there to do it; otherwise it expires after its ttl.
        if let (Some(store), Ok(rt)) = (self.store.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(async move {
                let _ = store.release().await;
            });
        }
    }
}

/// The status row and the server's clock, on a fresh session; `None` without a status table.
async fn read_row(lock: &MySqlLock) -> Result<(Option<StatusRow>, DateTime<Utc>), Error> {
    let ns = lock.namespace.as_str();
    lock.endpoint
        .once("reading the lease", async |c| {
            let now = server_now(c).await?;
            if !binds::table_exists(c, "dbwarden_lock", db_err).await? {
                return Ok((None, now));
            }
            Ok((tables::read_status(c, ns, false).await?, now))
        })
        .await
}

/// `lock-status` on the lease: held while the row records a lease not given back; core judges
/// how alive it is by its heartbeat and ttl.
pub(crate) async fn observe(lock: &MySqlLock) -> Result<Observation, Error> {
    let (row, now) = read_row(lock).await?;
    // Held by a live lease, or by a named-lock holder's row (a run inside an outer lease).
    let lease = row.as_ref().filter(|r| live(r));
    let mut notes = Vec::new();
    if lease.is_some() {
        notes.push(
            "Galera node (wsrep_on): the lock is the lease in dbwarden_lock, certified across the cluster; only its ttl frees it if the holder dies"
                .to_owned(),
        );
    }
    Ok(Observation {
        held: lease.is_some(),
        holder: lease.and_then(holder_of),
        fencing_token: row.as_ref().map(|r| r.fencing_token),
        last_heartbeat_at: row.as_ref().and_then(|r| r.last_heartbeat_at),
        expires_at: lease.and_then(|r| r.expires_at),
        session_id: lease.map(|r| match is_lease(r) {
            true => "lease in dbwarden_lock (Galera)".to_owned(),
            false => format!(
                "connection {} (GET_LOCK inside an outer lease)",
                r.db_connection_id.as_deref().unwrap_or("?")
            ),
        }),
        status: row,
        notes,
        ..Observation::new("mysql", Grade::C, lock.namespace.as_str(), now)
    })
}

/// Who holds the lease, for `dbwarden unlock`.
pub(crate) async fn sight(lock: &MySqlLock) -> Result<Sighting, Error> {
    let (row, _) = read_row(lock).await?;
    let active = row.as_ref().filter(|s| live(s));
    Ok(Sighting {
        current: active.and_then(|s| s.execution_id),
        anything: active.is_some(),
        holder: active.and_then(holder_of),
        token: row.as_ref().map(|s| s.fencing_token),
        ..Sighting::default()
    })
}

/// `dbwarden unlock` on the lease: in one transaction, fence the holder out (token bump, row
/// AVAILABLE, lease cleared) and audit it. A row claimed since the sighting, or a commit
/// refused by certification, is [`Broke::Changed`].
pub(crate) async fn break_lock(
    lock: &MySqlLock,
    seen: &Sighting,
    record: AuditRecord,
) -> Result<Broke, Error> {
    let ns = lock.namespace.as_str();
    let mut conn = lock.endpoint.connect().await?;
    let r = bounded(lock.endpoint.statement_timeout, "unlocking", async {
        let begin = "START TRANSACTION";
        let r = dbwarden_sql::transaction(&mut conn, begin, db_err, db_err, async |c| {
            let row = tables::read_status(c, ns, true).await?;
            let active = row.as_ref().filter(|s| live(s));
            if row.as_ref().map(|s| s.fencing_token) != seen.token
                || active.and_then(|s| s.execution_id) != seen.current
            {
                return Ok(Broke::Changed);
            }
            sqlx::query(
                "UPDATE dbwarden_lock SET fencing_token = fencing_token + 1, state = 'AVAILABLE', expires_at = NULL WHERE namespace = ?",
            )
            .bind(ns)
            .execute(&mut *c)
            .await
            .map_err(db_err)?;
            binds::insert_audit(c, &record, db_err).await?;
            Ok(Broke::Unlocked)
        })
        .await;
        match r {
            Err(e) if refused(&e) => Ok(Broke::Changed),
            other => other,
        }
    })
    .await;
    let _ = conn.close().await;
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use dbwarden_core::LockState;

    fn row(state: LockState, expires: bool) -> StatusRow {
        let now = Utc::now();
        StatusRow {
            namespace: "default".into(),
            execution_id: Some(uuid::Uuid::nil()),
            owner_id: None,
            migration_version: None,
            migration_checksum: None,
            fencing_token: 3,
            host: Some("h".into()),
            pid: Some(1),
            db_connection_id: Some(LEASE_SESSION.into()),
            state,
            acquired_at: Some(now),
            last_heartbeat_at: Some(now),
            expires_at: expires.then_some(now),
            lock_ttl_ms: None,
            heartbeat_interval_ms: None,
        }
    }

    #[test]
    fn a_lease_is_an_active_row_with_an_expiry() {
        assert!(is_lease(&row(LockState::Running, true)));
        assert!(!is_lease(&row(LockState::Running, false)));
        assert!(!is_lease(&row(LockState::Available, true)));
    }

    #[test]
    fn a_lease_given_back_is_free_and_a_named_lock_holders_row_is_not() {
        assert!(live(&row(LockState::Running, true)));
        assert!(!live(&row(LockState::Running, false)), "given back");
        let mut named = row(LockState::Running, false);
        named.db_connection_id = Some("42".into());
        assert!(live(&named), "judged by its heartbeat");
        assert!(!live(&row(LockState::Complete, true)));
    }
}
