//! Look: whether anything is pending, read without the exclusive lock (under the shared lock,
//! or in one consistent snapshot), so that replicas with nothing to do exit without queueing.

#[allow(unused_imports)]
use super::*;

/// The report of a run that found nothing to do by looking.
pub(super) fn looked(snapshot: &crate::lock::Snapshot, started: Instant, look: Look) -> Outcome {
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
pub(super) async fn look_snapshot(
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
pub(super) struct Looked {
    pub(super) outcome: Option<Outcome>,
    pub(super) history_empty: Option<bool>,
    /// The history the look read (when it read one).
    pub(super) history: Option<Vec<HistoryRow>>,
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
pub(super) async fn look_shared(
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

pub(super) async fn read_through(lock: &dyn MigrationLock) -> Result<crate::lock::Snapshot, Error> {
    Ok(crate::lock::Snapshot {
        status: lock.observe().await?.status,
        history: lock.read_history().await?,
    })
}

/// Every migration up to `to` is applied with the checksum of its file, no history row is
/// half-done or without a file, and the status row shows no run in progress or under review.
pub(super) fn nothing_to_do(
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
