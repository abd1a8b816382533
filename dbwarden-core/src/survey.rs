//! Every migration of the folder and of the history, side by side, each with its standing: what
//! `dbwarden status` shows, what `dbwarden validate` judges, and what `dbwarden wait` waits for.
//! Nothing here takes the lock or writes anything.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::migration::Migration;
use crate::{Error, HistoryRow, HistoryState, LockState, MigrationLock, Observation, Wait, wait};

/// Where one migration stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Standing {
    /// Applied, and its file is as it was then.
    Applied,
    /// Not applied yet, above every applied version: the next `migrate` runs it.
    Pending,
    /// Not applied yet, below the highest applied version (a branch merged late): `migrate`
    /// refuses it unless out-of-order migrations are allowed.
    OutOfOrder,
    /// Applied, but its file changed since: `migrate` refuses to go on.
    Changed,
    /// Applied, and its file is gone from the folder.
    Missing,
    /// A run is applying it now, or died while it did (the next `migrate` recovers it).
    Running,
    /// Its last run stopped on an error (the next `migrate` runs it again).
    Failed,
    /// Recovery halted on it: a human decides with `dbwarden resolve`.
    NeedsReview,
    /// Undone by `dbwarden revert`: the next `migrate` applies it again.
    Reverted,
}

impl Standing {
    /// Every standing, in the order reports list them.
    pub const ALL: [Standing; 9] = [
        Standing::Applied,
        Standing::Pending,
        Standing::OutOfOrder,
        Standing::Changed,
        Standing::Missing,
        Standing::Running,
        Standing::Failed,
        Standing::NeedsReview,
        Standing::Reverted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Applied => "applied",
            Standing::Pending => "pending",
            Standing::OutOfOrder => "out_of_order",
            Standing::Changed => "changed",
            Standing::Missing => "missing",
            Standing::Running => "running",
            Standing::Failed => "failed",
            Standing::NeedsReview => "needs_review",
            Standing::Reverted => "reverted",
        }
    }
}

impl std::fmt::Display for Standing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One migration: its file, its history row, or both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub version: i64,
    pub description: String,
    pub standing: Standing,
    /// The file in the folder (`None`: missing).
    pub file: Option<String>,
    /// The file's checksum now.
    pub checksum: Option<String>,
    /// The checksum recorded when it ran (`None`: never ran).
    pub recorded_checksum: Option<String>,
    /// The history row's state, as stored.
    pub history_state: Option<HistoryState>,
    pub execution_id: Option<Uuid>,
    pub fencing_token: Option<u64>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub duration_ms: Option<i64>,
    pub statements_done: Option<i64>,
    pub statements_total: Option<i64>,
}

/// Set the folder beside the history. `review`: the version the status row names as
/// NEEDS_REVIEW, if it does.
pub fn survey(files: &[Migration], history: &[HistoryRow], review: Option<i64>) -> Vec<Entry> {
    let highest = history
        .iter()
        .filter(|r| r.state == HistoryState::Applied)
        .map(|r| r.version)
        .max();
    let rows: BTreeMap<i64, &HistoryRow> = history.iter().map(|r| (r.version, r)).collect();
    let by_file: BTreeMap<i64, &Migration> = files.iter().map(|m| (m.version, m)).collect();
    let versions: std::collections::BTreeSet<i64> =
        rows.keys().chain(by_file.keys()).copied().collect();
    versions
        .into_iter()
        .map(|version| {
            let file = by_file.get(&version).copied();
            let row = rows.get(&version).copied();
            let standing = match (file, row) {
                _ if review == Some(version) && row.is_some() => Standing::NeedsReview,
                (_, Some(r)) if r.state == HistoryState::Running => Standing::Running,
                (_, Some(r)) if r.state == HistoryState::Failed => Standing::Failed,
                (_, Some(r)) if r.state == HistoryState::Reverted => Standing::Reverted,
                (None, _) => Standing::Missing,
                (Some(m), Some(r)) if m.checksum != r.checksum => Standing::Changed,
                (Some(_), Some(_)) => Standing::Applied,
                (Some(_), None) if highest.is_some_and(|h| version < h) => Standing::OutOfOrder,
                (Some(_), None) => Standing::Pending,
            };
            Entry {
                version,
                description: file
                    .map(|m| m.description.clone())
                    .or_else(|| row.map(|r| r.description.clone()))
                    .unwrap_or_default(),
                standing,
                file: file.map(|m| m.path.display().to_string()),
                checksum: file.map(|m| m.checksum.clone()),
                recorded_checksum: row.map(|r| r.checksum.clone()),
                history_state: row.map(|r| r.state),
                execution_id: row.and_then(|r| r.execution_id),
                fencing_token: row.map(|r| r.fencing_token),
                started_at: row.and_then(|r| r.started_at),
                finished_at: row.and_then(|r| r.finished_at),
                duration_ms: row.and_then(|r| r.duration_ms),
                statements_done: row.map(|r| r.statements_done),
                statements_total: row.map(|r| r.statements_total),
            }
        })
        .collect()
}

/// The version the status row names as halted for review, if it does.
pub fn halted_version(obs: &Observation) -> Option<i64> {
    obs.status
        .as_ref()
        .filter(|s| s.state == LockState::NeedsReview)
        .and_then(|s| s.migration_version)
}

/// What `validate` accepts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rules {
    /// Out-of-order files are applied in version order (`allow_out_of_order`): not a problem.
    pub allow_out_of_order: bool,
    /// Pending migrations are a problem too (after a deploy: "is this database up to date?").
    pub no_pending: bool,
}

/// Why `entry` makes the folder and the history disagree, if it does: one line, with what to do.
pub fn problem(entry: &Entry, rules: Rules) -> Option<String> {
    let v = entry.version;
    let file = entry.file.as_deref().unwrap_or("");
    Some(match entry.standing {
        Standing::Applied => return None,
        Standing::Pending if rules.no_pending => {
            format!("migration {v} ({file}) is pending: run `dbwarden migrate`")
        }
        Standing::Pending => return None,
        Standing::Reverted if rules.no_pending => {
            format!("migration {v} ({file}) was reverted: `dbwarden migrate` applies it again")
        }
        Standing::Reverted => return None,
        Standing::OutOfOrder if rules.allow_out_of_order => return None,
        Standing::OutOfOrder => format!(
            "migration {v} ({file}) is pending below the highest applied version: `migrate` refuses it; renumber it above, or allow out-of-order migrations (--allow-out-of-order)"
        ),
        Standing::Changed => format!(
            "migration {v} ({file}) changed after it was applied: restore the file (`migrate` refuses to go on)"
        ),
        Standing::Missing => format!(
            "migration {v} ({}) is applied but its file is missing from the folder",
            entry.description
        ),
        Standing::Running => format!(
            "migration {v} is RUNNING: a run is applying it, or died doing so (`dbwarden lock-status` tells which)"
        ),
        Standing::Failed => format!(
            "migration {v} ({file}) failed on its last run: fix it, then `dbwarden migrate` runs it again"
        ),
        Standing::NeedsReview => format!(
            "migration {v} is halted for review: `dbwarden resolve {v} --retry | --mark-applied | --abandon`"
        ),
    })
}

/// Why an INVALID index (a concurrent build killed or failed) is a problem, naming the
/// migration whose statement builds it and what to do about it (docs/design.md §9).
pub fn invalid_index_problem(
    index: &crate::InvalidIndex,
    files: &[Migration],
    history: &[HistoryRow],
) -> String {
    let builder = files.iter().find(|m| {
        (0..m.statements.len()).any(|i| {
            crate::migration::IndexBuild::of(m.statement(i), m.dialect)
                .is_some_and(|b| b.leaves(&index.name))
        })
    });
    let head = format!(
        "index {index} is INVALID (a concurrent build was killed or failed): every write maintains it and no query uses it"
    );
    let Some(m) = builder else {
        return format!(
            "{head}; no migration in the folder builds it: drop it (DROP INDEX CONCURRENTLY) or rebuild it (REINDEX INDEX CONCURRENTLY)"
        );
    };
    let (v, file) = (m.version, m.path.display());
    let applied = history
        .iter()
        .any(|r| r.version == v && r.state == HistoryState::Applied);
    if applied {
        format!(
            "{head}; migration {v} ({file}) builds it and is recorded APPLIED over it: drop the index (DROP INDEX CONCURRENTLY) and build it again in a new migration"
        )
    } else {
        format!(
            "{head}; migration {v} ({file}) builds it: `dbwarden migrate` (or `dbwarden resolve {v} --retry`) drops it and builds it anew"
        )
    }
}

/// What [`wait_until_applied`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitOutcome {
    /// Every migration waited for is applied.
    Ready { applied: usize },
    /// The time ran out; these versions were still not applied.
    TimedOut { waiting_for: Vec<i64> },
}

/// Block, without taking the lock, until every migration of `files` (or every one up to
/// `until`) is applied. Between looks the engine's release signal wakes it early where there is
/// one (PostgreSQL's NOTIFY); otherwise it polls with a capped backoff.
///
/// Errors: [`Error::ChangedChecksum`] when an applied file it waits for changed,
/// [`Error::NeedsReview`] when a migration it waits for is halted for review, and a usage
/// error for out-of-order files `migrate` would refuse (unless `allow_out_of_order`) -- waiting
/// longer cannot help with any of them.
///
/// `wake`: another lock whose release also ends a pause (the Redis lease a guarded `migrate`
/// holds around the database lock: its pub/sub wakes gates on engines that signal nothing).
pub async fn wait_until_applied(
    lock: &dyn MigrationLock,
    wake: Option<&dyn MigrationLock>,
    files: &[Migration],
    until: Option<i64>,
    timeout: Duration,
    allow_out_of_order: bool,
) -> Result<WaitOutcome, Error> {
    // A link that stops answering mid-read ends the gate within its timeout plus one
    // connect_timeout (exit 2, naming the server), as it ends any other wait.
    let r = wait::within_wait(
        lock,
        Wait::Up(timeout),
        wait_loop(lock, wake, files, until, timeout, allow_out_of_order),
    )
    .await;
    lock.stop_waiting().await;
    if let Some(w) = wake {
        w.stop_waiting().await;
    }
    r
}

/// How often a gate reads the status row for a halt when no row it waits for is half-done (a
/// halt over a rolled-back transaction names a migration with no history row).
const REVIEW_CHECK: Duration = Duration::from_secs(1);

async fn wait_loop(
    lock: &dyn MigrationLock,
    wake: Option<&dyn MigrationLock>,
    files: &[Migration],
    until: Option<i64>,
    timeout: Duration,
    allow_out_of_order: bool,
) -> Result<WaitOutcome, Error> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_review_check: Option<tokio::time::Instant> = None;
    let wanted = |m: &&Migration| until.is_none_or(|u| m.version <= u);
    let mut backoff = wait::Backoff::new(Duration::from_millis(25), lock.max_poll_interval());
    loop {
        // A server restarting or a network blip is waited out like a busy lock; at the
        // deadline the last such error is the answer (unreachable: exit 2, with the host).
        let history = match lock.read_history().await {
            Ok(h) => h,
            Err(e)
                if (e.is_unreachable() || e.is_busy())
                    && tokio::time::Instant::now() < deadline =>
            {
                tracing::info!("wait: cannot read the history yet ({e}); trying again");
                let pause = backoff
                    .next_pause()
                    .min(deadline - tokio::time::Instant::now());
                tokio::time::sleep(pause).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let entries = survey(files, &history, None);
        let mut waiting_for = Vec::new();
        let mut half_done = false;
        for m in files.iter().filter(wanted) {
            let Some(e) = entries.iter().find(|e| e.version == m.version) else {
                continue;
            };
            match e.standing {
                Standing::Applied => {}
                Standing::Changed => {
                    return Err(Error::ChangedChecksum {
                        version: m.version,
                        file: m.path.display().to_string(),
                        recorded: e.recorded_checksum.clone().unwrap_or_default(),
                        current: m.checksum.clone(),
                    });
                }
                Standing::OutOfOrder if !allow_out_of_order => {
                    return Err(Error::usage(format!(
                        "migration {} ({}) is pending below the highest applied version: `migrate` refuses it, so waiting cannot end; renumber it, or allow out-of-order migrations",
                        m.version,
                        m.path.display()
                    )));
                }
                Standing::Running | Standing::Failed => {
                    half_done = true;
                    waiting_for.push(m.version);
                }
                _ => waiting_for.push(m.version),
            }
        }
        if waiting_for.is_empty() {
            return Ok(WaitOutcome::Ready {
                applied: files.iter().filter(wanted).count(),
            });
        }
        // Halted for review on one of ours: nobody will apply it until a human decides.
        let now = tokio::time::Instant::now();
        if half_done || last_review_check.is_none_or(|t| now - t >= REVIEW_CHECK) {
            last_review_check = Some(now);
            let obs = lock.observe().await?;
            if let Some(v) = halted_version(&obs).filter(|v| waiting_for.contains(v)) {
                return Err(Error::NeedsReview {
                    version: v,
                    reason: "a migration this replica waits for is halted for review".into(),
                });
            }
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(WaitOutcome::TimedOut { waiting_for });
        }
        let pause = backoff.next_pause().min(deadline - now);
        match wake {
            // Either signal ends the pause.
            Some(w) => {
                tokio::select! {
                    _ = crate::lock::pause(lock, pause) => {}
                    _ = crate::lock::pause(w, pause) => {}
                }
            }
            None => crate::lock::pause(lock, pause).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::{Dialect, from_bytes};

    fn file(version: i64, sql: &str) -> Migration {
        from_bytes(
            version,
            format!("m{version}"),
            format!("{version:04}_m{version}.sql").into(),
            sql,
            Dialect::Sqlite,
        )
        .unwrap()
    }

    fn row(m: &Migration, state: HistoryState) -> HistoryRow {
        HistoryRow {
            version: m.version,
            description: m.description.clone(),
            checksum: m.checksum.clone(),
            state,
            statements_total: 1,
            statements_done: 1,
            execution_id: None,
            fencing_token: 1,
            started_at: None,
            finished_at: None,
            duration_ms: None,
        }
    }

    #[test]
    fn every_standing_is_told_apart() {
        let files = [
            file(1, "SELECT 1;"),
            file(2, "SELECT 2;"),
            file(3, "SELECT 3;"),
            file(5, "SELECT 5;"),
            file(6, "SELECT 6;"),
            file(7, "SELECT 7;"),
            file(9, "SELECT 9;"),
        ];
        let gone = file(4, "SELECT 4;");
        let mut changed = row(&files[1], HistoryState::Applied);
        changed.checksum = "0".repeat(64);
        let history = vec![
            row(&files[0], HistoryState::Applied),
            changed,
            row(&gone, HistoryState::Applied),
            row(&files[3], HistoryState::Failed),
            row(&files[4], HistoryState::Running),
            row(&files[5], HistoryState::Applied),
        ];
        let got: Vec<(i64, Standing)> = survey(&files, &history, None)
            .iter()
            .map(|e| (e.version, e.standing))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, Standing::Applied),
                (2, Standing::Changed),
                (3, Standing::OutOfOrder),
                (4, Standing::Missing),
                (5, Standing::Failed),
                (6, Standing::Running),
                (7, Standing::Applied),
                (9, Standing::Pending),
            ]
        );
        let halted = survey(&files, &history, Some(6));
        assert_eq!(halted[5].standing, Standing::NeedsReview);
    }

    #[test]
    fn validate_rules() {
        let files = [file(1, "SELECT 1;"), file(2, "SELECT 2;")];
        let history = vec![row(&files[1], HistoryState::Applied)];
        let entries = survey(&files, &history, None);
        assert_eq!(entries[0].standing, Standing::OutOfOrder);
        assert!(problem(&entries[0], Rules::default()).is_some());
        let lenient = Rules {
            allow_out_of_order: true,
            ..Rules::default()
        };
        assert!(problem(&entries[0], lenient).is_none());
        assert!(problem(&entries[1], Rules::default()).is_none());

        let pending = survey(&files, &[], None);
        assert!(pending.iter().all(|e| e.standing == Standing::Pending));
        assert!(problem(&pending[0], Rules::default()).is_none());
        let strict = Rules {
            no_pending: true,
            ..Rules::default()
        };
        assert!(problem(&pending[0], strict).unwrap().contains("pending"));
    }
}
