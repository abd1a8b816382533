//! PostgreSQL status, history and audit tables, in a configurable schema. Every write by a
//! holder runs in a short transaction that first reads the namespace's fencing token with
//! `SELECT … FOR UPDATE`, so a holder that lost its lock cannot write; a migration's statements
//! and its history row commit together (transactional DDL). The status row is never locked for
//! longer than one such short transaction, so the heartbeat (on another connection) is never
//! kept waiting by a long migration.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dbwarden_core::migration::Migration;
use dbwarden_core::{
    AuditRecord, Error, FencingToken, HistoryRow, HistoryState, HolderInfo, LockState, LostSignal,
    MigrationStore, StatusRow,
};
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use crate::lock::session_ended;

/// A second key space (two int4 keys, `objsubid` 2) so it never meets a namespace's bigint key:
/// serialises the creation of the tables between namespaces on a fresh database.
const DDL_LOCK: (i32, i32) = (0x6462_7764, 1);

/// The quoted, schema-qualified table names (identifiers validated before they get here).
#[derive(Debug, Clone)]
pub struct Tables {
    pub schema: String,
    pub lock: String,
    pub history: String,
    pub audit: String,
    /// Unquoted-name forms for `to_regclass`.
    reg: [String; 3],
}

impl Tables {
    pub fn new(schema: &str, history: &str) -> Self {
        let q = |t: &str| format!("\"{schema}\".\"{t}\"");
        Tables {
            schema: schema.to_owned(),
            lock: q("dbwarden_lock"),
            history: q(history),
            audit: q("dbwarden_lock_audit"),
            reg: [q("dbwarden_lock"), q(history), q("dbwarden_lock_audit")],
        }
    }
}

fn db_err(e: sqlx::Error) -> Error {
    Error::database(e)
}

/// Does the table exist? (Never creates anything; a missing schema is simply "no".)
pub async fn table_exists(conn: &mut PgConnection, quoted: &str) -> Result<bool, Error> {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(quoted)
        .fetch_one(conn)
        .await
        .map_err(db_err)
}

/// `BEGIN` with lock operations bounded by `ms` (statement and lock timeouts, this transaction
/// only).
async fn begin_bounded(conn: &mut PgConnection, ms: u128) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "BEGIN; SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}"
    )))
    .execute(conn)
    .await
    .map(|_| ())
}

/// Commit on success, roll back on error.
async fn finish_tx<T>(conn: &mut PgConnection, r: Result<T, Error>) -> Result<T, Error> {
    match r {
        Ok(v) => {
            sqlx::raw_sql("COMMIT")
                .execute(&mut *conn)
                .await
                .map_err(db_err)?;
            Ok(v)
        }
        Err(e) => {
            let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
            Err(e)
        }
    }
}

/// Create the schema and the three tables if missing. Safe outside the namespace lock too: a
/// transaction-level advisory lock serialises creators, so concurrent first runs (of different
/// namespaces) cannot collide in the catalog.
pub async fn ensure_tables(conn: &mut PgConnection, t: &Tables, ms: u128) -> Result<(), Error> {
    let mut all = true;
    for name in &t.reg {
        all &= table_exists(conn, name).await?;
    }
    if all {
        return Ok(());
    }
    begin_bounded(conn, ms).await.map_err(db_err)?;
    let r = async {
        sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
            .bind(DDL_LOCK.0)
            .bind(DDL_LOCK.1)
            .execute(&mut *conn)
            .await
            .map_err(db_err)?;
        let has_schema: bool =
            sqlx::query_scalar("SELECT to_regnamespace(quote_ident($1)) IS NOT NULL")
                .bind(&t.schema)
                .fetch_one(&mut *conn)
                .await
                .map_err(db_err)?;
        let mut sql = String::new();
        if !has_schema {
            sql.push_str(&format!("CREATE SCHEMA IF NOT EXISTS \"{}\";\n", t.schema));
        }
        sql.push_str(&format!(
            r#"CREATE TABLE IF NOT EXISTS {lock} (
    namespace TEXT PRIMARY KEY,
    execution_id TEXT, owner_id TEXT, migration_version BIGINT, migration_checksum TEXT,
    fencing_token BIGINT NOT NULL DEFAULT 0,
    host TEXT, pid INTEGER, db_connection_id TEXT,
    state TEXT NOT NULL DEFAULT 'AVAILABLE',
    acquired_at TIMESTAMPTZ, last_heartbeat_at TIMESTAMPTZ, expires_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS {history} (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL, checksum TEXT NOT NULL, state TEXT NOT NULL,
    statements_total BIGINT NOT NULL, statements_done BIGINT NOT NULL,
    execution_id TEXT, fencing_token BIGINT NOT NULL,
    started_at TIMESTAMPTZ, finished_at TIMESTAMPTZ, duration_ms BIGINT);
CREATE TABLE IF NOT EXISTS {audit} (
    id BIGSERIAL PRIMARY KEY,
    at TIMESTAMPTZ NOT NULL DEFAULT now(),
    namespace TEXT NOT NULL, action TEXT NOT NULL, actor TEXT NOT NULL,
    holder_execution_id TEXT, holder TEXT, reason TEXT NOT NULL);"#,
            lock = t.lock,
            history = t.history,
            audit = t.audit
        ));
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut *conn)
            .await
            .map_err(db_err)?;
        Ok(())
    }
    .await;
    finish_tx(conn, r).await
}

fn status_from_row(r: &PgRow) -> Result<StatusRow, Error> {
    let state: String = r.try_get("state").map_err(db_err)?;
    Ok(StatusRow {
        namespace: r.try_get("namespace").map_err(db_err)?,
        execution_id: r
            .try_get::<Option<String>, _>("execution_id")
            .map_err(db_err)?
            .and_then(|s| Uuid::parse_str(&s).ok()),
        owner_id: r.try_get("owner_id").map_err(db_err)?,
        migration_version: r.try_get("migration_version").map_err(db_err)?,
        migration_checksum: r.try_get("migration_checksum").map_err(db_err)?,
        fencing_token: r.try_get::<i64, _>("fencing_token").map_err(db_err)? as u64,
        host: r.try_get("host").map_err(db_err)?,
        pid: r
            .try_get::<Option<i32>, _>("pid")
            .map_err(db_err)?
            .map(|p| p as u32),
        db_connection_id: r.try_get("db_connection_id").map_err(db_err)?,
        state: LockState::parse(&state).unwrap_or(LockState::Available),
        acquired_at: r.try_get("acquired_at").map_err(db_err)?,
        last_heartbeat_at: r.try_get("last_heartbeat_at").map_err(db_err)?,
        expires_at: r.try_get("expires_at").map_err(db_err)?,
    })
}

/// The status row of `namespace` (the table must exist).
pub async fn read_status(
    conn: &mut PgConnection,
    t: &Tables,
    namespace: &str,
    for_update: bool,
) -> Result<Option<StatusRow>, Error> {
    let lock = if for_update { " FOR UPDATE" } else { "" };
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT * FROM {} WHERE namespace = $1{lock}",
        t.lock
    )))
    .bind(namespace)
    .fetch_optional(conn)
    .await
    .map_err(db_err)?;
    row.as_ref().map(status_from_row).transpose()
}

/// Every history row, ordered by version (the table must exist).
pub async fn read_history(conn: &mut PgConnection, t: &Tables) -> Result<Vec<HistoryRow>, Error> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT * FROM {} ORDER BY version",
        t.history
    )))
    .fetch_all(conn)
    .await
    .map_err(db_err)?;
    rows.iter()
        .map(|r| {
            let state: String = r.try_get("state").map_err(db_err)?;
            Ok(HistoryRow {
                version: r.try_get("version").map_err(db_err)?,
                description: r.try_get("description").map_err(db_err)?,
                checksum: r.try_get("checksum").map_err(db_err)?,
                state: HistoryState::parse(&state).unwrap_or(HistoryState::Failed),
                statements_total: r.try_get("statements_total").map_err(db_err)?,
                statements_done: r.try_get("statements_done").map_err(db_err)?,
                execution_id: r
                    .try_get::<Option<String>, _>("execution_id")
                    .map_err(db_err)?
                    .and_then(|s| Uuid::parse_str(&s).ok()),
                fencing_token: r.try_get::<i64, _>("fencing_token").map_err(db_err)? as u64,
                started_at: r
                    .try_get::<Option<DateTime<Utc>>, _>("started_at")
                    .map_err(db_err)?,
                finished_at: r.try_get("finished_at").map_err(db_err)?,
                duration_ms: r.try_get("duration_ms").map_err(db_err)?,
            })
        })
        .collect()
}

pub async fn insert_audit(
    conn: &mut PgConnection,
    t: &Tables,
    rec: &AuditRecord,
) -> Result<(), Error> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (namespace, action, actor, holder_execution_id, holder, reason) VALUES ($1, $2, $3, $4, $5, $6)",
        t.audit
    )))
    .bind(&rec.namespace)
    .bind(&rec.action)
    .bind(&rec.actor)
    .bind(rec.holder_execution_id.map(|u| u.to_string()))
    .bind(&rec.holder_desc)
    .bind(&rec.reason)
    .execute(conn)
    .await
    .map_err(db_err)?;
    Ok(())
}

/// Under the session lock: bump the fencing token and write our status row in one
/// transaction. Returns the new token and the row as it was before.
pub async fn bump_and_claim(
    conn: &mut PgConnection,
    t: &Tables,
    namespace: &str,
    holder: &HolderInfo,
    backend_pid: i32,
    ms: u128,
) -> Result<(FencingToken, Option<StatusRow>), Error> {
    begin_bounded(conn, ms).await.map_err(db_err)?;
    let r = async {
        let previous = read_status(conn, t, namespace, true).await?;
        let token: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "INSERT INTO {lock} AS l (namespace, execution_id, owner_id, fencing_token, host, pid, db_connection_id, state, acquired_at, last_heartbeat_at)
             VALUES ($1, $2, $3, 1, $4, $5, $6, 'RUNNING', now(), now())
             ON CONFLICT (namespace) DO UPDATE SET
               execution_id = $2, owner_id = $3, fencing_token = l.fencing_token + 1, host = $4, pid = $5,
               db_connection_id = $6, state = 'RUNNING', acquired_at = now(), last_heartbeat_at = now(),
               migration_version = NULL, migration_checksum = NULL, expires_at = NULL
             RETURNING fencing_token",
            lock = t.lock
        )))
        .bind(namespace)
        .bind(holder.execution_id.to_string())
        .bind(&holder.owner)
        .bind(&holder.host)
        .bind(holder.pid as i32)
        .bind(backend_pid.to_string())
        .fetch_one(&mut *conn)
        .await
        .map_err(db_err)?;
        if let Some(prev) = previous.as_ref().filter(|p| p.state.is_active()) {
            let rec = AuditRecord::new(
                &dbwarden_core::Namespace::new(namespace)?,
                "broken_stale_lock",
                holder,
                format!(
                    "the previous holder's session (backend {}) ended without releasing; the server freed its advisory lock while the status row said {}",
                    prev.db_connection_id.as_deref().unwrap_or("?"),
                    prev.state.as_str()
                ),
            );
            let mut rec = rec;
            rec.holder_execution_id = prev.execution_id;
            rec.holder_desc = Some(format!(
                "host={} pid={} owner={}",
                prev.host.as_deref().unwrap_or("?"),
                prev.pid.map_or("?".into(), |p| p.to_string()),
                prev.owner_id.as_deref().unwrap_or("?")
            ));
            insert_audit(conn, t, &rec).await?;
        }
        Ok((FencingToken(token as u64), previous))
    }
    .await;
    finish_tx(conn, r).await
}

/// The migration tables on the lock session.
pub struct PgStore {
    pub(crate) conn: PgConnection,
    pub(crate) tables: Tables,
    pub(crate) namespace: String,
    /// The lock session's backend pid (for messages).
    pub(crate) pid: i32,
    /// Bound for lock operations (never for migration statements), in milliseconds.
    pub(crate) ms: u128,
}

impl PgStore {
    /// A failure on the lock session: if the session itself ended, the lock ended with it.
    fn err(&self, e: sqlx::Error) -> Error {
        if session_ended(&e) {
            Error::Lost(format!(
                "the lock session (backend pid {}) ended: {}",
                self.pid,
                dbwarden_core::error::one_line(&e.to_string())
            ))
        } else {
            Error::database(e)
        }
    }

    /// Inside a transaction: fail unless the stored token is still `token`; `FOR UPDATE` holds
    /// the row until commit so no new holder can bump it under our write.
    async fn check_fence(&mut self, token: FencingToken, for_update: bool) -> Result<(), Error> {
        let lock = if for_update { " FOR UPDATE" } else { "" };
        let current: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT fencing_token FROM {} WHERE namespace = $1{lock}",
            self.tables.lock
        )))
        .bind(&self.namespace)
        .fetch_optional(&mut self.conn)
        .await
        .map_err(|e| self.err(e))?;
        match current {
            Some(t) if t as u64 == token.0 => Ok(()),
            other => Err(Error::Lost(format!(
                "fenced out: this run holds token {token}, the database now has {}",
                other.map_or_else(|| "no lock row".to_owned(), |t| t.to_string())
            ))),
        }
    }

    /// A short fenced transaction running `sql` with `binds` applied by `f`.
    async fn fenced_write<F>(&mut self, token: FencingToken, f: F) -> Result<(), Error>
    where
        F: for<'c> FnOnce(
            &'c mut PgConnection,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(), sqlx::Error>> + Send + 'c>,
        >,
    {
        begin_bounded(&mut self.conn, self.ms)
            .await
            .map_err(|e| self.err(e))?;
        let r = match self.check_fence(token, true).await {
            Ok(()) => f(&mut self.conn).await.map_err(|e| self.err(e)),
            Err(e) => Err(e),
        };
        self.finish(r).await
    }

    async fn finish<T>(&mut self, r: Result<T, Error>) -> Result<T, Error> {
        match r {
            Ok(v) => {
                sqlx::raw_sql("COMMIT")
                    .execute(&mut self.conn)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok(v)
            }
            Err(e) => {
                if let Err(re) = sqlx::raw_sql("ROLLBACK").execute(&mut self.conn).await
                    && session_ended(&re)
                    && !e.is_lost()
                    && !matches!(e, Error::MigrationFailed { .. })
                {
                    return Err(self.err(re));
                }
                Err(e)
            }
        }
    }

    fn upsert_history_sql(&self) -> String {
        format!(
            "INSERT INTO {t} AS h (version, description, checksum, state, statements_total, statements_done, execution_id, fencing_token, started_at, finished_at, duration_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now(), CASE WHEN $4 = 'APPLIED' THEN clock_timestamp() END, $9)
             ON CONFLICT (version) DO UPDATE SET description = $2, checksum = $3, state = $4,
               statements_total = $5, statements_done = $6, execution_id = $7, fencing_token = $8,
               started_at = now(), finished_at = CASE WHEN $4 = 'APPLIED' THEN clock_timestamp() END,
               duration_ms = $9",
            t = self.tables.history
        )
    }

    /// Record which migration is being worked on (its own short transaction, so the status
    /// row is not locked while the migration runs).
    async fn set_version(&mut self, token: FencingToken, m: &Migration) -> Result<(), Error> {
        let sql = format!(
            "UPDATE {} SET migration_version = $1, migration_checksum = $2 WHERE namespace = $3",
            self.tables.lock
        );
        let (version, checksum, ns) = (m.version, m.checksum.clone(), self.namespace.clone());
        self.fenced_write(token, move |c| {
            Box::pin(async move {
                // Informational only: not worth a WAL flush per migration (the next commit
                // flushes it anyway).
                sqlx::raw_sql("SET LOCAL synchronous_commit = off")
                    .execute(&mut *c)
                    .await?;
                sqlx::query(AssertSqlSafe(sql))
                    .bind(version)
                    .bind(checksum)
                    .bind(ns)
                    .execute(c)
                    .await
                    .map(|_| ())
            })
        })
        .await
    }

    fn failed(&self, m: &Migration, index: usize, e: sqlx::Error) -> Error {
        if session_ended(&e) {
            return self.err(e);
        }
        Error::MigrationFailed {
            version: m.version,
            file: m.path.display().to_string(),
            statement: index + 1,
            total: m.statements.len(),
            message: dbwarden_core::error::one_line(&e.to_string()),
        }
    }

    async fn upsert_history(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
        state: HistoryState,
        done: usize,
        duration_ms: Option<i64>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(AssertSqlSafe(self.upsert_history_sql()))
            .bind(m.version)
            .bind(&m.description)
            .bind(&m.checksum)
            .bind(state.as_str())
            .bind(m.statements.len() as i64)
            .bind(done as i64)
            .bind(execution_id.to_string())
            .bind(token.0 as i64)
            .bind(duration_ms)
            .execute(&mut self.conn)
            .await
            .map(|_| ())
    }

    pub(crate) fn into_conn(self) -> PgConnection {
        self.conn
    }
}

#[async_trait]
impl MigrationStore for PgStore {
    fn transactional(&self) -> bool {
        true
    }

    async fn history(&mut self) -> Result<Vec<HistoryRow>, Error> {
        read_history(&mut self.conn, &self.tables).await
    }

    async fn set_state(
        &mut self,
        token: FencingToken,
        state: LockState,
        migration: Option<&Migration>,
    ) -> Result<(), Error> {
        let t = self.tables.lock.clone();
        let ns = self.namespace.clone();
        let vc = migration.map(|m| (m.version, m.checksum.clone()));
        self.fenced_write(token, move |c| {
            Box::pin(async move {
                match vc {
                    Some((v, sum)) => sqlx::query(AssertSqlSafe(format!(
                        "UPDATE {t} SET state = $1, migration_version = $2, migration_checksum = $3 WHERE namespace = $4"
                    )))
                    .bind(state.as_str())
                    .bind(v)
                    .bind(sum)
                    .bind(ns)
                    .execute(c)
                    .await,
                    None => sqlx::query(AssertSqlSafe(format!(
                        "UPDATE {t} SET state = $1 WHERE namespace = $2"
                    )))
                    .bind(state.as_str())
                    .bind(ns)
                    .execute(c)
                    .await,
                }
                .map(|_| ())
            })
        })
        .await
    }

    async fn apply_in_transaction(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        self.set_version(token, m).await?;
        let t0 = std::time::Instant::now();
        sqlx::raw_sql("BEGIN")
            .execute(&mut self.conn)
            .await
            .map_err(|e| self.err(e))?;
        let r: Result<(), Error> = async {
            for (i, stmt) in m.statements.iter().enumerate() {
                lost.check()?;
                sqlx::raw_sql(AssertSqlSafe(stmt.clone()))
                    .execute(&mut self.conn)
                    .await
                    .map_err(|e| self.failed(m, i, e))?;
            }
            lost.check()?;
            // Bounded from here on: these are lock operations, not the migration.
            let ms = self.ms;
            sqlx::raw_sql(AssertSqlSafe(format!(
                "SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}"
            )))
            .execute(&mut self.conn)
            .await
            .map_err(|e| self.err(e))?;
            self.check_fence(token, true).await?;
            let total = m.statements.len();
            let ms = t0.elapsed().as_millis() as i64;
            self.upsert_history(
                token,
                execution_id,
                m,
                HistoryState::Applied,
                total,
                Some(ms),
            )
            .await
            .map_err(|e| self.err(e))
        }
        .await;
        self.finish(r).await
    }

    async fn journal_begin(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
        from: usize,
    ) -> Result<(), Error> {
        self.set_version(token, m).await?;
        begin_bounded(&mut self.conn, self.ms)
            .await
            .map_err(|e| self.err(e))?;
        let r = async {
            self.check_fence(token, true).await?;
            self.upsert_history(token, execution_id, m, HistoryState::Running, from, None)
                .await
                .map_err(|e| self.err(e))
        }
        .await;
        self.finish(r).await
    }

    async fn journal_statement(
        &mut self,
        token: FencingToken,
        m: &Migration,
        index: usize,
    ) -> Result<(), Error> {
        // Outside a transaction (e.g. CREATE INDEX CONCURRENTLY), still on the lock session.
        self.check_fence(token, false).await?;
        sqlx::raw_sql(AssertSqlSafe(m.statements[index].clone()))
            .execute(&mut self.conn)
            .await
            .map_err(|e| self.failed(m, index, e))?;
        let sql = format!(
            "UPDATE {} SET statements_done = $1 WHERE version = $2",
            self.tables.history
        );
        let (done, version) = (index as i64 + 1, m.version);
        self.fenced_write(token, move |c| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(sql))
                    .bind(done)
                    .bind(version)
                    .execute(c)
                    .await
                    .map(|_| ())
            })
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
        let sql = format!(
            "UPDATE {} SET state = $1, finished_at = clock_timestamp(), duration_ms = $2 WHERE version = $3",
            self.tables.history
        );
        let version = m.version;
        self.fenced_write(token, move |c| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(sql))
                    .bind(state.as_str())
                    .bind(duration_ms)
                    .bind(version)
                    .execute(c)
                    .await
                    .map(|_| ())
            })
        })
        .await
    }

    async fn mark_applied(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
    ) -> Result<(), Error> {
        begin_bounded(&mut self.conn, self.ms)
            .await
            .map_err(|e| self.err(e))?;
        let r = async {
            self.check_fence(token, true).await?;
            let total = m.statements.len();
            self.upsert_history(
                token,
                execution_id,
                m,
                HistoryState::Applied,
                total,
                Some(0),
            )
            .await
            .map_err(|e| self.err(e))
        }
        .await;
        self.finish(r).await
    }

    async fn forget(&mut self, token: FencingToken, version: i64) -> Result<(), Error> {
        let sql = format!("DELETE FROM {} WHERE version = $1", self.tables.history);
        self.fenced_write(token, move |c| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(sql))
                    .bind(version)
                    .execute(c)
                    .await
                    .map(|_| ())
            })
        })
        .await
    }

    async fn audit(&mut self, record: &AuditRecord) -> Result<(), Error> {
        insert_audit(&mut self.conn, &self.tables, record).await
    }
}
