//! The runner: `migrate` and `resolve`, in the order of work of docs/design.md §10.2. Engines only answer
//! the [`MigrationStore`] calls; every decision about what to run is made here.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::BusyInfo;
use crate::events::Events;
use crate::migration::Migration;
use crate::recovery::{self, RecoveryDecision};
use crate::wait::{self, Wait};
use crate::{
    AuditRecord, Error, FencingToken, HeartbeatConfig, HistoryRow, HistoryState, HolderInfo, Lease,
    LockState, LostSignal, MigrationLock, MigrationStore, RecoveryPolicy,
};

/// What `migrate` was asked to do.
#[derive(Debug, Clone)]
pub struct MigrateOptions {
    pub wait: Wait,
    pub skip_if_locked: bool,
    /// Apply nothing above this version.
    pub to: Option<i64>,
    pub allow_changed: bool,
    /// Apply a pending migration below the highest applied version instead of refusing.
    pub allow_out_of_order: bool,
    pub recovery_policy: RecoveryPolicy,
    pub heartbeat: HeartbeatConfig,
    /// The lost-signal of a lease this run is nested in (the Redis lease of
    /// `migrate --redis-url`): when it fires, the run stops as if its own lock were lost.
    pub outer_lost: Option<LostSignal>,
    /// Interoperate with sqlx's migrator (see [`crate::adopt::SqlxCompatMode`]).
    pub sqlx_compat: crate::adopt::SqlxCompatMode,
    /// Where lock events go (a lock broken or lost, a halt for review, a failed migration).
    pub events: Events,
}

impl MigrateOptions {
    /// What `migrate` runs with under `settings` when no flag says otherwise: its wait, policy,
    /// out-of-order and sqlx settings, the heartbeat for an engine whose default ttl is
    /// `default_ttl`; no `--to`, no `--allow-changed`, no `--skip-if-locked`.
    pub fn from_settings(
        settings: &crate::config::Settings,
        default_ttl: Duration,
    ) -> Result<Self, Error> {
        Ok(MigrateOptions {
            wait: Wait::from_duration(settings.wait),
            skip_if_locked: false,
            to: None,
            allow_changed: false,
            allow_out_of_order: settings.allow_out_of_order,
            recovery_policy: settings.recovery_policy,
            heartbeat: settings.heartbeat(default_ttl)?,
            outer_lost: None,
            sqlx_compat: settings.sqlx_compat,
            events: Events::default(),
        })
    }
}

/// One migration this run applied.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Applied {
    pub version: i64,
    pub description: String,
    pub duration_ms: u64,
    /// It was resumed from this statement (0-based) after a dead predecessor.
    pub resumed_from: Option<usize>,
}

/// What a finished `migrate` did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    pub applied: Vec<Applied>,
    /// Migrations that were already applied.
    pub already_applied: usize,
    pub fencing_token: u64,
    /// What recovery decided about a predecessor's half-done migrations.
    pub recovered: Vec<String>,
    pub elapsed_ms: u64,
    /// Set when nothing was pending and the run saw it without ever holding the lock alone:
    /// it bumped no token (`fencing_token` is the current one).
    pub look: Option<Look>,
}

/// How a run with nothing to do saw that (see [`MigrationLock::shared`] and
/// [`MigrationLock::snapshot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Look {
    /// Under the engine's shared lock (SQLite, PostgreSQL).
    SharedLock,
    /// In one consistent read of the status row and the history (MySQL/MariaDB).
    Snapshot,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done(Report),
    /// `--skip-if-locked` and another holder is running.
    Skipped(BusyInfo),
}

/// Progress callbacks (the CLI prints them; the library ignores them).
pub trait Progress: Send + Sync {
    fn started(&self, _m: &Migration, _index: usize, _total: usize) {}
    fn finished(&self, _m: &Migration, _elapsed: Duration) {}
    fn note(&self, _msg: &str) {}
}

/// Progress that says nothing.
pub struct Silent;
impl Progress for Silent {}

/// Set by SIGINT/SIGTERM: the runner finishes the current statement, records where it stopped,
/// releases and returns [`Error::Interrupted`].
#[derive(Debug, Clone)]
pub struct Interrupt(watch::Receiver<bool>);

impl Interrupt {
    pub fn new() -> (watch::Sender<bool>, Interrupt) {
        let (tx, rx) = watch::channel(false);
        (tx, Interrupt(rx))
    }

    pub fn never() -> Interrupt {
        let (tx, rx) = watch::channel(false);
        std::mem::forget(tx);
        Interrupt(rx)
    }

    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the interrupt is set.
    pub async fn wait(&self) {
        let mut rx = self.0.clone();
        if rx.wait_for(|set| *set).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Check a loaded migration set against the history: changed applied files are an error.
/// What stops a run before anything is applied, decided from the files and the history: an
/// applied migration whose file changed (unless `allow_changed`), and a migration that is
/// pending below the highest applied version (unless `allow_out_of_order`). Where the engine
/// can look first, this runs on the look's read, before the lock is taken; it runs again under
/// the lock on the history read there.
fn refusals(
    files: &BTreeMap<i64, &Migration>,
    history: &[HistoryRow],
    opts: &MigrateOptions,
) -> Result<(), Error> {
    let applied = || history.iter().filter(|r| r.state == HistoryState::Applied);
    if !opts.allow_changed {
        for row in applied() {
            if let Some(m) = files
                .get(&row.version)
                .filter(|m| m.checksum != row.checksum)
            {
                return Err(Error::ChangedChecksum {
                    version: row.version,
                    file: m.path.display().to_string(),
                    recorded: row.checksum.clone(),
                    current: m.checksum.clone(),
                });
            }
        }
    }
    let Some(highest) = applied().map(|r| r.version).max() else {
        return Ok(());
    };
    if opts.allow_out_of_order {
        return Ok(());
    }
    // Pending: a file with no history row at all (a RUNNING/FAILED row is recovery's).
    let below: Vec<&Migration> = files
        .range(..highest)
        .map(|(_, m)| *m)
        .filter(|m| opts.to.is_none_or(|to| m.version <= to))
        .filter(|m| history.iter().all(|r| r.version != m.version))
        .collect();
    if below.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = below
        .iter()
        .take(5)
        .map(|m| format!("{} ({})", m.version, m.path.display()))
        .collect();
    let more = if below.len() > 5 {
        format!(" and {} more", below.len() - 5)
    } else {
        String::new()
    };
    Err(Error::usage(format!(
        "out of order: migration(s) {}{more} pending below the highest applied version {highest}; nothing was run: give them versions above {highest}, or apply them in version order with --allow-out-of-order (allow_out_of_order = true)",
        named.join(", ")
    )))
}

fn check_applied(
    files: &BTreeMap<i64, &Migration>,
    history: &[HistoryRow],
    opts: &MigrateOptions,
    progress: &dyn Progress,
) -> Result<(), Error> {
    refusals(files, history, opts)?;
    for row in history.iter().filter(|r| r.state == HistoryState::Applied) {
        match files.get(&row.version) {
            Some(m) if m.checksum != row.checksum => {
                progress.note(&format!(
                    "warning: migration {} ({}) changed after it was applied; proceeding (--allow-changed)",
                    row.version,
                    m.path.display()
                ));
            }
            Some(_) => {}
            None => progress.note(&format!(
                "warning: migration {} ({}) is applied but its file is missing",
                row.version, row.description
            )),
        }
    }
    Ok(())
}

/// Take the lock and apply every pending migration (see docs/design.md §10.2, order of work).
pub async fn migrate(
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    holder: &HolderInfo,
    opts: &MigrateOptions,
    progress: &dyn Progress,
    interrupt: &Interrupt,
) -> Result<Outcome, Error> {
    let r = migrate_once(lock, migrations, holder, opts, progress, interrupt).await;
    // Whatever the outcome, nothing kept for a next attempt outlives the run (a library user
    // keeps the lock object; a kept session must not sit there, let alone holding the lock).
    lock.stop_waiting().await;
    r
}

async fn migrate_once(
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    holder: &HolderInfo,
    opts: &MigrateOptions,
    progress: &dyn Progress,
    interrupt: &Interrupt,
) -> Result<Outcome, Error> {
    let started = Instant::now();
    let deadline = match opts.wait {
        Wait::No => None,
        Wait::Up(d) => Some(started + d),
    };
    let left = || match deadline {
        Some(d) if d > Instant::now() => Wait::Up(d - Instant::now()),
        _ => Wait::No,
    };
    // Everything before the lock is held (looks, tries, waits) ends within the wait plus one
    // connect_timeout, whatever the network does.
    let taken = wait::within_wait(lock, opts.wait, async {
        let mut taken = None;
        // A database another tool migrated and dbwarden never adopted is refused before anything
        // is written; a look that saw our history holds rows has settled that already.
        let mut adoption_checked = false;
        let looks = lock.shared().is_some() || lock.snapshot().is_some();
        if looks && opts.outer_lost.is_none() {
            let mut pauses = wait::Pauses::new(lock);
            loop {
                let look = match lock.snapshot() {
                    Some(snapshot) if lock.shared().is_none() => {
                        look_snapshot(snapshot, migrations, opts, interrupt).await?
                    }
                    _ => look_shared(lock, migrations, holder, opts, left(), interrupt).await?,
                };
                if let Some(outcome) = look.outcome {
                    return Ok(Taken::Done(outcome));
                }
                // A changed file or an out-of-order one stops the run here, before the lock.
                if let Some(history) = &look.history {
                    let files: BTreeMap<i64, &Migration> =
                        migrations.iter().map(|m| (m.version, m)).collect();
                    refusals(&files, history, opts)?;
                }
                if !adoption_checked {
                    let checked = match look.history_empty {
                        Some(false) => Ok(()),
                        // The look read our history: only the other tools' tables are left to see.
                        Some(true) => crate::adopt::refuse_if_other_tools(lock).await,
                        None => crate::adopt::refuse_unadopted(lock).await,
                    };
                    match checked {
                        Ok(()) => adoption_checked = true,
                        // A full server refused the read: wait for a slot as for the lock, and
                        // look again (the wait is bounded like any other).
                        Err(Error::Busy(info)) if info.server_full => {
                            let Wait::Up(rest) = left() else {
                                return Err(Error::Busy(info));
                            };
                            tokio::select! {
                                _ = pauses.pause(lock, &info, rest) => {}
                                _ = interrupt.wait() => return Err(Error::Interrupted),
                            }
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
                // Something is pending. Take the exclusive lock if it is free. If another runner
                // holds it (most likely applying the same migrations), wait for its release and
                // look again instead of queueing for the lock alone: once it is done, there is
                // usually nothing left to do, and every waiter sees that side by side.
                let Wait::Up(rest) = left() else { break };
                if opts.skip_if_locked {
                    break;
                }
                // One try, through core's own acquire (no wait, no audit: this is not a refusal).
                let attempt = tokio::select! {
                    r = wait::acquire_unbounded(lock, holder, wait::Mode::Exclusive, Wait::No, opts.heartbeat) => r,
                    _ = interrupt.wait() => return Err(Error::Interrupted),
                };
                match attempt {
                    Ok(lease) => {
                        taken = Some(lease);
                        break;
                    }
                    Err(Error::Busy(info)) => {
                        tokio::select! {
                            _ = pauses.pause(lock, &info, rest) => {}
                            _ = interrupt.wait() => return Err(Error::Interrupted),
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        if !adoption_checked {
            crate::adopt::refuse_unadopted(lock).await?;
        }
        let lease = match taken {
            Some(lease) => lease,
            None => match acquire_or_decline(
                lock,
                holder,
                wait::Mode::Exclusive,
                left(),
                opts.skip_if_locked,
                opts.heartbeat,
                interrupt,
            )
            .await?
            {
                Acquired::Lease(lease) => *lease,
                Acquired::Skipped(info) => return Ok(Taken::Done(Outcome::Skipped(info))),
            },
        };
        Ok(Taken::Lease(Box::new(lease)))
    })
    .await?;
    let mut lease = match taken {
        Taken::Lease(lease) => *lease,
        Taken::Done(outcome) => return Ok(outcome),
    };
    if let Some(outer) = &opts.outer_lost {
        lease.tie_to(outer.clone());
    }
    let watch = opts.events.took(lock, &lease);
    let result = run_locked(&mut lease, lock, migrations, opts, progress, interrupt).await;
    let released = finish(lease, &result).await;
    watch.ended(migrations, &result, &released);
    released?;
    result.map(|mut report| {
        report.elapsed_ms = started.elapsed().as_millis() as u64;
        Outcome::Done(report)
    })
}

/// What the steps before the lock came to: the lock, or an outcome without it (nothing to do,
/// skipped).
enum Taken {
    Lease(Box<Lease>),
    Done(Outcome),
}

/// Busy past the wait, interrupted, unreachable, bad input: the answer the exclusive path would
/// give too. Anything else a look meets (a read that hit SQLite's write lock, say) is doubt:
/// the exclusive path, with its own handling, decides.
fn final_look_error(e: &Error) -> bool {
    matches!(
        e,
        Error::Busy(_) | Error::Interrupted | Error::Usage(_) | Error::MigrationFile(_)
    ) || e.is_unreachable()
}

/// The report of a run that found nothing to do by looking.
fn looked(snapshot: &crate::lock::Snapshot, started: Instant, look: Look) -> Outcome {
    Outcome::Done(Report {
        applied: Vec::new(),
        already_applied: snapshot.history.len(),
        fencing_token: snapshot.status.as_ref().map_or(0, |s| s.fencing_token),
        recovered: Vec::new(),
        elapsed_ms: started.elapsed().as_millis() as u64,
        look: Some(look),
    })
}

/// Without any lock, in one consistent read of the status row and the history: `Some` when
/// nothing is to do. As sound as a look under a shared lock: a run in progress shows in the
/// status row (RUNNING), so only a clean, complete state passes, and whatever a writer does
/// after the read can only add migrations this run does not have.
async fn look_snapshot(
    lock: &dyn crate::lock::SnapshotRead,
    migrations: &[Migration],
    opts: &MigrateOptions,
    interrupt: &Interrupt,
) -> Result<Looked, Error> {
    let started = Instant::now();
    let snapshot = tokio::select! {
        r = lock.read_snapshot() => r,
        _ = interrupt.wait() => return Err(Error::Interrupted),
    };
    match snapshot {
        Ok(s) => Ok(Looked::from(
            &s,
            nothing_to_do(&s, migrations, opts.to).then(|| looked(&s, started, Look::Snapshot)),
        )),
        // A full server: no lock was asked for, so this is not a refusal; the exclusive try
        // that follows says busy and the loop waits, as long as `--wait` allows.
        Err(e) if e.is_busy() => Ok(Looked::NOTHING),
        Err(e) if final_look_error(&e) => Err(e),
        Err(e) => {
            tracing::debug!("the look could not read ({e}); taking the exclusive lock");
            Ok(Looked::NOTHING)
        }
    }
}

/// What a look found: the outcome when nothing is to do, and whether our history was empty
/// (`None` when the look could not read it).
struct Looked {
    outcome: Option<Outcome>,
    history_empty: Option<bool>,
    /// The history the look read (when it read one).
    history: Option<Vec<HistoryRow>>,
}

impl Looked {
    const NOTHING: Looked = Looked {
        outcome: None,
        history_empty: None,
        history: None,
    };

    fn from(snapshot: &crate::lock::Snapshot, outcome: Option<Outcome>) -> Looked {
        Looked {
            history: outcome.is_none().then(|| snapshot.history.clone()),
            outcome,
            history_empty: Some(snapshot.history.is_empty()),
        }
    }
}

/// Under the shared lock, read whether anything is to do; `Some` when nothing is (or the run
/// declined per `--skip-if-locked`). Any doubt -- a pending migration, a changed or missing
/// file, a half-done history row, a status row other than AVAILABLE/COMPLETE -- answers `None`,
/// and the exclusive path decides with the whole recovery machinery. Readers overlap, so
/// replicas that start together with nothing to do check at once; the one that applies holds
/// the exclusive lock, which excludes them all while it writes.
async fn look_shared(
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    holder: &HolderInfo,
    opts: &MigrateOptions,
    wait: Wait,
    interrupt: &Interrupt,
) -> Result<Looked, Error> {
    let started = Instant::now();
    let final_error = final_look_error;
    let mut lease = match acquire_or_decline(
        lock,
        holder,
        wait::Mode::Shared,
        wait,
        opts.skip_if_locked,
        opts.heartbeat,
        interrupt,
    )
    .await
    {
        Ok(Acquired::Lease(lease)) => *lease,
        Ok(Acquired::Skipped(info)) => {
            return Ok(Looked {
                outcome: Some(Outcome::Skipped(info)),
                history_empty: None,
                history: None,
            });
        }
        Err(e) if final_error(&e) => return Err(e),
        Err(e) => {
            tracing::debug!("the shared look failed ({e}); taking the exclusive lock");
            return Ok(Looked::NOTHING);
        }
    };
    let snapshot = match lease.read_applied().await {
        Some(r) => r,
        None => read_through(lock).await,
    };
    if let Err(e) = lease.release().await {
        tracing::warn!("releasing the shared lock: {e}");
    }
    let snapshot = match snapshot {
        Ok(s) => s,
        Err(e) if final_error(&e) => return Err(e),
        Err(e) => {
            tracing::debug!("the shared look could not read ({e}); taking the exclusive lock");
            return Ok(Looked::NOTHING);
        }
    };
    Ok(Looked::from(
        &snapshot,
        nothing_to_do(&snapshot, migrations, opts.to)
            .then(|| looked(&snapshot, started, Look::SharedLock)),
    ))
}

async fn read_through(lock: &dyn MigrationLock) -> Result<crate::lock::Snapshot, Error> {
    Ok(crate::lock::Snapshot {
        status: lock.observe().await?.status,
        history: lock.read_history().await?,
    })
}

/// Every migration up to `to` is applied with the checksum of its file, no history row is
/// half-done or without a file, and the status row shows no run in progress or under review.
fn nothing_to_do(
    snapshot: &crate::lock::Snapshot,
    migrations: &[Migration],
    to: Option<i64>,
) -> bool {
    let clean_status = snapshot
        .status
        .as_ref()
        .is_none_or(|s| matches!(s.state, LockState::Available | LockState::Complete));
    let files: BTreeMap<i64, &Migration> = migrations.iter().map(|m| (m.version, m)).collect();
    let history_ok = snapshot.history.iter().all(|r| {
        r.state == HistoryState::Applied
            && files
                .get(&r.version)
                .is_some_and(|m| m.checksum == r.checksum)
    });
    let applied: std::collections::HashSet<i64> =
        snapshot.history.iter().map(|r| r.version).collect();
    let none_pending = migrations
        .iter()
        .filter(|m| to.is_none_or(|to| m.version <= to))
        .all(|m| applied.contains(&m.version));
    clean_status && history_ok && none_pending
}

/// What [`acquire_or_decline`] got.
pub enum Acquired {
    Lease(Box<Lease>),
    /// `--skip-if-locked` and another holder is running (audited as `lock_conflict`).
    Skipped(BusyInfo),
}

/// Take the lock per the wait policy; a run that declines to start (busy after the wait, or
/// `--skip-if-locked`) writes a `lock_conflict` audit row. SIGINT/SIGTERM while waiting
/// returns [`Error::Interrupted`].
pub async fn acquire_or_decline(
    lock: &dyn MigrationLock,
    holder: &HolderInfo,
    mode: wait::Mode,
    wait: Wait,
    skip_if_locked: bool,
    heartbeat: HeartbeatConfig,
    interrupt: &Interrupt,
) -> Result<Acquired, Error> {
    let wait = if skip_if_locked { Wait::No } else { wait };
    let acquired = tokio::select! {
        r = wait::acquire_mode(lock, holder, mode, wait, heartbeat) => r,
        _ = interrupt.wait() => Err(Error::Interrupted),
    };
    match acquired {
        Ok(lease) => Ok(Acquired::Lease(Box::new(lease))),
        Err(Error::Busy(info)) => {
            let why = if skip_if_locked {
                "declined: --skip-if-locked and another holder is running"
            } else {
                "declined: lock still busy when --wait ran out"
            };
            let record = AuditRecord::new(lock.namespace(), "lock_conflict", holder, why)
                .about(info.holder.as_ref());
            if let Err(e) = lock.audit(&record).await {
                tracing::warn!("could not write the lock_conflict audit row: {e}");
            }
            if skip_if_locked {
                Ok(Acquired::Skipped(*info))
            } else {
                Err(Error::Busy(info))
            }
        }
        Err(e) => Err(e),
    }
}

/// A stand-in for a migration known only by its history row (its file may be gone), so the
/// status row can still name the version.
pub(crate) fn placeholder(version: i64, checksum: Option<&str>) -> Migration {
    Migration::stand_in(version, checksum.unwrap_or_default())
}

/// The state to leave behind when a run ends without changing what the previous run left:
/// a halt for review survives anything but `resolve`; otherwise the previous final state.
fn restored_state(lease: &Lease) -> (LockState, Option<Migration>) {
    match lease.previous() {
        Some(p) if p.state == LockState::NeedsReview => (
            LockState::NeedsReview,
            p.migration_version
                .map(|v| placeholder(v, p.migration_checksum.as_deref())),
        ),
        Some(p) if !p.state.is_active() => (p.state, None),
        _ => (LockState::Available, None),
    }
}

/// End a `dbwarden run`: COMPLETE or FAILED, but a halt for review is kept.
pub async fn finish_command(mut lease: Lease, succeeded: bool) -> Result<(), Error> {
    let token = lease.fencing_token();
    let (state, m) = match restored_state(&lease) {
        (LockState::NeedsReview, m) => (LockState::NeedsReview, m),
        _ if succeeded => (LockState::Complete, None),
        _ => (LockState::Failed, None),
    };
    if !lease.is_lost()
        && let Some(store) = lease.store()
        && let Err(e) = store.set_state(token, state, m.as_ref()).await
    {
        tracing::warn!("could not record the final state {}: {e}", state.as_str());
    }
    if lease.is_lost() {
        return Ok(());
    }
    lease.release().await
}

/// Write the final state and release; after a lost lease, write nothing. A usage error after
/// the lock was taken (changed checksum, nothing to resolve) puts back what was there.
pub(crate) async fn finish<T>(mut lease: Lease, result: &Result<T, Error>) -> Result<(), Error> {
    let token = lease.fencing_token();
    let (state, m) = match result {
        Ok(_) => (Some(LockState::Complete), None),
        Err(e) if e.is_lost() => (None, None),
        Err(Error::NeedsReview { .. }) => (None, None), // already recorded with its version
        Err(e) if e.is_misconfigured() => {
            let (s, m) = restored_state(&lease);
            (Some(s), m)
        }
        Err(Error::Interrupted) => (Some(LockState::Available), None),
        Err(_) => (Some(LockState::Failed), None),
    };
    if let (Some(state), false) = (state, lease.is_lost())
        && let Some(store) = lease.store()
        && let Err(e) = store.set_state(token, state, m.as_ref()).await
    {
        tracing::warn!("could not record the final state {}: {e}", state.as_str());
    }
    if lease.is_lost() || matches!(result, Err(e) if e.is_lost()) {
        drop(lease); // frees whatever is left of the primitive, writes nothing
        return Ok(());
    }
    lease.release().await
}

pub(crate) fn store_of(lease: &mut Lease) -> Result<&mut (dyn MigrationStore + 'static), Error> {
    lease
        .store()
        .ok_or_else(|| Error::usage("this engine has no migration tables; use it through `dbwarden run` or as a library lock"))
}

/// Mark the lease lost when a fenced write was rejected, and pass the error on.
pub(crate) fn fenced<T>(lease_lost: &Lease, r: Result<T, Error>) -> Result<T, Error> {
    if let Err(e) = &r
        && e.is_lost()
    {
        lease_lost.mark_lost(e.to_string());
    }
    r
}

async fn run_locked(
    lease: &mut Lease,
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    opts: &MigrateOptions,
    progress: &dyn Progress,
    interrupt: &Interrupt,
) -> Result<Report, Error> {
    let token = lease.fencing_token();
    let lost = lease.lost_signal();
    let holder = lease.holder().clone();
    let previous = lease.previous().cloned();
    let files: BTreeMap<i64, &Migration> = migrations.iter().map(|m| (m.version, m)).collect();
    let mut recovered = Vec::new();

    // A run that halted for review stays halted until a human resolves it.
    if let Some(prev) = previous
        .as_ref()
        .filter(|p| p.state == LockState::NeedsReview)
    {
        let version = prev.migration_version.unwrap_or(0);
        let stand_in = placeholder(version, prev.migration_checksum.as_deref());
        let m = files.get(&version).copied().unwrap_or(&stand_in);
        let store = store_of(lease)?;
        lost.check()?;
        store
            .set_state(token, LockState::NeedsReview, Some(m))
            .await?;
        return Err(Error::NeedsReview {
            version,
            reason: "a previous run halted here and nobody has resolved it yet".into(),
        });
    }

    let mirroring = sqlx_handshake(lease, lock, migrations, opts, progress).await?;
    let store = store_of(lease)?;
    let history = store.history().await?; // only now: never before the lock
    check_applied(&files, &history, opts, progress)?;

    let mut resume_from: HashMap<i64, usize> = HashMap::new();
    let mut applied_versions: std::collections::HashSet<i64> = history
        .iter()
        .filter(|r| r.state == HistoryState::Applied)
        .map(|r| r.version)
        .collect();
    let half_done: Vec<&HistoryRow> = history.iter().filter(|r| r.state.is_unfinished()).collect();
    let dead_predecessor = previous.as_ref().filter(|p| p.state.is_active());
    if dead_predecessor.is_some() || !half_done.is_empty() {
        if half_done.is_empty() {
            recovered.push(
                "nothing was left half-done (the interrupted transaction rolled back); pending migrations run again".into(),
            );
        }
        if let Some(p) = dead_predecessor {
            progress.note(&format!(
                "previous holder died mid-run (host={} pid={} execution={}); inspecting",
                p.host.as_deref().unwrap_or("?"),
                p.pid.map(|p| p.to_string()).unwrap_or_else(|| "?".into()),
                p.execution_id
                    .map(|e| e.to_string())
                    .unwrap_or_else(|| "?".into()),
            ));
        }
        lost.check()?;
        store.set_state(token, LockState::Inspecting, None).await?;
        if half_done.is_empty() && opts.recovery_policy == RecoveryPolicy::Halt {
            // Nothing was left half-done (its transaction rolled back), but halt means a human
            // looks at every dead predecessor. It was working on the first pending migration.
            let version = migrations
                .iter()
                .find(|m| !applied_versions.contains(&m.version))
                .map(|m| m.version)
                .or(dead_predecessor.and_then(|p| p.migration_version))
                .unwrap_or(0);
            let stand_in = placeholder(version, None);
            let m = files.get(&version).copied().unwrap_or(&stand_in);
            let reason = "its runner died and recovery_policy = halt".to_owned();
            lost.check()?;
            store
                .set_state(token, LockState::NeedsReview, Some(m))
                .await?;
            let rec = AuditRecord::new(lock.namespace(), "needs_review", &holder, reason.clone());
            lost.check()?;
            store.audit(&rec).await?;
            return Err(Error::NeedsReview { version, reason });
        }
        let transactional = store.transactional();
        for row in half_done {
            let file = files.get(&row.version).copied();
            if crate::revert::is_interrupted_revert(row) {
                // A revert stopped here. Rolled back whole (nothing of it was journaled), the
                // migration is still applied; otherwise only a revert can finish it (a forward
                // run would go over it).
                let down = file.and_then(|m| m.down.as_deref());
                let rolled_back = transactional
                    && row.statements_done == 0
                    && down.is_some_and(|d| d.mode.is_transaction());
                if rolled_back {
                    if let Some(m) = file {
                        lost.check()?;
                        store.mark_applied(token, holder.execution_id, m).await?;
                    }
                    applied_versions.insert(row.version);
                    recovered.push(format!(
                        "the revert of migration {} rolled back: it is still applied",
                        row.version
                    ));
                    continue;
                }
                return Err(Error::usage(format!(
                    "the revert of migration {} stopped after {} of {} statements: finish it with `dbwarden revert --steps 1` (or decide it with `dbwarden resolve {} …`); nothing was applied",
                    row.version, row.statements_done, row.statements_total, row.version
                )));
            }
            let decision = recovery::decide(row, file, transactional, opts.recovery_policy);
            let what = format!(
                "migration {} ({}) left {} after {} of {} statements",
                row.version,
                row.description,
                row.state.as_str(),
                row.statements_done,
                row.statements_total
            );
            match decision {
                RecoveryDecision::Complete => {
                    if let Some(m) = file {
                        lost.check()?;
                        store.mark_applied(token, holder.execution_id, m).await?;
                    }
                    applied_versions.insert(row.version);
                    recovered.push(format!("{what}: every statement had run; marked applied"));
                }
                RecoveryDecision::Rerun => {
                    recovered.push(format!("{what}: its transaction rolled back; re-running"));
                }
                RecoveryDecision::Resume { from, forced } => {
                    if forced {
                        progress.note(&format!(
                            "warning: recovery_policy = force: resuming {what} at a non-idempotent statement"
                        ));
                        let rec = AuditRecord::new(
                            lock.namespace(),
                            "forced_resume",
                            &holder,
                            format!("{what}; resumed at statement {}", from + 1),
                        );
                        lost.check()?;
                        store.audit(&rec).await?;
                    }
                    resume_from.insert(row.version, from);
                    recovered.push(format!("{what}: resuming at statement {}", from + 1));
                }
                RecoveryDecision::NeedsReview { reason } => {
                    let stand_in = placeholder(row.version, Some(&row.checksum));
                    let m = file.unwrap_or(&stand_in);
                    lost.check()?;
                    store
                        .set_state(token, LockState::NeedsReview, Some(m))
                        .await?;
                    let rec =
                        AuditRecord::new(lock.namespace(), "needs_review", &holder, reason.clone());
                    lost.check()?;
                    store.audit(&rec).await?;
                    return Err(Error::NeedsReview {
                        version: row.version,
                        reason,
                    });
                }
            }
        }
        lost.check()?;
        store.set_state(token, LockState::Running, None).await?;
    }
    for r in &recovered {
        progress.note(r);
    }

    let pending: Vec<&Migration> = migrations
        .iter()
        .filter(|m| !applied_versions.contains(&m.version))
        .filter(|m| opts.to.is_none_or(|to| m.version <= to))
        .collect();
    let mut applied = Vec::new();
    let total = pending.len();
    for (i, m) in pending.into_iter().enumerate() {
        if interrupt.is_set() {
            return Err(Error::Interrupted);
        }
        fenced(lease, lost.check())?;
        progress.started(m, i, total);
        let t0 = Instant::now();
        let from = resume_from.get(&m.version).copied();
        let store = store_of(lease)?;
        let r = apply_one(store, token, holder.execution_id, m, from, &lost, interrupt).await;
        if let Err(e) = &r
            && mirroring
            && !e.is_lost()
            && store.transactional()
            && m.mode.is_transaction()
            && applied_by_sqlx_meanwhile(store, token, &holder, lock, m).await?
        {
            // sqlx-cli takes no lock: it ran this migration at the same time and committed
            // first, so ours rolled back. It is applied, once.
            progress.note(&format!(
                "migration {} was applied by sqlx at the same time (its transaction committed first; ours rolled back: {e}); recorded as applied",
                m.version
            ));
            continue;
        }
        fenced(lease, r)?;
        let elapsed = t0.elapsed();
        progress.finished(m, elapsed);
        applied.push(Applied {
            version: m.version,
            description: m.description.clone(),
            duration_ms: elapsed.as_millis() as u64,
            resumed_from: from,
        });
    }
    Ok(Report {
        already_applied: applied_versions.len(),
        applied,
        fencing_token: token.0,
        recovered,
        elapsed_ms: 0,
        look: None,
    })
}

/// After a transactional migration failed while mirroring to sqlx: whether sqlx's table now
/// says sqlx applied it (a sqlx-cli process, which takes no lock, ran it at the same time and
/// committed first); if so it is recorded applied here, audited.
async fn applied_by_sqlx_meanwhile(
    store: &mut (dyn MigrationStore + 'static),
    token: FencingToken,
    holder: &HolderInfo,
    lock: &dyn MigrationLock,
    m: &Migration,
) -> Result<bool, Error> {
    use crate::adopt::{self, ForeignHistory, Tool};
    let Some(compat) = store.sqlx_compat() else {
        return Ok(false);
    };
    let rows: Vec<_> = compat
        .sqlx_rows()
        .await?
        .into_iter()
        .filter(|r| r.version == m.version && r.ok)
        .collect();
    if rows.is_empty() {
        return Ok(false);
    }
    let plan = adopt::plan(
        &ForeignHistory {
            tool: Tool::Sqlx,
            rows,
        },
        std::slice::from_ref(m),
    )?;
    if !plan.changed.is_empty() {
        return Ok(false);
    }
    adopt::record(
        store,
        token,
        holder,
        lock,
        std::slice::from_ref(m),
        &plan,
        "sqlx_sync",
    )
    .await?;
    Ok(true)
}

/// `sqlx_compat`: take the lock sqlx's migrator takes (an old replica running it holds that lock
/// while it applies), record what sqlx applied since dbwarden last ran, and have every
/// migration this run applies written into `_sqlx_migrations` too, as sqlx would.
async fn sqlx_handshake(
    lease: &mut Lease,
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    opts: &MigrateOptions,
    progress: &dyn Progress,
) -> Result<bool, Error> {
    use crate::adopt::{self, ForeignHistory, SqlxCompatMode, Tool};
    if opts.sqlx_compat == SqlxCompatMode::Off {
        return Ok(false);
    }
    let token = lease.fencing_token();
    let lost = lease.lost_signal();
    let holder = lease.holder().clone();
    let store = store_of(lease)?;
    let Some(compat) = store.sqlx_compat() else {
        if opts.sqlx_compat == SqlxCompatMode::On {
            return Err(Error::usage(
                "sqlx_compat = on, but this engine has no sqlx to work with (PostgreSQL, MySQL and SQLite have)",
            ));
        }
        return Ok(false);
    };
    if opts.sqlx_compat == SqlxCompatMode::Auto && !compat.sqlx_table_exists().await? {
        return Ok(false);
    }
    let deadline = match opts.wait {
        Wait::No => Instant::now(),
        Wait::Up(d) => Instant::now() + d,
    };
    let mut backoff = wait::Backoff::new(Duration::from_millis(25), Duration::from_secs(1));
    while !compat.try_lock_sqlx().await? {
        lost.check()?;
        if Instant::now() >= deadline {
            return Err(Error::Busy(Box::new(BusyInfo {
                note: Some(
                    "sqlx's migration lock is held: a replica running sqlx's migrator is applying migrations"
                        .into(),
                ),
                ..Default::default()
            })));
        }
        tokio::time::sleep(backoff.next_pause()).await;
    }
    compat.mirror_to_sqlx().await?;
    let rows = compat.sqlx_rows().await?;
    let history = store.history().await?;
    let ours: std::collections::HashSet<i64> = history
        .iter()
        .filter(|r| r.state == HistoryState::Applied)
        .map(|r| r.version)
        .collect();
    let rows: Vec<_> = rows
        .into_iter()
        .filter(|r| !ours.contains(&r.version))
        .collect();
    if rows.is_empty() {
        return Ok(true);
    }
    // A version ours has half-done and sqlx recorded done: where ours rolled back (one
    // transaction) sqlx's is the only run, but a journaled one may have left statements done,
    // and then both tools ran part of it.
    for row in rows.iter().filter(|r| r.ok) {
        let half = history
            .iter()
            .any(|h| h.version == row.version && h.state.is_unfinished());
        let file = migrations.iter().find(|m| m.version == row.version);
        if half && file.is_none_or(|m| !m.mode.is_transaction()) {
            let stand_in = placeholder(row.version, None);
            let m = file.unwrap_or(&stand_in);
            let reason = format!(
                "sqlx applied migration {} while a journaled run of dbwarden's had left it half-done: both may have run part of it",
                row.version
            );
            lost.check()?;
            store
                .set_state(token, LockState::NeedsReview, Some(m))
                .await?;
            let rec = AuditRecord::new(lock.namespace(), "needs_review", &holder, reason.clone());
            store.audit(&rec).await?;
            return Err(Error::NeedsReview {
                version: row.version,
                reason,
            });
        }
    }
    let plan = adopt::plan(
        &ForeignHistory {
            tool: Tool::Sqlx,
            rows,
        },
        migrations,
    )?;
    adopt::check_changed(&plan, migrations, opts.allow_changed)?;
    progress.note(&format!(
        "sqlx_compat: recording what sqlx applied since: {}",
        plan.summary()
    ));
    lost.check()?;
    adopt::record(store, token, &holder, lock, migrations, &plan, "sqlx_sync").await?;
    Ok(true)
}

/// Apply one migration: in one transaction where the engine and the file allow it, otherwise
/// statement by statement with the journal, starting at `from`.
pub(crate) async fn apply_one(
    store: &mut dyn MigrationStore,
    token: FencingToken,
    execution_id: uuid::Uuid,
    m: &Migration,
    from: Option<usize>,
    lost: &LostSignal,
    interrupt: &Interrupt,
) -> Result<(), Error> {
    let t0 = Instant::now();
    if store.transactional() && m.mode.is_transaction() && from.is_none() {
        return match store
            .apply_in_transaction(token, execution_id, m, lost)
            .await
        {
            Ok(()) => Ok(()),
            // Only a statement that failed was surely rolled back; any other error (a lost
            // connection at COMMIT, a fenced write) leaves the outcome to recovery.
            Err(e) if !matches!(e, Error::MigrationFailed { .. }) || lost.is_lost() => Err(e),
            Err(e) => {
                // Rolled back: leave a FAILED row so history shows the attempt.
                let ms = t0.elapsed().as_millis() as i64;
                store.journal_begin(token, execution_id, m, 0).await?;
                store
                    .journal_end(token, m, HistoryState::Failed, ms)
                    .await?;
                Err(e)
            }
        };
    }
    let from = from.unwrap_or(0);
    store.journal_begin(token, execution_id, m, from).await?;
    for unit in units(m, from, store.batch_limit()) {
        lost.check()?;
        // Inside a transaction the file opened, stopping would leave it half-done on the
        // session: an interrupt is honoured once the file's transaction has ended.
        if interrupt.is_set() && !m.inside_own_transaction(unit.start) {
            // Stopped cleanly before this statement: FAILED tells recovery it was not in flight.
            let ms = t0.elapsed().as_millis() as i64;
            store
                .journal_end(token, m, HistoryState::Failed, ms)
                .await?;
            return Err(Error::Interrupted);
        }
        let r = if unit.len() == 1 {
            store.journal_statement(token, m, unit.start, lost).await
        } else {
            store.journal_batch(token, m, unit, lost).await
        };
        if let Err(e) = r {
            // FAILED tells recovery "not in flight, resume here": true only when the statement
            // itself failed. An error after it ran (recording it timed out, the connection
            // dropped, the lease was lost) leaves the row RUNNING, so recovery decides by the
            // statement's idempotency instead of re-running it blindly.
            if matches!(e, Error::MigrationFailed { .. }) && !lost.is_lost() {
                let ms = t0.elapsed().as_millis() as i64;
                store
                    .journal_end(token, m, HistoryState::Failed, ms)
                    .await?;
            }
            return Err(e);
        }
    }
    lost.check()?;
    let ms = t0.elapsed().as_millis() as i64;
    store.journal_end(token, m, m.done_state(), ms).await
}

/// Most bytes of SQL one journaled batch holds: a batch is one round trip and one commit, so a
/// 100 000-row data migration costs a hundred commits, not 100 000, and stays well under any
/// server's packet limit.
const BATCH_BYTES: usize = 1 << 20;

/// The journal's units from statement `from` on: runs of up to `limit` batchable statements
/// outside the file's own transactions (each run committed together with its journal entry),
/// every other statement alone.
fn units(m: &Migration, from: usize, limit: usize) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    let mut bytes = 0;
    for index in from..m.statements.len() {
        let s = &m.statements[index];
        let joins = s.batchable && !m.inside_own_transaction(index);
        let len = s.span.len();
        match out.last_mut() {
            Some(last)
                if joins
                    && last.end == index
                    && m.statements[last.start].batchable
                    && !m.inside_own_transaction(last.start)
                    && last.len() < limit
                    && bytes + len <= BATCH_BYTES =>
            {
                last.end = index + 1;
                bytes += len;
            }
            _ => {
                out.push(index..index + 1);
                bytes = len;
            }
        }
    }
    out
}

/// What a human decided in `dbwarden resolve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Run the migration again from the statement that was in flight.
    Retry,
    /// Record it APPLIED without running anything.
    MarkApplied,
    /// Forget the attempt: the migration is pending again, from its first statement.
    Abandon,
}

impl Resolution {
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Retry => "retry",
            Resolution::MarkApplied => "mark_applied",
            Resolution::Abandon => "abandon",
        }
    }
}

/// `dbwarden resolve <version>`: take the lock, apply the human's decision, audit it. Lock
/// events (a dead holder's lock broken, the lock lost, a retried migration failing) go to
/// `events`.
#[allow(clippy::too_many_arguments)]
pub async fn resolve(
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    holder: &HolderInfo,
    version: i64,
    resolution: Resolution,
    wait: Wait,
    heartbeat: HeartbeatConfig,
    events: &Events,
) -> Result<String, Error> {
    let mut lease = wait::acquire(lock, holder, wait, heartbeat).await?;
    let watch = events.took(lock, &lease);
    let result = resolve_locked(&mut lease, lock, migrations, version, resolution).await;
    let released = finish(lease, &result).await;
    watch.ended(migrations, &result, &released);
    released?;
    result
}

async fn resolve_locked(
    lease: &mut Lease,
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    version: i64,
    resolution: Resolution,
) -> Result<String, Error> {
    let token = lease.fencing_token();
    let lost = lease.lost_signal();
    let holder = lease.holder().clone();
    let halted_at = lease
        .previous()
        .filter(|p| p.state == LockState::NeedsReview)
        .and_then(|p| p.migration_version);
    let store = store_of(lease)?;
    let history = store.history().await?;
    let row = history.iter().find(|r| r.version == version).cloned();
    let half_done = row.as_ref().is_some_and(|r| r.state.is_unfinished());
    if !half_done && halted_at != Some(version) {
        return Err(Error::usage(format!(
            "migration {version} is not awaiting review (state: {}); nothing to resolve",
            row.as_ref().map_or("not in history", |r| r.state.as_str())
        )));
    }
    let file = migrations.iter().find(|m| m.version == version);
    if let Some(r) = row
        .as_ref()
        .filter(|r| crate::revert::is_interrupted_revert(r))
    {
        let done = resolve_revert(store, token, &holder, file, r, resolution, &lost).await?;
        let rec = AuditRecord::new(
            lock.namespace(),
            &format!("resolve_{}", resolution.as_str()),
            &holder,
            done.clone(),
        );
        store.audit(&rec).await?;
        return Ok(done);
    }
    let done = match resolution {
        Resolution::Retry => {
            let m = file.ok_or_else(|| {
                Error::usage(format!(
                    "migration {version}: its file is missing; cannot retry"
                ))
            })?;
            let from = row
                .as_ref()
                .filter(|_| !store.transactional() || !m.mode.is_transaction())
                .map(|r| usize::try_from(r.statements_done).unwrap_or(0));
            apply_one(
                store,
                token,
                holder.execution_id,
                m,
                from,
                &lost,
                &Interrupt::never(),
            )
            .await?;
            format!(
                "migration {version} re-run from statement {} and applied",
                from.unwrap_or(0) + 1
            )
        }
        Resolution::MarkApplied => {
            let m = file.ok_or_else(|| {
                Error::usage(format!(
                    "migration {version}: its file is missing; cannot record its checksum"
                ))
            })?;
            store.mark_applied(token, holder.execution_id, m).await?;
            format!("migration {version} marked applied without running it")
        }
        Resolution::Abandon => {
            store.forget(token, version).await?;
            format!(
                "migration {version}: the interrupted attempt was forgotten; it is pending again"
            )
        }
    };
    let rec = AuditRecord::new(
        lock.namespace(),
        &format!("resolve_{}", resolution.as_str()),
        &holder,
        done.clone(),
    );
    store.audit(&rec).await?;
    Ok(done)
}

/// `resolve` of a revert a run left half-done: `--retry` finishes the down file from the
/// statement that was in flight, `--mark-applied` records the revert done (finished by hand),
/// `--abandon` forgets the revert: the migration is applied again (its effects were restored
/// by hand).
async fn resolve_revert(
    store: &mut dyn MigrationStore,
    token: FencingToken,
    holder: &HolderInfo,
    file: Option<&Migration>,
    row: &HistoryRow,
    resolution: Resolution,
    lost: &LostSignal,
) -> Result<String, Error> {
    let version = row.version;
    let m = file.ok_or_else(|| {
        Error::usage(format!(
            "migration {version}: its file is missing; its revert cannot be resolved"
        ))
    })?;
    let down = || {
        m.down.as_deref().ok_or_else(|| {
            Error::usage(format!(
                "migration {version}: its down file is missing; restore it to resolve its revert"
            ))
        })
    };
    Ok(match resolution {
        Resolution::Retry => {
            let d = down()?;
            let from = (!store.transactional() || !d.mode.is_transaction())
                .then(|| usize::try_from(row.statements_done).unwrap_or(0));
            apply_one(
                store,
                token,
                holder.execution_id,
                d,
                from,
                lost,
                &Interrupt::never(),
            )
            .await?;
            format!(
                "the revert of migration {version} re-run from statement {} and finished",
                from.unwrap_or(0) + 1
            )
        }
        Resolution::MarkApplied => {
            store
                .journal_end(token, down()?, HistoryState::Reverted, 0)
                .await?;
            format!("the revert of migration {version} recorded as done without running anything")
        }
        Resolution::Abandon => {
            store.mark_applied(token, holder.execution_id, m).await?;
            format!("the revert of migration {version} was forgotten; the migration is applied")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::units;
    use crate::migration::{Dialect, Migration};

    fn m(sql: &str, dialect: Dialect) -> Migration {
        Migration::from_sql(1, "m", sql, dialect).unwrap()
    }

    #[test]
    fn data_changes_batch_up_to_the_limit_and_everything_else_runs_alone() {
        let my = m(
            "INSERT INTO t VALUES (1); INSERT INTO t VALUES (2); INSERT INTO t VALUES (3);\n\
             CREATE TABLE u (id int); UPDATE t SET a = 1; DELETE FROM t;",
            Dialect::MySql,
        );
        assert_eq!(units(&my, 0, 1000), [0..3, 3..4, 4..6]);
        assert_eq!(units(&my, 0, 2), [0..2, 2..3, 3..4, 4..6]);
        assert_eq!(units(&my, 1, 1000), [1..3, 3..4, 4..6]);
        // Batches of one where the engine asks for them.
        assert_eq!(units(&my, 4, 1), [4..5, 5..6]);
        // Nothing to run in an empty file.
        assert!(units(&m("-- nothing", Dialect::MySql), 0, 1000).is_empty());
    }

    #[test]
    fn statements_of_the_files_own_transaction_are_never_batched() {
        let my = m(
            "INSERT INTO t VALUES (1); START TRANSACTION; INSERT INTO t VALUES (2); INSERT INTO t VALUES (3); COMMIT; INSERT INTO t VALUES (4); INSERT INTO t VALUES (5);",
            Dialect::MySql,
        );
        assert_eq!(units(&my, 0, 1000), [0..1, 1..2, 2..3, 3..4, 4..5, 5..7]);
    }

    #[test]
    fn a_batch_stays_under_a_megabyte() {
        let row = format!("INSERT INTO t VALUES ('{}');\n", "x".repeat(300 * 1024));
        let my = m(&row.repeat(7), Dialect::MySql);
        let u = units(&my, 0, 1000);
        assert_eq!(u, [0..3, 3..6, 6..7]);
    }
}
