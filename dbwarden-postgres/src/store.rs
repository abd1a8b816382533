//! The migration tables as the runner writes them, on the lock session. Every write by a
//! holder runs in a short transaction that first reads the namespace's fencing token with
//! `SELECT … FOR UPDATE`, so a holder that lost its lock cannot write; a migration's file and
//! its history row commit together (transactional DDL). The file goes to the server as written,
//! in one simple query, as sqlx and psql send it: the server's own parser cuts it. The status row is never locked for
//! longer than one such short transaction, so the heartbeat (on another connection) is never
//! kept waiting by a long migration.

use async_trait::async_trait;
use dbwarden_core::adopt::{ForeignRow, Tool};
use dbwarden_core::migration::Migration;
use dbwarden_core::{Error, Fence, FencingToken, LockState, SqlxCompat, Tx};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgConnection;
use sqlx::postgres::PgDatabaseError;
use sqlx::postgres::PgErrorPosition;

use crate::literal::literal;
use crate::lock::{describe, session_ended};
use crate::tables::{Tables, local_bounds};

/// A query on the lock session, its binds owned.
type Q = sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// The migration tables on the lock session.
/// `lock_not_available`: `lock_timeout` ran out (or a `NOWAIT` lock was not granted).
const LOCK_NOT_AVAILABLE: &str = "55P03";

pub struct PgStore {
    pub(crate) conn: PgConnection,
    pub(crate) tables: Tables,
    pub(crate) namespace: String,
    /// The lock session's backend pid (for messages).
    pub(crate) pid: i32,
    /// Bound for lock operations (never for migration statements), in milliseconds.
    pub(crate) ms: u128,
    /// A migration's own SQL ran on this session: its `SET`s, `SET ROLE`s and temporary tables
    /// may outlive the migration, so the session is never used again after the release.
    pub(crate) touched: bool,
    /// sqlx interoperation (`sqlx_compat`).
    pub(crate) sqlx: SqlxSide,
    /// Reached through a transaction pooler (`lock = "lease"`): no statement is prepared
    /// under a name (another client may get the backend next), and every statement with
    /// parameters runs inside a transaction (the only span a pooler keeps one backend for).
    pub(crate) pooled: bool,
    /// `SET LOCAL` bounds for migration transactions behind a pooler (see
    /// `table_locks::PgStore::bound`); empty otherwise.
    pub(crate) tx_bounds: String,
    /// The bounds last set on the session (`None`: not known; see `table_locks`).
    pub(crate) bounds_set: Option<(Option<std::time::Duration>, Option<std::time::Duration>)>,
    /// The transaction the journal has open on the session: `Tx::Migration` until its
    /// statements are done and the bookkeeping after them is bounded again.
    pub(crate) tx: Option<Tx>,
}

/// What this session does for sqlx's migrator.
#[derive(Debug, Default)]
pub(crate) struct SqlxSide {
    /// sqlx's advisory lock is held on this session.
    locked: bool,
    /// Migrations recorded APPLIED also get their `_sqlx_migrations` row.
    pub(crate) mirror: bool,
    /// `_sqlx_migrations` as the server names it, once found or created.
    table: Option<String>,
}

impl PgStore {
    /// A failure on the lock session: if the session itself ended, the lock ended with it.
    pub(crate) fn err(&self, e: sqlx::Error) -> Error {
        if session_ended(&e) {
            Error::Lost(format!(
                "the lock session (backend pid {}) ended: {}",
                self.pid,
                dbwarden_core::error::one_line(&e.to_string())
            ))
        } else {
            Error::database_from(e.to_string(), e)
        }
    }

    /// The lock session ended under a table helper (which says "cannot reach"): for the
    /// holder that means the lock is lost.
    pub(crate) fn ended(&self, e: Error) -> Error {
        if e.is_unreachable() {
            Error::Lost(format!(
                "the lock session (backend pid {}) ended: {e}",
                self.pid
            ))
        } else {
            e
        }
    }

    /// Inside a transaction: fail unless the stored token is still `token`; `FOR UPDATE` holds
    /// the row until commit so no new holder can bump it under our write.
    pub(crate) async fn check_fence(
        &mut self,
        token: FencingToken,
        for_update: bool,
    ) -> Result<(), Error> {
        let lock = if for_update { " FOR UPDATE" } else { "" };
        // The simple protocol: valid inside a transaction and outside one, pooled or not.
        let row = sqlx::raw_sql(AssertSqlSafe(format!(
            "SELECT fencing_token FROM {} WHERE namespace = {}{lock}",
            self.tables.lock,
            literal(&self.namespace)?
        )))
        .fetch_optional(&mut self.conn)
        .await
        .map_err(|e| self.err(e))?;
        let current = row.map(|r| sqlx::Row::try_get(&r, 0));
        token.check(current.transpose().map_err(|e| self.err(e))?)
    }

    /// A fenced write matched no row: not ours any more (the fence says so), or `what` is
    /// missing.
    pub(crate) async fn unmatched(&mut self, token: FencingToken, what: &str) -> Result<(), Error> {
        self.check_fence(token, false).await?;
        Err(Error::database(format!(
            "{what} is missing (was the table edited by hand?)"
        )))
    }

    /// Bounded from here to the end of the transaction: lock operations, not the migration.
    pub(crate) async fn bound_rest(&mut self) -> Result<(), Error> {
        sqlx::raw_sql(AssertSqlSafe(local_bounds(self.ms)))
            .execute(&mut self.conn)
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Roll back after `cause`: a session that ended meanwhile is the lock lost, unless the
    /// cause already says what happened.
    pub(crate) async fn roll_back(&mut self, cause: Error) -> Error {
        self.tx = None;
        if let Err(re) = sqlx::raw_sql("ROLLBACK").execute(&mut self.conn).await
            && session_ended(&re)
            && !cause.is_lost()
            && !matches!(cause, Error::MigrationFailed { .. })
        {
            return self.err(re);
        }
        cause
    }

    /// `sql` on the lock session, prepared under a name unless a pooler sits between.
    pub(crate) fn query(&self, sql: String) -> Q {
        sqlx::query(AssertSqlSafe(sql)).persistent(!self.pooled)
    }

    /// The status row's `state` set, and with a migration which one it is on.
    pub(crate) fn state_query(&self, state: LockState, migration: Option<&Migration>) -> Q {
        let t = &self.tables.lock;
        let q = match migration {
            Some(m) => self
                .query(format!(
                    "UPDATE {t} SET state = $1, migration_version = $2, migration_checksum = $3 WHERE namespace = $4"
                ))
                .bind(state.as_str())
                .bind(m.version)
                .bind(m.checksum.clone()),
            None => self
                .query(format!("UPDATE {t} SET state = $1 WHERE namespace = $2"))
                .bind(state.as_str()),
        };
        q.bind(self.namespace.clone())
    }

    /// `q` on the lock session; a failure of the session itself is the lock lost.
    pub(crate) async fn exec(&mut self, q: Q) -> Result<u64, Error> {
        let done = q.execute(&mut self.conn).await.map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }

    /// Record which migration is being worked on: its own short transaction (the status row
    /// must not stay locked while the migration runs), sent as one simple query, so one round
    /// trip: bounded, not worth a WAL flush (informational; the next commit flushes it), and
    /// fenced by its `WHERE` (no row updated = not ours any more).
    pub(crate) async fn set_version(
        &mut self,
        token: FencingToken,
        m: &Migration,
    ) -> Result<(), Error> {
        let sql = format!(
            "BEGIN; {bounds}; \
             SET LOCAL synchronous_commit = off; \
             UPDATE {t} SET migration_version = {v}, migration_checksum = {c} \
             WHERE namespace = {ns} AND fencing_token = {token}; COMMIT",
            bounds = local_bounds(self.ms),
            t = self.tables.lock,
            v = m.version,
            c = literal(&m.checksum)?,
            ns = literal(&self.namespace)?,
            token = token.0 as i64,
        );
        let r = sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut self.conn)
            .await
            .map_err(|e| self.err(e));
        match r {
            Ok(done) if done.rows_affected() == 1 => Ok(()),
            Ok(_) => {
                self.unmatched(token, "recording the migration start: the status row")
                    .await
            }
            // An error inside leaves the transaction open and aborted.
            Err(e) => Err(self.roll_back(e).await),
        }
    }

    /// Inside a transaction: the status row names `m`, fenced by the same statement (the row
    /// stays locked until the commit).
    pub(crate) async fn name_migration(
        &mut self,
        m: &Migration,
        fence: Fence,
    ) -> Result<(), Error> {
        let token = fence.token();
        let fence = if token.is_some() {
            " AND fencing_token = $4"
        } else {
            ""
        };
        let sql = format!(
            "UPDATE {} SET migration_version = $1, migration_checksum = $2 WHERE namespace = $3{fence}",
            self.tables.lock
        );
        let q = self.query(sql).bind(m.version).bind(m.checksum.clone());
        let q = q.bind(self.namespace.clone());
        let q = match token {
            Some(t) => q.bind(t.0 as i64),
            None => q,
        };
        match (self.exec(q).await?, token) {
            (0, Some(token)) => {
                let what = "recording the migration start: the status row";
                self.unmatched(token, what).await
            }
            _ => Ok(()),
        }
    }

    /// A statement of `m` failed; `text_start` is where the text that was sent starts in the
    /// file, so the server's error position (in characters of that text) gives the line.
    fn failed_in(&self, m: &Migration, index: usize, text_start: usize, e: sqlx::Error) -> Error {
        if session_ended(&e) {
            return self.err(e);
        }
        let position = e
            .as_database_error()
            .and_then(|d| d.try_downcast_ref::<PgDatabaseError>())
            .and_then(|pg| match pg.position() {
                Some(PgErrorPosition::Original(chars)) => Some(chars),
                _ => None,
            });
        // The server may count more statements than the file's cut (a goose block holding
        // several): never name one past the last.
        let index = index.min(m.statements.len().saturating_sub(1));
        let (index, at) = match position {
            Some(chars) => {
                let text = m.sql.get(text_start..).unwrap_or_default();
                let offset = text_start
                    + text
                        .char_indices()
                        .nth(chars.saturating_sub(1))
                        .map_or(text.len(), |(b, _)| b);
                (m.statement_at(offset).max(index), offset)
            }
            None => (index, m.statements.get(index).map_or(0, |s| s.span.start)),
        };
        let lock_timeout = e
            .as_database_error()
            .and_then(|d| d.code())
            .is_some_and(|c| c == LOCK_NOT_AVAILABLE);
        if lock_timeout {
            return Error::LockTimeout {
                version: m.version,
                file: m.location_at(at),
                statement: index + 1,
                total: m.statements.len(),
                message: describe(&e),
                attempts: String::new(),
                blockers: String::new(),
            };
        }
        Error::MigrationFailed {
            version: m.version,
            file: m.location_at(at),
            statement: index + 1,
            total: m.statements.len(),
            message: describe(&e),
        }
    }

    /// Sends `text` (statements `first..` of `m`, possibly with more after them) as one simple
    /// query. A failure names the statement it stopped at: `first` plus the statements the
    /// server reported complete before it.
    pub(crate) async fn run_text(
        &mut self,
        m: &Migration,
        first: usize,
        text_start: usize,
        text: &str,
    ) -> Result<(), Error> {
        self.sending(text);
        match dbwarden_sql::run_counted(&mut self.conn, text).await {
            Ok(()) => Ok(()),
            Err((done, e)) => Err(self.failed_in(m, first + done, text_start, e)),
        }
    }

    /// Inside the file's own transaction: `statements_done = done`, fenced by the same
    /// statement's `EXISTS`, without opening or committing a transaction.
    /// `before_commit`: the transaction commits next, so the status row stays locked `FOR
    /// SHARE` until then -- no new holder can bump the token between this check and the commit
    /// (a lease can be taken over while its holder is paused). Not otherwise: the lock would
    /// hold the heartbeat off for the rest of a long transaction.
    pub(crate) async fn record_in_place(
        &mut self,
        token: FencingToken,
        m: &Migration,
        done: usize,
        before_commit: bool,
    ) -> Result<(), Error> {
        let lock = if before_commit { " FOR SHARE" } else { "" };
        let q = self.query(format!(
            "UPDATE {h} SET statements_done = $1 WHERE version = $2 \
             AND EXISTS (SELECT 1 FROM {l} WHERE namespace = $3 AND fencing_token = $4{lock})",
            h = self.tables.history,
            l = self.tables.lock
        ));
        let q = q.bind(done as i64).bind(m.version);
        let n = self
            .exec(q.bind(self.namespace.clone()).bind(token.0 as i64))
            .await?;
        if n == 0 {
            let what = format!("recording migration {}: its history row", m.version);
            return self.unmatched(token, &what).await;
        }
        Ok(())
    }

    /// Inside a transaction, when mirroring: `m`'s `_sqlx_migrations` row as sqlx writes it
    /// (`success`, the SHA-384 of the file, the time in nanoseconds). A row already there is
    /// an error when the migration just ran (someone else ran it too: roll back), and left as
    /// it is when only recording.
    pub(crate) async fn mirror_row(
        &mut self,
        m: &Migration,
        nanos: i64,
        ran: bool,
    ) -> Result<(), Error> {
        if !self.sqlx.mirror {
            return Ok(());
        }
        let checksum = m.sqlx_checksum()?;
        let conflict = if ran {
            ""
        } else {
            " ON CONFLICT (version) DO NOTHING"
        };
        // The name as the server spelled it (`to_regclass`), found when mirroring began.
        let table = self
            .sqlx
            .table
            .clone()
            .unwrap_or_else(|| Tool::Sqlx.table().to_owned());
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (version, description, success, checksum, execution_time) VALUES ($1, $2, TRUE, $3, $4){conflict}"
        )))
        .bind(m.version)
        .bind(m.sqlx_description())
        .bind(checksum)
        .bind(nanos)
        .execute(&mut self.conn)
        .await
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub(crate) fn into_conn(self) -> (PgConnection, bool) {
        (self.conn, self.touched)
    }
}

#[async_trait]
impl SqlxCompat for PgStore {
    async fn sqlx_table_exists(&mut self) -> Result<bool, Error> {
        let schema = self.tables.schema.clone();
        let r = crate::other_tools::locate(&mut self.conn, &schema, Tool::Sqlx).await;
        self.sqlx.table = r.map_err(|e| self.ended(e))?;
        Ok(self.sqlx.table.is_some())
    }

    async fn try_lock_sqlx(&mut self) -> Result<bool, Error> {
        if self.sqlx.locked {
            return Ok(true);
        }
        // A session holding sqlx's lock must end with the lease, never be kept.
        self.touched = true;
        // sqlx's advisory-lock key for this database.
        let db: String = sqlx::query_scalar("SELECT current_database()::text")
            .fetch_one(&mut self.conn)
            .await
            .map_err(|e| self.err(e))?;
        let key = dbwarden_core::adopt::sqlx_lock_key(&db);
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(key)
            .fetch_one(&mut self.conn)
            .await
            .map_err(|e| self.err(e))?;
        self.sqlx.locked = got;
        Ok(got)
    }

    async fn sqlx_rows(&mut self) -> Result<Vec<ForeignRow>, Error> {
        let schema = self.tables.schema.clone();
        let r = crate::other_tools::read_tools(&mut self.conn, &schema, &[Tool::Sqlx]).await;
        Ok(r.map_err(|e| self.ended(e))?
            .into_iter()
            .flat_map(|h| h.rows)
            .collect())
    }

    async fn mirror_to_sqlx(&mut self) -> Result<(), Error> {
        if !self.sqlx_table_exists().await? {
            sqlx::raw_sql(crate::other_tools::CREATE_SQLX_TABLE)
                .execute(&mut self.conn)
                .await
                .map_err(|e| self.err(e))?;
            self.sqlx_table_exists().await?;
        }
        self.sqlx.mirror = true;
        Ok(())
    }
}
