//! `dbwarden unlock`, decided once for every engine (docs/design.md §7.3). An engine offers two
//! primitives: [`MigrationLock::sight`] reads who holds the lock, and
//! [`MigrationLock::break_lock`] removes that holder's lock -- fencing it out and writing the
//! audit row in the same step -- unless the lock changed hands since the sighting. Core decides
//! the rest: a `--holder` that names someone else, a lock with nothing to unlock, the audit
//! record, and how often to look again when the lock changes hands underneath.

use uuid::Uuid;

use crate::lock::UnlockOutcome;
pub use crate::lock::{Broke, Sighting};
use crate::{AuditRecord, Error, MigrationLock};

/// How often the lock may change hands under one `unlock` before it gives up.
pub const LOOKS: usize = 5;

/// Forcibly free `lock` (`dbwarden unlock`), fencing out its holder. With `expected`, only that
/// execution's lock is removed. `audit` is the record to write, completed here with the holder
/// it concerned.
pub async fn force<L: MigrationLock + ?Sized>(
    lock: &L,
    expected: Option<Uuid>,
    audit: &AuditRecord,
) -> Result<UnlockOutcome, Error> {
    for _ in 0..LOOKS {
        let seen = lock.sight().await?;
        if let Some(want) = expected
            && seen.current != Some(want)
        {
            return Ok(UnlockOutcome::HolderMismatch {
                actual: seen.current,
            });
        }
        if !seen.anything {
            return Ok(UnlockOutcome::NothingToUnlock);
        }
        let record = record(audit, &seen);
        match lock.break_lock(&seen, expected, record).await? {
            Broke::Unlocked => {
                return Ok(UnlockOutcome::Unlocked {
                    holder: seen.holder,
                });
            }
            Broke::Changed => continue,
        }
    }
    Err(Error::database(format!(
        "the {} lock changed hands {LOOKS} times while unlocking; run `dbwarden lock-status` and try again",
        lock.engine()
    )))
}

/// `audit` about the sighted holder: its description where the engine knows it, else its
/// status row's.
fn record(audit: &AuditRecord, seen: &Sighting) -> AuditRecord {
    let record = audit.clone().about(seen.holder.as_ref());
    match (&seen.holder, &seen.row) {
        (None, Some(row)) => record.about_row(row),
        _ => record,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::{Attempt, Observation};
    use crate::{Grade, HistoryRow, HolderInfo, LockState, Namespace, StatusRow};
    use async_trait::async_trait;
    use std::sync::Mutex;

    /// A lock whose sightings and break results are scripted.
    struct Scripted {
        ns: Namespace,
        sightings: Mutex<Vec<Sighting>>,
        breaks: Mutex<Vec<Broke>>,
        written: Mutex<Vec<AuditRecord>>,
    }

    #[async_trait]
    impl MigrationLock for Scripted {
        fn identity(&self) -> crate::Identity<'_> {
            crate::Identity {
                engine: "scripted",
                grade: Grade::A,
                namespace: &self.ns,
                reach: None,
            }
        }

        async fn try_acquire(&self, _: &HolderInfo) -> Result<Attempt, Error> {
            unreachable!()
        }
        async fn observe(&self) -> Result<Observation, Error> {
            unreachable!()
        }
        async fn sight(&self) -> Result<Sighting, Error> {
            Ok(self.sightings.lock().unwrap().remove(0))
        }
        async fn break_lock(
            &self,
            _: &Sighting,
            _: Option<Uuid>,
            record: AuditRecord,
        ) -> Result<Broke, Error> {
            let b = self.breaks.lock().unwrap().remove(0);
            if b == Broke::Unlocked {
                self.written.lock().unwrap().push(record);
            }
            Ok(b)
        }
        async fn audit(&self, _: &AuditRecord) -> Result<(), Error> {
            Ok(())
        }
        async fn read_history(&self) -> Result<Vec<HistoryRow>, Error> {
            Ok(vec![])
        }
        fn dialect(&self) -> Option<crate::migration::Dialect> {
            None
        }
    }

    fn scripted(sightings: Vec<Sighting>, breaks: Vec<Broke>) -> Scripted {
        Scripted {
            ns: Namespace::new("n").unwrap(),
            sightings: Mutex::new(sightings),
            breaks: Mutex::new(breaks),
            written: Mutex::new(vec![]),
        }
    }

    fn held_by(h: &HolderInfo) -> Sighting {
        Sighting {
            current: Some(h.execution_id),
            anything: true,
            holder: Some(h.clone()),
            ..Sighting::default()
        }
    }

    fn audit() -> AuditRecord {
        let me = HolderInfo::current(None, "dbwarden unlock");
        AuditRecord::new(&Namespace::new("n").unwrap(), "forced_unlock", &me, "test")
    }

    #[tokio::test]
    async fn a_holder_named_wrongly_changes_nothing() {
        let h = HolderInfo::current(None, "a");
        let l = scripted(vec![held_by(&h)], vec![]);
        let out = force(&l, Some(Uuid::new_v4()), &audit()).await.unwrap();
        assert_eq!(
            out,
            UnlockOutcome::HolderMismatch {
                actual: Some(h.execution_id)
            }
        );
        assert!(l.written.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_free_lock_has_nothing_to_unlock() {
        let l = scripted(vec![Sighting::default()], vec![]);
        assert_eq!(
            force(&l, None, &audit()).await.unwrap(),
            UnlockOutcome::NothingToUnlock
        );
    }

    #[tokio::test]
    async fn a_lock_that_changed_hands_is_looked_at_again_and_judged_anew() {
        let (a, b) = (
            HolderInfo::current(None, "a"),
            HolderInfo::current(None, "b"),
        );
        // Unlocking a's lock finds b took it meanwhile: with --holder a, b is left alone.
        let l = scripted(vec![held_by(&a), held_by(&b)], vec![Broke::Changed]);
        let out = force(&l, Some(a.execution_id), &audit()).await.unwrap();
        assert_eq!(
            out,
            UnlockOutcome::HolderMismatch {
                actual: Some(b.execution_id)
            }
        );
        // Without --holder, b's lock is the one removed, and the audit names b.
        let l = scripted(
            vec![held_by(&a), held_by(&b)],
            vec![Broke::Changed, Broke::Unlocked],
        );
        let out = force(&l, None, &audit()).await.unwrap();
        assert_eq!(
            out,
            UnlockOutcome::Unlocked {
                holder: Some(b.clone())
            }
        );
        let written = l.written.lock().unwrap();
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].holder_execution_id, Some(b.execution_id));
    }

    #[tokio::test]
    async fn a_lock_changing_hands_without_end_is_an_error_not_a_loop() {
        let a = HolderInfo::current(None, "a");
        let l = scripted(vec![held_by(&a); LOOKS], vec![Broke::Changed; LOOKS]);
        let err = force(&l, None, &audit()).await.unwrap_err();
        assert!(err.to_string().contains("changed hands 5 times"), "{err}");
    }

    #[tokio::test]
    async fn a_holder_known_only_by_its_row_is_named_from_the_row() {
        let row = StatusRow {
            namespace: "n".into(),
            execution_id: Some(Uuid::new_v4()),
            owner_id: Some("ci".into()),
            migration_version: None,
            migration_checksum: None,
            fencing_token: 3,
            host: Some("web-1".into()),
            pid: Some(42),
            db_connection_id: None,
            state: LockState::Running,
            acquired_at: None,
            last_heartbeat_at: None,
            expires_at: None,
            lock_ttl_ms: None,
            heartbeat_interval_ms: None,
        };
        let seen = Sighting {
            current: row.execution_id,
            anything: true,
            row: Some(row.clone()),
            ..Sighting::default()
        };
        let l = scripted(vec![seen], vec![Broke::Unlocked]);
        let out = force(&l, None, &audit()).await.unwrap();
        assert_eq!(out, UnlockOutcome::Unlocked { holder: None });
        let w = l.written.lock().unwrap();
        assert_eq!(w[0].holder_execution_id, row.execution_id);
        assert_eq!(
            w[0].holder_desc.as_deref(),
            Some("host=web-1 pid=42 owner=ci")
        );
    }
}
