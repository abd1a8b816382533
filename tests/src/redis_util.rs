//! Helpers for the Redis tests: where the servers are, a plain client to look at what the lease
//! wrote, and the `redis_probe` helper process (tests/src/bin/redis_probe.rs).

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout};
use std::sync::mpsc;
use std::time::Duration;

/// The single Redis server (`DBWARDEN_TEST_REDIS_URL`, default `redis://127.0.0.1:6379`).
pub fn redis_url() -> String {
    crate::server_url("DBWARDEN_TEST_REDIS_URL", "redis://127.0.0.1:6379")
}

/// The 3-master cluster of `scripts/services.sh redis-cluster`
/// (`DBWARDEN_TEST_REDIS_CLUSTER_URL`).
pub fn cluster_url() -> String {
    crate::server_url(
        "DBWARDEN_TEST_REDIS_CLUSTER_URL",
        "redis+cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003",
    )
}

/// The steady primary + replica + sentinel of `scripts/services.sh redis-sentinel`
/// (`DBWARDEN_TEST_REDIS_SENTINEL_URL`).
pub fn sentinel_url() -> String {
    crate::server_url(
        "DBWARDEN_TEST_REDIS_SENTINEL_URL",
        "redis+sentinel://127.0.0.1:26390/dbwarden",
    )
}

/// For a `redis+sentinel://sentinel/<service>…` URL, `redis://<the primary it names now>`;
/// any other URL as it is.
pub fn primary_url(url: &str) -> String {
    let Some(rest) = url.strip_prefix("redis+sentinel://") else {
        return url.to_owned();
    };
    let rest = rest.split('?').next().unwrap_or_default();
    let (sentinels, path) = rest
        .split_once('/')
        .expect("redis+sentinel://host:port/service");
    let service = path.split('/').next().unwrap_or_default();
    let first = sentinels.split(',').next().unwrap_or_default();
    let addr: Vec<String> = redis::Client::open(format!("redis://{first}"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
        .and_then(|mut c| {
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(service)
                .query(&mut c)
        })
        .unwrap_or_else(|e| {
            panic!("no primary from the sentinel at {first} ({e}): start it with `sudo scripts/services.sh redis-sentinel`")
        });
    format!("redis://{}:{}", addr[0], addr[1])
}

/// Plain commands against the server or cluster a URL names (to look at, or tamper with, keys).
pub enum Peek {
    Single(redis::Connection),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl Peek {
    /// Connect, or panic with a message that says how to start the server.
    pub fn connect(url: &str) -> Peek {
        let url = primary_url(url);
        let url = url.as_str();
        let how = "start it with `sudo scripts/services.sh redis redis-cluster`";
        if let Some(nodes) = url.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> = nodes.split(',').map(|n| format!("redis://{n}")).collect();
            let conn = redis::cluster::ClusterClient::builder(nodes)
                .connection_timeout(Duration::from_secs(5))
                .build()
                .and_then(|c| c.get_connection())
                .unwrap_or_else(|e| panic!("Redis Cluster at {url} is not reachable ({e}): {how}"));
            Peek::Cluster(Box::new(conn))
        } else {
            let conn = redis::Client::open(url)
                .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
                .unwrap_or_else(|e| panic!("Redis at {url} is not reachable ({e}): {how}"));
            Peek::Single(conn)
        }
    }

    pub fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> T {
        match self {
            Peek::Single(c) => cmd.query(c),
            Peek::Cluster(c) => cmd.query(c.as_mut()),
        }
        .unwrap_or_else(|e| panic!("redis {cmd:?}: {e}"))
    }

    pub fn get(&mut self, key: &str) -> Option<String> {
        self.query(redis::cmd("GET").arg(key))
    }

    pub fn exists(&mut self, key: &str) -> bool {
        self.query::<i64>(redis::cmd("EXISTS").arg(key)) == 1
    }

    /// A list, oldest first for RPUSH-built lists.
    pub fn list(&mut self, key: &str) -> Vec<String> {
        self.query(redis::cmd("LRANGE").arg(key).arg(0).arg(-1))
    }

    /// The audit entries of a namespace (newest first), parsed.
    pub fn audit(&mut self, ns: &str) -> Vec<serde_json::Value> {
        self.list(&format!("dbwarden:{{{ns}}}:audit"))
            .iter()
            .map(|s| serde_json::from_str(s).expect("audit entries are JSON"))
            .collect()
    }

    /// The holder record of a namespace, parsed, if the lease is held.
    pub fn holder(&mut self, ns: &str) -> Option<serde_json::Value> {
        self.get(&format!("dbwarden:{{{ns}}}:holder"))
            .map(|s| serde_json::from_str(&s).expect("the holder record is JSON"))
    }

    pub fn fence(&mut self, ns: &str) -> Option<u64> {
        self.get(&format!("dbwarden:{{{ns}}}:fence"))
            .map(|s| s.parse().expect("the fence is a number"))
    }
}

/// A plain async connection (single server or cluster) for data the tests' holders share.
pub enum AsyncData {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl AsyncData {
    pub async fn open(url: &str) -> AsyncData {
        let url = primary_url(url);
        let url = url.as_str();
        if let Some(nodes) = url.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> = nodes.split(',').map(|n| format!("redis://{n}")).collect();
            let c = redis::cluster::ClusterClient::new(nodes).expect("cluster client");
            AsyncData::Cluster(c.get_async_connection().await.expect("cluster connection"))
        } else {
            let c = redis::Client::open(url).expect("client");
            AsyncData::Single(
                c.get_multiplexed_async_connection()
                    .await
                    .expect("connection"),
            )
        }
    }

    pub async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> T {
        match self {
            AsyncData::Single(c) => cmd.query_async(c).await,
            AsyncData::Cluster(c) => cmd.query_async(c).await,
        }
        .unwrap_or_else(|e| panic!("redis {cmd:?}: {e}"))
    }
}

/// The critical section every contender runs while it holds the lease: `INCR app:{ns}:inside`
/// must answer 1 (nobody else inside), `RPUSH app:{ns}:order <token>` records the order in
/// which holders held the lock, the fence must still be ours, then `DECR`.
pub struct CriticalSection {
    data: AsyncData,
    inside: String,
    order: String,
}

impl CriticalSection {
    pub async fn open(url: &str, ns: &str) -> Self {
        CriticalSection {
            data: AsyncData::open(url).await,
            inside: format!("app:{{{ns}}}:inside"),
            order: format!("app:{{{ns}}}:order"),
        }
    }

    /// Run the section once; what went wrong, one line each (empty when all is well).
    pub async fn enter(
        &mut self,
        lock: &dbwarden_redis::RedisLock,
        token: dbwarden_core::FencingToken,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        let n: i64 = self.data.query(redis::cmd("INCR").arg(&self.inside)).await;
        if n != 1 {
            problems.push(format!("OVERLAP token {token}: {n} holders inside"));
        }
        let _: i64 = self
            .data
            .query(redis::cmd("RPUSH").arg(&self.order).arg(token.0))
            .await;
        if let Err(e) = lock.check_fence(token).await {
            problems.push(format!("FENCE token {token}: {e}"));
        }
        tokio::task::yield_now().await;
        let _: i64 = self.data.query(redis::cmd("DECR").arg(&self.inside)).await;
        problems
    }
}

/// A running `redis_probe` whose stdout lines arrive on a channel.
pub struct Probe {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl Probe {
    pub fn new(mut child: Child) -> Probe {
        let out: ChildStdout = child.stdout.take().expect("probe stdout is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Probe {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The first line starting with `prefix` (waiting at most `limit`).
    pub fn expect(&mut self, prefix: &str, limit: Duration) -> String {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "redis_probe (pid {}) never printed {prefix:?} within {limit:?}; it printed {:?}",
                    self.pid(),
                    self.seen
                ),
            }
        }
    }

    /// Wait for the process to exit and return its remaining stdout lines and exit code.
    pub fn finish(mut self, limit: Duration) -> (i32, Vec<String>) {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for redis_probe") {
                while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
                    self.seen.push(line);
                }
                return (status.code().unwrap_or(-1), std::mem::take(&mut self.seen));
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "redis_probe (pid {}) did not exit within {limit:?}; it printed {:?}",
                    self.child.id(),
                    self.seen
                );
            }
            while let Ok(line) = self.lines.try_recv() {
                self.seen.push(line);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            crate::signal(self.child.id(), rustix::process::Signal::CONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
