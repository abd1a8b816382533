//! `dbwarden revert`: run `.down.sql` files, newest first, under the same lock, fencing, journal,
//! recovery and exit codes as `migrate`. A reverted migration keeps its history row, as
//! REVERTED (with the down file's checksum), until it is applied again.

use std::collections::BTreeMap;

use tokio::time::Instant;

use crate::migration::Migration;
use crate::recovery::{self, RecoveryDecision};
use crate::runner::{
    Applied, Holding, Interrupt, Progress, apply_one, fenced, hold, placeholder, store_of,
};
use crate::wait::{self, Wait};
use crate::{
    AuditRecord, Error, HeartbeatConfig, HistoryRow, HistoryState, HolderInfo, Lease, LockState,
    MigrationLock, RecoveryPolicy,
};

/// How far back to go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Revert every applied migration above this version (which stays applied).
    To(i64),
    /// Revert the newest N applied migrations.
    Steps(usize),
}

/// What `revert` was asked to do.
#[derive(Debug, Clone)]
pub struct RevertOptions {
    pub target: Target,
    pub wait: Wait,
    pub heartbeat: HeartbeatConfig,
    pub recovery_policy: RecoveryPolicy,
    /// Revert a migration although its file changed since it was applied.
    pub allow_changed: bool,
    /// Whether this database may keep sqlx's table too (revert refuses where it does).
    pub sqlx_compat: crate::other_tools::SqlxCompatMode,
    /// Where lock events go (a lock broken or lost, a down file failing).
    pub events: crate::events::Events,
    /// How the down files' statements meet table locks.
    pub lock_retry: crate::table_locks::LockRetry,
}

/// What a finished `revert` did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RevertReport {
    /// Newest first, in the order they ran.
    pub reverted: Vec<Applied>,
    pub fencing_token: u64,
    pub recovered: Vec<String>,
}

/// The migrations to revert, newest first: each applied (or with an interrupted revert),
/// with its file unchanged and a down file. Every refusal is a usage error (exit 2) naming
/// what is wrong, before anything is written. `under_lock`: the history was read holding the
/// lock, so a half-done row is one a run left behind (refused), not one being applied now.
pub fn plan<'a>(
    migrations: &'a [Migration],
    history: &[HistoryRow],
    target: Target,
    allow_changed: bool,
    under_lock: bool,
) -> Result<Vec<&'a Migration>, Error> {
    let files: BTreeMap<i64, &Migration> = migrations.iter().map(|m| (m.version, m)).collect();
    // Applied, or half-way through a revert: both are still (partly) in the schema.
    let mut candidates: Vec<&HistoryRow> = Vec::new();
    for row in history {
        if row.state == HistoryState::Applied || row.is_interrupted_revert() {
            candidates.push(row);
        } else if row.state.is_unfinished() && !under_lock {
            // Maybe a run applying it right now: only the lock can tell. Counted as applied
            // for the checks a read can make; decided under the lock.
            candidates.push(row);
        } else if row.state.is_unfinished() {
            return Err(Error::usage(format!(
                "migration {} is {} in the history (a run stopped in it): run `dbwarden migrate` to recover it, or decide it with `dbwarden resolve {} …`, before a revert; nothing was reverted",
                row.version,
                row.state.as_str(),
                row.version
            )));
        }
    }
    candidates.sort_by_key(|r| std::cmp::Reverse(r.version));
    let chosen: Vec<&HistoryRow> = match target {
        Target::Steps(0) => {
            return Err(Error::usage(
                "--steps 0 reverts nothing: give the number of migrations to revert (1 or more)",
            ));
        }
        Target::Steps(n) if n > candidates.len() => {
            return Err(Error::usage(format!(
                "--steps {n}: only {} migration(s) are applied; nothing was reverted",
                candidates.len()
            )));
        }
        Target::Steps(n) => candidates.into_iter().take(n).collect(),
        Target::To(v) => {
            let known = files.contains_key(&v) || history.iter().any(|r| r.version == v);
            if !known {
                return Err(Error::usage(format!(
                    "--to {v}: no migration has that version (neither a file nor a history row); nothing was reverted"
                )));
            }
            candidates.into_iter().filter(|r| r.version > v).collect()
        }
    };
    let mut out = Vec::with_capacity(chosen.len());
    for row in chosen {
        let v = row.version;
        let Some(m) = files.get(&v).copied() else {
            return Err(Error::usage(format!(
                "migration {v} ({}) is applied but its file is missing: its down file cannot be matched to it; nothing was reverted",
                row.description
            )));
        };
        if m.down.is_none() {
            return Err(Error::usage(format!(
                "migration {v} ({}) has no down file ({}): it cannot be reverted; nothing was reverted",
                m.path.display(),
                down_path(&m.path).display()
            )));
        }
        if row.state == HistoryState::Applied && m.checksum != row.checksum && !allow_changed {
            return Err(Error::ChangedChecksum {
                version: v,
                file: m.path.display().to_string(),
                recorded: row.checksum.clone(),
                current: m.checksum.clone(),
            });
        }
        out.push(m);
    }
    Ok(out)
}

/// Where the down file of the migration at `up` is looked for: `0002_b.up.sql` and
/// `0002_b.sql` both pair with `0002_b.down.sql`.
fn down_path(up: &std::path::Path) -> std::path::PathBuf {
    let name = up
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let lower = name.to_ascii_lowercase();
    let stem_len = if lower.ends_with(".up.sql") {
        name.len() - ".up.sql".len()
    } else {
        name.len().saturating_sub(".sql".len())
    };
    up.with_file_name(format!("{}.down.sql", &name[..stem_len]))
}

/// Take the lock and revert per `opts.target`. The plan is checked on a read before the lock
/// (a refusal touches nothing) and again under it.
pub async fn revert(
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    holder: &HolderInfo,
    opts: &RevertOptions,
    progress: &dyn Progress,
    interrupt: &Interrupt,
) -> Result<RevertReport, Error> {
    let history = lock.read_history().await?;
    let looked: Vec<i64> = plan(migrations, &history, opts.target, opts.allow_changed, false)?
        .iter()
        .map(|m| m.version)
        .collect();
    let acquired = tokio::select! {
        r = wait::acquire(lock, holder, opts.wait, opts.heartbeat) => r,
        _ = interrupt.wait() => Err(Error::Interrupted),
    };
    lock.stop_waiting().await;
    hold(lock, migrations, &opts.events, acquired?, async |lease| {
        revert_locked(lease, lock, migrations, opts, &looked, progress, interrupt).await
    })
    .await
}

async fn revert_locked(
    lease: &mut Lease,
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    opts: &RevertOptions,
    looked: &[i64],
    progress: &dyn Progress,
    interrupt: &Interrupt,
) -> Result<RevertReport, Error> {
    let token = lease.fencing_token();
    let lost = lease.lost_signal();
    let holder = lease.holder().clone();
    if let Some(prev) = lease
        .previous()
        .filter(|p| p.state == LockState::NeedsReview)
        .cloned()
    {
        let version = prev.migration_version.unwrap_or(0);
        let stand_in = placeholder(version, prev.migration_checksum.as_deref());
        let store = store_of(lease)?;
        lost.check()?;
        store
            .set_state(token, LockState::NeedsReview, Some(&stand_in))
            .await?;
        return Err(Error::NeedsReview {
            version,
            reason: "a previous run halted here and nobody has resolved it yet".into(),
        });
    }
    let store = store_of(lease)?;
    let history = store.history().await?; // again, under the lock
    let chosen = plan(migrations, &history, opts.target, opts.allow_changed, true)?;
    // `--steps N` names the newest N as they were when the plan was shown (and confirmed):
    // another run changed the history meanwhile, so those are not the ones anymore.
    let versions: Vec<i64> = chosen.iter().map(|m| m.version).collect();
    if matches!(opts.target, Target::Steps(_)) && versions != looked {
        return Err(Error::usage(format!(
            "the history changed while this revert waited for the lock (it would now revert {versions:?}, not {looked:?}); nothing was reverted: look with `dbwarden status` and run it again"
        )));
    }
    // sqlx's table would still say applied, and the next sqlx-compatible run would believe it.
    if opts.sqlx_compat != crate::other_tools::SqlxCompatMode::Off
        && let Some(compat) = store.sqlx_compat()
        && compat.sqlx_table_exists().await?
    {
        return Err(Error::usage(
            "this database also keeps sqlx's _sqlx_migrations (sqlx_compat), which revert does not update yet: reverting would leave it saying applied; drop that table once no replica runs sqlx's migrator, or set sqlx_compat = \"off\" and delete the reverted versions' rows from it by hand; nothing was reverted",
        ));
    }
    let transactional = store.transactional();
    if chosen.is_empty() {
        // Another run reverted them while this one waited for the lock.
        return Ok(RevertReport {
            reverted: Vec::new(),
            fencing_token: token.0,
            recovered: Vec::new(),
        });
    }
    lost.check()?;
    store.set_state(token, LockState::Running, None).await?;
    let mut reverted = Vec::new();
    let mut recovered = Vec::new();
    let note = |recovered: &mut Vec<String>, msg: String| {
        progress.note(&msg);
        recovered.push(msg);
    };
    let total = chosen.len();
    for (i, m) in chosen.into_iter().enumerate() {
        let down = m.down.as_deref().expect("plan checked the down file");
        let row = history.iter().find(|r| r.version == m.version);
        // An interrupted revert of this migration: recovery decides, with the down file as
        // the file that was running.
        let mut from = None;
        let store = store_of(lease)?;
        if let Some(row) = row.filter(|r| r.is_interrupted_revert()) {
            let what = format!(
                "the revert of migration {} left {} after {} of {} statements",
                m.version,
                row.state.as_str(),
                row.statements_done,
                row.statements_total
            );
            match recovery::decide(row, Some(down), transactional, opts.recovery_policy) {
                RecoveryDecision::Complete => {
                    lost.check()?;
                    store
                        .journal_end(token, down, HistoryState::Reverted, 0)
                        .await?;
                    note(
                        &mut recovered,
                        format!("{what}: every statement had run; marked reverted"),
                    );
                    continue;
                }
                RecoveryDecision::Rerun => {
                    note(
                        &mut recovered,
                        format!("{what}: its transaction rolled back; re-running"),
                    );
                }
                RecoveryDecision::Resume { from: f, forced } => {
                    if forced {
                        let rec = AuditRecord::new(
                            lock.namespace(),
                            "forced_resume",
                            &holder,
                            format!("{what}; resumed at statement {}", f + 1),
                        );
                        lost.check()?;
                        store.audit(&rec).await?;
                    }
                    note(
                        &mut recovered,
                        format!("{what}: resuming at statement {}", f + 1),
                    );
                    from = Some(f);
                }
                RecoveryDecision::NeedsReview { reason } => {
                    lost.check()?;
                    store
                        .set_state(token, LockState::NeedsReview, Some(down))
                        .await?;
                    let reason = format!("its revert: {reason}");
                    let rec =
                        AuditRecord::new(lock.namespace(), "needs_review", &holder, reason.clone());
                    lost.check()?;
                    store.audit(&rec).await?;
                    return Err(Error::NeedsReview {
                        version: m.version,
                        reason,
                    });
                }
            }
        }
        if interrupt.is_set() {
            return Err(Error::Interrupted);
        }
        fenced(lease, lost.check())?;
        progress.started(down, i, total);
        let t0 = Instant::now();
        let h = Holding {
            token,
            holder: &holder,
            lock,
            lost: &lost,
            interrupt,
            unsent: lease.unsent_mark(),
            retry: opts.lock_retry,
            retry_until: None,
        };
        let store = store_of(lease)?;
        let r = apply_one(store, &h, down, from).await;
        fenced(lease, r)?;
        let elapsed = t0.elapsed();
        progress.finished(down, elapsed);
        reverted.push(Applied {
            version: m.version,
            description: m.description.clone(),
            duration_ms: elapsed.as_millis() as u64,
            resumed_from: from,
        });
    }
    let store = store_of(lease)?;
    let rec = AuditRecord::new(
        lock.namespace(),
        "revert",
        &holder,
        format!(
            "reverted {}",
            reverted
                .iter()
                .map(|a| a.version.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    lost.check()?;
    store.audit(&rec).await?;
    Ok(RevertReport {
        reverted,
        fencing_token: token.0,
        recovered,
    })
}
