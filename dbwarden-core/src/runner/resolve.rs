//! Resolve: a human's decision about a migration halted for review (`dbwarden resolve`).

use super::*;

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
    lock_retry: crate::table_locks::LockRetry,
) -> Result<String, Error> {
    let lease = wait::acquire(lock, holder, wait, heartbeat).await?;
    hold(lock, migrations, events, lease, async |lease| {
        resolve_locked(lease, lock, migrations, version, resolution, lock_retry).await
    })
    .await
}

pub(super) async fn resolve_locked(
    lease: &mut Lease,
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    version: i64,
    resolution: Resolution,
    lock_retry: crate::table_locks::LockRetry,
) -> Result<String, Error> {
    let token = lease.fencing_token();
    let lost = lease.lost_signal();
    let holder = lease.holder().clone();
    let halted_at = lease
        .previous()
        .filter(|p| p.state == LockState::NeedsReview)
        .and_then(|p| p.migration_version);
    let never = Interrupt::never();
    let h = Holding {
        token,
        holder: &holder,
        lock,
        lost: &lost,
        interrupt: &never,
        unsent: lease.unsent_mark(),
        retry: lock_retry,
        retry_until: None,
    };
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
    if let Some(r) = row.as_ref().filter(|r| r.is_interrupted_revert()) {
        let done = resolve_revert(store, &h, file, r, resolution).await?;
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
            let mut from = row
                .as_ref()
                .filter(|_| !store.transactional() || !m.mode.is_transaction())
                .map(|r| usize::try_from(r.statements_done).unwrap_or(0));
            // A concurrent index build that was in flight and whose index is valid finished:
            // only its record is missing (docs/design.md §9).
            if let (Some(done), Some(r)) = (from, row.as_ref())
                && r.state == HistoryState::Running
                && super::index_builds::in_flight(store, m, done).await?
                    == crate::recovery::InFlight::Finished
            {
                from = Some(done + 1);
            }
            apply_one(store, &h, m, from).await?;
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
pub(super) async fn resolve_revert(
    store: &mut dyn MigrationStore,
    h: &Holding<'_>,
    file: Option<&Migration>,
    row: &HistoryRow,
    resolution: Resolution,
) -> Result<String, Error> {
    let (token, holder) = (h.token, h.holder);
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
            apply_one(store, h, d, from).await?;
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
