//! The per-statement journal on the lock session: `JournalSession` for [`MySqlStore`].

use std::time::Duration;

use async_trait::async_trait;
use dbwarden_core::journal::in_transaction;
use dbwarden_core::migration::Migration;
use dbwarden_core::{
    Error, Fence, FencingToken, HistoryRow, JournalSession, SqlxCompat, Tx, Within, Write,
};
use dbwarden_sql::binds;
use sqlx::AssertSqlSafe;

use crate::store::MySqlStore;
use crate::tables::db_err;

#[async_trait]
impl JournalSession for MySqlStore {
    fn sqlx_compat(&mut self) -> Option<&mut dyn SqlxCompat> {
        Some(self)
    }

    /// DDL autocommits: no migration commits together with its history row.
    fn transactional(&self) -> bool {
        false
    }

    /// `lock_wait_timeout` (and MariaDB's `max_statement_time`), set on the session only when
    /// they change. They bound dbwarden's own writes on this session too: those touch only
    /// dbwarden's tables, which no application locks for long.
    async fn bound_statements(
        &mut self,
        lock_timeout: Option<Duration>,
        statement_timeout: Option<Duration>,
    ) -> Result<(), Error> {
        let want = (lock_timeout, statement_timeout);
        let Some(sql) = crate::table_locks::bounds_sql(self.bounds, want) else {
            return Ok(());
        };
        self.bounds = None;
        // The session outlives the bounds only if nothing else marks it: close it at release.
        self.touched = true;
        self.guarded("setting the table-lock bounds", async |s| {
            sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&mut s.conn)
                .await
                .map_err(db_err)
        })
        .await?;
        self.bounds = Some(want);
        Ok(())
    }

    async fn batches_roll_back_whole(&mut self) -> Result<bool, Error> {
        self.all_tables_transactional().await
    }

    /// A data change costs a round trip and a commit of its own: runs of them go in batches.
    fn batch_limit(&self) -> usize {
        1000
    }

    fn mirrors_to_sqlx(&self) -> bool {
        self.sqlx.mirror
    }

    /// A `START TRANSACTION` cut off by its bound may have opened one all the same: rolled
    /// back, so the next write does not join it.
    async fn begin(&mut self, kind: Tx) -> Result<(), Error> {
        let r = self
            .guarded("opening a transaction", async |s| {
                let begin = sqlx::raw_sql("START TRANSACTION");
                begin.execute(&mut s.conn).await.map_err(db_err)?;
                Ok(())
            })
            .await;
        if r.is_err() {
            self.rollback_quietly().await;
        }
        r?;
        self.tx = Some(kind);
        Ok(())
    }

    /// A fence proven inside the transaction stays proven past its commit: nothing else ran.
    /// A migration's transaction is not bounded, even at its `COMMIT`.
    async fn end(&mut self, outcome: Result<(), Error>) -> Result<(), Error> {
        if let Err(cause) = outcome {
            self.tx = None;
            self.fence_proven = false;
            self.rollback_quietly().await;
            return Err(cause);
        }
        let mut proven = self.fence_proven;
        if let Some(token) = self.lease {
            let touched = self
                .guarded("proving the lease", async |s| s.touch_lease(token).await)
                .await;
            if let Err(e) = touched {
                self.tx = None;
                self.rollback_quietly().await;
                return Err(e);
            }
            proven = true;
        }
        let r = match self.tx.take() {
            Some(Tx::Migration) => {
                let r = dbwarden_sql::finish_tx(&mut self.conn, Ok(()), db_err).await;
                self.settle(r).await
            }
            _ => {
                self.guarded("committing", async |s| {
                    dbwarden_sql::finish_tx(&mut s.conn, Ok(()), db_err).await
                })
                .await
            }
        };
        if r.is_err() {
            // A `COMMIT` cut off by its bound leaves the transaction open: never joined.
            self.rollback_quietly().await;
        }
        self.fence_proven = proven && r.is_ok();
        r
    }

    /// A fence the last request proved (a conditional write that matched, nothing since) is
    /// not read again.
    async fn check_fence(&mut self, token: FencingToken, hold: bool) -> Result<(), Error> {
        let proven = std::mem::take(&mut self.fence_proven);
        if !hold && proven && self.lease.is_none() {
            return Ok(());
        }
        if self.lease.is_some() && !hold && !self.file_tx {
            // Before a statement that commits on its own (DDL): a proof committed alone.
            let r = self
                .guarded("proving the lease", async |s| s.touch_lease(token).await)
                .await;
            self.fence_proven = r.is_ok();
            return r;
        }
        self.guarded("checking the fencing token", async |s| {
            MySqlStore::check_fence(s, token, hold).await
        })
        .await
    }

    /// Not bounded: a migration may legitimately run for hours. Its waits for table locks
    /// are (`bound_statements`).
    async fn execute(
        &mut self,
        m: &Migration,
        range: std::ops::Range<usize>,
        within: Within,
    ) -> Result<(), Error> {
        self.fence_proven = false;
        let lone_change = self.lease.is_some()
            && within == Within::Nothing
            && m.statements[range.clone()].iter().all(|st| st.batchable);
        if lone_change {
            // A data change would commit by itself, unproven: on the lease it commits in a
            // transaction whose COMMIT proves the token, so a holder fenced out meanwhile
            // changes nothing.
            let start = range.start;
            let r = in_transaction(self, Tx::Short, async |s| {
                s.execute(m, range, Within::Journal).await
            })
            .await;
            return match r {
                // Refused by certification (another node's write to the same rows came first)
                // while the lease is still ours: the change rolled back whole, and the journal
                // may say so (the next run resumes it) instead of leaving it in doubt.
                Err(e) if crate::tables::refused(&e) => Err(m.failure(
                    start,
                    &format!("the cluster refused its commit, so it rolled back whole: {e}"),
                )),
                other => other,
            };
        }
        let r = self.execute_here(m, range.clone()).await;
        self.file_tx = within == (Within::File { open_after: true });
        r
    }

    async fn write(&mut self, row: Write<'_>, fence: Fence) -> Result<(), Error> {
        if let Write::Audit(record) = row {
            return self
                .guarded("writing an audit row", async |s| {
                    binds::insert_audit(&mut s.conn, record, db_err).await
                })
                .await;
        }
        if let (Some(_), true) = (self.lease, self.file_tx) {
            // Inside the migration's own transaction, which its COMMIT certifies: the entry
            // before that COMMIT carries the proof (written last, so the status row is not
            // held against the heartbeat for the whole transaction); the others join it.
            let what = Self::what(&row);
            let r = self
                .guarded(what, async |s| {
                    if let Fence::Hold(token) = fence {
                        s.touch_lease(token).await?;
                    }
                    s.write_unfenced(row).await
                })
                .await;
            return r;
        }
        if self.lease.is_some() && self.tx.is_none() {
            // Only a commit proves the lease: a write outside a transaction gets one.
            return in_transaction(self, Tx::Short, async |s| s.write(row, fence).await).await;
        }
        let what = Self::what(&row);
        let token = match fence {
            Fence::Hold(token) => token,
            // Inside the file's own transaction the fence is the lock session itself (the
            // transaction cannot outlive it, and no one else holds the named lock while it
            // lives); the conditional form would hold a shared lock on the status row until
            // the file's COMMIT and stall the heartbeat.
            Fence::Check(_) | Fence::Held => {
                // Not a proof of its own, but no reason to forget one made just before it in
                // the same transaction (the journal start's history row after its status row).
                let proven = self.fence_proven;
                let r = self
                    .guarded(what, async |s| s.write_unfenced(row).await)
                    .await;
                self.fence_proven = proven && r.is_ok();
                return r;
            }
        };
        let r = match self.conditional_sql(&row) {
            Some((q, name)) => {
                self.guarded(what, async |s| s.fenced_update(&name, token, q).await)
                    .await
            }
            None => {
                self.guarded(what, async |s| {
                    MySqlStore::check_fence(s, token, true).await?;
                    s.write_unfenced(row).await
                })
                .await
            }
        };
        self.fence_proven = r.is_ok();
        r
    }

    /// One conditional statement where the row allows it: one round trip, one commit.
    async fn write_alone(&mut self, row: Write<'_>, fence: Fence) -> Result<(), Error> {
        if let (Some(token), Some((q, _))) = (fence.token(), self.conditional_sql(&row)) {
            return self.conditional(Self::what(&row), token, q).await;
        }
        in_transaction(self, Tx::Short, async |s| s.write(row, fence).await).await
    }

    fn ddl_undone_on_lock_timeout(&self) -> bool {
        true
    }

    fn session(&self) -> Option<String> {
        Some(self.conn_id.to_string())
    }

    async fn history(&mut self) -> Result<Vec<HistoryRow>, Error> {
        self.guarded("reading the history", async |s| {
            binds::read_history(&mut s.conn, &s.history_table, db_err).await
        })
        .await
    }
}
