//! Table locks met by migration statements, for one migration (see [`crate::table_locks`]):
//! the bound set on the session, who blocks an attempt that waits, and the pause or the end
//! after an attempt that ran out of `lock_timeout`.

use std::time::Duration;

use tokio::time::Instant;

use super::holding::Holding;
use crate::migration::Migration;
use crate::table_locks::LockRetry;
use crate::{Error, MigrationStore};

/// One migration's dealings with table locks.
pub(super) struct Waits {
    lock_timeout: Option<Duration>,
    statement_timeout: Option<Duration>,
    /// The lock bound the session has now.
    current: Option<Duration>,
    /// The engine's name for the session the statements run on (for who blocks it).
    session: Option<String>,
    /// Attempts that ran out of `lock_timeout` so far.
    attempts: u32,
    /// Who blocked the last attempt, as the engine describes each session.
    blockers: Vec<String>,
    /// A schema change outside a transaction that the lock timeout stops did nothing
    /// ([`MigrationStore::ddl_undone_on_lock_timeout`]).
    ddl_undone: bool,
}

impl Waits {
    /// Set the migration's bounds (`(lock_timeout, statement_timeout)`, `None` = unbounded) on
    /// the store's session.
    pub(super) async fn new(
        store: &mut dyn MigrationStore,
        bounds: (Option<Duration>, Option<Duration>),
    ) -> Result<Waits, Error> {
        let (lock_timeout, statement_timeout) = bounds;
        store
            .bound_statements(lock_timeout, statement_timeout)
            .await?;
        Ok(Waits {
            lock_timeout,
            statement_timeout,
            current: lock_timeout,
            session: store.session(),
            attempts: 0,
            blockers: Vec::new(),
            ddl_undone: store.ddl_undone_on_lock_timeout(),
        })
    }

    /// Before statement `index` of `m` is sent alone or as the first of a batch; returns
    /// whether a lock timeout there leaves nothing done: it runs in a transaction (with its
    /// journal entry, or the file's own), or it is a single schema change on an engine where
    /// such a change stopped by the timeout did nothing (MySQL). Only such a statement is
    /// bounded: any other that runs outside a transaction (a concurrent index build, `DETACH …
    /// CONCURRENTLY`, a `CALL` that commits) may have done part of its work when a timeout
    /// stops it -- a concurrent build's wait for older transactions would turn into an INVALID
    /// index -- so it waits as long as the server lets it.
    pub(super) async fn bound_unit(
        &mut self,
        store: &mut dyn MigrationStore,
        m: &Migration,
        index: usize,
    ) -> Result<bool, Error> {
        let in_transaction = m.statements[index].batchable || m.inside_own_transaction(index);
        let undone = in_transaction || (self.ddl_undone && single_ddl(m, index));
        let want = if undone { self.lock_timeout } else { None };
        if want != self.current {
            store.bound_statements(want, self.statement_timeout).await?;
            self.current = want;
        }
        Ok(undone)
    }

    /// One attempt. If it still runs when most of its `lock_timeout` is gone, the engine is
    /// asked (on a session of its own) which sessions block it, for the retry's log line.
    pub(super) async fn watch<T>(
        &mut self,
        h: &Holding<'_>,
        attempt: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let (Some(limit), Some(session)) = (self.current, self.session.clone()) else {
            return attempt.await;
        };
        let probe = async {
            tokio::time::sleep(limit.saturating_sub(limit / 5)).await;
            tokio::time::timeout(limit.max(Duration::from_secs(2)), h.lock.blockers(&session))
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default()
        };
        tokio::pin!(attempt);
        tokio::pin!(probe);
        let mut seen: Option<Vec<String>> = None;
        loop {
            tokio::select! {
                biased;
                r = &mut attempt => {
                    // The last attempt's probe may come too late to see anyone: the names an
                    // earlier one saw stand until a later one sees others.
                    if let Some(b) = seen.filter(|b| !b.is_empty()) {
                        self.blockers = b;
                    }
                    return r;
                }
                b = &mut probe, if seen.is_none() => seen = Some(b),
            }
        }
    }

    /// After an attempt that ran out of `lock_timeout` (`e`): pause and return `Ok` for the
    /// next attempt, or, past `lock_retries` or `--wait`, give up with `e` naming the attempts
    /// and who blocked the last one. Each retry logs one line saying so.
    pub(super) async fn pause_or_give_up(
        &mut self,
        h: &Holding<'_>,
        e: Error,
    ) -> Result<(), Error> {
        self.attempts += 1;
        let seed = (h.holder.execution_id.as_u128() as u64).rotate_left(self.attempts);
        let pause = LockRetry::pause(self.attempts, seed);
        let blockers = if self.blockers.is_empty() {
            String::new()
        } else {
            format!("; blocked by {}", self.blockers.join(", "))
        };
        let in_time = h.retry_until.is_none_or(|u| Instant::now() + pause < u);
        let Error::LockTimeout {
            version,
            file,
            statement,
            total,
            message,
            ..
        } = e
        else {
            return Err(e);
        };
        if self.attempts > h.retry.retries || !in_time {
            return Err(Error::LockTimeout {
                version,
                file,
                statement,
                total,
                message,
                attempts: format!(" in {} attempt(s)", self.attempts),
                blockers,
            });
        }
        tracing::warn!(
            "migration {version}: statement {statement} of {total} waited {} for a table lock{blockers}; retry {} of {} in {}",
            self.current.map_or("long".into(), crate::duration::human),
            self.attempts,
            h.retry.retries,
            crate::duration::human(pause)
        );
        tokio::select! {
            _ = tokio::time::sleep(pause) => Ok(()),
            reason = h.lost.lost() => Err(Error::Lost(reason)),
            _ = h.interrupt.wait() => Err(Error::Interrupted),
        }
    }
}

/// Statement `index` of `m` is one schema change (`CREATE`, `ALTER`, `DROP`, `RENAME`,
/// `TRUNCATE`), not a piece holding several statements (a `DELIMITER` block).
fn single_ddl(m: &Migration, index: usize) -> bool {
    use crate::migration::{mode::head_words, statement_spans};
    let text = m.statement(index);
    let words = head_words(text, m.dialect, 1);
    matches!(
        words.first().map(String::as_str),
        Some("CREATE" | "ALTER" | "DROP" | "RENAME" | "TRUNCATE")
    ) && !(text.contains(';') && statement_spans(text, m.dialect).len() > 1)
}
