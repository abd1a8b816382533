//! MySQL status, history and audit tables, on the session that holds the named lock.
//!
//! DDL autocommits in MySQL, so a migration cannot commit together with its history row: every
//! migration runs through the per-statement journal (`statements_done` after each statement),
//! which is what recovery reads after a crash. Every write by a holder is fenced: a conditional
//! write (`... AND fencing_token = ?`, zero rows matched = fenced out) or a transaction that
//! re-reads the token `FOR UPDATE` first. Timestamps are the server's `UTC_TIMESTAMP(6)`.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDateTime, Utc};
use dbwarden_core::migration::Migration;
use dbwarden_core::{
    AuditRecord, Error, FencingToken, HistoryRow, HistoryState, HolderInfo, LockState, LostSignal,
    MigrationStore, StatusRow,
};
use sqlx::mysql::{MySqlConnection, MySqlRow};
use sqlx::{AssertSqlSafe, Connection, Row};
use uuid::Uuid;

use crate::lock::{bounded, is_used_lock};

pub(crate) fn db_err(e: sqlx::Error) -> Error {
    Error::database(e)
}

fn ts(t: Option<NaiveDateTime>) -> Option<DateTime<Utc>> {
    t.map(|t| t.and_utc())
}

/// Create the three tables if they are missing. Runs under the lock (and `CREATE TABLE IF NOT
/// EXISTS` is atomic in MySQL, so concurrent first runs cannot fail here either).
pub(crate) async fn create_tables(conn: &mut MySqlConnection, history: &str) -> Result<(), Error> {
    let statements = [
        "CREATE TABLE IF NOT EXISTS dbwarden_lock (
            namespace VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
            execution_id CHAR(36) NULL, owner_id VARCHAR(255) NULL,
            migration_version BIGINT NULL, migration_checksum CHAR(64) NULL,
            fencing_token BIGINT NOT NULL DEFAULT 0,
            host VARCHAR(255) NULL, pid BIGINT NULL, db_connection_id VARCHAR(32) NULL,
            state VARCHAR(16) NOT NULL DEFAULT 'AVAILABLE',
            acquired_at DATETIME(6) NULL, last_heartbeat_at DATETIME(6) NULL, expires_at DATETIME(6) NULL
        ) ENGINE=InnoDB"
            .to_owned(),
        format!(
            "CREATE TABLE IF NOT EXISTS `{history}` (
            version BIGINT NOT NULL PRIMARY KEY,
            description TEXT NOT NULL, checksum CHAR(64) NOT NULL, state VARCHAR(16) NOT NULL,
            statements_total BIGINT NOT NULL, statements_done BIGINT NOT NULL,
            execution_id CHAR(36) NULL, fencing_token BIGINT NOT NULL,
            started_at DATETIME(6) NULL, finished_at DATETIME(6) NULL, duration_ms BIGINT NULL
        ) ENGINE=InnoDB"
        ),
        AUDIT_TABLE.to_owned(),
    ];
    for sql in statements {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut *conn)
            .await
            .map_err(db_err)?;
    }
    Ok(())
}

pub(crate) const AUDIT_TABLE: &str = "CREATE TABLE IF NOT EXISTS dbwarden_lock_audit (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at DATETIME(6) NOT NULL,
    namespace VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    action VARCHAR(64) NOT NULL, actor VARCHAR(512) NOT NULL,
    holder_execution_id CHAR(36) NULL, holder VARCHAR(512) NULL, reason TEXT NOT NULL
) ENGINE=InnoDB";

/// Whether `table` exists in the connection's database (without creating anything).
pub(crate) async fn table_exists(conn: &mut MySqlConnection, table: &str) -> Result<bool, Error> {
    let n: i64 = sqlx::query_scalar(
        "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
    )
    .bind(table)
    .fetch_one(conn)
    .await
    .map_err(db_err)?;
    Ok(n > 0)
}

fn status_from_row(r: &MySqlRow) -> Result<StatusRow, Error> {
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
            .try_get::<Option<i64>, _>("pid")
            .map_err(db_err)?
            .map(|p| p as u32),
        db_connection_id: r.try_get("db_connection_id").map_err(db_err)?,
        state: LockState::parse(&state).unwrap_or(LockState::Available),
        acquired_at: ts(r.try_get("acquired_at").map_err(db_err)?),
        last_heartbeat_at: ts(r.try_get("last_heartbeat_at").map_err(db_err)?),
        expires_at: ts(r.try_get("expires_at").map_err(db_err)?),
    })
}

const STATUS_COLUMNS: &str = "namespace, execution_id, owner_id, migration_version, migration_checksum, fencing_token, host, pid, db_connection_id, state, acquired_at, last_heartbeat_at, expires_at";

pub(crate) async fn read_status(
    conn: &mut MySqlConnection,
    namespace: &str,
    for_update: bool,
) -> Result<Option<StatusRow>, Error> {
    let sql = format!(
        "SELECT {STATUS_COLUMNS} FROM dbwarden_lock WHERE namespace = ?{}",
        if for_update { " FOR UPDATE" } else { "" }
    );
    let row = sqlx::query(AssertSqlSafe(sql))
        .bind(namespace)
        .fetch_optional(conn)
        .await
        .map_err(db_err)?;
    let status = row.as_ref().map(status_from_row).transpose()?;
    // A placeholder row inserted by a first acquire that never got further is no status at all.
    Ok(status.filter(|s| s.fencing_token > 0 || s.execution_id.is_some()))
}

pub(crate) async fn read_history(
    conn: &mut MySqlConnection,
    table: &str,
) -> Result<Vec<HistoryRow>, Error> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT version, description, checksum, state, statements_total, statements_done, execution_id, fencing_token, started_at, finished_at, duration_ms FROM `{table}` ORDER BY version"
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
                started_at: ts(r.try_get("started_at").map_err(db_err)?),
                finished_at: ts(r.try_get("finished_at").map_err(db_err)?),
                duration_ms: r.try_get("duration_ms").map_err(db_err)?,
            })
        })
        .collect()
}

pub(crate) async fn insert_audit(
    conn: &mut MySqlConnection,
    rec: &AuditRecord,
) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO dbwarden_lock_audit (at, namespace, action, actor, holder_execution_id, holder, reason) VALUES (UTC_TIMESTAMP(6), ?, ?, ?, ?, ?, ?)",
    )
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

/// Commit on success, roll back on error.
pub(crate) async fn finish_tx<T>(
    conn: &mut MySqlConnection,
    r: Result<T, Error>,
) -> Result<T, Error> {
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

/// Under the named lock: bump the fencing token and write our status row in one transaction,
/// with `audits`. Returns the new token and the row as it was before.
pub(crate) async fn bump_and_claim(
    conn: &mut MySqlConnection,
    namespace: &str,
    holder: &HolderInfo,
    conn_id: u64,
    audits: impl Fn(Option<&StatusRow>) -> Vec<AuditRecord>,
) -> Result<(FencingToken, Option<StatusRow>), Error> {
    // The row exists before the transaction, so `FOR UPDATE` takes a record lock, never a gap
    // lock (two namespaces' first runs would otherwise deadlock on their inserts).
    sqlx::query("INSERT IGNORE INTO dbwarden_lock (namespace, fencing_token, state) VALUES (?, 0, 'AVAILABLE')")
        .bind(namespace)
        .execute(&mut *conn)
        .await
        .map_err(db_err)?;
    sqlx::raw_sql("START TRANSACTION")
        .execute(&mut *conn)
        .await
        .map_err(db_err)?;
    let r: Result<_, Error> = async {
        let previous = read_status(conn, namespace, true).await?;
        sqlx::query(
            "UPDATE dbwarden_lock SET execution_id = ?, owner_id = ?, fencing_token = fencing_token + 1,
               host = ?, pid = ?, db_connection_id = ?, state = 'RUNNING', acquired_at = UTC_TIMESTAMP(6),
               last_heartbeat_at = UTC_TIMESTAMP(6), expires_at = NULL, migration_version = NULL,
               migration_checksum = NULL
             WHERE namespace = ?",
        )
        .bind(holder.execution_id.to_string())
        .bind(&holder.owner)
        .bind(&holder.host)
        .bind(i64::from(holder.pid))
        .bind(conn_id.to_string())
        .bind(namespace)
        .execute(&mut *conn)
        .await
        .map_err(db_err)?;
        let token: i64 =
            sqlx::query_scalar("SELECT fencing_token FROM dbwarden_lock WHERE namespace = ?")
                .bind(namespace)
                .fetch_one(&mut *conn)
                .await
                .map_err(db_err)?;
        for rec in audits(previous.as_ref()) {
            insert_audit(conn, &rec).await?;
        }
        Ok((FencingToken(token as u64), previous))
    }
    .await;
    finish_tx(conn, r).await
}

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
}

fn fenced_out(token: FencingToken, current: Option<i64>) -> Error {
    Error::Lost(format!(
        "fenced out: this run holds token {token}, the database now has {}",
        current.map_or_else(|| "no lock row".to_owned(), |t| t.to_string())
    ))
}

impl MySqlStore {
    /// After a failed statement or write: if this session no longer holds the named lock (it
    /// was killed, or the connection dropped), the lock is lost, whatever the error said.
    async fn classify(&mut self, e: Error) -> Error {
        let check = tokio::time::timeout(
            self.statement_timeout,
            is_used_lock(&mut self.conn, &self.lock_name),
        )
        .await;
        match check {
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
        }
    }

    /// Run a bookkeeping step bounded by `statement_timeout`; failures are classified.
    async fn step<T, F>(&mut self, what: &str, f: F) -> Result<T, Error>
    where
        F: for<'c> FnOnce(
            &'c mut Self,
        )
            -> std::pin::Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'c>>,
    {
        let limit = self.statement_timeout;
        match bounded(limit, what, f(self)).await {
            Ok(v) => Ok(v),
            Err(e) if e.is_lost() => Err(e),
            Err(e) => Err(self.classify(e).await),
        }
    }

    /// `START TRANSACTION`, then the token `FOR UPDATE`; the caller ends with [`finish_tx`].
    async fn begin_fenced(&mut self, token: FencingToken) -> Result<(), Error> {
        sqlx::raw_sql("START TRANSACTION")
            .execute(&mut self.conn)
            .await
            .map_err(db_err)?;
        let current: Result<Option<i64>, Error> = sqlx::query_scalar(
            "SELECT fencing_token FROM dbwarden_lock WHERE namespace = ? FOR UPDATE",
        )
        .bind(&self.namespace)
        .fetch_optional(&mut self.conn)
        .await
        .map_err(db_err);
        match current {
            Ok(Some(t)) if t as u64 == token.0 => Ok(()),
            other => {
                let _ = sqlx::raw_sql("ROLLBACK").execute(&mut self.conn).await;
                match other {
                    Ok(current) => Err(fenced_out(token, current)),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// A plain re-read of the token (before a migration statement, which cannot be in our
    /// transaction because DDL commits it).
    async fn check_fence(&mut self, token: FencingToken) -> Result<(), Error> {
        let current: Option<i64> =
            sqlx::query_scalar("SELECT fencing_token FROM dbwarden_lock WHERE namespace = ?")
                .bind(&self.namespace)
                .fetch_optional(&mut self.conn)
                .await
                .map_err(db_err)?;
        match current {
            Some(t) if t as u64 == token.0 => Ok(()),
            other => Err(fenced_out(token, other)),
        }
    }

    /// Replace the history row of `m` (inside a fenced transaction).
    async fn put_history(
        &mut self,
        m: &Migration,
        state: HistoryState,
        done: usize,
        execution_id: Uuid,
        token: FencingToken,
        duration_ms: Option<i64>,
    ) -> Result<(), Error> {
        let t = &self.history_table;
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM `{t}` WHERE version = ?"
        )))
        .bind(m.version)
        .execute(&mut self.conn)
        .await
        .map_err(db_err)?;
        let finished = if state == HistoryState::Applied {
            "UTC_TIMESTAMP(6)"
        } else {
            "NULL"
        };
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO `{t}` (version, description, checksum, state, statements_total, statements_done, execution_id, fencing_token, started_at, finished_at, duration_ms)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), {finished}, ?)"
        )))
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
        .map_err(db_err)?;
        Ok(())
    }

    /// A fenced transaction around `f`.
    async fn in_fenced_tx<F>(&mut self, what: &str, token: FencingToken, f: F) -> Result<(), Error>
    where
        F: for<'c> FnOnce(
                &'c mut Self,
            )
                -> std::pin::Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'c>>
            + Send
            + 'static,
    {
        self.step(what, move |s| {
            Box::pin(async move {
                s.begin_fenced(token).await?;
                let r = f(s).await;
                finish_tx(&mut s.conn, r).await
            })
        })
        .await
    }

    /// A single conditional write: `sql` must end in `WHERE ... AND EXISTS (fence)`, with the
    /// namespace and token bound last. Zero rows matched means fenced out.
    async fn conditional(
        &mut self,
        what: &str,
        token: FencingToken,
        q: sqlx::query::Query<'static, sqlx::MySql, sqlx::mysql::MySqlArguments>,
    ) -> Result<(), Error> {
        let ns = self.namespace.clone();
        let n = self
            .step(what, move |s| {
                Box::pin(async move {
                    q.bind(ns)
                        .bind(token.0 as i64)
                        .execute(&mut s.conn)
                        .await
                        .map(|r| r.rows_affected())
                        .map_err(db_err)
                })
            })
            .await?;
        if n == 0 {
            self.check_fence(token).await?;
            return Err(Error::database(format!(
                "{what}: the row to update is missing (was the history table edited by hand?)"
            )));
        }
        Ok(())
    }

    /// Free the named lock and close the session.
    pub(crate) async fn release(mut self) -> Result<(), Error> {
        let name = self.lock_name.clone();
        let r = bounded(self.statement_timeout, "releasing the lock", async {
            sqlx::query("DO RELEASE_LOCK(?)")
                .bind(name)
                .execute(&mut self.conn)
                .await
                .map_err(db_err)
        })
        .await;
        // Closing the session frees the lock too, should RELEASE_LOCK have failed.
        let _ = self.conn.close().await;
        r.map(|_| ())
    }
}

const FENCE: &str =
    "EXISTS (SELECT 1 FROM dbwarden_lock WHERE namespace = ? AND fencing_token = ?)";

#[async_trait]
impl MigrationStore for MySqlStore {
    /// DDL autocommits: no migration commits together with its history row.
    fn transactional(&self) -> bool {
        false
    }

    async fn history(&mut self) -> Result<Vec<HistoryRow>, Error> {
        self.step("reading the history", |s| {
            Box::pin(async move { read_history(&mut s.conn, &s.history_table).await })
        })
        .await
    }

    async fn set_state(
        &mut self,
        token: FencingToken,
        state: LockState,
        migration: Option<&Migration>,
    ) -> Result<(), Error> {
        let q = match migration {
            Some(m) => sqlx::query(
                "UPDATE dbwarden_lock SET state = ?, migration_version = ?, migration_checksum = ? WHERE namespace = ? AND fencing_token = ?",
            )
            .bind(state.as_str())
            .bind(m.version)
            .bind(m.checksum.clone()),
            None => sqlx::query(
                "UPDATE dbwarden_lock SET state = ? WHERE namespace = ? AND fencing_token = ?",
            )
            .bind(state.as_str()),
        };
        self.conditional("recording the lock state", token, q).await
    }

    async fn apply_in_transaction(
        &mut self,
        _token: FencingToken,
        _execution_id: Uuid,
        m: &Migration,
        _lost: &LostSignal,
    ) -> Result<(), Error> {
        Err(Error::usage(format!(
            "migration {}: MySQL commits DDL on its own, so a migration cannot run in one transaction; use the journal (journal_begin / journal_statement / journal_end)",
            m.version
        )))
    }

    async fn journal_begin(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
        from: usize,
    ) -> Result<(), Error> {
        let m = m.clone();
        self.in_fenced_tx("recording the migration start", token, move |s| {
            Box::pin(async move {
                sqlx::query(
                    "UPDATE dbwarden_lock SET migration_version = ?, migration_checksum = ? WHERE namespace = ?",
                )
                .bind(m.version)
                .bind(&m.checksum)
                .bind(&s.namespace)
                .execute(&mut s.conn)
                .await
                .map_err(db_err)?;
                s.put_history(&m, HistoryState::Running, from, execution_id, token, None)
                    .await
            })
        })
        .await
    }

    async fn journal_statement(
        &mut self,
        token: FencingToken,
        m: &Migration,
        index: usize,
    ) -> Result<(), Error> {
        self.step("checking the fencing token", |s| {
            Box::pin(async move { s.check_fence(token).await })
        })
        .await?;
        let stmt = m.statements[index].clone();
        if let Err(e) = sqlx::raw_sql(AssertSqlSafe(stmt))
            .execute(&mut self.conn)
            .await
        {
            let failed = Error::MigrationFailed {
                version: m.version,
                file: m.path.display().to_string(),
                statement: index + 1,
                total: m.statements.len(),
                message: dbwarden_core::error::one_line(&e.to_string()),
            };
            return Err(self.classify(failed).await);
        }
        let q = sqlx::query(AssertSqlSafe(format!(
            "UPDATE `{}` SET statements_done = ? WHERE version = ? AND {FENCE}",
            self.history_table
        )))
        .bind((index + 1) as i64)
        .bind(m.version);
        self.conditional("recording the statement", token, q).await
    }

    async fn journal_end(
        &mut self,
        token: FencingToken,
        m: &Migration,
        state: HistoryState,
        duration_ms: i64,
    ) -> Result<(), Error> {
        let q = sqlx::query(AssertSqlSafe(format!(
            "UPDATE `{}` SET state = ?, finished_at = UTC_TIMESTAMP(6), duration_ms = ? WHERE version = ? AND {FENCE}",
            self.history_table
        )))
        .bind(state.as_str())
        .bind(duration_ms)
        .bind(m.version);
        self.conditional("recording the migration end", token, q)
            .await
    }

    async fn mark_applied(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
    ) -> Result<(), Error> {
        let m = m.clone();
        let total = m.statements.len();
        self.in_fenced_tx("marking the migration applied", token, move |s| {
            Box::pin(async move {
                s.put_history(
                    &m,
                    HistoryState::Applied,
                    total,
                    execution_id,
                    token,
                    Some(0),
                )
                .await
            })
        })
        .await
    }

    async fn forget(&mut self, token: FencingToken, version: i64) -> Result<(), Error> {
        self.in_fenced_tx("forgetting the migration", token, move |s| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(format!(
                    "DELETE FROM `{}` WHERE version = ?",
                    s.history_table
                )))
                .bind(version)
                .execute(&mut s.conn)
                .await
                .map_err(db_err)?;
                Ok(())
            })
        })
        .await
    }

    async fn audit(&mut self, record: &AuditRecord) -> Result<(), Error> {
        let record = record.clone();
        self.step("writing an audit row", move |s| {
            Box::pin(async move { insert_audit(&mut s.conn, &record).await })
        })
        .await
    }
}
