//! dbwarden-clickhouse: the ClickHouse engine. The lock is a table created with atomic DDL and
//! kept alive as a lease by appended heartbeat rows (grade C, see [`lock`]); the status, history,
//! fence and audit tables are append-only and read with `argMax` (see [`store`]).
//!
//! URLs: `clickhouse://[user[:password]@]host[:8123][/database]` or
//! `http://host:8123/?database=<db>` (see [`url`]). Migrations that must run on every node of
//! a cluster put `{on_cluster}` where ClickHouse expects `ON CLUSTER <name>`; it is replaced with
//! ` ON CLUSTER `<cluster>`` when `cluster` is configured and with nothing otherwise:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS events {on_cluster} (id UInt64) ENGINE = MergeTree ORDER BY id;
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), dbwarden_core::Error> {
//! use dbwarden_core::{HolderInfo, HeartbeatConfig, MigrationLock, Wait, config::Settings, wait::acquire};
//! let settings = Settings { database_url: "clickhouse://127.0.0.1:8123/app".into(), ..Settings::default() };
//! let lock = dbwarden_clickhouse::from_settings(&settings)?;
//! let hb = settings.heartbeat(lock.default_ttl())?;
//! let lease = acquire(lock.as_ref(), &HolderInfo::current(None, "demo"), Wait::No, hb).await?;
//! lease.release().await
//! # }
//! ```
#![forbid(unsafe_code)]

mod cluster;
mod held;
pub mod lock;
pub mod names;
pub mod server;
pub mod store;
pub mod tables;
pub mod url;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dbwarden_core::config::Settings;
use dbwarden_core::error::BusyInfo;
use dbwarden_core::migration::Dialect;
use dbwarden_core::unlock::{Broke, Sighting};
use dbwarden_core::{
    Attempt, AuditRecord, BrokenLock, Error, FencingToken, Grade, Grant, HistoryRow, HolderInfo,
    LockState, MigrationLock, Namespace, Observation, WakeUp,
};
use tokio::time::Instant;
use uuid::Uuid;

use crate::held::{ChHeld, OurTable};
use crate::lock::{LockTable, LockView, TableHeartbeat, judge, ts};
use crate::server::{Server, code};
use crate::store::ClickHouseStore;
use crate::tables::StatusWrite;
use dbwarden_core::release::ReleaseOnce;
use dbwarden_core::takeover::{Decision, Freed, Refusal};

/// The lease TTL when none is configured (docs/design.md §7).
pub const DEFAULT_TTL: Duration = Duration::from_secs(120);

/// This engine in the registry (`dbwarden_core::registry`): its name, URL schemes and factory.
pub static ENGINE: dbwarden_core::registry::Engine = dbwarden_core::registry::Engine {
    name: "clickhouse",
    schemes: &["clickhouse", "http", "https"],
    open: from_settings,
    lease_lock: false,
};

/// The lock for `settings.database_url` and `settings.namespace`. Validates everything it can
/// without connecting; connections are made when the lock is first used.
pub fn from_settings(settings: &Settings) -> Result<Box<dyn MigrationLock>, Error> {
    let endpoint = url::parse(&settings.database_url)?;
    dbwarden_core::config::validate_identifier("history_table", &settings.history_table)?;
    if let Some(c) = &settings.cluster {
        dbwarden_core::config::validate_identifier("cluster", c)?;
    }
    let server = Server::new(
        &endpoint,
        settings.cluster.clone(),
        settings.connect_timeout,
        settings.statement_timeout,
    );
    Ok(Box::new(ClickHouseLock::new(
        server,
        settings.namespace.clone(),
        settings.history_table.clone(),
        settings.lock_ttl.unwrap_or(DEFAULT_TTL),
    )))
}

/// A lock (and the migration tables) for one namespace of one ClickHouse database.
pub struct ClickHouseLock {
    table: LockTable,
    namespace: Namespace,
    history_table: String,
    ttl: Duration,
    tables_ready: AtomicBool,
    /// The last attempt found the lock held (the next one looks before it creates).
    polling: AtomicBool,
    /// When the lease seen by the last busy attempt runs out (wakes a waiter right then).
    expiry_hint: Mutex<Option<Instant>>,
}

impl ClickHouseLock {
    /// `history_table` must be a validated identifier; `ttl` is the lease this holder promises.
    pub fn new(server: Server, namespace: Namespace, history_table: String, ttl: Duration) -> Self {
        let name = names::lock_table_name(&namespace);
        ClickHouseLock {
            table: LockTable { server, name },
            namespace,
            history_table,
            ttl,
            tables_ready: AtomicBool::new(false),
            polling: AtomicBool::new(false),
            expiry_hint: Mutex::new(None),
        }
    }

    fn server(&self) -> &Server {
        &self.table.server
    }

    async fn ensure_tables(&self) -> Result<(), Error> {
        if !self.tables_ready.load(Ordering::Relaxed) {
            tables::ensure_tables(self.server(), &self.history_table).await?;
            self.tables_ready.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn busy(&self, view: Option<&LockView>, note: Option<String>) -> Attempt {
        let holder = view.and_then(|v| v.holder.as_ref());
        Attempt::Busy(BusyInfo {
            holder: holder.map(|h| h.holder_info()),
            fencing_token: holder.map(|h| h.fencing_token).filter(|t| *t > 0),
            age: holder.map(|h| Duration::from_secs(u64::from(h.now.saturating_sub(h.started_at)))),
            note,
            server_full: false,
        })
    }

    /// The lock table is ours: write the fence, the status row, the first heartbeat.
    async fn claim(&self, holder: &HolderInfo) -> Result<Grant, Error> {
        let s = self.server();
        self.ensure_tables().await?;
        let ns = self.namespace.as_str();
        let previous = tables::read_status(s, ns).await?;
        let (token, now) = tables::bump_fence(s, ns, &holder.execution_id.to_string())
            .await
            .map_err(|e| s.error(e))?;
        let seq = Arc::new(AtomicU64::new(1));
        let st = ClickHouseStore {
            lock: self.table.clone(),
            namespace: ns.to_owned(),
            history_table: self.history_table.clone(),
            holder: holder.clone(),
            token: FencingToken(token),
            seq: seq.clone(),
            acquired_at: now,
            ttl_s: self.ttl.as_secs().max(1),
            started: Default::default(),
            now: 0,
        };
        // No fence re-check for this first row: the token was handed out a moment ago, and a
        // row with a token that an unlock has since passed loses to the unlock's row anyway.
        st.first_status().await?;
        let beat = TableHeartbeat {
            table: self.table.clone(),
            execution_id: holder.execution_id,
            token,
            seq,
        };
        let held = ChHeld {
            store: Some(st),
            table: ReleaseOnce::new(OurTable {
                table: self.table.clone(),
                execution_id: holder.execution_id,
            }),
        };
        Ok(Grant::new(FencingToken(token), previous, beat, held))
    }

    /// Break a stale lock (see [`LockTable::break_stale`]). `Some`: broken (whose, and why),
    /// try to create a fresh lock; core logs and audits the takeover once this holder has it.
    async fn break_stale(
        &self,
        me: &HolderInfo,
        seen: &LockView,
        age: Duration,
    ) -> Result<Option<BrokenLock>, Error> {
        let s = self.server();
        let broken = self
            .table
            .break_stale(seen, self.ttl, me.execution_id)
            .await
            .map_err(|e| s.error(e))?;
        Ok(broken.then(|| BrokenLock {
            why: Freed::LeaseExpired {
                silent: age,
                ttl: None,
                state: None,
            },
            holder: seen.holder.as_ref().map(|h| h.holder_info()),
        }))
    }

    /// One attempt (see [`MigrationLock::try_acquire`]); a stale lock it broke on the way in
    /// `broke`.
    async fn attempt(
        &self,
        holder: &HolderInfo,
        broke: &mut Option<BrokenLock>,
    ) -> Result<Attempt, Error> {
        let s = self.server();
        s.ready().await?;
        // A waiter that saw the lock held asks whether it still exists before trying to create
        // it: a failed CREATE costs the server an exception (and a stack trace in its log).
        let mut look_first = self.polling.swap(false, Ordering::Relaxed);
        for _ in 0..3 {
            let exists = look_first && self.table.exists().await.unwrap_or(true);
            look_first = false;
            // Ok(false): the table is there, as a failed CREATE would have said.
            let created = match exists {
                true => Ok(false),
                false => self.table.create(holder, self.ttl).await.map(|()| true),
            };
            match created {
                Ok(true) => {
                    return match self.claim(holder).await {
                        Ok(grant) => Ok(Attempt::Acquired(grant)),
                        Err(e) => {
                            let _ = self.table.drop_if_ours(holder.execution_id).await;
                            Err(e)
                        }
                    };
                }
                Ok(false) => {}
                Err(e) if e.is(code::TABLE_ALREADY_EXISTS) => {}
                Err(e) => {
                    if e.is(code::DDL_TIMEOUT) {
                        // A host did not run our CREATE in time: it ran where it could and stays
                        // queued for that host. Take it back through the same queue (it runs
                        // after the CREATE on every host), so a claim that failed does not hold
                        // the lock for a ttl once the slow host catches up.
                        let _ = self.table.drop_if_ours(holder.execution_id).await;
                    }
                    return Err(s.error(e));
                }
            }
            // Held (or being dropped/renamed right now): look at the holder.
            let view = match self.table.view().await {
                Ok(Some(v)) => v,
                Ok(None) => continue, // released meanwhile: try again
                Err(e) => {
                    tracing::debug!("could not read the lock table: {e}");
                    return Ok(self.busy(None, None));
                }
            };
            match judge(&view, self.ttl) {
                Decision::Wait { retry_in, .. } => {
                    if let Ok(mut hint) = self.expiry_hint.lock() {
                        *hint = Some(Instant::now() + retry_in);
                    }
                    self.polling.store(true, Ordering::Relaxed);
                    return Ok(self.busy(Some(&view), None));
                }
                Decision::Refuse(Refusal::Skew { what, ahead }) => {
                    // A usage error (exit 2): waiting or retrying cannot help until a human
                    // fixes a clock, nothing was touched, and the lock is left alone.
                    return Err(Error::usage(format!(
                        "clock skew: the lock {} has {what} {} in the future of the server clock; it is never broken automatically: fix the clocks, check the holder, then run `dbwarden unlock`",
                        self.table.qualified(),
                        dbwarden_core::duration::human(ahead)
                    )));
                }
                Decision::Break { age } if broke.is_none() => {
                    *broke = self.break_stale(holder, &view, age).await?;
                    if broke.is_none() {
                        return Ok(self.busy(Some(&view), None));
                    }
                }
                // Broken once already this attempt, or a refusal a lease cannot get (nothing
                // is known of its holder's process): busy.
                Decision::Break { .. } | Decision::Refuse(_) => {
                    return Ok(self.busy(Some(&view), None));
                }
            }
        }
        Ok(self.busy(None, None))
    }

    /// Observation without the status row (for `observe` and `force_unlock`).
    async fn lock_view(&self) -> Result<Option<LockView>, Error> {
        self.table.view().await.map_err(|e| self.server().error(e))
    }
}

#[async_trait]
impl WakeUp for ClickHouseLock {
    async fn wait_for_release(&self, max: Duration) {
        let hint = self.expiry_hint.lock().ok().and_then(|mut h| h.take());
        let until = match hint {
            Some(at) if at > Instant::now() => (at - Instant::now()).min(max),
            _ => max,
        };
        tokio::time::sleep(until).await;
    }
}

#[async_trait]
impl MigrationLock for ClickHouseLock {
    fn identity(&self) -> dbwarden_core::Identity<'_> {
        dbwarden_core::Identity {
            engine: "clickhouse",
            grade: Grade::C,
            namespace: &self.namespace,
            reach: Some(dbwarden_core::Reach {
                target: self.table.server.target.clone(),
                connect_timeout: self.table.server.connect_timeout,
            }),
        }
    }

    fn wake_up(&self) -> Option<&dyn WakeUp> {
        Some(self)
    }

    async fn try_acquire(&self, holder: &HolderInfo) -> Result<Attempt, Error> {
        // The stale lock this attempt broke, if it did: core audits it whether this attempt
        // then takes the fresh lock or another runner does. (An error after a break loses
        // that row; the tombstone table still names the broken lock.)
        let mut broke: Option<BrokenLock> = None;
        Ok(match self.attempt(holder, &mut broke).await? {
            Attempt::Acquired(mut grant) => {
                grant.broken = broke.map(Box::new);
                Attempt::Acquired(grant)
            }
            Attempt::Busy(info) => match broke {
                Some(b) => Attempt::BrokeThenBusy(Box::new(b), info),
                None => Attempt::Busy(info),
            },
            other => other,
        })
    }

    async fn observe(&self) -> Result<Observation, Error> {
        let s = self.server();
        s.ready().await?;
        let view = self.lock_view().await?;
        let status = tables::read_status(s, self.namespace.as_str()).await?;
        let fence = tables::max_token(s, self.namespace.as_str())
            .await
            .ok()
            .map(|(t, _)| t);
        let mut notes = Vec::new();
        let now = match &view {
            Some(v) => v.now,
            None => server_now(s).await?,
        };
        let holder_rows = view.as_ref().and_then(|v| v.holder.as_ref());
        let ttl_of = |h: &lock::ExecutionRows| h.ttl(self.ttl);
        let held = match (&view, holder_rows) {
            (Some(v), _) => match judge(v, self.ttl) {
                Decision::Break { age } => {
                    notes.push(format!(
                        "the lock table {} is still there but its lease ran out {} ago; the next acquirer breaks it",
                        self.table.qualified(),
                        dbwarden_core::duration::human(age.saturating_sub(
                            holder_rows.map_or(self.ttl, ttl_of)
                        ))
                    ));
                    false
                }
                Decision::Refuse(Refusal::Skew { what, ahead }) => {
                    notes.push(format!(
                        "clock skew: {what} is {} ahead of the server clock; never broken automatically",
                        dbwarden_core::duration::human(ahead)
                    ));
                    true
                }
                Decision::Wait { .. } | Decision::Refuse(_) => true,
            },
            (None, _) => false,
        };
        if view.as_ref().is_some_and(|v| v.holder.is_none()) {
            notes.push("the lock table exists without a holder row (an acquire in progress, or a creator that died)".into());
        }
        let tombstones = self.table.tombstones().await.map_err(|e| s.error(e))?;
        if !tombstones.is_empty() {
            let names: Vec<&str> = tombstones.iter().map(|(n, _)| n.as_str()).collect();
            notes.push(format!(
                "broken stale locks kept as tombstones: {} (dropped automatically after {})",
                names.join(", "),
                dbwarden_core::duration::human(lock::TOMBSTONE_AGE)
            ));
        }
        let last = holder_rows.map(|h| ts(h.last_at));
        Ok(Observation {
            held,
            holder: holder_rows.filter(|_| held).map(|h| h.holder_info()),
            fencing_token: fence
                .filter(|t| *t > 0)
                .or(status.as_ref().map(|s| s.fencing_token)),
            last_heartbeat_at: last,
            expires_at: holder_rows
                .map(|h| ts(h.last_at) + chrono::Duration::seconds(ttl_of(h).as_secs() as i64)),
            session_id: view
                .as_ref()
                .map(|_| format!("lock table {}", self.table.qualified())),
            status,
            notes,
            ..Observation::new(
                self.engine(),
                self.grade(),
                self.namespace.as_str(),
                ts(now),
            )
        })
    }

    async fn sight(&self) -> Result<Sighting, Error> {
        let s = self.server();
        s.ready().await?;
        let view = self.lock_view().await?;
        let status = tables::read_status(s, self.namespace.as_str()).await?;
        let holder = view
            .as_ref()
            .and_then(|v| v.holder.as_ref())
            .map(|h| h.holder_info());
        let active = status.as_ref().is_some_and(|st| st.state.is_active());
        Ok(Sighting {
            current: holder
                .as_ref()
                .map(|h| h.execution_id)
                .or(status.as_ref().and_then(|st| st.execution_id)),
            anything: view.is_some() || active,
            holder,
            session: view.map(|_| self.table.name.clone()),
            ..Sighting::default()
        })
    }

    /// Fence first, while the old lock table still keeps new holders out; then drop it (only
    /// the sighted holder's), then audit.
    async fn break_lock(
        &self,
        seen: &Sighting,
        _expected: Option<Uuid>,
        record: AuditRecord,
    ) -> Result<Broke, Error> {
        let s = self.server();
        // Another holder's table by now (the sighted one released, a new one took it): judged
        // anew, never fenced out on the strength of an old look.
        let now = self.lock_view().await?;
        let holder_now = now
            .as_ref()
            .and_then(|v| v.holder.as_ref())
            .map(|h| h.holder_info().execution_id);
        if now.is_some() != seen.session.is_some()
            || holder_now != seen.holder.as_ref().map(|h| h.execution_id)
        {
            return Ok(Broke::Changed);
        }
        self.ensure_tables().await?;
        let ns = self.namespace.as_str();
        let (token, _) = tables::bump_fence(s, ns, "dbwarden unlock")
            .await
            .map_err(|e| s.error(e))?;
        let me = HolderInfo::current(None, "dbwarden unlock");
        let session = self.table.qualified();
        let w = StatusWrite {
            namespace: ns,
            holder: &me,
            token,
            seq: 0,
            state: LockState::Available,
            migration: None,
            session: &session,
            acquired_at: 0,
            ttl_s: 0,
        };
        tables::append_status(s, &w).await.map_err(|e| s.error(e))?;
        if seen.session.is_some() {
            let drop = match seen.holder.as_ref() {
                Some(h) => self.table.drop_if_ours(h.execution_id).await.map(|_| ()),
                None => self.table.drop_table(&self.table.name).await,
            };
            drop.map_err(|e| s.error(e))?;
        }
        tables::insert_audit(s, &record).await?;
        Ok(Broke::Unlocked)
    }

    async fn audit(&self, record: &AuditRecord) -> Result<(), Error> {
        self.server().ready().await?;
        tables::insert_audit(self.server(), record).await
    }

    async fn read_history(&self) -> Result<Vec<HistoryRow>, Error> {
        self.server().ready().await?;
        tables::read_history(self.server(), &self.history_table).await
    }

    fn dialect(&self) -> Option<Dialect> {
        Some(Dialect::ClickHouse)
    }

    fn default_ttl(&self) -> Duration {
        DEFAULT_TTL
    }
}

async fn server_now(s: &Server) -> Result<u32, Error> {
    let r: Vec<u32> = s
        .fetch(s.query("SELECT toUInt32(now())"))
        .await
        .map_err(|e| s.error(e))?;
    Ok(r.first().copied().unwrap_or(0))
}
