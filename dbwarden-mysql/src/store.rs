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

use dbwarden_core::migration::Migration;
use dbwarden_core::{Error, FencingToken, HistoryState, Tx, Write};
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
    pub(crate) locked: bool,
    /// Migrations recorded APPLIED also get their `_sqlx_migrations` row.
    pub(crate) mirror: bool,
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
    pub(crate) async fn settle<T>(&mut self, r: Result<T, Error>) -> Result<T, Error> {
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

    /// `f` on the session, bounded by `statement_timeout`; a failure is judged by [`settle`].
    ///
    /// [`settle`]: Self::settle
    pub(crate) async fn guarded<T>(
        &mut self,
        what: &str,
        f: impl AsyncFnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.fence_proven = false;
        let r = bounded(self.statement_timeout, what, f(&mut *self)).await;
        self.settle(r).await
    }

    /// A re-read of the token; `hold`: `FOR UPDATE`, inside a transaction.
    pub(crate) async fn check_fence(
        &mut self,
        token: FencingToken,
        hold: bool,
    ) -> Result<(), Error> {
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
    pub(crate) async fn fenced_update(
        &mut self,
        row: &str,
        token: FencingToken,
        q: Q,
    ) -> Result<(), Error> {
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
    pub(crate) async fn conditional(
        &mut self,
        what: &str,
        token: FencingToken,
        q: Q,
    ) -> Result<(), Error> {
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
    pub(crate) async fn rollback_quietly(&mut self) -> bool {
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
    pub(crate) async fn all_tables_transactional(&mut self) -> Result<bool, Error> {
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
    pub(crate) fn conditional_sql(&self, row: &Write<'_>) -> Option<(Q, String)> {
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
            Write::History(_) | Write::Mirror { .. } | Write::Forget(_) | Write::Audit(_) => {
                return None;
            }
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
    pub(crate) async fn write_unfenced(&mut self, row: Write<'_>) -> Result<(), Error> {
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
            Write::Audit(record) => {
                return binds::insert_audit(&mut self.conn, record, db_err).await;
            }
        };
        q.execute(&mut self.conn).await.map_err(db_err)?;
        Ok(())
    }

    /// What a write is, for a timeout's message.
    pub(crate) fn what(row: &Write<'_>) -> &'static str {
        match row {
            Write::Working(_) => "recording the migration start",
            Write::State(..) => "recording the lock state",
            Write::History(_) => "recording the history row",
            Write::Done { .. } => "recording the statement",
            Write::End { .. } => "recording the migration end",
            Write::Mirror { .. } => "mirroring to _sqlx_migrations",
            Write::Forget(_) => "forgetting the migration",
            Write::Audit(_) => "writing an audit row",
        }
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
    /// A migration's statements `range` on the session, as they are.
    pub(crate) async fn execute_here(
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
pub(crate) fn missing(row: &str) -> Error {
    Error::database(format!("{row} is missing (was the table edited by hand?)"))
}

/// `m`'s history row, as an error names it.
fn history_row(m: &Migration) -> String {
    format!("recording migration {}: its history row", m.version)
}
