//! The ClickHouse lock: a table. ClickHouse has no session locks and no synchronous
//! compare-and-swap on rows (`ALTER … UPDATE` is an asynchronous mutation), but DDL on one server
//! is atomic: of many concurrent `CREATE TABLE <db>.dbwarden_lock_<ns>` exactly one succeeds and
//! the others get code 57, and of many concurrent `RENAME TABLE` of one table exactly one
//! succeeds. The lock table holds the holder row and then one appended row per heartbeat (never
//! updated), so it is a lease: grade C, only the TTL frees the lock of a holder that died. A
//! lock whose holder's newest heartbeat is older than the holder's TTL by the server clock (and
//! whose holder's own start time agrees) is stale; a contender breaks it by renaming it to
//! `dbwarden_lock_<ns>_stale_<host>_<unix>_<pid>_<id>` named after the stale holder (one winner),
//! re-reads it, renames it back if it turns out fresh, else creates a fresh lock (one retry). The
//! renamed table stays for 10 minutes as a tombstone, so a contender still acting on an old view
//! of the stale lock finds the name taken instead of renaming the fresh lock away.
//!
//! What it cannot prevent: a holder paused longer than its TTL (SIGSTOP, a VM freeze) is
//! replaced while it sleeps, and the statement it was sending when it froze still reaches the
//! server. Everything after that is fenced (see `store.rs`): before each statement and each
//! journal row the holder re-reads the fence and its lock table, so it stops before its next
//! statement.

use std::time::Duration;

use chrono::{DateTime, Utc};
use dbwarden_core::takeover::{self, Decision, Liveness, Probe};
use dbwarden_core::{Beat, Error, Heartbeat, HolderInfo};
use serde::Deserialize;
use uuid::Uuid;

use crate::server::{ChError, Server, code};

/// Broken locks stay this long as tombstones before they are dropped, so that a contender
/// still acting on an old view of the stale lock cannot rename the fresh lock that replaced it
/// (its RENAME finds the tombstone's name taken).
pub const TOMBSTONE_AGE: Duration = Duration::from_secs(600);

/// One execution's rows in a lock table, folded by the server.
#[derive(Debug, Clone, Default, clickhouse::Row, Deserialize)]
pub struct ExecutionRows {
    pub execution_id: String,
    pub holder_rows: u64,
    pub host: String,
    pub pid: u32,
    pub owner: String,
    pub command: String,
    /// Unix seconds by the holder's own clock.
    pub started_at: u32,
    pub ttl_s: u32,
    pub fencing_token: u64,
    /// Unix seconds by the server clock: the newest row (holder row or heartbeat).
    pub last_at: u32,
    pub now: u32,
}

/// What a lock table says, read in one request.
#[derive(Debug, Clone, Default)]
pub struct LockView {
    /// The row group of the execution that wrote the holder row.
    pub holder: Option<ExecutionRows>,
    /// Server time of the read (unix seconds).
    pub now: u32,
    /// When the table was created (only read when it has no holder row yet).
    pub created: Option<u32>,
}

pub fn ts(unix: u32) -> DateTime<Utc> {
    DateTime::from_timestamp(i64::from(unix), 0).unwrap_or_default()
}

impl ExecutionRows {
    /// The holder's own ttl, `fallback` when it recorded none.
    pub fn ttl(&self, fallback: Duration) -> Duration {
        match self.ttl_s {
            0 => fallback,
            s => Duration::from_secs(u64::from(s)),
        }
    }

    pub fn holder_info(&self) -> HolderInfo {
        HolderInfo {
            host: self.host.clone(),
            pid: self.pid,
            execution_id: Uuid::parse_str(&self.execution_id).unwrap_or_default(),
            owner: self.owner.clone(),
            command: self.command.clone(),
            started_at: ts(self.started_at),
            lock_ttl_ms: (self.ttl_s > 0).then(|| u64::from(self.ttl_s) * 1000),
            heartbeat_interval_ms: None,
        }
    }
}

/// What a lock table says about its holder, as core's takeover judge takes it: the server
/// clock, whole seconds, the holder's own ttl (`fallback_ttl` when the holder row is missing --
/// a creator that has not written it yet, or died in between -- or carries none), nothing
/// known of its process.
pub fn probe(view: &LockView, fallback_ttl: Duration) -> Probe {
    let (last, started, ttl) = match &view.holder {
        Some(h) => (h.last_at, Some(ts(h.started_at)), h.ttl(fallback_ttl)),
        None => (view.created.unwrap_or(view.now), None, fallback_ttl),
    };
    Probe {
        now: ts(view.now),
        last_seen: ts(last),
        started,
        ttl,
        resolution: Duration::from_secs(1),
        process: Liveness::Unknown,
    }
}

/// Core's decision about a lock table (see [`probe`]).
pub fn judge(view: &LockView, fallback_ttl: Duration) -> Decision {
    takeover::judge(&probe(view, fallback_ttl))
}

/// The columns of a lock table, as `CREATE TABLE … AS SELECT` creates them with the holder row.
///
/// `nonce` is random on each host that runs the statement: on a cluster every host inserts its
/// own holder row, and two equal rows would be one block that the replicated table keeps once,
/// so the host whose insert came second would have no holder row until it fetched the other
/// host's part (a holder on that host read its lock as someone else's).
fn holder_select() -> &'static str {
    "SELECT 'holder' AS kind, ? AS execution_id, ? AS host, toUInt32(?) AS pid, ? AS owner, \
     ? AS command, toUInt32(?) AS started_at, now() AS at, toUInt64(0) AS fencing_token, \
     toUInt32(?) AS ttl_s, toUInt64(0) AS seq, rand64() AS nonce"
}

/// One namespace's lock table on one server.
#[derive(Clone)]
pub struct LockTable {
    pub server: Server,
    pub name: String,
}

impl LockTable {
    pub fn qualified(&self) -> String {
        self.server.table(&self.name)
    }

    /// `CREATE TABLE` with our holder row in the same statement. `Err(code 57)`: held. On a
    /// cluster the statement goes through the cluster's DDL queue (ZooKeeper sequential nodes,
    /// one total order that every host executes): of concurrent creators, the first in the
    /// queue creates the table on every host and every later one fails there, so the winner is
    /// the same everywhere. The table is replicated, its ZooKeeper path this creation's own.
    pub fn create_sql(&self, execution_id: Uuid) -> String {
        format!(
            "CREATE TABLE {}{} ENGINE = {} AS {}",
            self.qualified(),
            self.server.on_cluster(),
            self.server
                .table_engine(&self.name, Some(&execution_id.simple().to_string())),
            holder_select()
        )
    }

    pub fn rename_sql(&self, from: &str, to: &str) -> String {
        format!(
            "RENAME TABLE {} TO {}{}",
            self.server.table(from),
            self.server.table(to),
            self.server.on_cluster()
        )
    }

    pub fn drop_sql(&self, name: &str) -> String {
        format!(
            "DROP TABLE IF EXISTS {}{}",
            self.server.table(name),
            self.server.on_cluster()
        )
    }

    pub async fn create(&self, holder: &HolderInfo, ttl: Duration) -> Result<(), ChError> {
        let sql = self.create_sql(holder.execution_id);
        let q = self
            .server
            .ddl(&sql)
            .bind(holder.execution_id.to_string())
            .bind(&holder.host)
            .bind(holder.pid)
            .bind(&holder.owner)
            .bind(&holder.command)
            .bind(holder.started_at.timestamp().max(0))
            .bind(ttl.as_secs().max(1));
        self.server.execute(q).await
    }

    /// `EXISTS TABLE`: answers without an exception either way.
    pub async fn exists(&self) -> Result<bool, ChError> {
        let sql = format!("EXISTS TABLE {}", self.qualified());
        let r: Vec<u8> = self.server.fetch(self.server.query(&sql)).await?;
        Ok(r.first().is_some_and(|v| *v == 1))
    }

    /// Read the table; `Ok(None)` when it does not exist.
    pub async fn view(&self) -> Result<Option<LockView>, ChError> {
        Self::view_of(&self.server, &self.name).await
    }

    pub async fn view_of(server: &Server, name: &str) -> Result<Option<LockView>, ChError> {
        let sql = format!(
            "SELECT execution_id, toUInt64(countIf(kind = 'holder')) AS holder_rows, \
             anyIf(host, kind = 'holder') AS host, anyIf(pid, kind = 'holder') AS pid, \
             anyIf(owner, kind = 'holder') AS owner, anyIf(command, kind = 'holder') AS command, \
             anyIf(started_at, kind = 'holder') AS started_at, anyIf(ttl_s, kind = 'holder') AS ttl_s, \
             max(fencing_token) AS fencing_token, toUInt32(max(at)) AS last_at, toUInt32(now()) AS now \
             FROM {} GROUP BY execution_id",
            server.table(name)
        );
        let rows: Vec<ExecutionRows> = match server.fetch(server.query(&sql)).await {
            Ok(r) => r,
            Err(e) if e.is_gone() => return Ok(None),
            Err(e) => return Err(e),
        };
        let now = rows.first().map(|r| r.now);
        let holder = rows.into_iter().find(|r| r.holder_rows > 0);
        if let (Some(h), Some(now)) = (holder.clone(), now) {
            return Ok(Some(LockView {
                holder: Some(h),
                now,
                created: None,
            }));
        }
        // No holder row (yet): judge by the table's own age.
        let q = server
            .query(
                "SELECT toUInt32(now()) AS now, toUInt32(metadata_modification_time) AS created \
                 FROM system.tables WHERE database = ? AND name = ?",
            )
            .bind(&server.database)
            .bind(name);
        let t: Vec<(u32, u32)> = server.fetch(q).await?;
        Ok(t.first().map(|(now, created)| LockView {
            holder: None,
            now: *now,
            created: Some(*created),
        }))
    }

    /// `RENAME TABLE` (atomic: one winner among concurrent renamers).
    pub async fn rename(&self, from: &str, to: &str) -> Result<(), ChError> {
        let sql = self.rename_sql(from, to);
        self.server.execute(self.server.ddl(&sql)).await
    }

    pub async fn drop_table(&self, name: &str) -> Result<(), ChError> {
        let sql = self.drop_sql(name);
        self.server.execute(self.server.ddl(&sql)).await
    }

    /// Break the stale lock `seen`: rename it to its tombstone name (one winner), re-read it,
    /// rename it back if it turns out fresh. `Ok(true)`: broken; a fresh lock may be created.
    pub async fn break_stale(
        &self,
        seen: &LockView,
        ttl: Duration,
        me: Uuid,
    ) -> Result<bool, ChError> {
        let stale = crate::names::stale_table_name(
            &self.name,
            seen.holder.as_ref().map(|h| crate::names::StaleHolder {
                host: &h.host,
                started_at: h.started_at,
                pid: h.pid,
                execution_id: &h.execution_id,
            }),
            seen.created,
        );
        match self.rename(&self.name, &stale).await {
            Ok(()) => {}
            Err(e) if e.is_gone() || e.is(code::TABLE_ALREADY_EXISTS) => {
                return Ok(false); // another contender broke it first
            }
            Err(e) => return Err(e),
        }
        let again = Self::view_of(&self.server, &stale).await?;
        let same_holder = |v: &LockView| {
            v.holder.as_ref().map(|h| &h.execution_id)
                == seen.holder.as_ref().map(|h| &h.execution_id)
        };
        let still_stale = again
            .as_ref()
            .is_some_and(|v| same_holder(v) && matches!(judge(v, ttl), Decision::Break { .. }));
        if !still_stale {
            tracing::warn!(
                "the lock renamed to {stale} turned out fresh; renaming it back to {}",
                self.name
            );
            if let Err(e) = self.rename(&stale, &self.name).await {
                tracing::warn!(
                    "could not rename {stale} back ({e}); its holder will find its lock gone and stop"
                );
            }
            return Ok(false);
        }
        let sql = format!(
            "INSERT INTO {} (kind, execution_id, at) SELECT 'broken', ?, now()",
            self.server.table(&stale)
        );
        self.server
            .insert(self.server.query(&sql).bind(me.to_string()))
            .await?;
        if let Err(e) = self.drop_old_tombstones().await {
            tracing::info!("could not drop old broken lock tables: {e}");
        }
        Ok(true)
    }

    /// Tombstones of this lock (broken stale locks): `(name, seconds since broken)`.
    pub async fn tombstones(&self) -> Result<Vec<(String, u32)>, ChError> {
        let q = self
            .server
            .query("SELECT name FROM system.tables WHERE database = ? AND startsWith(name, ?) ORDER BY name")
            .bind(&self.server.database)
            .bind(format!("{}_stale_", self.name));
        let names: Vec<String> = self.server.fetch(q).await?;
        let mut out = Vec::new();
        for n in names {
            // Its age since it was broken; a tombstone whose breaker has not written the
            // 'broken' row yet (or died before it) ages from its holder's last heartbeat, so it
            // is neither dropped at once nor kept for ever.
            let sql = format!(
                "SELECT toUInt32(greatest(toInt64(now()) - toInt64(if(countIf(kind = 'broken') > 0, \
                 maxIf(at, kind = 'broken'), max(at))), 0)) FROM {}",
                self.server.table(&n)
            );
            match self.server.fetch::<u32>(self.server.query(&sql)).await {
                Ok(r) => out.push((n, r.first().copied().unwrap_or(0))),
                Err(e) if e.is_gone() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    async fn drop_old_tombstones(&self) -> Result<(), ChError> {
        for (name, age) in self.tombstones().await? {
            if u64::from(age) > TOMBSTONE_AGE.as_secs() {
                self.drop_table(&name).await?;
            }
        }
        Ok(())
    }

    /// Whether the lock table's holder row is `execution_id`'s; `Ok(None)`: no table.
    pub async fn holder_is(&self, execution_id: Uuid) -> Result<Option<bool>, ChError> {
        let sql = format!(
            "SELECT toUInt64(countIf(execution_id = ?)) AS mine, toUInt64(count()) AS holders \
             FROM {} WHERE kind = 'holder'",
            self.qualified()
        );
        let q = self.server.query(&sql).bind(execution_id.to_string());
        match self.server.fetch::<(u64, u64)>(q).await {
            Ok(r) => Ok(Some(r.first().is_some_and(|(mine, _)| *mine > 0))),
            Err(e) if e.is_gone() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Append a heartbeat row (never an update).
    pub async fn append_beat(
        &self,
        execution_id: Uuid,
        token: u64,
        seq: u64,
    ) -> Result<(), ChError> {
        let sql = format!(
            "INSERT INTO {} (kind, execution_id, at, fencing_token, seq) \
             SELECT 'beat', ?, now(), toUInt64(?), toUInt64(?)",
            self.qualified()
        );
        let q = self
            .server
            .query(&sql)
            .bind(execution_id.to_string())
            .bind(token)
            .bind(seq);
        self.server.insert(q).await
    }

    /// Drop the lock table if it is still `execution_id`'s. Between the check and the drop a
    /// holder paused past its TTL could see its lock broken and retaken; the drop then removes
    /// the new holder's table, whose next heartbeat or fence check finds it gone and stops
    /// (exit 4) before its next statement, so no two runners go on writing.
    pub async fn drop_if_ours(&self, execution_id: Uuid) -> Result<bool, ChError> {
        match self.holder_is(execution_id).await? {
            Some(true) => {
                match self.drop_table(&self.name).await {
                    Ok(()) => {}
                    Err(e) if e.is_gone() => {}
                    Err(e) => return Err(e),
                }
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

/// Renews the lease from beside the migration session.
pub struct TableHeartbeat {
    pub table: LockTable,
    pub execution_id: Uuid,
    pub token: u64,
    pub seq: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

#[async_trait::async_trait]
impl Heartbeat for TableHeartbeat {
    async fn beat(&self) -> Result<Beat, Error> {
        let server = &self.table.server;
        match self.table.holder_is(self.execution_id).await {
            Ok(Some(true)) => {}
            Ok(Some(false)) => {
                return Ok(Beat::Gone(format!(
                    "the lock table {} now belongs to another execution (our lease ran out and was broken, or it was force-unlocked)",
                    self.table.qualified()
                )));
            }
            Ok(None) => {
                return Ok(Beat::Gone(format!(
                    "the lock table {} was dropped or renamed (broken as stale, or force-unlocked)",
                    self.table.qualified()
                )));
            }
            Err(e) => return Err(server.error(e)),
        }
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match self
            .table
            .append_beat(self.execution_id, self.token, seq)
            .await
        {
            Ok(()) => Ok(Beat::Alive),
            Err(e) if e.is_gone() => Ok(Beat::Gone(format!(
                "the lock table {} was dropped while heartbeating",
                self.table.qualified()
            ))),
            Err(e) => Err(server.error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use dbwarden_core::takeover::Refusal;

    use super::*;

    pub(crate) fn view(last_ago: i64, started_ago: i64, ttl_s: u32) -> LockView {
        let now = 1_800_000_000u32;
        LockView {
            holder: Some(ExecutionRows {
                holder_rows: 1,
                ttl_s,
                last_at: (i64::from(now) - last_ago) as u32,
                started_at: (i64::from(now) - started_ago) as u32,
                now,
                ..Default::default()
            }),
            now,
            created: None,
        }
    }

    #[test]
    fn a_lock_table_is_judged_by_its_holders_ttl_and_the_server_clock() {
        let fb = Duration::from_secs(120);
        // The holder row's own 3 s ttl, not the 120 s fallback (the rules: core's takeover).
        assert!(matches!(judge(&view(3, 100, 3), fb), Decision::Wait { .. }));
        assert_eq!(
            judge(&view(4, 100, 3), fb),
            Decision::Break {
                age: Duration::from_secs(4)
            }
        );
        assert!(matches!(
            judge(&view(-301, 100, 3), fb),
            Decision::Refuse(Refusal::Skew { .. })
        ));
        // A holder row without a ttl: the fallback.
        assert!(matches!(
            judge(&view(100, 200, 0), fb),
            Decision::Wait { .. }
        ));
    }

    #[test]
    fn a_lock_table_without_a_holder_row_ages_from_its_creation() {
        let v = LockView {
            holder: None,
            now: 1000,
            created: Some(1000 - 121),
        };
        assert!(matches!(
            judge(&v, Duration::from_secs(120)),
            Decision::Break { .. }
        ));
        let young = LockView {
            created: Some(1000 - 5),
            ..v
        };
        assert!(matches!(
            judge(&young, Duration::from_secs(120)),
            Decision::Wait { .. }
        ));
    }

    #[test]
    fn on_cluster_is_rendered_for_the_lock_table_ddl() {
        let ep = crate::url::parse("clickhouse://h:8123/app").unwrap();
        let d = Duration::from_secs(1);
        let on = |cluster: Option<&str>| LockTable {
            server: Server::new(&ep, cluster.map(str::to_owned), d, d),
            name: "dbwarden_lock_default".into(),
        };
        let t = on(Some("prod"));
        let id = Uuid::from_u128(0xab);
        let sql = t.create_sql(id);
        assert!(
            sql.starts_with(&format!(
                "CREATE TABLE `app`.`dbwarden_lock_default` ON CLUSTER `prod` ENGINE = \
                 ReplicatedMergeTree('/clickhouse/dbwarden/prod/app/dbwarden_lock_default/{}', \
                 '{{shard}}-{{replica}}') ORDER BY tuple() AS SELECT",
                id.simple()
            )),
            "{sql}"
        );
        assert_eq!(
            t.rename_sql("a", "b"),
            "RENAME TABLE `app`.`a` TO `app`.`b` ON CLUSTER `prod`"
        );
        assert_eq!(
            t.drop_sql("a"),
            "DROP TABLE IF EXISTS `app`.`a` ON CLUSTER `prod`"
        );
        let plain = on(None);
        let sql = plain.create_sql(id);
        assert!(!sql.contains("CLUSTER"), "{sql}");
        assert!(sql.contains(" ENGINE = Log AS SELECT"), "{sql}");
        assert_eq!(plain.drop_sql("a"), "DROP TABLE IF EXISTS `app`.`a`");
    }
}
