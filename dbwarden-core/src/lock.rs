//! The lock trait every engine implements. An engine takes its native primitive once per call;
//! waiting, heartbeats, lost-lock handling and verdicts are core policy built on top.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::{
    AuditRecord, Error, FencingToken, HolderInfo, MigrationStore, Namespace, StatusRow,
    error::BusyInfo,
};

/// How the lock is freed when its holder dies (docs/design.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Grade {
    /// The engine frees the lock when the holder's session dies.
    A,
    /// The operating system / file system frees it.
    B,
    /// Only a TTL frees it.
    C,
}

/// The staleness threshold (and lease ttl) of an engine that names no other
/// ([`MigrationLock::default_ttl`]).
pub const DEFAULT_TTL: Duration = Duration::from_secs(45);

/// The outcome of one attempt to take the primitive.
pub enum Attempt {
    Acquired(Grant),
    Busy(BusyInfo),
    /// Busy, after this attempt broke a stale lock that another runner then took first (a
    /// ClickHouse lock table re-created by someone else): core audits the break all the same.
    BrokeThenBusy(Box<BrokenLock>, BusyInfo),
}

/// What a take that succeeded reports: the facts of the acquisition, and the handles that keep
/// the primitive (its heartbeat, and the primitive itself with its store).
pub struct Grant {
    /// The token this holder's writes carry.
    pub token: FencingToken,
    /// The status row as it was found just before this acquire (for recovery).
    pub previous: Option<StatusRow>,
    /// Beats from beside the session that runs migrations, which may be busy in a statement.
    pub heartbeat: Box<dyn Heartbeat>,
    pub held: Box<dyn HeldLock>,
    /// The take replaced a holder whose lock had been freed or broken: why, and whose it was.
    /// Core logs it and writes the `broken_stale_lock` audit row.
    pub broken: Option<Box<BrokenLock>>,
}

/// A dead or stale holder's lock that an attempt broke or found freed and took
/// ([`Grant::broken`]), or broke and then lost to another runner ([`Attempt::BrokeThenBusy`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenLock {
    pub why: crate::takeover::Freed,
    /// The holder it replaced, where the engine read one; otherwise the audit names the
    /// holder from [`Grant::previous`].
    pub holder: Option<HolderInfo>,
}

impl BrokenLock {
    /// The `broken_stale_lock` audit row `me` owes for it, naming the holder it replaced (else
    /// the holder `previous` recorded).
    pub fn record(
        &self,
        namespace: &Namespace,
        me: &HolderInfo,
        previous: Option<&StatusRow>,
    ) -> AuditRecord {
        let record = crate::takeover::broken_stale_lock(namespace, me, &self.why);
        match (&self.holder, previous) {
            (Some(h), _) => record.about(Some(h)),
            (None, Some(row)) => record.about_row(row),
            (None, None) => record,
        }
    }
}

impl Grant {
    pub fn new(
        token: FencingToken,
        previous: Option<StatusRow>,
        heartbeat: impl Heartbeat + 'static,
        held: impl HeldLock + 'static,
    ) -> Self {
        Grant {
            token,
            previous,
            heartbeat: Box::new(heartbeat),
            held: Box::new(held),
            broken: None,
        }
    }

    /// This take replaced a holder (see [`Grant::broken`]); `why` `None`: it did not.
    pub fn broke(
        mut self,
        why: Option<crate::takeover::Freed>,
        holder: Option<HolderInfo>,
    ) -> Self {
        self.broken = why.map(|why| Box::new(BrokenLock { why, holder }));
        self
    }
}

/// What one heartbeat found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Beat {
    /// The primitive is still ours; liveness recorded.
    Alive,
    /// The primitive is gone or belongs to someone else.
    Gone(String),
}

/// Renews and verifies a held lock from beside the session that runs migrations.
#[async_trait]
pub trait Heartbeat: Send + Sync {
    /// Record liveness and check ownership. `Err` is a failed beat (e.g. the server did not
    /// answer), which the heartbeat policy tolerates up to `ttl - interval`.
    async fn beat(&self) -> Result<Beat, Error>;
}

/// A heartbeat shared between a held lock and the lease's loop that beats it.
#[async_trait]
impl<H: Heartbeat + ?Sized> Heartbeat for std::sync::Arc<H> {
    async fn beat(&self) -> Result<Beat, Error> {
        (**self).beat().await
    }
}

/// A held primitive, in the [`Grant`] of [`MigrationLock::try_acquire`]. It is wrapped in a
/// [`crate::Lease`] right away; dropping it must free the primitive on every path.
#[async_trait]
pub trait HeldLock: Send {
    /// The status and history tables on the locked session, when the engine has them.
    fn store(&mut self) -> Option<&mut (dyn MigrationStore + 'static)> {
        None
    }

    /// Free the primitive now and report failures (dropping frees it too, silently).
    async fn release(self: Box<Self>) -> Result<(), Error>;

    /// A shared holder's read of the status row and the history on its own locked session,
    /// without creating anything. `None`: read them through the lock object
    /// ([`MigrationLock::observe`], [`MigrationLock::read_history`]) instead.
    async fn read_applied(&mut self) -> Option<Result<Snapshot, Error>> {
        None
    }
}

/// The status row and the history rows as a look reads them (under the shared lock, or in one
/// consistent read).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub status: Option<StatusRow>,
    pub history: Vec<crate::HistoryRow>,
}

/// Everything `lock-status` needs to reach a verdict, read without taking the lock.
#[derive(Debug, Clone, Serialize)]
pub struct Observation {
    pub engine: &'static str,
    pub grade: Grade,
    pub namespace: String,
    /// The primitive is held right now.
    pub held: bool,
    /// The primitive is still held, but the engine knows the holder's process is gone (MySQL:
    /// its liveness session ended while the server still runs its lock session's statement).
    /// The verdict is DEAD: the next `migrate` takes over.
    pub holder_gone: bool,
    pub holder: Option<HolderInfo>,
    pub fencing_token: Option<u64>,
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    /// Server time when observed (ages are computed from the server clock).
    pub server_now: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    /// The server-side session that holds the primitive (backend pid, connection id, ...).
    pub session_id: Option<String>,
    pub status: Option<StatusRow>,
    /// Things the engine noticed that an operator should know (foreign host lock file, ...).
    pub notes: Vec<String>,
}

impl Observation {
    /// What an engine saw at `server_now` before it fills in its own facts: nothing held, no
    /// holder, no status row, no note.
    pub fn new(
        engine: &'static str,
        grade: Grade,
        namespace: &str,
        server_now: DateTime<Utc>,
    ) -> Self {
        Observation {
            engine,
            grade,
            namespace: namespace.to_owned(),
            held: false,
            holder_gone: false,
            holder: None,
            fencing_token: None,
            last_heartbeat_at: None,
            server_now,
            expires_at: None,
            session_id: None,
            status: None,
            notes: Vec::new(),
        }
    }

    /// A lock-only engine's lease, held: its `token`, the session handle `session`, when it was
    /// last renewed and when it runs out; with the holder's record (`holder` and when it took
    /// the lease) where it could be read, which also stands in for the status row
    /// ([`StatusRow::of_lease`]), else a note that the lease has none.
    pub fn held_lease(
        mut self,
        holder: Option<(HolderInfo, DateTime<Utc>)>,
        token: u64,
        session: String,
        renewed_at: Option<DateTime<Utc>>,
        expires_at: Option<DateTime<Utc>>,
    ) -> Self {
        self.held = true;
        self.fencing_token = Some(token);
        self.last_heartbeat_at = renewed_at;
        self.expires_at = expires_at;
        match holder {
            Some((h, taken)) => {
                let ns = &self.namespace;
                let row = StatusRow::of_lease(ns, &h, token, taken, renewed_at, expires_at);
                self.status = Some(row);
                self.holder = Some(h);
            }
            None => self.notes.push(format!(
                "{session} is held but has no holder record dbwarden can read (written by another tool?)"
            )),
        }
        self.session_id = Some(session);
        self
    }
}

impl Observation {
    /// What `unlock` sees here: the live holder, else the execution an active status row
    /// names; something to unlock when the primitive is held or the row is active; the
    /// holder's session as `observe` named it (while held); the row's token.
    pub fn sighting(self) -> Sighting {
        let token = self.status.as_ref().map(|s| s.fencing_token);
        let row = self.status.filter(|s| s.state.is_active());
        let current = self.holder.as_ref().map(|h| h.execution_id);
        Sighting {
            current: current.or(row.as_ref().and_then(|r| r.execution_id)),
            anything: self.held || row.is_some(),
            holder: self.holder,
            session: self.session_id.filter(|_| self.held),
            token,
            row,
        }
    }
}

/// What `unlock` saw of a lock, read without taking it ([`MigrationLock::sight`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sighting {
    /// The execution whose lock `unlock` would remove: the live holder's, else the one an
    /// active status row names. `None` for a holder that wrote no status row.
    pub current: Option<Uuid>,
    /// Whether there is anything to unlock: a held primitive, an active status row, a reader.
    pub anything: bool,
    /// The holder, as the audit row and the outcome name it.
    pub holder: Option<HolderInfo>,
    /// The active status row, which names the holder in the audit when `holder` cannot.
    pub row: Option<StatusRow>,
    /// The engine's handle on the holder's session as it saw it (a backend pid, a connection
    /// id, a lease id), which its [`MigrationLock::break_lock`] acts on and nothing newer.
    pub session: Option<String>,
    /// The fencing token the status row had.
    pub token: Option<u64>,
}

/// What [`MigrationLock::break_lock`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broke {
    /// The sighted holder's lock is removed, the holder fenced out, the audit row written.
    Unlocked,
    /// The lock changed hands since the sighting: nothing was changed or written.
    Changed,
}

/// What `unlock` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnlockOutcome {
    /// The holder's lock was removed (and the holder fenced out).
    Unlocked { holder: Option<HolderInfo> },
    /// Nothing held the lock and no status row was active.
    NothingToUnlock,
    /// `--holder` named someone else; nothing changed.
    HolderMismatch { actual: Option<Uuid> },
}

/// Shared mode (`dbwarden run --shared`): readers share, a writer excludes everyone. With it,
/// `migrate` first looks under the shared lock whether anything is pending, so replicas that
/// start together with nothing to do look at once instead of taking the exclusive lock one
/// after another. Reached through [`MigrationLock::shared`].
#[async_trait]
pub trait SharedLock: Send + Sync {
    /// Take the primitive once in shared mode. A shared holder does not bump the fencing token
    /// and has no store.
    async fn try_acquire_shared(&self, holder: &HolderInfo) -> Result<Attempt, Error>;

    /// Every current shared holder.
    async fn shared_holders(&self) -> Result<Vec<HolderInfo>, Error>;
}

/// The status row and the history in one consistent read, without any lock and without
/// creating anything (missing tables read as empty). Reached through
/// [`MigrationLock::snapshot`].
#[async_trait]
pub trait SnapshotRead: Send + Sync {
    async fn read_snapshot(&self) -> Result<Snapshot, Error>;
}

/// Hearing a release: a waiter wakes when the holder may have released, not at the end of its
/// pause. Reached through [`MigrationLock::wake_up`].
#[async_trait]
pub trait WakeUp: Send + Sync {
    /// Return once the holder may have released, at the latest after `max`.
    async fn wait_for_release(&self, max: Duration);
}

/// A waiter's pause between attempts on `lock`: at most `max`, ended early by the engine's
/// release signal where it has one.
pub async fn pause(lock: &dyn MigrationLock, max: Duration) {
    match lock.wake_up() {
        Some(w) => w.wait_for_release(max).await,
        None => tokio::time::sleep(max).await,
    }
}

/// An engine's lock for one namespace of one database.
///
/// ```no_run
/// # async fn demo(lock: &dyn dbwarden_core::MigrationLock) -> Result<(), dbwarden_core::Error> {
/// use std::time::Duration;
/// use dbwarden_core::{HolderInfo, HeartbeatConfig, Wait, wait::acquire};
/// let holder = HolderInfo::current(None, "demo");
/// let lease = acquire(lock, &holder, Wait::Up(Duration::from_secs(60)), HeartbeatConfig::default()).await?;
/// println!("holding with fencing token {}", lease.fencing_token());
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait MigrationLock: Send + Sync {
    /// What this lock is: its engine, grade, namespace and where it lives, in one place. The
    /// four accessors below read it.
    fn identity(&self) -> Identity<'_>;

    /// `sqlite`, `postgres`, ...
    fn engine(&self) -> &'static str {
        self.identity().engine
    }

    fn grade(&self) -> Grade {
        self.identity().grade
    }

    fn namespace(&self) -> &Namespace {
        self.identity().namespace
    }

    /// Take the primitive once, without waiting: bump the fencing token and write the status
    /// row on success, or describe the holder. A take that replaced a dead or stale holder says
    /// so ([`Grant::broken`], [`Attempt::BrokeThenBusy`]) and writes no audit row itself: core's
    /// [`crate::wait::acquire`] records it (a caller of this method alone owes that row). `Err(Error::Busy)` (a full server, a
    /// write-locked database) counts as a busy attempt for the wait policy.
    async fn try_acquire(&self, holder: &HolderInfo) -> Result<Attempt, Error>;

    /// The engine's release signal, where it has one (NOTIFY, pub/sub, a blocking `GET_LOCK`, a
    /// lease's known expiry). Without one, a waiter sleeps its whole pause: see [`pause`].
    fn wake_up(&self) -> Option<&dyn WakeUp> {
        None
    }

    /// The caller has stopped trying for now (it found nothing to do, gave up, or was
    /// interrupted): free what the lock kept between attempts -- a waiting session, and a lock
    /// that a blocking wait took but no attempt claimed. The default keeps nothing.
    async fn stop_waiting(&self) {}

    /// Shared mode, where the engine has a shared primitive (PostgreSQL, SQLite, Redis).
    fn shared(&self) -> Option<&dyn SharedLock> {
        None
    }

    /// A consistent read without any lock, where the engine has one and no shared mode
    /// (MySQL/MariaDB): `migrate` looks there first whether anything is pending.
    fn snapshot(&self) -> Option<&dyn SnapshotRead> {
        None
    }

    /// Read the primitive and the status row without taking the lock and without creating
    /// anything.
    async fn observe(&self) -> Result<Observation, Error>;

    /// Who holds the lock, for `dbwarden unlock`: read without taking it and without creating
    /// anything (`dbwarden_core::unlock`). By default what [`observe`](Self::observe) sees
    /// ([`Observation::sighting`]): then [`break_lock`](Self::break_lock) acts on the session
    /// handle `observe` reports.
    async fn sight(&self) -> Result<Sighting, Error> {
        Ok(self.observe().await?.sighting())
    }

    /// Remove the lock `seen` describes and fence its holder out, writing `record` in the same
    /// step; [`Broke::Changed`] without changing anything where the lock is no longer the one
    /// seen (with `expected`, where its holder is not that execution). Core decides everything
    /// else (`dbwarden_core::unlock::force`).
    async fn break_lock(
        &self,
        seen: &Sighting,
        expected: Option<Uuid>,
        record: AuditRecord,
    ) -> Result<Broke, Error>;

    /// Append an audit row without holding the lock (e.g. a declined run); best effort.
    async fn audit(&self, record: &AuditRecord) -> Result<(), Error>;

    /// Read the history table without taking the lock and without creating anything
    /// (`dbwarden history`, `migrate --dry-run`). A lock-only engine has none: the default
    /// says so and where its URL belongs.
    async fn read_history(&self) -> Result<Vec<crate::HistoryRow>, Error> {
        Err(Error::usage(format!(
            "the {} engine is a lock only and keeps no migration history: point -u at the database (postgres://, mysql://, sqlite://, ...) and pass this URL as --lock-url",
            self.engine()
        )))
    }

    /// The sessions that block `session` (see [`crate::MigrationStore::session`]) right now,
    /// one line each -- who, what state, how old its transaction -- never their query text,
    /// read on a session of its own. Engines that cannot tell say nothing.
    async fn blockers(&self, _session: &str) -> Result<Vec<String>, Error> {
        Ok(Vec::new())
    }

    /// Every INVALID index (a concurrent build killed or failed) in the schemas this
    /// database's migrations work in, read without the lock, for `status` and `validate`.
    /// Engines without concurrent index builds have none.
    async fn invalid_indexes(&self) -> Result<Vec<crate::InvalidIndex>, Error> {
        Ok(Vec::new())
    }

    /// Reading the history tables of other migration tools, where this engine can
    /// (`migrate` refuses a database another tool migrated; `adopt` imports it).
    fn other_tools(&self) -> Option<&dyn crate::other_tools::OtherTools> {
        None
    }

    /// The SQL dialect of this engine's migration tables: how a file is cut into statements
    /// (quotes, comments, compound statements) and whether it can run in one transaction.
    /// `None` (the default) for an engine that keeps no migration tables (Redis, etcd: a lock
    /// only).
    fn dialect(&self) -> Option<crate::migration::Dialect> {
        None
    }

    /// The longest pause between two attempts while waiting. Engines that hear releases can
    /// afford a long safety-net poll; polling a local flock is cheap, so SQLite polls often.
    fn max_poll_interval(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// The staleness threshold this engine uses when none is configured.
    fn default_ttl(&self) -> Duration {
        DEFAULT_TTL
    }

    /// See [`Identity::reach`].
    fn reach(&self) -> Option<Reach> {
        self.identity().reach
    }
}

/// What a lock is, as every message, verdict and bound names it ([`MigrationLock::identity`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity<'a> {
    /// `sqlite`, `postgres`, ...
    pub engine: &'static str,
    /// How the lock is freed when its holder dies.
    pub grade: Grade,
    pub namespace: &'a Namespace,
    /// Where the lock's server is and how long one silent step there is waited for: core bounds
    /// every wait by it (`--wait D` ends within D plus one `connect_timeout`, whatever the
    /// network does). `None` for a lock with no network between it and its data (SQLite: a
    /// local file, whose write lock each try waits for at most `busy_timeout`).
    pub reach: Option<Reach>,
}

/// Where a lock lives, as messages name it, and how long its server may stay silent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reach {
    /// Host, port and database (or file), never a password.
    pub target: String,
    /// The engine's `connect_timeout`.
    pub connect_timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockState;

    #[test]
    fn a_sighting_names_the_live_holder_else_the_active_row_and_nothing_when_idle() {
        let holder = HolderInfo::current(None, "migrate");
        let now = Utc::now();
        let base = Observation::new("memory", Grade::A, "ns", now);
        let row = |state| StatusRow {
            state,
            ..StatusRow::of_lease("ns", &holder, 7, now, None, None)
        };
        // Held: the holder, its session, the row's token.
        let mut held =
            base.clone()
                .held_lease(Some((holder.clone(), now)), 7, "lease 3".into(), None, None);
        held.status = Some(row(LockState::Running));
        let seen = held.sighting();
        assert_eq!(seen.current, Some(holder.execution_id));
        assert!(seen.anything);
        assert_eq!(seen.session.as_deref(), Some("lease 3"));
        assert_eq!(seen.token, Some(7));
        // A dead holder's row, nothing held: the row names the execution; no session to act on.
        let mut dead = base.clone();
        dead.status = Some(row(LockState::Dead));
        dead.session_id = Some("gone".into());
        let seen = dead.sighting();
        assert_eq!(seen.current, Some(holder.execution_id));
        assert!(seen.anything && seen.holder.is_none() && seen.session.is_none());
        assert!(seen.row.is_some());
        // Idle: nothing to unlock, though the row keeps its token.
        let mut idle = base;
        idle.status = Some(row(LockState::Available));
        let seen = idle.sighting();
        assert_eq!((seen.current, seen.anything), (None, false));
        assert!(seen.row.is_none());
        assert_eq!(seen.token, Some(7));
    }
}
