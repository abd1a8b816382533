//! Acquire: take the exclusive lock (waiting as asked) or decline, and end a holding: the
//! status row left as the run ended, then the release.

#[allow(unused_imports)]
use super::*;

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
pub(super) fn restored_state(lease: &Lease) -> (LockState, Option<Migration>) {
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

/// Do `work` under `lease`, then end the holding: the final state, the release, and the
/// `ended` event (after `took`, sent here too). Every store call is bounded by its engine where
/// a server that answers can be waited for; a link that holds (no answer, no error) is not, nor
/// is a migration statement. So the work races the lost-signal: once the lock is lost the work
/// in flight is abandoned, as if the process had been killed, the command ends with
/// [`Error::Lost`] (exit 4), and the next holder's recovery judges what it left. `biased`: work
/// that finishes in the same poll keeps its own result. See docs/design.md §7.2.
pub(crate) async fn hold<T>(
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    events: &crate::events::Events,
    mut lease: Lease,
    work: impl AsyncFnOnce(&mut Lease) -> Result<T, Error>,
) -> Result<T, Error> {
    let watch = events.took(lock, &lease);
    let lost = lease.lost_signal();
    let result = tokio::select! {
        biased;
        r = work(&mut lease) => r,
        reason = lost.lost() => Err(Error::Lost(format!(
            "{reason}; the statement or write in flight was abandoned"
        ))),
    };
    let released = finish(lease, migrations, &result).await;
    watch.ended(migrations, &result, &released);
    released?;
    result
}

/// Write the final state and release; after a lost lease, write nothing but the step back of
/// [`step_back`]. A usage error after the lock was taken (changed checksum, nothing to resolve)
/// puts back what was there.
pub(super) async fn finish<T>(
    mut lease: Lease,
    migrations: &[Migration],
    result: &Result<T, Error>,
) -> Result<(), Error> {
    if result.is_err() {
        step_back(&mut lease, migrations).await;
    }
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

/// Longest the step back may take: a server that answers does in milliseconds; a link that
/// holds must not keep a holder that lost its lock from exiting (docs/design.md §7.2).
const STEP_BACK_BOUND: Duration = Duration::from_millis(500);

/// A journaled migration stopped between two sends (its lease lost, or a write before the next
/// statement failed): its row says `RUNNING` at a statement this holder knows it never sent.
/// One fenced write turns it into `FAILED` there ("stopped before statement N"), so the next
/// holder resumes instead of judging the statement's idempotency -- and halting for review on
/// an INSERT that never ran. The fence decides: once a successor holds the token the write is
/// refused and the row stays as the journal left it, which recovery handles as before. A row
/// whose `RUNNING` write may still be in flight (a fresh migration) is written first, so the
/// step back never depends on which of the two writes landed. Bounded by
/// [`STEP_BACK_BOUND`]; any failure leaves the row to recovery. See docs/design.md §10.3.
async fn step_back(lease: &mut Lease, migrations: &[Migration]) {
    let Some(at) = lease.unsent_mark().get() else {
        return;
    };
    lease.unsent_mark().set(None);
    let Some(m) = migrations
        .iter()
        .find(|m| m.version == at.version)
        .and_then(|m| if at.down { m.down.as_deref() } else { Some(m) })
    else {
        return;
    };
    let token = lease.fencing_token();
    let execution_id = lease.holder().execution_id;
    let Some(store) = lease.store() else { return };
    let write = async {
        if !at.begun {
            store
                .journal_begin(token, execution_id, m, at.index)
                .await?;
        }
        store.journal_end(token, m, HistoryState::Failed, 0).await
    };
    match tokio::time::timeout(STEP_BACK_BOUND, write).await {
        Ok(Ok(())) => tracing::info!(
            "migration {}: stopped before statement {}, which was never sent; recorded FAILED there, so the next run resumes it",
            m.version,
            at.index + 1
        ),
        Ok(Err(e)) => tracing::debug!(
            "migration {}: could not record that statement {} was never sent ({e}); recovery judges the row",
            m.version,
            at.index + 1
        ),
        Err(_) => tracing::debug!(
            "migration {}: recording that statement {} was never sent took over {}; recovery judges the row",
            m.version,
            at.index + 1,
            crate::duration::human(STEP_BACK_BOUND)
        ),
    }
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
