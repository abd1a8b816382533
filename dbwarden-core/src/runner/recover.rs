//! Recover: what a dead predecessor left half-done is settled before any pending migration
//! runs (docs/design.md §10.2): completed, re-run, resumed, or stopped for a human, by
//! [`crate::recovery::decide`] and the configured policy, each step fenced and audited.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{MigrateOptions, Progress, placeholder};
use crate::migration::Migration;
use crate::recovery::{self, RecoveryDecision};
use crate::{
    AuditRecord, Error, FencingToken, HistoryRow, HistoryState, HolderInfo, LockState, LostSignal,
    MigrationLock, MigrationStore, RecoveryPolicy, StatusRow,
};

/// What recovery settled.
pub(super) struct Recovered {
    /// Where a half-done migration resumes (its first statement not yet run).
    pub resume_from: HashMap<i64, usize>,
    /// Every version that counts as applied: the history's, and those recovery completed.
    pub applied: HashSet<i64>,
    /// What recovery did, one line each (said to the user, and in the report).
    pub notes: Vec<String>,
}

/// Who writes recovery's records: the holder's store, fenced by its token, watched by its
/// lost signal.
pub(super) struct Writer<'a> {
    pub store: &'a mut (dyn MigrationStore + 'static),
    pub token: FencingToken,
    pub lost: &'a LostSignal,
    pub holder: &'a HolderInfo,
    pub lock: &'a dyn MigrationLock,
}

/// Under the lock, with the history just read: settle every unfinished row, in version order,
/// before anything pending runs. `previous` is the status row as the holder found it.
pub(super) async fn recover(
    w: Writer<'_>,
    previous: Option<&StatusRow>,
    history: &[HistoryRow],
    migrations: &[Migration],
    files: &BTreeMap<i64, &Migration>,
    opts: &MigrateOptions,
    progress: &dyn Progress,
) -> Result<Recovered, Error> {
    let Writer {
        store,
        token,
        lost,
        holder,
        lock,
    } = w;
    let mut recovered: Vec<String> = Vec::new();
    let mut resume_from: HashMap<i64, usize> = HashMap::new();
    let mut applied_versions: HashSet<i64> = history
        .iter()
        .filter(|r| r.state == HistoryState::Applied)
        .map(|r| r.version)
        .collect();
    let half_done: Vec<&HistoryRow> = history.iter().filter(|r| r.state.is_unfinished()).collect();
    let dead_predecessor = previous.filter(|p| p.state.is_active());
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
            let rec = AuditRecord::new(lock.namespace(), "needs_review", holder, reason.clone());
            lost.check()?;
            store.audit(&rec).await?;
            return Err(Error::NeedsReview { version, reason });
        }
        let transactional = store.transactional();
        for row in half_done {
            let file = files.get(&row.version).copied();
            if row.is_interrupted_revert() {
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
            // A statement in flight that left something the server can show (a concurrent
            // index build: its index) is judged by that, not by its text alone.
            let in_flight = match file {
                Some(m) if row.state == HistoryState::Running && m.checksum == row.checksum => {
                    let done = usize::try_from(row.statements_done).unwrap_or(0);
                    super::index_builds::in_flight(store, m, done).await?
                }
                _ => recovery::InFlight::Unknown,
            };
            let decision =
                recovery::decide_seeing(row, file, transactional, opts.recovery_policy, in_flight);
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
                            holder,
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
                        AuditRecord::new(lock.namespace(), "needs_review", holder, reason.clone());
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
    Ok(Recovered {
        resume_from,
        applied: applied_versions,
        notes: recovered,
    })
}
