//! What a cluster changes on the server side (`cluster = "<name>"`, replicas behind ZooKeeper;
//! docs/engines.md, "On a cluster"): dbwarden's tables replicated to every host, quorum
//! inserts, `ON CLUSTER` DDL bounded by the statement timeout, and the connect-time check of the
//! cluster and its macros. On one server each of these is the plain statement.

use std::time::Duration;

use clickhouse::query::Query;
use dbwarden_core::Error;

use crate::server::{ChError, Server, code};

/// The longest a quorum insert waits for the other replicas to confirm (they confirm within
/// milliseconds on a healthy cluster).
const QUORUM_WAIT: Duration = Duration::from_secs(10);

impl Server {
    /// The engine of one of dbwarden's own tables: `Log` on one server; with a cluster a
    /// `ReplicatedMergeTree` whose ZooKeeper path leaves out `{shard}`, so every host of the
    /// cluster is a replica of it and holds the whole lock state and history. `unique` makes the
    /// path one creation's own (lock tables are created and dropped again and again).
    pub fn table_engine(&self, name: &str, unique: Option<&str>) -> String {
        match &self.cluster {
            None => "Log".into(),
            Some(c) => format!(
                "ReplicatedMergeTree('/clickhouse/dbwarden/{c}/{}/{name}{}', '{{shard}}-{{replica}}') ORDER BY tuple()",
                self.database,
                unique.map(|u| format!("/{u}")).unwrap_or_default()
            ),
        }
    }

    /// DDL on dbwarden's own tables: with a cluster, the hosts must all have run it before
    /// the statement timeout (the server then answers code 159 and keeps it queued).
    pub fn ddl(&self, sql: &str) -> Query {
        let q = self.query(sql);
        match self.cluster {
            None => q,
            Some(_) => q.with_setting(
                "distributed_ddl_task_timeout",
                self.statement_timeout
                    .as_secs()
                    .saturating_sub(1)
                    .max(1)
                    .to_string(),
            ),
        }
    }

    /// Append rows to one of dbwarden's own tables. With a cluster the insert is a quorum
    /// insert over every host (it returns once every replica has the rows, so a read on any
    /// host sees them; with a host known to be down it fails at once, code 285, and writes
    /// nothing) and is never deduplicated (two equal rows are two events). A quorum insert racing
    /// another on the same table is refused whole (code 286) and tried again.
    pub async fn insert(&self, q: Query) -> Result<(), ChError> {
        self.quorum_retry(|| self.insert_once(q.clone())).await
    }

    /// [`Self::insert`] without the retry of code 286 (a caller whose rows depend on what it
    /// read retries itself, reading again).
    pub async fn insert_once(&self, q: Query) -> Result<(), ChError> {
        let Some(cluster) = &self.cluster else {
            return self.execute(q).await;
        };
        let hosts = self
            .hosts
            .get_or_try_init(|| async {
                let q = self
                    .query("SELECT toUInt64(count()) FROM system.clusters WHERE cluster = ?")
                    .bind(cluster);
                let n: Vec<u64> = self.fetch(q).await?;
                Ok::<_, ChError>(n.first().copied().unwrap_or(0))
            })
            .await?;
        // A short quorum wait: a quorum insert holds its table while it waits, and a replica
        // dropped meanwhile (a lock table broken or unlocked while its holder heartbeats) never
        // confirms, so the wait would stall that host's DROP, and with it the cluster's DDL
        // queue on that host, for the server's default of 10 minutes.
        let quorum_wait = self.statement_timeout.min(QUORUM_WAIT);
        let q = q
            .with_setting("insert_quorum", hosts.to_string())
            .with_setting("insert_quorum_timeout", quorum_wait.as_millis().to_string())
            .with_setting("insert_deduplicate", "0");
        self.execute(q).await
    }

    /// Run `attempt` again while it fails with code 286 (another quorum insert on the table is
    /// in progress; nothing was written), within the statement timeout.
    pub async fn quorum_retry<T, F>(&self, mut attempt: impl FnMut() -> F) -> Result<T, ChError>
    where
        F: std::future::Future<Output = Result<T, ChError>>,
    {
        let deadline = tokio::time::Instant::now() + self.statement_timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            match attempt().await {
                Err(e) if e.is(code::QUORUM_BUSY) && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                r => return r,
            }
        }
    }

    /// The cluster is defined on this host, and the `{shard}` and `{replica}` macros that
    /// name this host's replica of dbwarden's tables are set.
    pub(crate) async fn check_cluster(&self, cluster: &str) -> Result<(), Error> {
        let q = self
            .query(
                "SELECT toUInt64((SELECT count() FROM system.clusters WHERE cluster = ?)) AS hosts, \
                 toUInt64((SELECT count() FROM system.macros WHERE macro IN ('shard', 'replica'))) AS macros",
            )
            .bind(cluster);
        let r: Vec<(u64, u64)> = self.fetch(q).await.map_err(|e| self.error(e))?;
        let (hosts, macros) = r.first().copied().unwrap_or_default();
        if hosts == 0 {
            return Err(Error::usage(format!(
                "cluster `{cluster}` is not defined on {} (system.clusters): check `remote_servers` in its config, or the cluster name",
                self.target
            )));
        }
        if macros < 2 {
            return Err(Error::usage(format!(
                "{} has no `shard` and `replica` macros: with a cluster, dbwarden's tables are replicated to every host and each host's replica is named `{{shard}}-{{replica}}` (set `<macros>` in its config)",
                self.target
            )));
        }
        let _ = self.hosts.set(hosts);
        Ok(())
    }
}
