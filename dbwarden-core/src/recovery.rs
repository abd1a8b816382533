//! The recovery state machine of docs/design.md §9: what to do with a migration a previous run left
//! RUNNING (its holder died) or FAILED (it stopped on an error).
//!
//! ```text
//! AVAILABLE → RUNNING → COMPLETE
//!                     → FAILED
//!                     → DEAD (found by the next acquirer) → INSPECTING → COMPLETE | RUNNING | NEEDS_REVIEW
//! ```

use serde::{Deserialize, Serialize};

use crate::migration::{Migration, StatementKind, TxControl};
use crate::{Error, HistoryRow, HistoryState};

/// `recovery_policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryPolicy {
    /// Re-run rolled-back transactions; resume non-transactional work only where the in-flight
    /// statement is idempotent; otherwise NEEDS_REVIEW.
    #[default]
    ResumeIdempotent,
    /// Every dead predecessor goes to NEEDS_REVIEW: a human always looks.
    Halt,
    /// Resume regardless (warned and audited).
    Force,
}

impl RecoveryPolicy {
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "resume_idempotent" => Ok(RecoveryPolicy::ResumeIdempotent),
            "halt" => Ok(RecoveryPolicy::Halt),
            "force" => Ok(RecoveryPolicy::Force),
            _ => Err(Error::usage(format!(
                "invalid recovery_policy {s:?}: use resume_idempotent, halt or force"
            ))),
        }
    }
}

/// What INSPECTING decided for one half-done migration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryDecision {
    /// Every statement had completed; only the APPLIED mark is missing.
    Complete,
    /// The transaction rolled back: run the migration again from its first statement.
    Rerun,
    /// Continue at statement `from` (0-based), re-executing it.
    Resume { from: usize, forced: bool },
    /// A human must decide.
    NeedsReview { reason: String },
}

/// What the server shows of the statement a `RUNNING` row points at, where the engine can
/// tell (a concurrent index build: its index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlight {
    /// Nothing to look at: judged by its idempotency.
    Unknown,
    /// It finished (its index is valid): the migration resumes after it.
    Finished,
    /// It did not finish (its index is missing or INVALID; an INVALID one is dropped before
    /// the statement runs again): it is safe to run again.
    NotFinished,
}

/// Decide what to do with `row`, which a previous run left RUNNING or FAILED.
///
/// `transactional_engine`: the engine commits a migration and its history row together.
pub fn decide(
    row: &HistoryRow,
    file: Option<&Migration>,
    transactional_engine: bool,
    policy: RecoveryPolicy,
) -> RecoveryDecision {
    decide_seeing(row, file, transactional_engine, policy, InFlight::Unknown)
}

/// [`decide`], with what the server shows of the statement the row points at.
pub fn decide_seeing(
    row: &HistoryRow,
    file: Option<&Migration>,
    transactional_engine: bool,
    policy: RecoveryPolicy,
    in_flight: InFlight,
) -> RecoveryDecision {
    let Some(m) = file else {
        return RecoveryDecision::NeedsReview {
            reason: "its file is missing from the migrations folder".into(),
        };
    };
    let transactional = transactional_engine && m.mode.is_transaction();
    if transactional {
        // The transaction rolled back: nothing of it exists, so even an edited file is safe to
        // run. (Checked first because a fix to a failed migration is the normal next step.)
        return match policy {
            RecoveryPolicy::Halt if row.state == HistoryState::Running => {
                RecoveryDecision::NeedsReview {
                    reason: "its runner died and recovery_policy = halt".into(),
                }
            }
            _ => RecoveryDecision::Rerun,
        };
    }
    if row.checksum != m.checksum {
        return RecoveryDecision::NeedsReview {
            reason: "its file changed since the interrupted run started".into(),
        };
    }
    let done = usize::try_from(row.statements_done).unwrap_or(0);
    if done >= m.statements.len() {
        return RecoveryDecision::Complete;
    }
    if policy == RecoveryPolicy::Halt {
        return RecoveryDecision::NeedsReview {
            reason: format!(
                "its runner stopped after statement {done} of {} and recovery_policy = halt",
                m.statements.len()
            ),
        };
    }
    // FAILED: the runner saw statement `done` fail (or stopped before it), so it is not in
    // flight. RUNNING: the runner died, and statement `done` may have been half-way — unless
    // it ran inside a transaction together with its journal entry, so that a row still
    // pointing at it means the transaction rolled back: the file's own `BEGIN` (the entries
    // of the statements inside commit with that transaction), or, where DDL is transactional
    // (PostgreSQL, SQLite), any statement that may run in a transaction (each runs in one with
    // its entry, alone or in a batch).
    let statement = &m.statements[done];
    if row.state == HistoryState::Running && in_flight == InFlight::Finished {
        return if done + 1 >= m.statements.len() {
            RecoveryDecision::Complete
        } else {
            RecoveryDecision::Resume {
                from: done + 1,
                forced: false,
            }
        };
    }
    let rolled_back = statement.control == Some(TxControl::Begin)
        || (transactional_engine && statement.batchable);
    let in_flight_ok = row.state == HistoryState::Failed
        || rolled_back
        || in_flight == InFlight::NotFinished
        || StatementKind::of_in(m.statement(done), m.dialect).is_idempotent();
    match (in_flight_ok, policy) {
        (true, _) => RecoveryDecision::Resume {
            from: done,
            forced: false,
        },
        (false, RecoveryPolicy::Force) => RecoveryDecision::Resume {
            from: done,
            forced: true,
        },
        (false, _) => RecoveryDecision::NeedsReview {
            reason: format!(
                "its runner died during statement {} of {}, which is not idempotent ({})",
                done + 1,
                m.statements.len(),
                preview(m.statement(done))
            ),
        },
    }
}

fn preview(stmt: &str) -> String {
    let one = crate::error::one_line(stmt);
    if one.chars().count() > 60 {
        format!("{}…", one.chars().take(60).collect::<String>())
    } else {
        one
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::migration::Dialect;

    fn migration(no_tx: bool, sql: &str) -> Migration {
        migration_in(no_tx, sql, Dialect::Postgres)
    }

    fn migration_in(no_tx: bool, sql: &str, dialect: Dialect) -> Migration {
        let mut text = String::new();
        if no_tx {
            text.push_str("-- dbwarden:no-transaction\n");
        }
        text.push_str(sql);
        Migration::from_sql(3, "m", text, dialect).unwrap()
    }

    fn row(m: &Migration, state: HistoryState, done: i64) -> HistoryRow {
        HistoryRow {
            version: m.version,
            description: m.description.clone(),
            checksum: m.checksum.clone(),
            state,
            statements_total: m.statements.len() as i64,
            statements_done: done,
            execution_id: None,
            fencing_token: 1,
            started_at: None,
            finished_at: None,
            duration_ms: None,
        }
    }

    const MIXED: &str = "CREATE TABLE IF NOT EXISTS a (x int);\nCREATE TABLE IF NOT EXISTS b (x int);\nINSERT INTO a VALUES (1);\nCREATE TABLE IF NOT EXISTS c (x int);";

    #[test]
    fn a_concurrent_build_in_flight_is_judged_by_its_index() {
        let m = migration(
            true,
            "CREATE INDEX CONCURRENTLY i ON t (c);\nCREATE INDEX CONCURRENTLY j ON t (d);",
        );
        let running = row(&m, HistoryState::Running, 0);
        let seeing = |in_flight| {
            decide_seeing(
                &running,
                Some(&m),
                true,
                RecoveryPolicy::ResumeIdempotent,
                in_flight,
            )
        };
        // Not idempotent by its text: a human looks, as before.
        assert!(matches!(
            seeing(InFlight::Unknown),
            RecoveryDecision::NeedsReview { .. }
        ));
        // Its index is valid: it finished, only its record is missing.
        assert_eq!(
            seeing(InFlight::Finished),
            RecoveryDecision::Resume {
                from: 1,
                forced: false
            }
        );
        // Missing or INVALID: run it again (after the INVALID one is dropped).
        assert_eq!(
            seeing(InFlight::NotFinished),
            RecoveryDecision::Resume {
                from: 0,
                forced: false
            }
        );
        let last = row(&m, HistoryState::Running, 1);
        assert_eq!(
            decide_seeing(
                &last,
                Some(&m),
                true,
                RecoveryPolicy::ResumeIdempotent,
                InFlight::Finished
            ),
            RecoveryDecision::Complete
        );
        // halt still means a human looks.
        assert!(matches!(
            decide_seeing(
                &running,
                Some(&m),
                true,
                RecoveryPolicy::Halt,
                InFlight::Finished
            ),
            RecoveryDecision::NeedsReview { .. }
        ));
    }

    #[test]
    fn transactional_migrations_are_rerun() {
        let m = migration(false, MIXED);
        let r = row(&m, HistoryState::Running, 0);
        use RecoveryPolicy::*;
        assert_eq!(
            decide(&r, Some(&m), true, ResumeIdempotent),
            RecoveryDecision::Rerun
        );
        assert_eq!(decide(&r, Some(&m), true, Force), RecoveryDecision::Rerun);
        assert!(matches!(
            decide(&r, Some(&m), true, Halt),
            RecoveryDecision::NeedsReview { .. }
        ));
    }

    #[test]
    fn non_transactional_resume_only_on_idempotent_in_flight() {
        use RecoveryPolicy::*;
        // MySQL: the in-flight INSERT may have committed on its own.
        let m = migration_in(false, MIXED, Dialect::MySql);
        let at = |done, state| decide(&row(&m, state, done), Some(&m), false, ResumeIdempotent);
        assert_eq!(
            at(1, HistoryState::Running),
            RecoveryDecision::Resume {
                from: 1,
                forced: false
            }
        );
        assert!(matches!(
            at(2, HistoryState::Running),
            RecoveryDecision::NeedsReview { .. }
        ));
        assert_eq!(
            at(2, HistoryState::Failed),
            RecoveryDecision::Resume {
                from: 2,
                forced: false
            }
        );
        assert_eq!(at(4, HistoryState::Running), RecoveryDecision::Complete);
        let forced = decide(&row(&m, HistoryState::Running, 2), Some(&m), false, Force);
        assert_eq!(
            forced,
            RecoveryDecision::Resume {
                from: 2,
                forced: true
            }
        );
        let halted = decide(&row(&m, HistoryState::Running, 1), Some(&m), false, Halt);
        assert!(matches!(halted, RecoveryDecision::NeedsReview { .. }));
    }

    #[test]
    fn a_journaled_statement_that_ran_in_a_transaction_with_its_entry_resumes() {
        use RecoveryPolicy::*;
        // PostgreSQL and SQLite run a journaled INSERT in a transaction with its journal entry:
        // a row still pointing at it means it rolled back.
        for dialect in [Dialect::Postgres, Dialect::Sqlite] {
            let m = migration_in(true, MIXED, dialect);
            let d = decide(
                &row(&m, HistoryState::Running, 2),
                Some(&m),
                true,
                ResumeIdempotent,
            );
            assert_eq!(
                d,
                RecoveryDecision::Resume {
                    from: 2,
                    forced: false
                },
                "{dialect:?}"
            );
        }
        // A statement that cannot run in a transaction is judged by its idempotency.
        let m = migration(
            false,
            "CREATE TABLE a (x int);\nCREATE INDEX CONCURRENTLY i ON a (x);",
        );
        assert!(matches!(
            decide(
                &row(&m, HistoryState::Running, 1),
                Some(&m),
                true,
                ResumeIdempotent
            ),
            RecoveryDecision::NeedsReview { .. }
        ));
        // The file's own BEGIN: the block's entries commit with it, so it rolled back.
        let m = migration(
            false,
            "INSERT INTO a VALUES (1);\nBEGIN;\nINSERT INTO a VALUES (2);\nCOMMIT;",
        );
        assert_eq!(
            decide(
                &row(&m, HistoryState::Running, 1),
                Some(&m),
                true,
                ResumeIdempotent
            ),
            RecoveryDecision::Resume {
                from: 1,
                forced: false
            }
        );
        let my = migration_in(
            false,
            "START TRANSACTION;\nINSERT INTO a VALUES (2);\nCOMMIT;",
            Dialect::MySql,
        );
        assert_eq!(
            decide(
                &row(&my, HistoryState::Running, 0),
                Some(&my),
                false,
                ResumeIdempotent
            ),
            RecoveryDecision::Resume {
                from: 0,
                forced: false
            }
        );
    }

    #[test]
    fn non_transactional_engine_treats_every_file_as_journaled() {
        let m = migration(false, MIXED);
        let d = decide(
            &row(&m, HistoryState::Running, 2),
            Some(&m),
            false,
            RecoveryPolicy::ResumeIdempotent,
        );
        assert!(matches!(d, RecoveryDecision::NeedsReview { .. }));
    }

    #[test]
    fn changed_or_missing_files_need_review() {
        let m = migration(true, MIXED);
        let mut r = row(&m, HistoryState::Running, 1);
        r.checksum = "0".repeat(64);
        assert!(matches!(
            decide(&r, Some(&m), true, RecoveryPolicy::Force),
            RecoveryDecision::NeedsReview { .. }
        ));
        assert!(matches!(
            decide(&r, None, true, RecoveryPolicy::Force),
            RecoveryDecision::NeedsReview { .. }
        ));
    }
}
