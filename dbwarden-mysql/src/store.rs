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
use dbwarden_core::journal::in_transaction;
use dbwarden_core::migration::Migration;
use dbwarden_core::{
    AuditRecord, Error, Fence, FencingToken, HistoryRow, HistoryState, JournalSession, SqlxCompat,
    Tx, Within, Write,
};
use dbwarden_sql::{HistoryWrite, binds};
use sqlx::mysql::{MySqlArguments, MySqlConnection};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Connection, MySql};

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
    /// The transaction the journal has open.
    pub(crate) tx: Option<Tx>,
    /// The table-lock bounds the session has (`None`: unknown, a migration statement may have
    /// set them itself); see [`crate::table_locks`].
    pub(crate) bounds: Option<crate::table_locks::Bounds>,
    /// sqlx interoperation (`sqlx_compat`).
    pub(crate) sqlx: SqlxSide,
    /// On a Galera node the lock is the lease in the status row ([`crate::lease`]) and this
    /// session holds no named lock: the fence is this token, proven by a write to the status
    /// row in the same transaction (certification then refuses a commit that races a takeover
    /// on another node). `None`: the named lock on this session is the fence.
    pub(crate) lease: Option<FencingToken>,
    /// The migration's own `START TRANSACTION` is open on the session (after its last
    /// statement run): a write then joins it, and must not open a transaction of its own
    /// (which would commit the file's).
    pub(crate) file_tx: bool,
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
    /// The store on session `conn` (connection `conn_id`) of `lock`'s database and namespace;
    /// `lease`: the Galera lease's token, when the lock is the lease ([`Self::lease`]).
    pub(crate) fn new(
        conn: MySqlConnection,
        conn_id: u64,
        lock: &crate::MySqlLock,
        lease: Option<FencingToken>,
    ) -> Self {
        MySqlStore {
            conn,
            conn_id,
            lock_name: lock.lock_name.clone(),
            namespace: lock.namespace.as_str().to_owned(),
            history_table: lock.history_table.clone(),
            statement_timeout: lock.endpoint.statement_timeout,
            fence_proven: false,
            touched: false,
            tx: None,
            bounds: Some((None, None)),
            transactional_tables: None,
            sqlx: Default::default(),
            lease,
            file_tx: false,
        }
    }

    /// After a failure: if this session no longer holds the named lock (it was killed, or the
    /// connection dropped), the lock is lost, whatever the error said.
    async fn settle<T>(&mut self, r: Result<T, Error>) -> Result<T, Error> {
        let e = match r {
            Ok(v) => return Ok(v),
            Err(e) if e.is_lost() => return Err(e),
            Err(e) => e,
        };
        if let Some(token) = self.lease {
            return Err(self.settle_lease(token, e).await);
        }
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

    /// After a failure on the lease: the lease is lost when the status row carries another
    /// token now, and when the token cannot be read on this session (it ended with its node:
    /// the run cannot go on, and the lease runs out after its ttl).
    async fn settle_lease(&mut self, token: FencingToken, e: Error) -> Error {
        // A transaction the failure left open (a refused commit, a statement cut off) first.
        self.rollback_quietly().await;
        let read = tokio::time::timeout(
            self.statement_timeout,
            binds::stored_token(&mut self.conn, &self.namespace, "", db_err),
        )
        .await;
        match read {
            Ok(Ok(now)) => match token.check(now) {
                Ok(()) => e,
                Err(lost) => Error::Lost(format!("{lost}; it failed with: {e}")),
            },
            _ => Error::Lost(format!(
                "the session on the node that holds the lease ended, so this run cannot go on (the lease runs out after its ttl); it failed with: {e}"
            )),
        }
    }

    /// The lease's proof, in the open transaction (or alone): a write to the status row while
    /// it carries `token`. Its write set holds the row, so on a Galera cluster a commit that
    /// races a takeover on another node fails certification instead of landing after it.
    async fn touch_lease(&mut self, token: FencingToken) -> Result<(), Error> {
        let n = sqlx::query(
            "UPDATE dbwarden_lock SET last_heartbeat_at = GREATEST(UTC_TIMESTAMP(6), last_heartbeat_at + INTERVAL 1 MICROSECOND) \
             WHERE namespace = ? AND fencing_token = ?",
        )
        .bind(&self.namespace)
        .bind(token.0 as i64)
        .execute(&mut self.conn)
        .await
        .map_err(db_err)?
        .rows_affected();
        if n == 1 {
            return Ok(());
        }
        token.check(binds::stored_token(&mut self.conn, &self.namespace, "", db_err).await?)?;
        Err(missing("proving the lease: the status row"))
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

    /// A re-read of the token; `hold`: `FOR UPDATE`, inside a transaction.
    async fn check_fence(&mut self, token: FencingToken, hold: bool) -> Result<(), Error> {
        // On the lease a locked read would hold the status row against the heartbeat until
        // the commit; the commit proves the token instead (`touch_lease`).
        let lock = if hold && self.lease.is_none() {
            " FOR UPDATE"
        } else {
            ""
        };
        token.check(binds::stored_token(&mut self.conn, &self.namespace, lock, db_err).await?)
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
        self.check_fence(token, false).await?;
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

    /// The conditional form of `row`, where one statement can carry the fence (its SQL ends
    /// with [`FENCE`], for [`fenced_update`](Self::fenced_update) to bind), with the name an
    /// error gives the row; `None` for a row that cannot be written so.
    fn conditional_sql(&self, row: &Write<'_>) -> Option<(Q, String)> {
        // On the lease a condition read is no proof: the write goes in a transaction whose
        // commit proves the token.
        if self.lease.is_some() {
            return None;
        }
        Some(match *row {
            Write::Working(m) => (
                binds::status_update(None, Some(m), true),
                "recording the migration start: the status row".to_owned(),
            ),
            Write::State(state, m) => (
                binds::status_update(Some(state), m, true),
                "recording the lock state: the status row".to_owned(),
            ),
            Write::Done { m, done } => (
                sqlx::query(self.history_sql("statements_done = ?", true))
                    .bind(done as i64)
                    .bind(m.version),
                history_row(m),
            ),
            Write::End {
                m,
                state,
                duration_ms,
                done,
            } => (
                self.end_query(m, state, duration_ms, done, true),
                history_row(m),
            ),
            Write::History(_) | Write::Mirror { .. } | Write::Forget(_) => return None,
        })
    }

    /// The history row of `m` closed; with `fence`, conditional (see [`Self::history_sql`]).
    fn end_query(
        &self,
        m: &Migration,
        state: HistoryState,
        duration_ms: i64,
        done: Option<usize>,
        fence: bool,
    ) -> Q {
        let set = "state = ?, finished_at = UTC_TIMESTAMP(6), duration_ms = ?, statements_done = COALESCE(?, statements_done)";
        sqlx::query(self.history_sql(set, fence))
            .bind(state.as_str())
            .bind(duration_ms)
            .bind(done.map(|d| d as i64))
            .bind(m.version)
    }

    /// `row` in the open transaction, not fenced here (the transaction's fence holds, or the
    /// session is the fence).
    async fn write_unfenced(&mut self, row: Write<'_>) -> Result<(), Error> {
        let ns = self.namespace.clone();
        let q = match row {
            Write::Working(m) => binds::status_update(None, Some(m), false).bind(ns),
            Write::State(state, m) => binds::status_update(Some(state), m, false).bind(ns),
            Write::Done { m, done } => {
                let q = sqlx::query(self.history_sql("statements_done = ?", false));
                let q = q.bind(done as i64).bind(m.version);
                let n = q.execute(&mut self.conn).await.map_err(db_err)?;
                return match n.rows_affected() {
                    0 => Err(missing(&history_row(m))),
                    _ => Ok(()),
                };
            }
            Write::End {
                m,
                state,
                duration_ms,
                done,
            } => self.end_query(m, state, duration_ms, done, false),
            Write::History(e) => {
                return self
                    .put_history(HistoryWrite::of(&e), e.token, e.duration_ms)
                    .await;
            }
            Write::Mirror { m, nanos, ran } => {
                return binds::mirror_row(&mut self.conn, m, nanos, ran, db_err).await;
            }
            Write::Forget(version) => {
                let t = &self.history_table;
                return binds::forget(&mut self.conn, t, version, db_err).await;
            }
        };
        q.execute(&mut self.conn).await.map_err(db_err)?;
        Ok(())
    }

    /// What a write is, for a timeout's message.
    fn what(row: &Write<'_>) -> &'static str {
        match row {
            Write::Working(_) => "recording the migration start",
            Write::State(..) => "recording the lock state",
            Write::History(_) => "recording the history row",
            Write::Done { .. } => "recording the statement",
            Write::End { .. } => "recording the migration end",
            Write::Mirror { .. } => "mirroring to _sqlx_migrations",
            Write::Forget(_) => "forgetting the migration",
        }
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
        if let Some(token) = self.lease {
            let r = self.give_lease_back(token).await;
            let _ = self.conn.close().await;
            return (r, None);
        }
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

impl MySqlStore {
    /// The lease given back while it is still ours (`expires_at` cleared): the next runner
    /// takes it at once instead of after the ttl.
    async fn give_lease_back(&mut self, token: FencingToken) -> Result<(), Error> {
        // A transaction a lost lease left open must not be committed by this write.
        self.rollback_quietly().await;
        bounded(self.statement_timeout, "giving the lease back", async {
            sqlx::query(
                "UPDATE dbwarden_lock SET expires_at = NULL WHERE namespace = ? AND fencing_token = ?",
            )
            .bind(&self.namespace)
            .bind(token.0 as i64)
            .execute(&mut self.conn)
            .await
            .map_err(db_err)
        })
        .await?;
        Ok(())
    }
}

impl MySqlStore {
    /// A migration's statements `range` on the session, as they are.
    async fn execute_here(
        &mut self,
        m: &Migration,
        range: std::ops::Range<usize>,
    ) -> Result<(), Error> {
        let words =
            dbwarden_core::migration::mode::head_words(m.statement(range.start), m.dialect, 2);
        let table_lock = range.len() == 1
            && matches!(
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
                range.start + 1,
                words.join(" ")
            );
            return Ok(());
        }
        self.touched = true;
        let r = crate::table_locks::run(&mut self.conn, m, range.clone()).await;
        if !m.statements[range].iter().all(|st| st.batchable) {
            // DDL, a CALL, a SET: it may have made or changed a table that is not InnoDB.
            self.transactional_tables = None;
            let ddl = matches!(
                words.first().map(String::as_str),
                Some("CREATE" | "ALTER" | "DROP" | "RENAME" | "TRUNCATE")
            );
            if !ddl {
                // A SET, a CALL: it may have changed the session's own bounds.
                self.bounds = None;
            }
        }
        self.settle(r).await
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
    async fn commit(&mut self) -> Result<(), Error> {
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

    async fn rollback(&mut self, cause: Error) -> Error {
        self.tx = None;
        self.fence_proven = false;
        self.rollback_quietly().await;
        cause
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

    async fn audit(&mut self, record: &AuditRecord) -> Result<(), Error> {
        self.guarded("writing an audit row", async |s| {
            binds::insert_audit(&mut s.conn, record, db_err).await
        })
        .await
    }
}
