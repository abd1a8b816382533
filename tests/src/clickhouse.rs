//! Helpers for the ClickHouse tests: a private database per test on the server named by
//! `DBWARDEN_TEST_CLICKHOUSE_URL` (default `http://127.0.0.1:8123`, the HTTP interface), and
//! plain HTTP queries against it (no client library, so the tests read exactly what is stored).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The HTTP interface the tests talk to.
pub fn base_url() -> String {
    crate::server_url("DBWARDEN_TEST_CLICKHOUSE_URL", "http://127.0.0.1:8123")
}

fn host_port() -> String {
    let base = base_url();
    let rest = base.strip_prefix("http://").unwrap_or(&base);
    rest.trim_end_matches('/').to_owned()
}

/// POST `sql` to the server (in `database` if given); `Err(body)` for a server error.
pub fn http_query(database: Option<&str>, sql: &str) -> Result<String, String> {
    try_http_query(database, sql, Duration::from_secs(120))
        .unwrap_or_else(|e| {
            panic!(
                "ClickHouse is not reachable at {} ({e}); start it with `scripts/services.sh clickhouse` or set DBWARDEN_TEST_CLICKHOUSE_URL",
                host_port()
            )
        })
}

/// [`http_query`] without panicking on a transport failure (the outer `Err`).
pub fn try_http_query(
    database: Option<&str>,
    sql: &str,
    limit: Duration,
) -> Result<Result<String, String>, std::io::Error> {
    try_http_query_at(&host_port(), database, sql, limit)
}

/// [`try_http_query`] against the server at `hp` (`host:port` of its HTTP interface).
pub fn try_http_query_at(
    hp: &str,
    database: Option<&str>,
    sql: &str,
    limit: Duration,
) -> Result<Result<String, String>, std::io::Error> {
    let mut s = TcpStream::connect(hp)?;
    s.set_read_timeout(Some(limit))?;
    let path = match database {
        Some(db) => format!("/?database={db}"),
        None => "/".to_owned(),
    };
    let req = format!(
        "POST {path} HTTP/1.0\r\nHost: {hp}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{sql}",
        sql.len()
    );
    s.write_all(req.as_bytes())?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let text = String::from_utf8_lossy(&resp).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let ok = head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200");
    Ok(if ok {
        Ok(body.to_owned())
    } else {
        Err(body.to_owned())
    })
}

/// A database of its own for one test, dropped at the end.
pub struct TestDb {
    pub name: String,
}

impl Default for TestDb {
    fn default() -> Self {
        Self::new()
    }
}

impl TestDb {
    pub fn new() -> Self {
        let name = crate::unique_name("dbw");
        http_query(None, &format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} on {}: {e}", base_url()));
        TestDb { name }
    }

    /// The URL `dbwarden` is given.
    pub fn url(&self) -> String {
        format!(
            "{}/?database={}",
            base_url().trim_end_matches('/'),
            self.name
        )
    }

    /// Run `sql` in this database, panicking on a server error.
    pub fn query(&self, sql: &str) -> String {
        http_query(Some(&self.name), sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Run `sql`; `Err` on a server error (e.g. a table that does not exist yet).
    pub fn try_query(&self, sql: &str) -> Result<String, String> {
        http_query(Some(&self.name), sql)
    }

    /// Every output line of `sql` (TabSeparated).
    pub fn lines(&self, sql: &str) -> Vec<String> {
        self.query(sql)
            .lines()
            .map(str::to_owned)
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// A single number.
    pub fn count(&self, sql: &str) -> i64 {
        let out = self.query(sql);
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{sql}: not a number: {out:?}"))
    }

    /// `count` that is 0 while the table does not exist yet.
    pub fn count_or_zero(&self, sql: &str) -> i64 {
        self.try_query(sql)
            .ok()
            .and_then(|o| o.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Whether a table exists in this database.
    pub fn has_table(&self, table: &str) -> bool {
        self.count(&format!(
            "SELECT count() FROM system.tables WHERE database = '{}' AND name = '{table}'",
            self.name
        )) == 1
    }

    /// Tables whose name starts with `prefix`.
    pub fn tables_like(&self, prefix: &str) -> Vec<String> {
        self.lines(&format!(
            "SELECT name FROM system.tables WHERE database = '{}' AND startsWith(name, '{prefix}') ORDER BY name",
            self.name
        ))
    }

    /// The fence tokens handed out, in the order they were written.
    pub fn fence_tokens(&self) -> Vec<u64> {
        self.lines("SELECT token FROM dbwarden_fence ORDER BY token")
            .iter()
            .map(|l| l.parse().unwrap())
            .collect()
    }

    /// Leave a lock table that looks like a holder that died `age_s` seconds ago with a
    /// `ttl_s` lease, plus a RUNNING status row (what a killed `dbwarden migrate` leaves).
    pub fn fabricate_stale_lock(&self, lock_table: &str, age_s: u32, ttl_s: u32) -> String {
        let exec = uuid::Uuid::new_v4().to_string();
        self.query(&format!(
            "CREATE TABLE {lock_table} ENGINE = Log AS SELECT 'holder' AS kind, '{exec}' AS execution_id, \
             'ghost-host' AS host, toUInt32(999999) AS pid, 'ghost' AS owner, 'dbwarden migrate' AS command, \
             toUInt32(toUInt32(now()) - {age_s}) AS started_at, now() - {age_s} AS at, toUInt64(0) AS fencing_token, \
             toUInt32({ttl_s}) AS ttl_s, toUInt64(0) AS seq"
        ));
        exec
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Never panic here (a panic while a test unwinds aborts the run); the server finishes
        // the DROP even if we stop waiting.
        let sql = format!("DROP DATABASE IF EXISTS {}", self.name);
        if let Err(e) = try_http_query(None, &sql, Duration::from_secs(300)) {
            eprintln!("could not drop test database {}: {e}", self.name);
        }
    }
}

/// The two replicas of cluster `dbw` (`scripts/services.sh clickhouse-cluster`), HTTP.
pub const CLUSTER_NODES: [&str; 2] = ["127.0.0.1:8124", "127.0.0.1:8125"];
/// The cluster's name, as `dbwarden.toml` gives it (`cluster = "dbw"`).
pub const CLUSTER: &str = "dbw";

/// A database of its own on every node of the cluster (`CREATE DATABASE … ON CLUSTER`),
/// dropped on every node at the end.
pub struct ClusterDb {
    pub name: String,
}

impl Default for ClusterDb {
    fn default() -> Self {
        Self::new()
    }
}

impl ClusterDb {
    /// Both nodes are started first (a no-op when they run): a test that stopped one and
    /// failed before starting it again leaves it down, and `ON CLUSTER` DDL waits for it.
    pub fn new() -> Self {
        crate::services("clickhouse-cluster");
        let name = crate::unique_name("dbwc");
        cluster_query(
            0,
            None,
            &format!("CREATE DATABASE {name} ON CLUSTER {CLUSTER}"),
        )
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name} ON CLUSTER {CLUSTER}: {e}"));
        ClusterDb { name }
    }

    /// The URL `dbwarden` is given to reach this database through `node` (0 or 1).
    pub fn url(&self, node: usize) -> String {
        format!("http://{}/?database={}", CLUSTER_NODES[node], self.name)
    }

    /// Every output line of `sql` on `node`, panicking on a server error.
    pub fn lines_at(&self, node: usize, sql: &str) -> Vec<String> {
        cluster_query(node, Some(&self.name), sql)
            .unwrap_or_else(|e| panic!("{sql} on node {}: {e}", node + 1))
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for ClusterDb {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} ON CLUSTER {CLUSTER}", self.name);
        if let Err(e) = try_http_query_at(CLUSTER_NODES[0], None, &sql, Duration::from_secs(300)) {
            eprintln!("could not drop test database {}: {e}", self.name);
        }
    }
}

/// `sql` on cluster node `node`; `Err(body)` for a server error, a panic naming the script
/// when the node does not answer.
pub fn cluster_query(node: usize, database: Option<&str>, sql: &str) -> Result<String, String> {
    try_http_query_at(CLUSTER_NODES[node], database, sql, Duration::from_secs(120)).unwrap_or_else(
        |e| {
            panic!(
                "ClickHouse cluster node {} is not reachable ({e}); start it with `scripts/services.sh clickhouse-cluster`",
                CLUSTER_NODES[node]
            )
        },
    )
}
