//! Apply: one pending migration, in one transaction where it may, else statement by statement
//! (batched where that is safe), each write fenced by the holder's token.

pub(crate) use super::holding::Holding;
use super::*;
use crate::lease::Unsent;

/// Apply one migration: in one transaction where the engine and the file allow it, otherwise
/// statement by statement with the journal, starting at `from`. While journaling, `unsent`
/// says which statement has surely not been sent yet (cleared just before each send), so a
/// lease lost between two sends is reported as "stopped before statement N" instead of "N may
/// have been in flight" (`runner::finish`, docs/design.md §10.3). Before a concurrent index
/// build is sent, an INVALID index an earlier attempt of it left is dropped
/// ([`super::index_builds::clear_leftovers`]). An attempt that ran out of `lock_timeout` did
/// nothing and is retried ([`super::table_locks`]).
pub(crate) async fn apply_one(
    store: &mut dyn MigrationStore,
    h: &Holding<'_>,
    m: &Migration,
    from: Option<usize>,
) -> Result<(), Error> {
    let (token, execution_id, lost, interrupt, unsent) = (
        h.token,
        h.holder.execution_id,
        h.lost,
        h.interrupt,
        &h.unsent,
    );
    let t0 = Instant::now();
    let bounds = h.retry.for_file(m.lock_timeout, m.statement_timeout);
    let mut waits = super::table_locks::Waits::new(store, bounds).await?;
    if store.transactional() && m.mode.is_transaction() && from.is_none() {
        let r = loop {
            let r = waits
                .watch(h, store.apply_in_transaction(token, execution_id, m, lost))
                .await;
            match r {
                Err(e @ Error::LockTimeout { .. }) => {
                    if let Err(e) = waits.pause_or_give_up(h, e).await {
                        break Err(e);
                    }
                }
                other => break other,
            }
        };
        return match r {
            Ok(()) => Ok(()),
            // Only a statement that failed (or gave up on a table lock) was surely rolled
            // back; any other error (a lost connection at COMMIT, a fenced write) leaves the
            // outcome to recovery.
            Err(e) if !rolled_back(&e) || lost.is_lost() => Err(e),
            Err(e) => {
                // Rolled back: leave a FAILED row so history shows the attempt.
                let ms = t0.elapsed().as_millis() as i64;
                store.journal_begin(token, execution_id, m, 0).await?;
                store
                    .journal_end(token, m, HistoryState::Failed, ms)
                    .await?;
                Err(e)
            }
        };
    }
    let at = |index, begun| {
        Some(Unsent {
            version: m.version,
            down: m.direction == crate::migration::Direction::Down,
            index,
            begun,
        })
    };
    // A fresh migration has no row a predecessor left: while its RUNNING row is being written
    // nothing of it has been sent either. A resumed one's row is recovery's until ours lands,
    // and a down file's version still has its APPLIED row until the revert's lands.
    if from.is_none() && m.direction == crate::migration::Direction::Up {
        unsent.set(at(0, false));
    }
    let from = from.unwrap_or(0);
    store.journal_begin(token, execution_id, m, from).await?;
    unsent.set(at(from, true));
    for unit in units(m, from, store.batch_limit()) {
        lost.check()?;
        // Inside a transaction the file opened, stopping would leave it half-done on the
        // session: an interrupt is honoured once the file's transaction has ended.
        if interrupt.is_set() && !m.inside_own_transaction(unit.start) {
            // Stopped cleanly before this statement: FAILED tells recovery it was not in flight.
            let ms = t0.elapsed().as_millis() as i64;
            store
                .journal_end(token, m, HistoryState::Failed, ms)
                .await?;
            unsent.set(None);
            return Err(Error::Interrupted);
        }
        if unit.len() == 1 {
            super::index_builds::clear_leftovers(store, h, m, unit.start).await?;
        }
        let undone = waits.bound_unit(store, m, unit.start).await?;
        let last = unit.end - 1;
        // A retry is safe only where a timed-out attempt left nothing and the journal still
        // points before it: not inside the file's own transaction (the whole transaction is
        // gone, and the file resumes at its BEGIN on the next run), nor for a statement outside
        // any transaction that may have done part of its work.
        let retries = undone && !m.inside_own_transaction(unit.start);
        let r = loop {
            unsent.set(None);
            let r = if unit.len() == 1 {
                waits
                    .watch(h, store.journal_statement(token, m, unit.start, lost))
                    .await
            } else {
                waits
                    .watch(h, store.journal_batch(token, m, unit.clone(), lost))
                    .await
            };
            match r {
                Err(e @ Error::LockTimeout { .. }) if retries => {
                    // It did nothing: the row still points before it.
                    unsent.set(at(unit.start, true));
                    match waits.pause_or_give_up(h, e).await {
                        Ok(()) => lost.check()?,
                        Err(e) => break Err(e),
                    }
                }
                other => break other,
            }
        };
        if let Err(e) = r {
            // FAILED tells recovery "not in flight, resume here": true only when the statement
            // itself failed. An error after it ran (recording it timed out, the connection
            // dropped, the lease was lost) leaves the row RUNNING, so recovery decides by the
            // statement's idempotency instead of re-running it blindly.
            if rolled_back(&e) && !lost.is_lost() {
                let ms = t0.elapsed().as_millis() as i64;
                store
                    .journal_end(token, m, HistoryState::Failed, ms)
                    .await?;
                unsent.set(None);
            }
            return Err(e);
        }
        // Inside the file's own transaction a later write would join that transaction and die
        // with the session: nothing is marked there, and the row stays as the journal left it.
        if !m.inside_own_transaction_after(last) {
            unsent.set(at(last + 1, true));
        }
    }
    lost.check()?;
    // Every statement ran: a row left RUNNING with all of them done is completed by recovery,
    // and the final write below may land, so nothing is stepped back from here on.
    unsent.set(None);
    let ms = t0.elapsed().as_millis() as i64;
    store.journal_end(token, m, m.done_state(), ms).await
}

/// The statement failed, or gave up waiting for a table lock: nothing of it stayed.
fn rolled_back(e: &Error) -> bool {
    matches!(e, Error::MigrationFailed { .. } | Error::LockTimeout { .. })
}

/// Most bytes of SQL one journaled batch holds: a batch is one round trip and one commit, so a
/// 100 000-row data migration costs a hundred commits, not 100 000, and stays well under any
/// server's packet limit.
pub(super) const BATCH_BYTES: usize = 1 << 20;

/// The journal's units from statement `from` on: runs of up to `limit` batchable statements
/// outside the file's own transactions (each run committed together with its journal entry),
/// every other statement alone.
pub(super) fn units(m: &Migration, from: usize, limit: usize) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    let mut bytes = 0;
    for index in from..m.statements.len() {
        let s = &m.statements[index];
        let joins = s.batchable && !m.inside_own_transaction(index);
        let len = s.span.len();
        match out.last_mut() {
            Some(last)
                if joins
                    && last.end == index
                    && m.statements[last.start].batchable
                    && !m.inside_own_transaction(last.start)
                    && last.len() < limit
                    && bytes + len <= BATCH_BYTES =>
            {
                last.end = index + 1;
                bytes += len;
            }
            _ => {
                out.push(index..index + 1);
                bytes = len;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::units;
    use crate::migration::{Dialect, Migration};

    fn m(sql: &str, dialect: Dialect) -> Migration {
        Migration::from_sql(1, "m", sql, dialect).unwrap()
    }

    #[test]
    fn data_changes_batch_up_to_the_limit_and_everything_else_runs_alone() {
        let my = m(
            "INSERT INTO t VALUES (1); INSERT INTO t VALUES (2); INSERT INTO t VALUES (3);\n\
             CREATE TABLE u (id int); UPDATE t SET a = 1; DELETE FROM t;",
            Dialect::MySql,
        );
        assert_eq!(units(&my, 0, 1000), [0..3, 3..4, 4..6]);
        assert_eq!(units(&my, 0, 2), [0..2, 2..3, 3..4, 4..6]);
        assert_eq!(units(&my, 1, 1000), [1..3, 3..4, 4..6]);
        // Batches of one where the engine asks for them.
        assert_eq!(units(&my, 4, 1), [4..5, 5..6]);
        // Nothing to run in an empty file.
        assert!(units(&m("-- nothing", Dialect::MySql), 0, 1000).is_empty());
    }

    #[test]
    fn statements_of_the_files_own_transaction_are_never_batched() {
        let my = m(
            "INSERT INTO t VALUES (1); START TRANSACTION; INSERT INTO t VALUES (2); INSERT INTO t VALUES (3); COMMIT; INSERT INTO t VALUES (4); INSERT INTO t VALUES (5);",
            Dialect::MySql,
        );
        assert_eq!(units(&my, 0, 1000), [0..1, 1..2, 2..3, 3..4, 4..5, 5..7]);
    }

    #[test]
    fn a_batch_stays_under_a_megabyte() {
        let row = format!("INSERT INTO t VALUES ('{}');\n", "x".repeat(300 * 1024));
        let my = m(&row.repeat(7), Dialect::MySql);
        let u = units(&my, 0, 1000);
        assert_eq!(u, [0..3, 3..6, 6..7]);
    }
}
