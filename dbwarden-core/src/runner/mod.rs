//! The runner: `migrate` and `resolve`, in the order of work of docs/design.md §10.2. Engines only answer
//! the [`MigrationStore`] calls; every decision about what to run is made here.
//!
//! In parts: [`look`] (is anything pending, without the exclusive lock), [`acquire`] (take the
//! lock or decline), [`recover`] (settle what a dead predecessor left), [`apply`] (run what is
//! pending, each migration fenced), [`sqlx_compat`] (a database sqlx-cli also migrates), and
//! [`resolve`] (a human's decision about a halted migration). This file holds the order of work.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::BusyInfo;
use crate::events::Events;
use crate::migration::Migration;
use crate::wait::{self, Wait};
use crate::{
    AuditRecord, Error, FencingToken, HeartbeatConfig, HistoryRow, HistoryState, HolderInfo, Lease,
    LockState, LostSignal, MigrationLock, MigrationStore, RecoveryPolicy,
};

mod acquire;
mod apply;
mod holding;
mod index_builds;
mod interrupt;
mod look;
mod recover;
mod resolve;
mod sqlx_compat;
mod table_locks;
mod within;

pub use acquire::{Acquired, acquire_or_decline, finish_command};
pub(crate) use acquire::{fenced, hold, placeholder, store_of};
pub(crate) use apply::{Holding, apply_one};
pub use interrupt::Interrupt;
use look::*;
pub use resolve::{Resolution, resolve};
use sqlx_compat::{applied_by_sqlx_meanwhile, sqlx_handshake};
pub use within::migrate_within;

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
    /// Interoperate with sqlx's migrator (see [`crate::other_tools::SqlxCompatMode`]).
    pub sqlx_compat: crate::other_tools::SqlxCompatMode,
    /// Where lock events go (a lock broken or lost, a halt for review, a failed migration).
    pub events: Events,
    /// How migration statements meet table locks (`lock_timeout`, `lock_retries`).
    pub lock_retry: crate::table_locks::LockRetry,
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
            lock_retry: settings.lock_retry(),
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
                        Some(true) => crate::other_tools::refuse_if_other_tools(lock).await,
                        None => crate::other_tools::refuse_unadopted(lock).await,
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
            crate::other_tools::refuse_unadopted(lock).await?;
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
    let retry_until = deadline;
    let report = hold(lock, migrations, &opts.events, lease, async |lease| {
        run_locked(
            lease,
            lock,
            migrations,
            opts,
            progress,
            interrupt,
            retry_until,
        )
        .await
    })
    .await?;
    Ok(Outcome::Done(Report {
        elapsed_ms: started.elapsed().as_millis() as u64,
        ..report
    }))
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

async fn run_locked(
    lease: &mut Lease,
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    opts: &MigrateOptions,
    progress: &dyn Progress,
    interrupt: &Interrupt,
    retry_until: Option<Instant>,
) -> Result<Report, Error> {
    let token = lease.fencing_token();
    let lost = lease.lost_signal();
    let holder = lease.holder().clone();
    let previous = lease.previous().cloned();
    let files: BTreeMap<i64, &Migration> = migrations.iter().map(|m| (m.version, m)).collect();

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

    let recovered = recover::recover(
        recover::Writer {
            store,
            token,
            lost: &lost,
            holder: &holder,
            lock,
        },
        previous.as_ref(),
        &history,
        migrations,
        &files,
        opts,
        progress,
    )
    .await?;
    let (resume_from, applied_versions, recovered) =
        (recovered.resume_from, recovered.applied, recovered.notes);
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
        let h = Holding {
            token,
            holder: &holder,
            lock,
            lost: &lost,
            interrupt,
            unsent: lease.unsent_mark(),
            retry: opts.lock_retry,
            retry_until,
        };
        let store = store_of(lease)?;
        let r = apply_one(store, &h, m, from).await;
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
