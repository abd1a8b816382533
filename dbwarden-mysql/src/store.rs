//! The migration store on the session that holds the named lock.
//!
//! DDL autocommits in MySQL, so a migration cannot commit together with its history row: every
//! migration runs through the per-statement journal (`statements_done` after each statement),
//! which is what recovery reads after a crash. Every write by a holder is fenced: a single
//! conditional write (`... AND EXISTS (token still ours)`, zero rows matched = fenced out) or a
//! transaction that first re-reads the token `FOR UPDATE`. A migration statement (which cannot
//! be conditional) follows a fresh proof of the token: the conditional write just before it on
//! the same session (the journal start, or the previous statement's record), else a re-read.
//! A write or statement that fails after the lock session was killed reports the lock lost,
//! never a migration failure.
//!
//! Runs of data changes (`INSERT`, `UPDATE`, `DELETE`, `REPLACE`) go in batches: one
//! transaction holding the statements and their journal entry, so a 100 000-row data migration
//! costs a hundred commits and round trips instead of 200 000, and a batch is recorded whole or
//! not at all. That needs transactional tables: where the database holds any other (MyISAM,
//! Aria, MEMORY), statements run one by one as before.

use std::time::Duration;

use async_trait::async_trait;
use dbwarden_core::adopt::ForeignRow;
use dbwarden_core::migration::Migration;
use dbwarden_core::{
    AuditRecord, Error, FencingToken, HistoryRow, HistoryState, LockState, LostSignal,
    MigrationStore, SqlxCompat,
};
use dbwarden_sql::{HistoryWrite, binds};
use sqlx::mysql::{MySqlArguments, MySqlConnection};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Connection, MySql};
use uuid::Uuid;

use crate::lock::{bounded, is_used_lock};
use crate::tables::db_err;

/// A query on the lock session, its binds owned.
type Q = Query<'static, MySql, MySqlArguments>;

/// The fence of a conditional write; binds the namespace and the token, in that order.
const FENCE: &str =
    "EXISTS (SELECT 1 FROM dbwarden_lock WHERE namespace = ? AND fencing_token = ?)";

/// The tables, on the session that holds the named lock.
pub struct MySqlStore {
    pub(crate) conn: MySqlConnection,
    /// The lock session's `CONNECTION_ID()`.
    pub(crate) conn_id: u64,
    pub(crate) lock_name: String,
    pub(crate) namespace: String,
    /// Validated identifier (see `dbwarden_core::config::validate_identifier`).
    pub(crate) history_table: String,
    pub(crate) statement_timeout: Duration,
    /// The last request on this session was a fenced write that matched our token, and nothing
    /// has run since: a migration statement may follow without re-reading the token (the
    /// re-read would be the very next round trip after that proof).
    pub(crate) fence_proven: bool,
    /// A migration statement ran on this session: what it set (`SET`, a role, a temporary
    /// table) may outlive it, so the session is closed at release, never kept.
    pub(crate) touched: bool,
    /// Every table of the database is transactional (InnoDB), so a batch of data changes rolls
    /// back whole with its journal entry; `None` until checked, and again after DDL.
    pub(crate) transactional_tables: Option<bool>,
    /// `(version, count)`: the last statement of that migration ran and its count is written
    /// with the migration's end, one commit instead of two (or alone, if the end cannot be
    /// written). A kill in between leaves the statement journaled as in flight, which recovery
    /// judges by its idempotency, as after a kill just before its count was written.
    pub(crate) deferred_done: Option<(i64, usize)>,
    /// The table-lock bounds the session has (`None`: unknown, a migration statement may have
    /// set them itself); see [`crate::table_locks`].
    pub(crate) bounds: Option<crate::table_locks::Bounds>,
    /// sqlx interoperation (`sqlx_compat`).
    pub(crate) sqlx: SqlxSide,
}

/// What this session does for sqlx's migrator.
#[derive(Debug, Default)]
pub(crate) struct SqlxSide {
    /// sqlx's named lock is held on this session.
    locked: bool,
    /// Migrations recorded APPLIED also get their `_sqlx_migrations` row.
    mirror: bool,
}

impl MySqlStore {
    /// After a failure: if this session no longer holds the named lock (it was killed, or the
    /// connection dropped), the lock is lost, whatever the error said.
    async fn settle<T>(&mut self, r: Result<T, Error>) -> Result<T, Error> {
        let e = match r {
            Ok(v) => return Ok(v),
            Err(e) if e.is_lost() => return Err(e),
            Err(e) => e,
        };
        let check = tokio::time::timeout(
            self.statement_timeout,
            is_used_lock(&mut self.conn, &self.lock_name),
        )
        .await;
        Err(match check {
            Ok(Ok(Some(id))) if id == self.conn_id => e,
            Ok(Ok(other)) => Error::Lost(format!(
                "the lock session (connection {}) no longer holds the lock (now {}); it failed with: {e}",
                self.conn_id,
                other.map_or_else(|| "free".to_owned(), |o| format!("connection {o}"))
            )),
            _ => Error::Lost(format!(
                "the lock session (connection {}) ended (killed or disconnected), so the server freed the lock; it failed with: {e}",
                self.conn_id
            )),
        })
    }

    /// `f` on the session, bounded by `statement_timeout`; a failure is judged by [`settle`].
    ///
    /// [`settle`]: Self::settle
    async fn guarded<T>(
        &mut self,
        what: &str,
        f: impl AsyncFnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.fence_proven = false;
        let r = bounded(self.statement_timeout, what, f(&mut *self)).await;
        self.settle(r).await
    }

    /// `f` between `START TRANSACTION` and `COMMIT` (`ROLLBACK` when it fails), then judged by
    /// [`settle`]. `what` names a step bounded by `statement_timeout`, and a bounded step cut
    /// off is rolled back (the next write must not join it); `None` leaves the transaction
    /// unbounded: it runs migration statements, or writes a row per adopted migration.
    ///
    /// [`settle`]: Self::settle
    async fn tx<T>(
        &mut self,
        what: Option<&str>,
        f: impl AsyncFnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.fence_proven = false;
        let limit = self.statement_timeout;
        let body = async {
            sqlx::raw_sql("START TRANSACTION")
                .execute(&mut self.conn)
                .await
                .map_err(db_err)?;
            let r = f(&mut *self).await;
            dbwarden_sql::finish_tx(&mut self.conn, r, db_err).await
        };
        let r = match what {
            Some(what) => bounded(limit, what, body).await,
            None => body.await,
        };
        if r.is_err() && what.is_some() {
            self.rollback_quietly().await;
        }
        self.settle(r).await
    }

    /// [`tx`](Self::tx) that first re-reads the token `FOR UPDATE`: `f` runs only while the
    /// token is still ours, and no other holder can take it before the commit.
    async fn fenced<T>(
        &mut self,
        what: Option<&str>,
        token: FencingToken,
        f: impl AsyncFnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.tx(what, async move |s| {
            token.check(
                binds::stored_token(&mut s.conn, &s.namespace, " FOR UPDATE", db_err).await?,
            )?;
            f(s).await
        })
        .await
    }

    /// A plain re-read of the token, before a migration statement (which cannot join our
    /// transaction: DDL commits it).
    async fn check_fence(&mut self, token: FencingToken) -> Result<(), Error> {
        token.check(binds::stored_token(&mut self.conn, &self.namespace, "", db_err).await?)
    }

    /// Inside a fenced transaction: the history row of `m`, with `token` and `duration_ms`.
    async fn put_history(
        &mut self,
        w: HistoryWrite<'_>,
        token: FencingToken,
        ms: Option<i64>,
    ) -> Result<(), Error> {
        binds::put_history(&mut self.conn, &self.history_table, w, token, ms, db_err).await
    }

    /// `UPDATE` of a history row: `set`, then `WHERE version = ?`; with `fence`, the SQL ends
    /// with [`FENCE`] for [`fenced_update`](Self::fenced_update) to bind.
    fn history_sql(&self, set: &str, fence: bool) -> AssertSqlSafe<String> {
        let t = &self.history_table;
        let fence = if fence {
            format!(" AND {FENCE}")
        } else {
            String::new()
        };
        AssertSqlSafe(format!("UPDATE `{t}` SET {set} WHERE version = ?{fence}"))
    }

    /// `q`, whose SQL ends with a fence on the namespace and token (bound here, last), as one
    /// conditional write. Zero rows matched: fenced out, or `row` (named for the error) is gone.
    async fn fenced_update(&mut self, row: &str, token: FencingToken, q: Q) -> Result<(), Error> {
        let q = q.bind(self.namespace.clone()).bind(token.0 as i64);
        let n = q
            .execute(&mut self.conn)
            .await
            .map_err(db_err)?
            .rows_affected();
        if n > 0 {
            return Ok(());
        }
        self.check_fence(token).await?;
        Err(missing(row))
    }

    /// [`fenced_update`](Self::fenced_update) bounded and settled; on success the fence is
    /// proven for a migration statement that follows.
    async fn conditional(&mut self, what: &str, token: FencingToken, q: Q) -> Result<(), Error> {
        let r = self
            .guarded(what, async |s| {
                let row = format!("{what}: the row to update");
                s.fenced_update(&row, token, q).await
            })
            .await;
        self.fence_proven = r.is_ok();
        r
    }

    /// A bounded `ROLLBACK` whose outcome does not matter: after a bounded transaction failed
    /// (it may have been cut off between `START TRANSACTION` and `COMMIT`, and the final state
    /// written next must not join it), or after a statement inside the file's own transaction
    /// failed.
    async fn rollback_quietly(&mut self) -> bool {
        let limit = self.statement_timeout;
        bounded(limit, "rolling back", async {
            sqlx::raw_sql("ROLLBACK")
                .execute(&mut self.conn)
                .await
                .map_err(db_err)
        })
        .await
        .is_ok()
    }

    /// Whether every base table of the database is InnoDB and new tables will be too.
    async fn all_tables_transactional(&mut self) -> Result<bool, Error> {
        if let Some(known) = self.transactional_tables {
            return Ok(known);
        }
        let known = self
            .guarded("checking the table engines", async |s| {
                let (default, tmp, others): (String, String, i64) = sqlx::query_as(
                    "SELECT @@default_storage_engine, \
                     COALESCE(@@default_tmp_storage_engine, @@default_storage_engine), \
                     (SELECT COUNT(*) FROM information_schema.TABLES \
                     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_TYPE = 'BASE TABLE' \
                     AND (ENGINE IS NULL OR ENGINE <> 'InnoDB'))",
                )
                .fetch_one(&mut s.conn)
                .await
                .map_err(db_err)?;
                Ok(default.eq_ignore_ascii_case("InnoDB")
                    && tmp.eq_ignore_ascii_case("InnoDB")
                    && others == 0)
            })
            .await?;
        if !known {
            tracing::info!(
                "the database holds tables that are not InnoDB: data changes run one statement at a time"
            );
        }
        self.transactional_tables = Some(known);
        Ok(known)
    }

    /// Statement `index` of `m` and its journal entry (see `MigrationStore::journal_statement`).
    async fn journal_one(
        &mut self,
        token: FencingToken,
        m: &Migration,
        index: usize,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        let record = |this: &Self, fence: bool| {
            sqlx::query(this.history_sql("statements_done = ?", fence))
                .bind((index + 1) as i64)
                .bind(m.version)
        };
        // The COMMIT of the file's own transaction: its record goes in first, so it commits
        // with the transaction or not at all.
        let commits = m.commits_own_transaction(index);
        if commits {
            lost.check()?;
            let q = record(self, true);
            self.conditional("recording the statement", token, q)
                .await?;
        }
        if !std::mem::take(&mut self.fence_proven) {
            self.guarded("checking the fencing token", async |s| {
                s.check_fence(token).await
            })
            .await?;
        }
        let text = m.statement(index);
        let words = dbwarden_core::migration::mode::head_words(text, m.dialect, 2);
        let table_lock = matches!(
            words.iter().map(String::as_str).collect::<Vec<_>>()[..],
            ["LOCK" | "UNLOCK", "TABLE" | "TABLES"]
        );
        if table_lock {
            // mysqldump wraps each table's rows in LOCK TABLES … UNLOCK TABLES. Under the
            // migration lock they add nothing, and a session with locked tables could not
            // write its journal entry: skipped, and said so.
            tracing::warn!(
                "migration {} statement {}: `{}` skipped (the migration lock already excludes other runners; a table lock would stop the journal)",
                m.version,
                index + 1,
                words.join(" ")
            );
        } else {
            // The statement itself is not bounded here: a migration may legitimately run for
            // hours. Its waits for table locks are (`bound_statements`).
            self.touched = true;
            let r = crate::table_locks::run(&mut self.conn, m, index..index + 1).await;
            if !m.statements[index].batchable
                && !matches!(
                    words.first().map(String::as_str),
                    Some("CREATE" | "ALTER" | "DROP" | "RENAME" | "TRUNCATE")
                )
            {
                // A SET, a CALL: it may have changed the session's own bounds.
                self.bounds = None;
            }
            self.settle(r).await?;
        }
        if !m.statements[index].batchable {
            // DDL, a CALL, a SET: it may have made or changed a table that is not InnoDB.
            self.transactional_tables = None;
        }
        if commits {
            return Ok(());
        }
        lost.check()?;
        if index + 1 == m.statements.len() && !m.inside_own_transaction_after(index) {
            self.deferred_done = Some((m.version, index + 1));
            return Ok(());
        }
        if m.inside_own_transaction_after(index) {
            // Inside the file's transaction the entry commits with it. Its fence is the lock
            // session itself (the transaction cannot outlive it); the fenced form would hold a
            // shared lock on the status row until the file's COMMIT and stall the heartbeat.
            let q = record(self, false);
            return self
                .guarded("recording the statement", async |s| {
                    let n = q.execute(&mut s.conn).await.map_err(db_err)?;
                    match n.rows_affected() {
                        0 => Err(missing(&history_row(m))),
                        _ => Ok(()),
                    }
                })
                .await;
        }
        let q = record(self, true);
        self.conditional("recording the statement", token, q).await
    }

    /// sqlx's `GET_LOCK` name for this database: its lock key in lowercase hex.
    async fn sqlx_lock_name(&mut self) -> Result<String, Error> {
        let db: String = sqlx::query_scalar("SELECT DATABASE()")
            .fetch_one(&mut self.conn)
            .await
            .map_err(db_err)?;
        Ok(format!("{:x}", dbwarden_core::adopt::sqlx_lock_key(&db)))
    }

    /// Free the named lock; the session, when no migration ran on it and the release went
    /// through, for the lock to keep (otherwise it is closed, which frees the lock too).
    pub(crate) async fn release(mut self) -> (Result<(), Error>, Option<crate::lock::Session>) {
        let r = bounded(self.statement_timeout, "releasing the lock", async {
            crate::lock::release_lock(&mut self.conn, &self.lock_name)
                .await
                .map_err(db_err)
        })
        .await;
        // A write cut short by its bound may have left a transaction open: the session is
        // kept only outside one (closing would have rolled it back; so does this).
        let clean = r.is_ok() && !self.touched && self.rollback_quietly().await;
        if clean {
            return (r, Some(crate::lock::Session::new(self.conn, self.conn_id)));
        }
        let _ = self.conn.close().await;
        (r, None)
    }
}

/// A write that matched no row, and not for a moved token: `row` is gone.
fn missing(row: &str) -> Error {
    Error::database(format!("{row} is missing (was the table edited by hand?)"))
}

/// `m`'s history row, as an error names it.
fn history_row(m: &Migration) -> String {
    format!("recording migration {}: its history row", m.version)
}

#[async_trait]
impl SqlxCompat for MySqlStore {
    async fn sqlx_table_exists(&mut self) -> Result<bool, Error> {
        self.guarded("looking for _sqlx_migrations", async |s| {
            binds::table_exists(&mut s.conn, "_sqlx_migrations", db_err).await
        })
        .await
    }

    async fn try_lock_sqlx(&mut self) -> Result<bool, Error> {
        if self.sqlx.locked {
            return Ok(true);
        }
        // A session holding sqlx's lock must end with the lease, never be kept.
        self.touched = true;
        let got = self
            .guarded("taking sqlx's lock", async |s| {
                let name = s.sqlx_lock_name().await?;
                let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                    .bind(name)
                    .fetch_one(&mut s.conn)
                    .await
                    .map_err(db_err)?;
                Ok(got == Some(1))
            })
            .await?;
        self.sqlx.locked = got;
        Ok(got)
    }

    async fn sqlx_rows(&mut self) -> Result<Vec<ForeignRow>, Error> {
        self.guarded("reading _sqlx_migrations", async |s| {
            binds::sqlx_rows(&mut s.conn, db_err).await
        })
        .await
    }

    async fn mirror_to_sqlx(&mut self) -> Result<(), Error> {
        self.guarded("creating _sqlx_migrations", async |s| {
            let create = sqlx::raw_sql(binds::CREATE_SQLX_TABLE);
            create.execute(&mut s.conn).await.map_err(db_err)
        })
        .await?;
        self.sqlx.mirror = true;
        Ok(())
    }
}

#[async_trait]
impl MigrationStore for MySqlStore {
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

    async fn set_state(
        &mut self,
        token: FencingToken,
        state: LockState,
        migration: Option<&Migration>,
    ) -> Result<(), Error> {
        let q = binds::status_update(Some(state), migration, true);
        self.conditional("recording the lock state", token, q).await
    }

    /// Name `m` in the status row and write its RUNNING history row, in one transaction: one
    /// commit (the costly part of a small migration), and no moment where the status row names
    /// `m` without its history row. The status update's rows matched is the fence.
    async fn journal_begin(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
        from: usize,
    ) -> Result<(), Error> {
        self.deferred_done = None;
        let what = "recording the migration start";
        let r = self
            .tx(Some(what), async |s| {
                let q = binds::status_update(None, Some(m), true);
                let row = "recording the migration start: the status row";
                s.fenced_update(row, token, q).await?;
                let w = HistoryWrite::new(m, HistoryState::Running, from, execution_id);
                s.put_history(w, token, None).await
            })
            .await;
        self.fence_proven = r.is_ok();
        r
    }

    async fn journal_statement(
        &mut self,
        token: FencingToken,
        m: &Migration,
        index: usize,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        let own = m.inside_own_transaction(index) || m.inside_own_transaction_after(index);
        let r = self.journal_one(token, m, index, lost).await;
        if r.is_err() && own {
            // Nothing of the file's transaction may stay open on the session: the next write
            // (`START TRANSACTION`, DDL) would commit it half-done.
            self.rollback_quietly().await;
        }
        r
    }

    /// A data change costs a round trip and a commit of its own: runs of them go in batches.
    fn batch_limit(&self) -> usize {
        1000
    }

    /// One batch: `START TRANSACTION`, the statements, their journal entry, `COMMIT`.
    async fn journal_batch(
        &mut self,
        token: FencingToken,
        m: &Migration,
        range: std::ops::Range<usize>,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        if !self.all_tables_transactional().await? {
            for index in range {
                self.journal_statement(token, m, index, lost).await?;
            }
            return Ok(());
        }
        self.touched = true;
        self.tx(None, async |s| {
            crate::table_locks::run(&mut s.conn, m, range.clone()).await?;
            lost.check()?;
            let q = sqlx::query(s.history_sql("statements_done = ?", true))
                .bind(range.end as i64)
                .bind(m.version);
            s.fenced_update(&history_row(m), token, q).await
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
        let done = match self.deferred_done.take() {
            Some((version, n)) if version == m.version => Some(n as i64),
            _ => None,
        };
        let what = "recording the migration end";
        let set = "state = ?, finished_at = UTC_TIMESTAMP(6), duration_ms = ?, statements_done = COALESCE(?, statements_done)";
        let end = |this: &Self, fence: bool| {
            sqlx::query(this.history_sql(set, fence))
                .bind(state.as_str())
                .bind(duration_ms)
                .bind(done)
                .bind(m.version)
        };
        let r = if state == HistoryState::Applied && self.sqlx.mirror {
            // The migration's end, APPLIED, with its `_sqlx_migrations` row, in one transaction.
            let q = end(self, false);
            self.fenced(Some(what), token, async |s| {
                q.execute(&mut s.conn).await.map_err(db_err)?;
                let nanos = duration_ms.saturating_mul(1_000_000);
                binds::mirror_row(&mut s.conn, m, nanos, true, db_err).await
            })
            .await
        } else {
            let q = end(self, true);
            self.conditional(what, token, q).await
        };
        if let (Err(e), Some(n)) = (&r, done)
            && !e.is_lost()
        {
            // The end was not written, but the last statement did run: its count must not be
            // lost with it, or recovery would take the statement for one in flight.
            let q = sqlx::query(self.history_sql("statements_done = ?", true))
                .bind(n)
                .bind(m.version);
            let _ = self.conditional("recording the statement", token, q).await;
        }
        r
    }

    async fn mark_applied(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
    ) -> Result<(), Error> {
        let what = Some("marking the migration applied");
        self.fenced(what, token, async |s| {
            let total = m.statements.len();
            let w = HistoryWrite::new(m, HistoryState::Applied, total, execution_id);
            s.put_history(w, token, Some(0)).await?;
            if !s.sqlx.mirror {
                return Ok(());
            }
            binds::mirror_row(&mut s.conn, m, 0, false, db_err).await
        })
        .await
    }

    async fn record_adopted(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        applied: &[&Migration],
        halted: Option<&Migration>,
    ) -> Result<(), Error> {
        self.fenced(None, token, async |s| {
            let (t, ns) = (&s.history_table, &s.namespace);
            let c = &mut s.conn;
            binds::record_adopted(c, t, ns, token, execution_id, applied, halted, db_err).await
        })
        .await
    }

    async fn forget(&mut self, token: FencingToken, version: i64) -> Result<(), Error> {
        self.fenced(Some("forgetting the migration"), token, async |s| {
            binds::forget(&mut s.conn, &s.history_table, version, db_err).await
        })
        .await
    }

    async fn audit(&mut self, record: &AuditRecord) -> Result<(), Error> {
        self.guarded("writing an audit row", async |s| {
            binds::insert_audit(&mut s.conn, record, db_err).await
        })
        .await
    }
}
