//! The status, history, fence and audit tables of ClickHouse: their DDL, and every read and
//! append that does not need the held lock (see `store.rs` for the holder's fenced writes).
//! Every table is append-only and read with `argMax(column, (fencing_token, seq))`: a later
//! holder always has a larger token, and one holder numbers its own rows with `seq`, so the newest
//! row wins without relying on `DateTime`'s whole seconds.

use dbwarden_core::{
    AuditRecord, Error, HistoryRow, HistoryState, HolderInfo, LockState, StatusRow,
};
use serde::Deserialize;
use uuid::Uuid;

use crate::lock::ts;
use crate::server::{ChError, Server, code};

pub const STATUS_TABLE: &str = "dbwarden_lock";
pub const FENCE_TABLE: &str = "dbwarden_fence";
pub const AUDIT_TABLE: &str = "dbwarden_lock_audit";

/// `CREATE TABLE IF NOT EXISTS` for every table but the lock tables. Concurrent first runs may
/// race on `IF NOT EXISTS` (the loser gets code 57 on old servers); that is success too.
///
/// `Log` tables: every write is one small append (a MergeTree insert makes a part, measured 3×
/// slower on 18.16, and thousands of parts slow down `DROP`), reads are whole-table `argMax`
/// scans of tables that only grow by a few rows per run.
///
/// Only missing tables are created: on a cluster every `CREATE … ON CLUSTER` goes through the
/// cluster's DDL queue, one task after another, even when the table exists.
pub async fn ensure_tables(server: &Server, history: &str) -> Result<(), Error> {
    let names = [STATUS_TABLE, history, FENCE_TABLE, AUDIT_TABLE];
    let q = server
        .query("SELECT name FROM system.tables WHERE database = ? AND name IN (?, ?, ?, ?)")
        .bind(&server.database)
        .bind(names[0])
        .bind(names[1])
        .bind(names[2])
        .bind(names[3]);
    let present: Vec<String> = server.fetch(q).await.map_err(|e| server.error(e))?;
    for (sql, name) in ddl(server, history).iter().zip(names) {
        if !present.iter().any(|p| p == name) {
            create_tolerant(server, sql).await?;
        }
    }
    Ok(())
}

/// The DDL of [`ensure_tables`].
pub fn ddl(server: &Server, history: &str) -> [String; 4] {
    let c = server.on_cluster();
    let engine = |name: &str| server.table_engine(name, None);
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {}{c} (namespace String, execution_id String, owner_id String, \
             migration_version Int64, migration_checksum String, fencing_token UInt64, host String, \
             pid UInt32, db_connection_id String, state String, acquired_at DateTime, \
             last_heartbeat_at DateTime, expires_at DateTime, seq UInt64, at DateTime DEFAULT now()) \
             ENGINE = {}",
            server.table(STATUS_TABLE),
            engine(STATUS_TABLE)
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {}{c} (version Int64, description String, checksum String, \
             state String, statements_total Int64, statements_done Int64, execution_id String, \
             fencing_token UInt64, started_at DateTime, finished_at DateTime, duration_ms Int64, \
             deleted UInt8, seq UInt64, at DateTime DEFAULT now()) \
             ENGINE = {}",
            server.table(history),
            engine(history)
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {}{c} (namespace String, token UInt64, execution_id String, \
             at DateTime DEFAULT now()) ENGINE = {}",
            server.table(FENCE_TABLE),
            engine(FENCE_TABLE)
        ),
        audit_ddl(server),
    ]
}

fn audit_ddl(server: &Server) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {}{} (at DateTime DEFAULT now(), namespace String, action String, \
         actor String, holder_execution_id String, holder String, reason String) \
         ENGINE = {}",
        server.table(AUDIT_TABLE),
        server.on_cluster(),
        server.table_engine(AUDIT_TABLE, None)
    )
}

async fn create_tolerant(server: &Server, sql: &str) -> Result<(), Error> {
    match server.execute(server.ddl(sql)).await {
        Ok(()) => Ok(()),
        Err(e) if e.is(code::TABLE_ALREADY_EXISTS) => Ok(()),
        Err(e) => Err(server.error(e)),
    }
}

/// Append an audit row (creating the audit table if needed).
pub async fn insert_audit(server: &Server, rec: &AuditRecord) -> Result<(), Error> {
    let sql = format!(
        "INSERT INTO {} (namespace, action, actor, holder_execution_id, holder, reason) SELECT ?, ?, ?, ?, ?, ?",
        server.table(AUDIT_TABLE)
    );
    let q = || {
        server
            .query(&sql)
            .bind(&rec.namespace)
            .bind(&rec.action)
            .bind(&rec.actor)
            .bind(
                rec.holder_execution_id
                    .map(|u| u.to_string())
                    .unwrap_or_default(),
            )
            .bind(rec.holder_desc.clone().unwrap_or_default())
            .bind(&rec.reason)
    };
    match server.insert(q()).await {
        Err(e) if e.is(code::UNKNOWN_TABLE) => {
            create_tolerant(server, &audit_ddl(server)).await?;
            server.insert(q()).await.map_err(|e| server.error(e))
        }
        r => r.map_err(|e| server.error(e)),
    }
}

#[derive(Debug, Clone, clickhouse::Row, Deserialize)]
struct StatusCols {
    execution_id: String,
    owner_id: String,
    migration_version: i64,
    migration_checksum: String,
    fencing_token: u64,
    host: String,
    pid: u32,
    db_connection_id: String,
    state: String,
    acquired_at: u32,
    last_heartbeat_at: u32,
    expires_at: u32,
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn some_ts(t: u32) -> Option<chrono::DateTime<chrono::Utc>> {
    (t > 0).then(|| ts(t))
}

/// The newest status row of `namespace`; `Ok(None)` when there is none or no table.
pub async fn read_status(server: &Server, namespace: &str) -> Result<Option<StatusRow>, Error> {
    let k = "k_";
    let cols = [
        "execution_id",
        "owner_id",
        "migration_version",
        "migration_checksum",
        "fencing_token",
        "host",
        "pid",
        "db_connection_id",
        "state",
    ]
    .iter()
    .map(|c| format!("argMax({c}, {k}) AS {c}"))
    .chain(
        ["acquired_at", "last_heartbeat_at", "expires_at"]
            .iter()
            .map(|c| format!("toUInt32(argMax({c}, {k})) AS {c}")),
    )
    .collect::<Vec<_>>()
    .join(", ");
    let sql = format!(
        "SELECT {cols} FROM (SELECT *, (fencing_token, seq) AS k_ FROM {} WHERE namespace = ?) \
         GROUP BY namespace",
        server.table(STATUS_TABLE)
    );
    let rows: Vec<StatusCols> = match server.fetch(server.query(&sql).bind(namespace)).await {
        Ok(r) => r,
        Err(e) if e.is(code::UNKNOWN_TABLE) => return Ok(None),
        Err(e) => return Err(server.error(e)),
    };
    rows.into_iter()
        .next()
        .map(|r| {
            Ok(StatusRow {
                state: LockState::read(namespace, &r.state)?,
                namespace: namespace.to_owned(),
                execution_id: Uuid::parse_str(&r.execution_id).ok(),
                owner_id: non_empty(r.owner_id),
                migration_version: (r.migration_version != 0).then_some(r.migration_version),
                migration_checksum: non_empty(r.migration_checksum),
                fencing_token: r.fencing_token,
                host: non_empty(r.host),
                pid: (r.pid != 0).then_some(r.pid),
                db_connection_id: non_empty(r.db_connection_id),
                acquired_at: some_ts(r.acquired_at),
                last_heartbeat_at: some_ts(r.last_heartbeat_at),
                expires_at: some_ts(r.expires_at),
                // The holder's ttl is in its lock table's holder row (`ttl_s`).
                lock_ttl_ms: None,
                heartbeat_interval_ms: None,
            })
        })
        .transpose()
}

/// The largest fencing token ever handed out for `namespace` (fence and status tables), and
/// the server time.
pub async fn max_token(server: &Server, namespace: &str) -> Result<(u64, u32), ChError> {
    let sql = format!(
        "SELECT greatest(toUInt64((SELECT max(token) FROM {} WHERE namespace = ?)), \
         toUInt64((SELECT max(fencing_token) FROM {} WHERE namespace = ?))) AS t, toUInt32(now()) AS now",
        server.table(FENCE_TABLE),
        server.table(STATUS_TABLE)
    );
    let q = server.query(&sql).bind(namespace).bind(namespace);
    let r: Vec<(u64, u32)> = server.fetch(q).await?;
    Ok(r.first().copied().unwrap_or_default())
}

/// Hand out the next token: `max + 1`, appended. Safe because only the holder of the lock table
/// (or `unlock`, which then drops it) writes the fence. Returns the token and the server time.
/// On a cluster a quorum insert that met another fence write in progress (code 286: an unlock
/// racing a claim) reads the max again before it tries again, so no two writes carry one token.
pub async fn bump_fence(
    server: &Server,
    namespace: &str,
    who: &str,
) -> Result<(u64, u32), ChError> {
    let sql = format!(
        "INSERT INTO {} (namespace, token, execution_id) SELECT ?, toUInt64(?), ?",
        server.table(FENCE_TABLE)
    );
    server
        .quorum_retry(|| async {
            let (max, now) = max_token(server, namespace).await?;
            let next = max + 1;
            server
                .insert_once(server.query(&sql).bind(namespace).bind(next).bind(who))
                .await?;
            Ok((next, now))
        })
        .await
}

/// A status row to append.
pub struct StatusWrite<'a> {
    pub namespace: &'a str,
    pub holder: &'a HolderInfo,
    pub token: u64,
    pub seq: u64,
    pub state: LockState,
    pub migration: Option<(i64, &'a str)>,
    pub session: &'a str,
    pub acquired_at: u32,
    pub ttl_s: u64,
}

pub async fn append_status(server: &Server, w: &StatusWrite<'_>) -> Result<(), ChError> {
    let sql = format!(
        "INSERT INTO {} (namespace, execution_id, owner_id, migration_version, migration_checksum, \
         fencing_token, host, pid, db_connection_id, state, acquired_at, last_heartbeat_at, expires_at, seq) \
         SELECT ?, ?, ?, toInt64(?), ?, toUInt64(?), ?, toUInt32(?), ?, ?, toDateTime(toUInt32(?)), now(), \
         now() + toUInt32(?), toUInt64(?)",
        server.table(STATUS_TABLE)
    );
    let (version, checksum) = w.migration.unwrap_or((0, ""));
    let q = server
        .query(&sql)
        .bind(w.namespace)
        .bind(w.holder.execution_id.to_string())
        .bind(&w.holder.owner)
        .bind(version)
        .bind(checksum)
        .bind(w.token)
        .bind(&w.holder.host)
        .bind(w.holder.pid)
        .bind(w.session)
        .bind(w.state.as_str())
        .bind(w.acquired_at)
        .bind(w.ttl_s)
        .bind(w.seq);
    server.insert(q).await
}

#[derive(Debug, Clone, clickhouse::Row, Deserialize)]
struct HistoryCols {
    version: i64,
    description: String,
    checksum: String,
    state: String,
    statements_total: i64,
    statements_done: i64,
    execution_id: String,
    fencing_token: u64,
    started_at: u32,
    finished_at: u32,
    duration_ms: i64,
}

/// Every live row of the history table, newest version of each, ordered by version.
pub async fn read_history(server: &Server, table: &str) -> Result<Vec<HistoryRow>, Error> {
    let k = "k_";
    let sql = format!(
        "SELECT version, argMax(description, {k}) AS description, argMax(checksum, {k}) AS checksum, \
         argMax(state, {k}) AS state, argMax(statements_total, {k}) AS statements_total, \
         argMax(statements_done, {k}) AS statements_done, argMax(execution_id, {k}) AS execution_id, \
         max(fencing_token) AS fencing_token, toUInt32(argMax(started_at, {k})) AS started_at, \
         toUInt32(argMax(finished_at, {k})) AS finished_at, argMax(duration_ms, {k}) AS duration_ms \
         FROM (SELECT *, (fencing_token, seq) AS k_ FROM {}) \
         GROUP BY version HAVING argMax(deleted, {k}) = 0 ORDER BY version",
        server.table(table)
    );
    let rows: Vec<HistoryCols> = match server.fetch(server.query(&sql)).await {
        Ok(r) => r,
        Err(e) if e.is(code::UNKNOWN_TABLE) => return Ok(Vec::new()),
        Err(e) => return Err(server.error(e)),
    };
    rows.into_iter()
        .map(|r| {
            Ok(HistoryRow {
                state: HistoryState::read(table, r.version, &r.state)?,
                version: r.version,
                description: r.description,
                checksum: r.checksum,
                statements_total: r.statements_total,
                statements_done: r.statements_done,
                execution_id: Uuid::parse_str(&r.execution_id).ok(),
                fencing_token: r.fencing_token,
                started_at: some_ts(r.started_at),
                finished_at: some_ts(r.finished_at),
                duration_ms: (r.duration_ms >= 0).then_some(r.duration_ms),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_replicates_the_status_history_fence_and_audit_tables_to_every_host() {
        let ep = crate::url::parse("clickhouse://h:8123/app").unwrap();
        let d = std::time::Duration::from_secs(1);
        let clustered = Server::new(&ep, Some("prod".into()), d, d);
        let names = [
            "dbwarden_lock",
            "dbwarden_migrations",
            "dbwarden_fence",
            "dbwarden_lock_audit",
        ];
        for (sql, name) in ddl(&clustered, "dbwarden_migrations").iter().zip(names) {
            let head = format!("CREATE TABLE IF NOT EXISTS `app`.`{name}` ON CLUSTER `prod` (");
            assert!(sql.starts_with(&head), "{sql}");
            // Every host a replica (no `{shard}` in the path): the whole state on each.
            let engine = format!(
                "ENGINE = ReplicatedMergeTree('/clickhouse/dbwarden/prod/app/{name}', '{{shard}}-{{replica}}') ORDER BY tuple()"
            );
            assert!(sql.ends_with(&engine), "{sql}");
        }
        let plain = Server::new(&ep, None, d, d);
        for sql in ddl(&plain, "dbwarden_migrations") {
            assert!(!sql.contains("CLUSTER"), "{sql}");
            assert!(sql.ends_with("ENGINE = Log"), "{sql}");
        }
    }
}
