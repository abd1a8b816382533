//! The journal (docs/design.md §4.4, §9–10), written once for every SQL engine.
//!
//! An engine gives a [`JournalSession`]: the session that holds its lock, able to open and end a
//! transaction, check the fencing token, send a migration's text, and write one of dbwarden's
//! rows in its own dialect. Everything else — when the token is checked and whether the status
//! row stays locked until the commit, where a lost lock stops the work, that a migration and its
//! history row commit together, that the file's own `COMMIT` is recorded before it runs, that
//! nothing of a failed transaction stays open on the session, which statements share a
//! transaction with their journal entry — is decided here, once, by the [`MigrationStore`]
//! every `JournalSession` is.
//!
//! The model is refinery's `AsyncTransaction`: the protocol is the provided part, the engine
//! the small required part.

use std::ops::Range;

use async_trait::async_trait;
use uuid::Uuid;

use crate::migration::{Migration, Statement};
use crate::store::{
    AuditRecord, HistoryRow, HistoryState, IndexBuilds, LockState, MigrationStore, SqlxCompat,
};
use crate::{Error, FencingToken, LostSignal};

/// What a transaction the journal opens is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tx {
    /// dbwarden's own bookkeeping: short, bounded by the lock's own timeouts.
    Short,
    /// A migration's statements, then their journal entry: the statements are bounded only by
    /// [`MigrationStore::bound_statements`]; what the journal writes after them is short again.
    Migration,
}

/// How a write is fenced (see [`JournalSession::write`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// Written only while the stored token is still this one, and the status row kept from
    /// being bumped by a new holder until the transaction ends: the transaction commits next,
    /// or is short.
    Hold(FencingToken),
    /// Written only while the stored token is still this one, without keeping the status row
    /// locked: a long transaction (the file's own) goes on after it, and the heartbeat, on
    /// another session, must not wait for it. Used only inside the file's own transaction,
    /// where an engine whose lock is its session (MySQL's named lock: no one else can hold it
    /// while the session lives, and `unlock` kills the session before it bumps the token) may
    /// take the live session as the check.
    Check(FencingToken),
    /// Not checked again: an earlier write in the same transaction holds the fence. An engine
    /// without transactions (ClickHouse) checks every write anyway.
    Held,
}

impl Fence {
    /// The token the write must match, if it checks one.
    pub fn token(self) -> Option<FencingToken> {
        match self {
            Fence::Hold(t) | Fence::Check(t) => Some(t),
            Fence::Held => None,
        }
    }
}

/// Which transaction a unit of a migration's text runs in, as the journal knows it (see
/// [`JournalSession::execute`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Within {
    /// None: each statement commits by itself (a statement run alone and recorded after).
    Nothing,
    /// A transaction the journal opened ([`JournalSession::begin`]) that ends with the unit's
    /// entry.
    Journal,
    /// The file's own transaction: the unit opens it, runs inside it or ends it.
    /// `open_after`: it is still open when the unit has run, so the writes that follow join it
    /// (until a later unit commits or rolls it back).
    File { open_after: bool },
}

/// One of dbwarden's rows, as the journal writes it.
#[derive(Debug, Clone, Copy)]
pub enum Write<'a> {
    /// The status row names `m` as the migration in hand. Outside any transaction the engine
    /// may write it as cheaply as it can (it is informational; the next commit makes it
    /// durable), but never without the fence.
    Working(&'a Migration),
    /// The status row's state, and with a migration which one it is on.
    State(LockState, Option<&'a Migration>),
    /// A whole history row (insert or replace).
    History(Entry<'a>),
    /// `statements_done` of `m`'s history row. The row must exist: a fenced write that
    /// matches no row is fenced out, or the row was deleted by hand (an error naming it).
    Done { m: &'a Migration, done: usize },
    /// `m`'s history row closed: its final state, finished now, its duration, and with
    /// `done` its `statements_done` (a count the journal did not write alone).
    End {
        m: &'a Migration,
        state: HistoryState,
        duration_ms: i64,
        done: Option<usize>,
    },
    /// `m`'s `_sqlx_migrations` row, as sqlx writes it, when the session mirrors to sqlx
    /// (nothing otherwise). `ran`: the migration just ran, so a row already there is an error
    /// (someone else ran it too); otherwise an existing row is left as it is.
    Mirror {
        m: &'a Migration,
        nanos: i64,
        ran: bool,
    },
    /// The history row of this version removed.
    Forget(i64),
    /// An audit row appended. Never fenced (it records what happened, whoever holds the lock)
    /// and written as it comes: in the transaction open on the session, else alone.
    Audit(&'a AuditRecord),
}

/// A whole history row as a holder writes it: `m` in `state` with `done` statements done, by
/// the holder of `token` in run `execution_id`, started now, finished now when `state` is
/// APPLIED or REVERTED.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    pub m: &'a Migration,
    pub state: HistoryState,
    pub done: usize,
    pub execution_id: Uuid,
    pub token: FencingToken,
    pub duration_ms: Option<i64>,
}

impl<'a> Entry<'a> {
    pub fn new(
        m: &'a Migration,
        state: HistoryState,
        done: usize,
        execution_id: Uuid,
        token: FencingToken,
        duration_ms: Option<i64>,
    ) -> Self {
        Entry {
            m,
            state,
            done,
            execution_id,
            token,
            duration_ms,
        }
    }
}

/// The primitive a SQL engine implements: its lock session, as the journal uses
/// it. Each method is one dialect-level step; none decides when it is called.
#[async_trait]
pub trait JournalSession: Send {
    /// Open a transaction of `kind`.
    async fn begin(&mut self, kind: Tx) -> Result<(), Error>;

    /// End the transaction open on the session by its `outcome`: `Ok`, commit it; `Err(cause)`,
    /// roll back whatever transaction is open (dbwarden's or the file's own) and return the
    /// error to report, never `Ok`: `cause`, or the lock lost if the session itself ended.
    async fn end(&mut self, outcome: Result<(), Error>) -> Result<(), Error>;

    /// Fail with [`Error::Lost`] unless the stored token is still `token`. `hold`: inside a
    /// transaction, keep the status row from being bumped until it ends.
    async fn check_fence(&mut self, token: FencingToken, hold: bool) -> Result<(), Error>;

    /// Send statements `range` of `m` as one text (from the start of the first to the end of
    /// the last; the engine may send the whole body when `range` covers every statement, with
    /// the comments around them). A failure names the
    /// statement it stopped at ([`Error::MigrationFailed`], or [`Error::LockTimeout`] when a
    /// table-lock bound ran out). `within` says which transaction the text runs in: the
    /// journal decides it, the engine need not read the file's own `BEGIN`/`COMMIT`.
    async fn execute(
        &mut self,
        m: &Migration,
        range: Range<usize>,
        within: Within,
    ) -> Result<(), Error>;

    /// Write `row` in the transaction open on the session (the journal's, or the file's own),
    /// fenced as `fence` says.
    async fn write(&mut self, row: Write<'_>, fence: Fence) -> Result<(), Error>;

    /// Write `row` alone, no transaction being open, atomically with its fence: by default in
    /// a short transaction of its own. An engine that can carry the fence in the statement
    /// itself writes it in one.
    async fn write_alone(&mut self, row: Write<'_>, fence: Fence) -> Result<(), Error> {
        in_transaction(self, Tx::Short, async |s| s.write(row, fence).await).await
    }

    /// Every row of the history table, ordered by version.
    async fn history(&mut self) -> Result<Vec<HistoryRow>, Error>;

    /// Append an audit row ([`Write::Audit`]).
    async fn audit(&mut self, record: &AuditRecord) -> Result<(), Error> {
        self.write(Write::Audit(record), Fence::Held).await
    }

    /// Whether a migration's statements and its history row can commit together. Where DDL
    /// commits by itself (MySQL), they cannot: every migration goes through the journal
    /// statement by statement, the fence is checked before every statement, and the last
    /// statement's count is written with the migration's end (one commit instead of two; a
    /// kill in between leaves it in flight, which recovery judges by its idempotency).
    fn transactional(&self) -> bool {
        true
    }

    /// Whether runs of data changes roll back whole with their journal entry right now (MySQL:
    /// only while every table is InnoDB); when not, they are journaled one by one.
    async fn batches_roll_back_whole(&mut self) -> Result<bool, Error> {
        Ok(true)
    }

    /// See [`MigrationStore::batch_limit`].
    fn batch_limit(&self) -> usize {
        1
    }

    /// Whether migrations recorded APPLIED also get their `_sqlx_migrations` row
    /// ([`Write::Mirror`]), in the same transaction.
    fn mirrors_to_sqlx(&self) -> bool {
        false
    }

    /// Whether the status row may be named inside the transaction a migration runs in. Where
    /// a row written stays locked until the commit and the heartbeat writes that row from
    /// another session, it may not (the heartbeat would wait for the whole migration): the
    /// default names it first, alone. SQLite's writes lock the whole file anyway, and its
    /// heartbeat is the sidecar.
    fn names_migration_in_its_transaction(&self) -> bool {
        false
    }

    /// Whether statement `s`, outside a transaction the file opened, runs in a transaction of
    /// the journal's with its entry (so recovery knows it rolled back), rather than alone and
    /// recorded after. The default: anything that does not refuse a transaction.
    fn journals_in_transaction(&self, s: &Statement) -> bool {
        s.refuses_transaction.is_none()
    }

    /// The most statements and bytes one [`execute`](Self::execute) may carry when a whole
    /// migration runs in one transaction (`None`: no limit; the server's parser cuts it).
    fn text_limit(&self) -> Option<(usize, usize)> {
        None
    }

    /// See [`MigrationStore::sqlx_compat`].
    fn sqlx_compat(&mut self) -> Option<&mut dyn SqlxCompat> {
        None
    }

    /// See [`MigrationStore::index_builds`].
    fn index_builds(&mut self) -> Option<&mut dyn IndexBuilds> {
        None
    }

    /// See [`MigrationStore::bound_statements`].
    async fn bound_statements(
        &mut self,
        _lock_timeout: Option<std::time::Duration>,
        _statement_timeout: Option<std::time::Duration>,
    ) -> Result<(), Error> {
        Ok(())
    }

    /// See [`MigrationStore::session`].
    fn session(&self) -> Option<String> {
        None
    }

    /// See [`MigrationStore::ddl_undone_on_lock_timeout`].
    fn ddl_undone_on_lock_timeout(&self) -> bool {
        false
    }
}

/// `body` in a transaction of `kind`: committed when it succeeds, rolled back when it fails.
pub async fn in_transaction<S: JournalSession + ?Sized, T>(
    s: &mut S,
    kind: Tx,
    body: impl AsyncFnOnce(&mut S) -> Result<T, Error>,
) -> Result<T, Error> {
    s.begin(kind).await?;
    match body(&mut *s).await {
        Ok(v) => s.end(Ok(())).await.map(|()| v),
        Err(e) => Err(roll_back(s, e).await),
    }
}

/// Whatever transaction is open on `s` rolled back after `cause`: the error to report.
async fn roll_back<S: JournalSession + ?Sized>(s: &mut S, cause: Error) -> Error {
    match s.end(Err(cause)).await {
        Err(e) => e,
        // An engine that reports a rollback as a success breaks `end`'s contract.
        Ok(()) => Error::database("a failed transaction was reported as committed"),
    }
}

/// A migration's statements in the units [`JournalSession::text_limit`] allows.
fn text_units(m: &Migration, limit: Option<(usize, usize)>) -> Vec<Range<usize>> {
    let n = m.statements.len();
    let Some((most, bytes_max)) = limit else {
        return (n > 0).then_some(0..n).into_iter().collect();
    };
    let mut out: Vec<Range<usize>> = Vec::new();
    let mut bytes = 0;
    for (i, s) in m.statements.iter().enumerate() {
        match out.last_mut() {
            Some(last) if last.len() < most && bytes + s.span.len() <= bytes_max => {
                last.end = i + 1;
                bytes += s.span.len();
            }
            _ => {
                out.push(i..i + 1);
                bytes = s.span.len();
            }
        }
    }
    out
}

/// Statement `index`, which runs inside a transaction the file opened (or opens or ends it):
/// its entry is written in that transaction — before a `COMMIT`, so a committed transaction is
/// always recorded and an uncommitted one never is; after anything else.
async fn own_transaction_statement<S: JournalSession + ?Sized>(
    s: &mut S,
    token: FencingToken,
    m: &Migration,
    index: usize,
    lost: &LostSignal,
) -> Result<(), Error> {
    let done = index + 1;
    let commits = m.commits_own_transaction(index);
    if commits {
        lost.check()?;
        s.write(Write::Done { m, done }, Fence::Hold(token)).await?;
    }
    if !s.transactional() {
        // The statement may commit by itself (DDL does): it follows a fresh proof.
        s.check_fence(token, false).await?;
    }
    let within = Within::File {
        open_after: m.inside_own_transaction_after(index),
    };
    s.execute(m, index..done, within).await?;
    if commits {
        return Ok(());
    }
    lost.check()?;
    if within == (Within::File { open_after: true }) {
        // The file's transaction goes on: the status row must not stay locked until its end.
        s.write(Write::Done { m, done }, Fence::Check(token)).await
    } else {
        // A ROLLBACK, or a BEGIN the file's transaction did not survive: recorded alone.
        s.write_alone(Write::Done { m, done }, Fence::Hold(token))
            .await
    }
}

/// `m`'s `_sqlx_migrations` row, the migration having just run, in the transaction that
/// records it APPLIED (a row already there rolls it back: someone else ran it too).
async fn mirror_ran<S: JournalSession + ?Sized>(
    s: &mut S,
    m: &Migration,
    nanos: i64,
) -> Result<(), Error> {
    let row = Write::Mirror {
        m,
        nanos,
        ran: true,
    };
    s.write(row, Fence::Held).await
}

/// Every SQL engine's store: the journal protocol over its session.
#[async_trait]
impl<S: JournalSession> MigrationStore for S {
    fn transactional(&self) -> bool {
        JournalSession::transactional(self)
    }

    fn batch_limit(&self) -> usize {
        JournalSession::batch_limit(self)
    }

    fn ddl_undone_on_lock_timeout(&self) -> bool {
        JournalSession::ddl_undone_on_lock_timeout(self)
    }

    fn sqlx_compat(&mut self) -> Option<&mut dyn SqlxCompat> {
        JournalSession::sqlx_compat(self)
    }

    fn index_builds(&mut self) -> Option<&mut dyn IndexBuilds> {
        JournalSession::index_builds(self)
    }

    async fn bound_statements(
        &mut self,
        lock_timeout: Option<std::time::Duration>,
        statement_timeout: Option<std::time::Duration>,
    ) -> Result<(), Error> {
        JournalSession::bound_statements(self, lock_timeout, statement_timeout).await
    }

    fn session(&self) -> Option<String> {
        JournalSession::session(self)
    }

    async fn history(&mut self) -> Result<Vec<HistoryRow>, Error> {
        JournalSession::history(self).await
    }

    async fn set_state(
        &mut self,
        token: FencingToken,
        state: LockState,
        migration: Option<&Migration>,
    ) -> Result<(), Error> {
        let row = Write::State(state, migration);
        self.write_alone(row, Fence::Hold(token)).await
    }

    /// The whole file in one transaction with its history row: the history row is written
    /// after the statements, before the `COMMIT`, with the status row held until then.
    async fn apply_in_transaction(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        if !JournalSession::transactional(self) {
            return Err(Error::usage(format!(
                "migration {}: this engine cannot run a migration in one transaction; the runner journals it statement by statement instead",
                m.version
            )));
        }
        let inside = self.names_migration_in_its_transaction();
        if !inside {
            self.write_alone(Write::Working(m), Fence::Check(token))
                .await?;
        }
        let units = text_units(m, self.text_limit());
        let t0 = std::time::Instant::now();
        in_transaction(self, Tx::Migration, async |s| {
            if inside {
                s.write(Write::Working(m), Fence::Hold(token)).await?;
            }
            for unit in units {
                lost.check()?;
                s.execute(m, unit, Within::Journal).await?;
            }
            // Lost while the statements ran: roll them back with their record.
            lost.check()?;
            let (state, done) = (m.done_state(), m.statements.len());
            let duration_ms = Some(t0.elapsed().as_millis() as i64);
            let row = Entry::new(m, state, done, execution_id, token, duration_ms);
            s.write(Write::History(row), Fence::Hold(token)).await?;
            if state != HistoryState::Applied || !s.mirrors_to_sqlx() {
                return Ok(());
            }
            mirror_ran(s, m, t0.elapsed().as_nanos() as i64).await
        })
        .await
    }

    async fn journal_begin(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
        from: usize,
    ) -> Result<(), Error> {
        in_transaction(self, Tx::Short, async |s| {
            s.write(Write::Working(m), Fence::Hold(token)).await?;
            let row = Entry::new(m, HistoryState::Running, from, execution_id, token, None);
            s.write(Write::History(row), Fence::Held).await
        })
        .await
    }

    async fn journal_statement(
        &mut self,
        token: FencingToken,
        m: &Migration,
        index: usize,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        if m.inside_own_transaction(index) || m.inside_own_transaction_after(index) {
            let r = own_transaction_statement(self, token, m, index, lost).await;
            return match r {
                Ok(()) => Ok(()),
                // Nothing of the file's transaction may stay open on the session.
                Err(e) => Err(roll_back(self, e).await),
            };
        }
        if JournalSession::transactional(self) && self.journals_in_transaction(&m.statements[index])
        {
            return self.journal_batch(token, m, index..index + 1, lost).await;
        }
        // Alone (a concurrent index build, VACUUM; anything where DDL commits by itself),
        // still on the lock session: checked before, recorded after; a statement in flight at
        // a crash is judged by recovery.
        self.check_fence(token, false).await?;
        self.execute(m, index..index + 1, Within::Nothing).await?;
        lost.check()?;
        if !JournalSession::transactional(self) && index + 1 == m.statements.len() {
            // Written with the migration's end (see `JournalSession::transactional`).
            return Ok(());
        }
        let done = index + 1;
        self.write_alone(Write::Done { m, done }, Fence::Hold(token))
            .await
    }

    /// Statements `range` and their entry in one transaction: they commit together or not at
    /// all.
    async fn journal_batch(
        &mut self,
        token: FencingToken,
        m: &Migration,
        range: Range<usize>,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        if range.is_empty() {
            return Ok(());
        }
        if !self.batches_roll_back_whole().await? {
            for index in range {
                self.journal_statement(token, m, index, lost).await?;
            }
            return Ok(());
        }
        lost.check()?;
        in_transaction(self, Tx::Migration, async |s| {
            s.execute(m, range.clone(), Within::Journal).await?;
            // Lost while the statements ran: roll them back with their record.
            lost.check()?;
            let done = range.end;
            s.write(Write::Done { m, done }, Fence::Hold(token)).await
        })
        .await
    }

    async fn journal_end(
        &mut self,
        token: FencingToken,
        m: &Migration,
        state: HistoryState,
        duration_ms: i64,
    ) -> Result<(), Error> {
        // Where the last statement's count was not written alone, the end carries it.
        let done = (!JournalSession::transactional(self) && state == m.done_state())
            .then_some(m.statements.len());
        let row = Write::End {
            m,
            state,
            duration_ms,
            done,
        };
        let r = if state == HistoryState::Applied && self.mirrors_to_sqlx() {
            // APPLIED commits with its `_sqlx_migrations` row.
            in_transaction(self, Tx::Short, async |s| {
                s.write(row, Fence::Hold(token)).await?;
                mirror_ran(s, m, duration_ms.saturating_mul(1_000_000)).await
            })
            .await
        } else {
            self.write_alone(row, Fence::Hold(token)).await
        };
        if let (Err(e), Some(done)) = (&r, done)
            && !e.is_lost()
        {
            // The end was not written, but the last statement did run: its count must not be
            // lost with it, or recovery would take the statement for one in flight.
            let _ = self
                .write_alone(Write::Done { m, done }, Fence::Hold(token))
                .await;
        }
        r
    }

    async fn mark_applied(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
    ) -> Result<(), Error> {
        in_transaction(self, Tx::Short, async |s| {
            let (state, done) = (HistoryState::Applied, m.statements.len());
            let row = Entry::new(m, state, done, execution_id, token, Some(0));
            s.write(Write::History(row), Fence::Hold(token)).await?;
            if !s.mirrors_to_sqlx() {
                return Ok(());
            }
            let mirror = Write::Mirror {
                m,
                nanos: 0,
                ran: false,
            };
            s.write(mirror, Fence::Held).await
        })
        .await
    }

    /// Adopted migrations APPLIED and the halted one RUNNING with the status row naming it for
    /// review, in one transaction: an adoption is recorded whole or not at all.
    async fn record_adopted(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        applied: &[&Migration],
        halted: Option<&Migration>,
    ) -> Result<(), Error> {
        in_transaction(self, Tx::Short, async |s| {
            // The halt first: where rows do not commit together (ClickHouse), a run cut short
            // leaves the review halt, never adopted rows without it.
            let rows = halted
                .map(|m| (m, HistoryState::Running, 0, None))
                .into_iter()
                .chain(
                    applied
                        .iter()
                        .map(|m| (*m, HistoryState::Applied, m.statements.len(), Some(0))),
                );
            let mut fence = Fence::Hold(token);
            for (i, (m, state, done, duration_ms)) in rows.enumerate() {
                let row = Entry::new(m, state, done, execution_id, token, duration_ms);
                s.write(Write::History(row), fence).await?;
                fence = Fence::Held;
                if i == 0
                    && let Some(h) = halted
                {
                    let row = Write::State(LockState::NeedsReview, Some(h));
                    s.write(row, Fence::Held).await?;
                }
            }
            Ok(())
        })
        .await
    }

    async fn forget(&mut self, token: FencingToken, version: i64) -> Result<(), Error> {
        self.write_alone(Write::Forget(version), Fence::Hold(token))
            .await
    }

    async fn audit(&mut self, record: &AuditRecord) -> Result<(), Error> {
        JournalSession::audit(self, record).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn migration(sql: &str) -> Migration {
        Migration::from_sql(1, "t", sql, crate::migration::Dialect::Sqlite).unwrap()
    }

    #[test]
    fn text_units_cut_between_whole_statements() {
        let m = migration("SELECT 1; SELECT 2; SELECT 3;");
        assert_eq!(
            text_units(&m, None),
            std::iter::once(0..3).collect::<Vec<_>>()
        );
        assert_eq!(text_units(&m, Some((2, 1 << 20))), vec![0..2, 2..3]);
        assert_eq!(text_units(&m, Some((10, 12))), vec![0..1, 1..2, 2..3]);
        assert!(text_units(&migration(""), None).is_empty());
    }
}
