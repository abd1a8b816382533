//! The holder's writes to the ClickHouse tables (see `tables.rs` for their layout). ClickHouse
//! has no transactions, so every migration is journaled statement by statement.
//!
//! Fencing: `dbwarden_fence` gets `max + 1` on every acquire (only the holder writes it, so the
//! read-then-append is safe). Before every write and every migration statement the holder re-reads
//! the fence and its lock table in one request: the stored max token must still be its own and
//! the lock table must still name its execution id, or the write is refused with `Error::Lost`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use dbwarden_core::migration::Migration;
use dbwarden_core::{
    Entry, Error, Fence, FencingToken, HistoryRow, HistoryState, HolderInfo, JournalSession,
    LockState, Tx, Within, Write,
};

use crate::lock::LockTable;
use crate::server::{ChError, Server, code, render_statement};
use crate::tables::{FENCE_TABLE, StatusWrite, append_status, insert_audit, read_history};

/// The tables, as the holder writes them.
pub struct ClickHouseStore {
    pub(crate) lock: LockTable,
    pub(crate) namespace: String,
    pub(crate) history_table: String,
    pub(crate) holder: HolderInfo,
    pub(crate) token: FencingToken,
    pub(crate) seq: Arc<AtomicU64>,
    pub(crate) acquired_at: u32,
    pub(crate) ttl_s: u64,
    /// Server time each journaled migration started (for its later rows).
    pub(crate) started: HashMap<i64, u32>,
    /// Server time at the last fence check.
    pub(crate) now: u32,
}

impl ClickHouseStore {
    fn server(&self) -> &Server {
        &self.lock.server
    }

    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst)
    }

    /// Re-read the fence and the lock table in one request; returns the server time.
    async fn check_fence(&self, token: FencingToken) -> Result<u32, Error> {
        let s = self.server();
        let sql = format!(
            "SELECT toUInt64((SELECT max(token) FROM {} WHERE namespace = ?)) AS token, \
             toUInt64((SELECT count() FROM {} WHERE kind = 'holder' AND execution_id = ?)) AS mine, \
             toUInt32(now()) AS now",
            s.table(FENCE_TABLE),
            self.lock.qualified()
        );
        let q = s
            .query(&sql)
            .bind(&self.namespace)
            .bind(self.holder.execution_id.to_string());
        let rows: Vec<(u64, u64, u32)> = match s.fetch(q).await {
            Ok(r) => r,
            Err(e) if e.is_gone() => {
                return Err(Error::Lost(format!(
                    "fenced out: the lock table {} is gone (broken as stale, or force-unlocked)",
                    self.lock.qualified()
                )));
            }
            Err(e) => return Err(self.held_error(e)),
        };
        let (stored, mine, now) = rows.first().copied().unwrap_or_default();
        if stored != token.0 {
            return Err(Error::Lost(format!(
                "fenced out: this run holds token {token}, the fence now has {stored}"
            )));
        }
        if mine == 0 {
            return Err(Error::Lost(format!(
                "fenced out: the lock table {} now belongs to another execution",
                self.lock.qualified()
            )));
        }
        Ok(now)
    }

    pub(crate) async fn status(
        &self,
        state: LockState,
        m: Option<&Migration>,
    ) -> Result<(), Error> {
        self.status_write(state, m)
            .await
            .map_err(|e| self.held_error(e))
    }

    /// The claim's first status row: written while the lease is being taken, so a server
    /// that cannot be reached is reported as unreachable (exit 2), not as a lost lock.
    pub(crate) async fn first_status(&self) -> Result<(), Error> {
        self.status_write(LockState::Running, None)
            .await
            .map_err(|e| self.server().error(e))
    }

    async fn status_write(&self, state: LockState, m: Option<&Migration>) -> Result<(), ChError> {
        let session = self.lock.qualified();
        let w = StatusWrite {
            namespace: &self.namespace,
            holder: &self.holder,
            token: self.token.0,
            seq: self.next_seq(),
            state,
            migration: m.map(|m| (m.version, m.checksum.as_str())),
            session: &session,
            acquired_at: self.acquired_at,
            ttl_s: self.ttl_s,
        };
        append_status(self.server(), &w).await
    }

    async fn history_row(&self, r: &HistoryWrite<'_>) -> Result<(), Error> {
        let s = self.server();
        let sql = format!(
            "INSERT INTO {} (version, description, checksum, state, statements_total, statements_done, \
             execution_id, fencing_token, started_at, finished_at, duration_ms, deleted, seq) \
             SELECT toInt64(?), ?, ?, ?, toInt64(?), toInt64(?), ?, toUInt64(?), toDateTime(toUInt32(?)), \
             toDateTime(toUInt32(?)), toInt64(?), toUInt8(?), toUInt64(?)",
            s.table(&self.history_table)
        );
        let q = s
            .query(&sql)
            .bind(r.version)
            .bind(r.description)
            .bind(r.checksum)
            .bind(r.state.as_str())
            .bind(r.total)
            .bind(r.done as i64)
            .bind(self.holder.execution_id.to_string())
            .bind(self.token.0)
            .bind(r.started)
            .bind(r.finished)
            .bind(r.duration_ms)
            .bind(u8::from(r.deleted))
            .bind(self.next_seq());
        s.insert(q).await.map_err(|e| self.held_error(e))
    }

    /// A request of the holder failed. Losing contact with the server (it restarted, the
    /// network dropped) means the lease can no longer be renewed: the run has lost its lock
    /// and stops (exit 4), writing nothing more; the next run recovers from the journal. Any
    /// other failure is reported as it is.
    fn held_error(&self, e: ChError) -> Error {
        let s = self.server();
        match e {
            ChError::Unreachable(why, _) => Error::Lost(format!(
                "lost contact with {} while holding the lease ({why}); the next run recovers",
                s.target
            )),
            e if e.is(code::QUORUM_TIMEOUT) => Error::Lost(format!(
                "a host of cluster `{}` did not confirm a write in time ({e}); this run stops here, the next run recovers",
                s.cluster.as_deref().unwrap_or_default()
            )),
            e if e.is(code::TOO_FEW_LIVE_REPLICAS) => Error::Lost(format!(
                "a host of cluster `{}` is down ({e}): dbwarden's state is written to every host, so this run stops here, nothing written; the next run recovers once every host is back",
                s.cluster.as_deref().unwrap_or_default()
            )),
            e => s.error(e),
        }
    }
}

/// One history row to append.
struct HistoryWrite<'a> {
    version: i64,
    description: &'a str,
    checksum: &'a str,
    total: i64,
    state: HistoryState,
    done: usize,
    started: u32,
    finished: u32,
    duration_ms: i64,
    deleted: bool,
}

impl<'a> HistoryWrite<'a> {
    fn of(m: &'a Migration, state: HistoryState, done: usize) -> Self {
        HistoryWrite {
            version: m.version,
            description: &m.description,
            checksum: &m.checksum,
            total: m.statements.len() as i64,
            state,
            done,
            started: 0,
            finished: 0,
            duration_ms: -1,
            deleted: false,
        }
    }
}

/// The journal itself is core's ([`dbwarden_core::journal`]); this is ClickHouse's side of it.
/// ClickHouse has no transactions: `begin` and `end` do nothing, every fenced write re-reads
/// the fence first, and every migration is journaled statement by statement.
#[async_trait]
impl JournalSession for ClickHouseStore {
    fn transactional(&self) -> bool {
        false
    }

    /// Nothing rolls back: statements are journaled one by one.
    async fn batches_roll_back_whole(&mut self) -> Result<bool, Error> {
        Ok(false)
    }

    async fn begin(&mut self, _kind: Tx) -> Result<(), Error> {
        Ok(())
    }

    async fn end(&mut self, outcome: Result<(), Error>) -> Result<(), Error> {
        outcome
    }

    async fn check_fence(&mut self, token: FencingToken, _hold: bool) -> Result<(), Error> {
        self.now = ClickHouseStore::check_fence(self, token).await?;
        Ok(())
    }

    /// One statement per request, sent verbatim; no client-side time limit (long DDL).
    async fn execute(
        &mut self,
        m: &Migration,
        range: std::ops::Range<usize>,
        _within: Within,
    ) -> Result<(), Error> {
        for index in range {
            let s = self.server();
            let sql = render_statement(m.statement(index), s.cluster.as_deref());
            let Err(e) = s.execute_unbounded(s.raw(&sql)).await else {
                continue;
            };
            if e.is(code::DDL_TIMEOUT) {
                // `ON CLUSTER` DDL that a host did not run in time: it ran where it could, and
                // the cluster's DDL queue runs it on the missing host when that host is back.
                return Err(Error::Lost(format!(
                    "statement {} of migration {} did not finish on every host of cluster `{}` ({e}); it stays queued for the missing host, so it stays journaled as in flight",
                    index + 1,
                    m.version,
                    s.cluster.as_deref().unwrap_or_default()
                )));
            }
            if let ChError::Unreachable(why, _) = e {
                // Its outcome is unknown (the server may have run it, or may still be running
                // it): leave the journal saying it was in flight, so the next run decides by
                // its idempotency, instead of recording FAILED (which means "did not run").
                return Err(Error::Lost(format!(
                    "lost contact with {} during statement {} of migration {} ({why}); its outcome is unknown, so it stays journaled as in flight",
                    s.target,
                    index + 1,
                    m.version
                )));
            }
            return Err(Error::MigrationFailed {
                version: m.version,
                file: m.path.display().to_string(),
                statement: index + 1,
                total: m.statements.len(),
                message: e.to_string(),
            });
        }
        Ok(())
    }

    /// Every write re-reads the fence first, `Fence::Held` too: without transactions, an
    /// earlier write's check does not cover this one.
    async fn write(&mut self, row: Write<'_>, fence: Fence) -> Result<(), Error> {
        if let Write::Audit(record) = row {
            return insert_audit(self.server(), record).await;
        }
        let token = fence.token().unwrap_or(self.token);
        JournalSession::check_fence(self, token, true).await?;
        let now = self.now;
        match row {
            Write::Working(m) => {
                self.started.insert(m.version, now);
                self.status(LockState::Running, Some(m)).await
            }
            Write::State(state, m) => self.status(state, m).await,
            Write::History(Entry {
                m,
                state,
                done,
                duration_ms,
                ..
            }) => {
                self.started.insert(m.version, now);
                let ended = matches!(state, HistoryState::Applied | HistoryState::Reverted);
                self.history_row(&HistoryWrite {
                    started: now,
                    finished: if ended { now } else { 0 },
                    duration_ms: duration_ms.unwrap_or(-1),
                    ..HistoryWrite::of(m, state, done)
                })
                .await
            }
            Write::Done { m, done } => {
                let started = self.started.get(&m.version).copied().unwrap_or(0);
                self.history_row(&HistoryWrite {
                    started,
                    ..HistoryWrite::of(m, HistoryState::Running, done)
                })
                .await
            }
            Write::End {
                m,
                state,
                duration_ms,
                done,
            } => {
                let started = self.started.get(&m.version).copied().unwrap_or(now);
                let done = match done {
                    Some(done) => done,
                    None => self.done_of(m).await?,
                };
                self.history_row(&HistoryWrite {
                    started,
                    finished: now,
                    duration_ms,
                    ..HistoryWrite::of(m, state, done)
                })
                .await
            }
            // ClickHouse has no sqlx to mirror to.
            Write::Mirror { .. } => Ok(()),
            Write::Forget(version) => self.tombstone(version).await,
            Write::Audit(_) => unreachable!("written above: never fenced"),
        }
    }

    async fn history(&mut self) -> Result<Vec<HistoryRow>, Error> {
        read_history(self.server(), &self.history_table).await
    }
}

impl ClickHouseStore {
    /// `statements_done` of `m` as journaled so far.
    async fn done_of(&self, m: &Migration) -> Result<usize, Error> {
        let rows = read_history(self.server(), &self.history_table).await?;
        Ok(rows
            .iter()
            .find(|r| r.version == m.version)
            .map_or(0, |r| usize::try_from(r.statements_done).unwrap_or(0)))
    }

    /// The history row of `version` deleted: a tombstone row that hides it.
    async fn tombstone(&mut self, version: i64) -> Result<(), Error> {
        let rows = read_history(self.server(), &self.history_table).await?;
        let Some(r) = rows.into_iter().find(|r| r.version == version) else {
            return Ok(());
        };
        self.history_row(&HistoryWrite {
            version,
            description: &r.description,
            checksum: &r.checksum,
            total: r.statements_total,
            state: r.state,
            done: 0,
            started: 0,
            finished: 0,
            duration_ms: -1,
            deleted: true,
        })
        .await
    }
}
