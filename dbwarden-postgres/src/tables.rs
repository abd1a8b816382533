//! The status, history and audit tables (docs/design.md §4) in a configurable schema: creating them
//! (safely, even by concurrent first runs of different namespaces), reading them, and the claim
//! a new holder writes under the session lock.

use chrono::{DateTime, Utc};
use dbwarden_core::takeover::{self, Freed};
use dbwarden_core::{AuditRecord, Error, FencingToken, HistoryRow, HolderInfo, StatusRow};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Row};

use crate::literal::literal;

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

/// A session the server ended (a restart: SQLSTATE 57P01, a dropped connection) is "cannot
/// reach", as everywhere else in this crate -- not a database error (exit 1), which would say
/// a migration failed.
pub(crate) fn db_err(e: sqlx::Error) -> Error {
    if crate::lock::session_ended(&e) {
        Error::unreachable_from("the PostgreSQL server", crate::lock::describe(&e), e)
    } else {
        Error::database_from(crate::lock::describe(&e), e)
    }
}

/// Does the table exist? (Never creates anything; a missing schema is simply "no".)
pub async fn table_exists(conn: &mut PgConnection, quoted: &str) -> Result<bool, Error> {
    simple_bool(
        conn,
        &format!("SELECT to_regclass({}) IS NOT NULL", literal(quoted)?),
    )
    .await
}

/// One boolean from a query sent in the simple protocol: no prepared statement, so it
/// runs the same through a transaction pooler (`lock = "lease"`), inside a transaction or not.
pub(crate) async fn simple_bool(conn: &mut PgConnection, sql: &str) -> Result<bool, Error> {
    let row = sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .fetch_one(conn)
        .await
        .map_err(db_err)?;
    row.try_get(0).map_err(db_err)
}

/// `BEGIN` for a claim (advisory or lease): statements bounded by `ms`, but the status row's
/// lock waited for only half of it, so a row another transaction keeps locked (a lease holder
/// paused inside a fenced write, an unlock in flight) ends the claim with lock_not_available --
/// busy, see [`row_locked`] -- before the client's bound on the attempt calls the server
/// unreachable.
pub(crate) async fn begin_claim(conn: &mut PgConnection, ms: u128) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "BEGIN; SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {}",
        (ms / 2).max(1)
    )))
    .execute(conn)
    .await
    .map(|_| ())
}

/// lock_not_available (the claim's `lock_timeout`): the status row stayed locked by another
/// transaction. A cancelled statement (57014: a slow server, a DBA's `pg_cancel_backend`) is not
/// this, and stays an error.
pub(crate) fn row_locked(e: &Error) -> bool {
    e.to_string().contains("[SQLSTATE 55P03]")
}

/// What a claim that met the status row locked reports: busy, as for any holder.
pub(crate) fn row_locked_busy() -> dbwarden_core::error::BusyInfo {
    dbwarden_core::error::BusyInfo {
        note: Some(
            "a holder's write keeps the status row locked (paused, or slow); waiting".to_owned(),
        ),
        ..Default::default()
    }
}

/// Statement and lock timeouts of `ms` for the rest of this transaction: what bounds the lock
/// operations (never a migration's own statements).
pub(crate) fn local_bounds(ms: u128) -> String {
    format!("SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}")
}

/// `BEGIN` with lock operations bounded by `ms` ([`local_bounds`]).
pub(crate) async fn begin_bounded(conn: &mut PgConnection, ms: u128) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(format!("BEGIN; {}", local_bounds(ms))))
        .execute(conn)
        .await
        .map(|_| ())
}

/// Commit on success, roll back on error.
pub(crate) async fn finish_tx<T>(conn: &mut PgConnection, r: Result<T, Error>) -> Result<T, Error> {
    dbwarden_sql::finish_tx(conn, r, db_err).await
}

/// Create the schema and the three tables if missing. Safe outside the namespace lock too: a
/// transaction-level advisory lock serialises creators, so concurrent first runs (of different
/// namespaces) cannot collide in the catalog. Returns whether the status table has the
/// holder-settings columns (see `upgrade_status_table`).
pub async fn ensure_tables(conn: &mut PgConnection, t: &Tables, ms: u128) -> Result<bool, Error> {
    // One round trip for the three and the columns (this runs inside every claim).
    // In the simple protocol, as every read here: the same through a transaction pooler.
    let [a, b, c] = &t.reg;
    let (a, b, c) = (literal(a)?, literal(b)?, literal(c)?);
    let row = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT to_regclass({a}) IS NOT NULL AND to_regclass({b}) IS NOT NULL AND to_regclass({c}) IS NOT NULL,
           EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass({a}) AND attname = 'heartbeat_interval_ms' AND NOT attisdropped)"
    )))
    .fetch_one(&mut *conn)
    .await
    .map_err(db_err)?;
    let (all, settings): (bool, bool) = sqlx::FromRow::from_row(&row).map_err(db_err)?;
    if !all {
        create_tables(conn, t, ms).await?;
    }
    if settings {
        return Ok(true);
    }
    // An older status table (or one created just now, with the columns: a no-op).
    upgrade_status_table(conn, t).await
}

/// A status table of an older version lacks the holder-settings columns: add them, without
/// making the claim depend on it. `ALTER TABLE` needs the table's owner and an exclusive lock
/// on it; a role that may only write, or a lock not granted within 2 s, leaves the table as
/// it is (the claim then records no settings, and lock-status judges by its own ttl).
async fn upgrade_status_table(conn: &mut PgConnection, t: &Tables) -> Result<bool, Error> {
    begin_bounded(conn, 2000).await.map_err(db_err)?;
    let r = sqlx::raw_sql(AssertSqlSafe(format!(
        "ALTER TABLE {lock} ADD COLUMN IF NOT EXISTS lock_ttl_ms BIGINT, ADD COLUMN IF NOT EXISTS heartbeat_interval_ms BIGINT",
        lock = t.lock
    )))
    .execute(&mut *conn)
    .await;
    match r {
        Ok(_) => finish_tx(conn, Ok(true)).await,
        Err(e) if crate::lock::session_ended(&e) => Err(db_err(e)),
        Err(e) => {
            tracing::warn!(
                "cannot add the holder-settings columns to {} ({}); this run records no lock_ttl there",
                t.lock,
                crate::lock::describe(&e)
            );
            let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
            Ok(false)
        }
    }
}

async fn create_tables(conn: &mut PgConnection, t: &Tables, ms: u128) -> Result<(), Error> {
    begin_bounded(conn, ms).await.map_err(db_err)?;
    let r = async {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "SELECT pg_advisory_xact_lock({}, {})",
            DDL_LOCK.0, DDL_LOCK.1
        )))
        .execute(&mut *conn)
        .await
        .map_err(db_err)?;
        let has_schema = simple_bool(
            conn,
            &format!(
                "SELECT to_regnamespace(quote_ident({})) IS NOT NULL",
                literal(&t.schema)?
            ),
        )
        .await?;
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
    acquired_at TIMESTAMPTZ, last_heartbeat_at TIMESTAMPTZ, expires_at TIMESTAMPTZ,
    lock_ttl_ms BIGINT, heartbeat_interval_ms BIGINT);
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

/// The status row of `namespace` (the table must exist).
pub async fn read_status(
    conn: &mut PgConnection,
    t: &Tables,
    namespace: &str,
    for_update: bool,
) -> Result<Option<StatusRow>, Error> {
    let lock = if for_update { " FOR UPDATE" } else { "" };
    let row = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT * FROM {} WHERE namespace = {}{lock}",
        t.lock,
        literal(namespace)?
    )))
    .fetch_optional(conn)
    .await
    .map_err(db_err)?;
    row.as_ref().map(dbwarden_sql::status_row).transpose()
}

/// The status row of `namespace`, `None` when its table does not exist.
pub async fn status_if_any(
    conn: &mut PgConnection,
    t: &Tables,
    namespace: &str,
) -> Result<Option<StatusRow>, Error> {
    if !table_exists(conn, &t.lock).await? {
        return Ok(None);
    }
    read_status(conn, t, namespace, false).await
}

/// Every history row, none when the table does not exist.
pub async fn history_if_any(conn: &mut PgConnection, t: &Tables) -> Result<Vec<HistoryRow>, Error> {
    if !table_exists(conn, &t.history).await? {
        return Ok(Vec::new());
    }
    read_history(conn, t).await
}

/// Every history row, ordered by version (the table must exist).
pub async fn read_history(conn: &mut PgConnection, t: &Tables) -> Result<Vec<HistoryRow>, Error> {
    let rows = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT * FROM {} ORDER BY version",
        t.history
    )))
    .fetch_all(conn)
    .await
    .map_err(db_err)?;
    rows.iter()
        .map(|r| dbwarden_sql::history_row(r, &t.history))
        .collect()
}

pub async fn insert_audit(
    conn: &mut PgConnection,
    t: &Tables,
    rec: &AuditRecord,
) -> Result<(), Error> {
    let opt = |v: Option<String>| v.map_or(Ok("NULL".to_owned()), |s| literal(&s));
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO {} (namespace, action, actor, holder_execution_id, holder, reason) VALUES ({}, {}, {}, {}, {}, {})",
        t.audit,
        literal(&rec.namespace)?,
        literal(&rec.action)?,
        literal(&rec.actor)?,
        opt(rec.holder_execution_id.map(|u| u.to_string()))?,
        opt(rec.holder_desc.clone())?,
        literal(&rec.reason)?
    )))
    .execute(conn)
    .await
    .map_err(db_err)?;
    Ok(())
}

/// Inside a claim: the status row of `namespace`, locked `FOR UPDATE`, made first if missing
/// (then `FOR UPDATE` waits for the other primitive's claim of a new namespace that is not
/// committed yet, and sees it). `None` only if it was deleted meanwhile.
pub(crate) async fn lock_row(
    conn: &mut PgConnection,
    t: &Tables,
    namespace: &str,
) -> Result<Option<StatusRow>, Error> {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO {} (namespace) VALUES ({}) ON CONFLICT (namespace) DO NOTHING",
        t.lock,
        literal(namespace)?
    )))
    .execute(&mut *conn)
    .await
    .map_err(db_err)?;
    read_status(conn, t, namespace, true).await
}

/// Under the session lock: bump the fencing token and write our status row in one
/// transaction. Returns the new token and the row as it was before.
pub(crate) async fn bump_and_claim(
    pg: &crate::PgLock,
    conn: &mut PgConnection,
    holder: &HolderInfo,
    backend_pid: i32,
    settings: bool,
) -> Result<Claimed, Error> {
    let (t, namespace) = (&pg.tables, pg.namespace.as_str());
    begin_claim(conn, pg.ms()).await.map_err(db_err)?;
    let r = async {
        let previous = lock_row(conn, t, namespace).await?;
        // A runner on `lock = "lease"` (through a transaction pooler) holds no advisory lock:
        // its live lease in this row excludes us as our advisory lock excludes it.
        let mut broken_lease = None;
        if let Some(p) = previous.as_ref().filter(|p| is_lease(p)) {
            match judge_lease(p, server_now(conn).await?) {
                Ok(age) => broken_lease = Some(age),
                Err(busy) => return Err(Error::Busy(busy)),
            }
        }
        // Without the holder-settings columns (an older table this role may not alter), the
        // same claim without them.
        let (cols, vals, set) = if settings {
            (
                ", lock_ttl_ms, heartbeat_interval_ms",
                ", $7, $8",
                ", lock_ttl_ms = $7, heartbeat_interval_ms = $8",
            )
        } else {
            ("", "", "")
        };
        let mut q = sqlx::query_scalar(AssertSqlSafe(format!(
            "INSERT INTO {lock} AS l (namespace, execution_id, owner_id, fencing_token, host, pid, db_connection_id, state, acquired_at, last_heartbeat_at{cols})
             VALUES ($1, $2, $3, 1, $4, $5, $6, 'RUNNING', now(), now(){vals})
             ON CONFLICT (namespace) DO UPDATE SET
               execution_id = $2, owner_id = $3, fencing_token = l.fencing_token + 1, host = $4, pid = $5,
               db_connection_id = $6, state = 'RUNNING', acquired_at = now(), last_heartbeat_at = now(),
               migration_version = NULL, migration_checksum = NULL, expires_at = NULL{set}
             RETURNING fencing_token",
            lock = t.lock
        )))
        .bind(namespace)
        .bind(holder.execution_id.to_string())
        .bind(&holder.owner)
        .bind(&holder.host)
        .bind(holder.pid as i32)
        .bind(backend_pid.to_string())
        // Once per run: a named statement would outlive it on the session for nothing.
        .persistent(false);
        if settings {
            q = q
                .bind(holder.lock_ttl_ms.map(|ms| ms as i64))
                .bind(holder.heartbeat_interval_ms.map(|ms| ms as i64));
        }
        let token: i64 = q
        .fetch_one(&mut *conn)
        .await
        .map_err(db_err)?;
        let why = previous
            .as_ref()
            .filter(|p| p.state.is_active())
            .map(|prev| takeover_reason(prev, broken_lease));
        Ok((FencingToken(token as u64), previous, why))
    }
    .await;
    let r = match r {
        Err(e) if row_locked(&e) => Err(Error::Busy(Box::new(row_locked_busy()))),
        other => other,
    };
    finish_tx(conn, r).await
}

/// What a claim took: the token, the status row it found, and why its holder was replaced
/// (where the row was still active).
pub(crate) type Claimed = (FencingToken, Option<StatusRow>, Option<Freed>);

/// Why `prev` was taken over: its lease expired `Some(age)` ago, or else the advisory holder's
/// session ended (the server freed its lock).
pub(crate) fn takeover_reason(prev: &StatusRow, lease_age: Option<std::time::Duration>) -> Freed {
    match lease_age {
        Some(age) => Freed::LeaseExpired {
            silent: age,
            ttl: Some(takeover::lease_ttl(prev, dbwarden_core::lock::DEFAULT_TTL)),
            state: Some(prev.state),
        },
        None => Freed::SessionEnded {
            session: format!(
                "backend {}",
                prev.db_connection_id.as_deref().unwrap_or("?")
            ),
            lock: "advisory lock",
            state: prev.state,
        },
    }
}

/// The `db_connection_id` a lease holder records: it has no session of its own.
pub const LEASE_SESSION: &str = "lease";

/// Does this status row record a lease (`lock = "lease"`) that has not been released?
pub fn is_lease(row: &StatusRow) -> bool {
    row.state.is_active() && row.expires_at.is_some()
}

/// The holder a lease row names (no session: `db_connection_id` is [`LEASE_SESSION`]).
pub fn lease_holder(row: &StatusRow, now: DateTime<Utc>) -> Option<HolderInfo> {
    Some(HolderInfo {
        host: row.host.clone().unwrap_or_else(|| "?".into()),
        pid: row.pid.unwrap_or(0),
        execution_id: row.execution_id?,
        owner: row.owner_id.clone().unwrap_or_default(),
        command: String::new(),
        started_at: row.acquired_at.unwrap_or(now),
        lock_ttl_ms: row.lock_ttl_ms,
        heartbeat_interval_ms: row.heartbeat_interval_ms,
    })
}

/// Core's takeover judge on an active status row that no session holds the advisory lock for,
/// by the server's clock: `Ok(age)` when it may be broken, else what a waiter reports. A lease
/// row is judged by its heartbeat and ttl; a row without a lease belonged to an advisory
/// holder whose session ended (the server freed its lock), so its holder is known gone.
pub(crate) fn judge_lease(
    row: &StatusRow,
    now: DateTime<Utc>,
) -> Result<std::time::Duration, Box<dbwarden_core::error::BusyInfo>> {
    use dbwarden_core::takeover::{Decision, Liveness, Probe, judge};
    let mut probe = Probe::lease_row(row, now, dbwarden_core::lock::DEFAULT_TTL);
    if !is_lease(row) {
        probe.process = Liveness::Dead;
    }
    let decision = judge(&probe);
    let note = match decision {
        Decision::Break { age } => return Ok(age),
        Decision::Wait { .. } => {
            "holds the lease in the status table (lock = \"lease\")".to_owned()
        }
        Decision::Refuse(r) => format!(
            "holds the lease in the status table, which is never broken automatically ({r:?})"
        ),
    };
    Err(Box::new(dbwarden_core::error::BusyInfo {
        holder: lease_holder(row, now),
        fencing_token: Some(row.fencing_token),
        age: row.acquired_at.and_then(|t| (now - t).to_std().ok()),
        note: Some(note),
        server_full: false,
    }))
}

/// The server's clock, now (not the transaction's start: a claim may have waited for the row).
pub(crate) async fn server_now(conn: &mut PgConnection) -> Result<DateTime<Utc>, Error> {
    let row = sqlx::raw_sql("SELECT clock_timestamp()")
        .fetch_one(conn)
        .await
        .map_err(db_err)?;
    row.try_get(0).map_err(db_err)
}
