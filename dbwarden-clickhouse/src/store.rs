//! ClickHouse status, history, fence and audit tables. ClickHouse has no synchronous row update,
//! so every table is append-only and read with `argMax(column, (fencing_token, seq))`: a later
//! holder always has a larger token, and one holder numbers its own rows with `seq`, so the
//! newest row wins without relying on `DateTime`'s whole seconds.
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
    AuditRecord, Error, FencingToken, HistoryRow, HistoryState, HolderInfo, LockState, LostSignal,
    MigrationStore, StatusRow,
};
use serde::Deserialize;
use uuid::Uuid;

use crate::lock::{LockTable, ts};
use crate::server::{ChError, Server, code, render_statement};

pub const STATUS_TABLE: &str = "dbwarden_lock";
pub const FENCE_TABLE: &str = "dbwarden_fence";
pub const AUDIT_TABLE: &str = "dbwarden_lock_audit";

/// `CREATE TABLE IF NOT EXISTS` for every table but the lock tables. Concurrent first runs may
/// race on `IF NOT EXISTS` (the loser gets code 57 on old servers); that is success too.
///
/// `Log` tables: every write is one small append (a MergeTree insert makes a part, measured 3×
/// slower on 18.16, and thousands of parts slow down `DROP`), reads are whole-table `argMax`
/// scans of tables that only grow by a few rows per run.
pub async fn ensure_tables(server: &Server, history: &str) -> Result<(), Error> {
    let c = server.on_cluster();
    let ddl = [
        format!(
            "CREATE TABLE IF NOT EXISTS {}{c} (namespace String, execution_id String, owner_id String, \
             migration_version Int64, migration_checksum String, fencing_token UInt64, host String, \
             pid UInt32, db_connection_id String, state String, acquired_at DateTime, \
             last_heartbeat_at DateTime, expires_at DateTime, seq UInt64, at DateTime DEFAULT now()) \
             ENGINE = Log",
            server.table(STATUS_TABLE)
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {}{c} (version Int64, description String, checksum String, \
             state String, statements_total Int64, statements_done Int64, execution_id String, \
             fencing_token UInt64, started_at DateTime, finished_at DateTime, duration_ms Int64, \
             deleted UInt8, seq UInt64, at DateTime DEFAULT now()) \
             ENGINE = Log",
            server.table(history)
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {}{c} (namespace String, token UInt64, execution_id String, \
             at DateTime DEFAULT now()) ENGINE = Log",
            server.table(FENCE_TABLE)
        ),
        audit_ddl(server),
    ];
    for sql in ddl {
        create_tolerant(server, &sql).await?;
    }
    Ok(())
}

fn audit_ddl(server: &Server) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {}{} (at DateTime DEFAULT now(), namespace String, action String, \
         actor String, holder_execution_id String, holder String, reason String) \
         ENGINE = Log",
        server.table(AUDIT_TABLE),
        server.on_cluster()
    )
}

async fn create_tolerant(server: &Server, sql: &str) -> Result<(), Error> {
    match server.execute(server.query(sql)).await {
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
    match server.execute(q()).await {
        Err(e) if e.is(code::UNKNOWN_TABLE) => {
            create_tolerant(server, &audit_ddl(server)).await?;
            server.execute(q()).await.map_err(|e| server.error(e))
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
    Ok(rows.into_iter().next().map(|r| StatusRow {
        namespace: namespace.to_owned(),
        execution_id: Uuid::parse_str(&r.execution_id).ok(),
        owner_id: non_empty(r.owner_id),
        migration_version: (r.migration_version != 0).then_some(r.migration_version),
        migration_checksum: non_empty(r.migration_checksum),
        fencing_token: r.fencing_token,
        host: non_empty(r.host),
        pid: (r.pid != 0).then_some(r.pid),
        db_connection_id: non_empty(r.db_connection_id),
        state: LockState::parse(&r.state).unwrap_or(LockState::Available),
        acquired_at: some_ts(r.acquired_at),
        last_heartbeat_at: some_ts(r.last_heartbeat_at),
        expires_at: some_ts(r.expires_at),
    }))
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
pub async fn bump_fence(
    server: &Server,
    namespace: &str,
    who: &str,
) -> Result<(u64, u32), ChError> {
    let (max, now) = max_token(server, namespace).await?;
    let next = max + 1;
    let sql = format!(
        "INSERT INTO {} (namespace, token, execution_id) SELECT ?, toUInt64(?), ?",
        server.table(FENCE_TABLE)
    );
    server
        .execute(server.query(&sql).bind(namespace).bind(next).bind(who))
        .await?;
    Ok((next, now))
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
    server.execute(q).await
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
    Ok(rows
        .into_iter()
        .map(|r| HistoryRow {
            version: r.version,
            description: r.description,
            checksum: r.checksum,
            state: HistoryState::parse(&r.state).unwrap_or(HistoryState::Failed),
            statements_total: r.statements_total,
            statements_done: r.statements_done,
            execution_id: Uuid::parse_str(&r.execution_id).ok(),
            fencing_token: r.fencing_token,
            started_at: some_ts(r.started_at),
            finished_at: some_ts(r.finished_at),
            duration_ms: (r.duration_ms >= 0).then_some(r.duration_ms),
        })
        .collect())
}

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
            Err(e) => return Err(s.error(e)),
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
        append_status(self.server(), &w)
            .await
            .map_err(|e| self.server().error(e))
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
        s.execute(q).await.map_err(|e| s.error(e))
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

#[async_trait]
impl MigrationStore for ClickHouseStore {
    /// ClickHouse has no transactions: every migration is journaled statement by statement.
    fn transactional(&self) -> bool {
        false
    }

    async fn history(&mut self) -> Result<Vec<HistoryRow>, Error> {
        read_history(self.server(), &self.history_table).await
    }

    async fn set_state(
        &mut self,
        token: FencingToken,
        state: LockState,
        migration: Option<&Migration>,
    ) -> Result<(), Error> {
        self.check_fence(token).await?;
        self.status(state, migration).await
    }

    async fn apply_in_transaction(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        // Not called (transactional() is false); journaled all the same if it ever is.
        let t0 = std::time::Instant::now();
        self.journal_begin(token, execution_id, m, 0).await?;
        for i in 0..m.statements.len() {
            lost.check()?;
            self.journal_statement(token, m, i).await?;
        }
        let ms = t0.elapsed().as_millis() as i64;
        self.journal_end(token, m, HistoryState::Applied, ms).await
    }

    async fn journal_begin(
        &mut self,
        token: FencingToken,
        _execution_id: Uuid,
        m: &Migration,
        from: usize,
    ) -> Result<(), Error> {
        let now = self.check_fence(token).await?;
        self.started.insert(m.version, now);
        self.status(LockState::Running, Some(m)).await?;
        self.history_row(&HistoryWrite {
            started: now,
            ..HistoryWrite::of(m, HistoryState::Running, from)
        })
        .await
    }

    async fn journal_statement(
        &mut self,
        token: FencingToken,
        m: &Migration,
        index: usize,
    ) -> Result<(), Error> {
        self.check_fence(token).await?;
        let s = self.server();
        let sql = render_statement(&m.statements[index], s.cluster.as_deref());
        // One statement per request, sent verbatim; no client-side time limit (long DDL).
        if let Err(e) = s.execute_unbounded(s.raw(&sql)).await {
            if let ChError::Unreachable(_) = e {
                // The server may still be running it: the journal says it was in flight.
                return Err(s.error(e));
            }
            return Err(Error::MigrationFailed {
                version: m.version,
                file: m.path.display().to_string(),
                statement: index + 1,
                total: m.statements.len(),
                message: e.to_string(),
            });
        }
        // A holder frozen during the statement must not journal it after being replaced.
        self.check_fence(token).await?;
        let started = self.started.get(&m.version).copied().unwrap_or(0);
        self.history_row(&HistoryWrite {
            started,
            ..HistoryWrite::of(m, HistoryState::Running, index + 1)
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
        let now = self.check_fence(token).await?;
        let started = self.started.get(&m.version).copied().unwrap_or(now);
        let done = match state {
            HistoryState::Applied => m.statements.len(),
            _ => self.done_of(m).await?,
        };
        self.history_row(&HistoryWrite {
            started,
            finished: now,
            duration_ms,
            ..HistoryWrite::of(m, state, done)
        })
        .await
    }

    async fn mark_applied(
        &mut self,
        token: FencingToken,
        _execution_id: Uuid,
        m: &Migration,
    ) -> Result<(), Error> {
        let now = self.check_fence(token).await?;
        self.history_row(&HistoryWrite {
            started: now,
            finished: now,
            duration_ms: 0,
            ..HistoryWrite::of(m, HistoryState::Applied, m.statements.len())
        })
        .await
    }

    async fn forget(&mut self, token: FencingToken, version: i64) -> Result<(), Error> {
        self.check_fence(token).await?;
        let rows = self.history().await?;
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

    async fn audit(&mut self, record: &AuditRecord) -> Result<(), Error> {
        insert_audit(self.server(), record).await
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
}
