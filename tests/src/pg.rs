//! Helpers for the PostgreSQL tests: a fresh database per test (dropped at the end), and a
//! small synchronous client to look at what `dbwarden` wrote.

use std::time::Duration;

use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{Connection, Row, ValueRef};

use crate::{Sandbox, server_url, unique_name};

/// The server the tests use: `$DBWARDEN_TEST_PG_URL` or the local default.
pub fn base_url() -> String {
    server_url(
        "DBWARDEN_TEST_PG_URL",
        "postgres://root@127.0.0.1:5432/test",
    )
}

/// `url` with its database (path) replaced by `db`.
pub fn with_database(url: &str, db: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, format!("?{q}")),
        None => (url, String::new()),
    };
    let scheme_end = head.find("://").map_or(0, |i| i + 3);
    let base = match head[scheme_end..].find('/') {
        Some(i) => &head[..scheme_end + i],
        None => head,
    };
    format!("{base}/{db}{query}")
}

/// `url` with its port replaced by `port` (for PgBouncer and the standby).
pub fn with_port(url: &str, port: u16) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[scheme_end..];
    let auth_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..auth_end];
    let (userinfo, hostport) = match authority.rfind('@') {
        Some(i) => (&authority[..=i], &authority[i + 1..]),
        None => ("", authority),
    };
    let host = hostport.rsplit_once(':').map_or(hostport, |(h, _)| h);
    format!(
        "{}{userinfo}{host}:{port}{}",
        &url[..scheme_end],
        &rest[auth_end..]
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// One connection, used synchronously.
pub struct Client {
    rt: tokio::runtime::Runtime,
    conn: Option<PgConnection>,
    url: String,
}

fn cell(r: &PgRow, i: usize) -> String {
    let raw = r.try_get_raw(i).expect("column");
    if raw.is_null() {
        return "NULL".into();
    }
    if let Ok(v) = r.try_get::<i64, _>(i) {
        return v.to_string();
    }
    if let Ok(v) = r.try_get::<i32, _>(i) {
        return v.to_string();
    }
    if let Ok(v) = r.try_get::<bool, _>(i) {
        return v.to_string();
    }
    if let Ok(v) = r.try_get::<f64, _>(i) {
        return v.to_string();
    }
    r.try_get::<String, _>(i)
        .unwrap_or_else(|e| panic!("column {i}: cast it to text in the query ({e})"))
}

impl Client {
    /// Connect or panic with a message that says how to start the server.
    pub fn connect(url: &str) -> Client {
        Client::try_connect(url).unwrap_or_else(|e| {
            panic!("PostgreSQL is not reachable at {url} ({e}): start it with `scripts/services.sh postgres`")
        })
    }

    /// Connect, or say why not.
    pub fn try_connect(url: &str) -> Result<Client, String> {
        let rt = runtime();
        let conn = rt
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(url)).await
            })
            .map_err(|_| "timed out".to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))?;
        Ok(Client {
            rt,
            conn: Some(conn),
            url: url.to_owned(),
        })
    }

    /// Every row, each as its columns rendered as strings (NULL as "NULL").
    pub fn rows(&mut self, sql: &str) -> Vec<Vec<String>> {
        self.try_rows(sql)
            .unwrap_or_else(|e| panic!("{sql} on {}: {e}", self.url))
    }

    /// [`Client::rows`], or the server's error.
    pub fn try_rows(&mut self, sql: &str) -> Result<Vec<Vec<String>>, sqlx::Error> {
        let conn = self.conn.as_mut().expect("open connection");
        let rows = self
            .rt
            .block_on(sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned())).fetch_all(conn))?;
        Ok(rows
            .iter()
            .map(|r| (0..r.len()).map(|i| cell(r, i)).collect())
            .collect())
    }

    /// The first column of every row.
    pub fn query(&mut self, sql: &str) -> Vec<String> {
        self.rows(sql)
            .into_iter()
            .map(|mut r| r.remove(0))
            .collect()
    }

    /// The first column of the first row, as a number.
    pub fn count(&mut self, sql: &str) -> i64 {
        let v = self.query(sql);
        v.first()
            .unwrap_or_else(|| panic!("{sql}: no row"))
            .parse()
            .unwrap_or_else(|e| panic!("{sql}: {v:?} is not a number ({e})"))
    }

    pub fn exec(&mut self, sql: &str) {
        let conn = self.conn.as_mut().expect("open connection");
        self.rt
            .block_on(sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned())).execute(conn))
            .unwrap_or_else(|e| panic!("{sql} on {}: {e}", self.url));
    }

    /// This session's backend pid.
    pub fn backend_pid(&mut self) -> i64 {
        self.count("SELECT pg_backend_pid()")
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            let _ = self.rt.block_on(c.close());
        }
    }
}

/// A fresh database `dbw_<12 hex>` for one test, dropped (`WITH (FORCE)`) when this goes.
pub struct PgDb {
    pub name: String,
    pub url: String,
}

impl Default for PgDb {
    fn default() -> Self {
        Self::new()
    }
}

impl PgDb {
    pub fn new() -> PgDb {
        let name = unique_name("dbw");
        Client::connect(&base_url()).exec(&format!("CREATE DATABASE \"{name}\""));
        PgDb {
            url: with_database(&base_url(), &name),
            name,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.url)
    }

    pub fn query(&self, sql: &str) -> Vec<String> {
        self.client().query(sql)
    }

    pub fn count(&self, sql: &str) -> i64 {
        self.client().count(sql)
    }

    pub fn exec(&self, sql: &str) {
        self.client().exec(sql)
    }

    /// The URL through another port of the same server host (PgBouncer, a standby).
    pub fn url_on_port(&self, port: u16) -> String {
        with_port(&self.url, port)
    }

    /// `dbwarden <args> -u <this database>` in `sb`, run to completion.
    pub fn run(&self, sb: &Sandbox, args: &[&str]) -> crate::Run {
        sb.run(
            &self
                .args(args)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
    }

    pub fn spawn(&self, sb: &Sandbox, args: &[&str]) -> std::process::Child {
        sb.spawn(
            &self
                .args(args)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
    }

    /// `lock-status --json` on this database.
    pub fn status(&self, sb: &Sandbox, extra: &[&str]) -> (i32, serde_json::Value) {
        let mut a = vec!["-u", self.url.as_str()];
        a.extend_from_slice(extra);
        sb.status(&a)
    }

    /// Poll lock-status until `pred` holds (at most `limit`).
    pub fn wait_status(
        &self,
        sb: &Sandbox,
        limit: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        sb.wait_status(&["-u", self.url.as_str()], limit, pred)
    }

    fn args(&self, args: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        v.insert(1, self.url.clone());
        v.insert(1, "-u".into());
        v
    }

    /// Wait until a session of this database sleeps in `pg_sleep((SELECT secs FROM knob))`
    /// (the tests' slow statement, whose length a `knob` table sets): it has read the knob,
    /// so setting the knob from then on only shortens what runs after it.
    pub fn wait_knob_sleep(&self) {
        self.wait_for(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND state = 'active' AND pid <> pg_backend_pid() AND wait_event = 'PgSleep' \
             AND query LIKE '%pg_sleep((SELECT secs FROM knob))%'",
            Duration::from_secs(60),
        );
    }

    /// Poll `sql` (a count) until it is at least 1 (at most `limit`); errors (a table that
    /// does not exist yet) count as 0.
    pub fn wait_for(&self, sql: &str, limit: Duration) {
        let t0 = std::time::Instant::now();
        let mut c = self.client();
        loop {
            let n = c
                .try_rows(sql)
                .ok()
                .and_then(|rows| rows.into_iter().next())
                .and_then(|r| r.first().and_then(|v| v.parse::<i64>().ok()));
            if n.unwrap_or(0) >= 1 {
                return;
            }
            assert!(
                t0.elapsed() < limit,
                "timed out after {limit:?} waiting for: {sql}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Seconds since the epoch on the server clock.
    pub fn server_epoch(&self) -> f64 {
        self.query("SELECT extract(epoch FROM clock_timestamp())::float8")[0]
            .parse()
            .expect("epoch")
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        // Best effort: a test that failed should still not leave its database behind.
        let rt = runtime();
        let name = self.name.clone();
        let _ = rt.block_on(async move {
            let mut c = PgConnection::connect(&base_url()).await?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
            )))
            .execute(&mut c)
            .await?;
            c.close().await
        });
    }
}

/// Seconds since the epoch on this host's clock (the same clock as the local server's).
pub fn local_epoch() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// The migrations of the contention tests: a side table whose primary key makes a second run
/// of any migration fail loudly, then `n - 1` migrations that each create a table and record
/// their version.
pub fn numbered_migrations(sb: &Sandbox, n: u32) {
    sb.write_migration(
        "0001_ran.sql",
        "CREATE TABLE ran (version INTEGER PRIMARY KEY, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp());\nINSERT INTO ran (version) VALUES (1);",
    );
    for v in 2..=n {
        sb.write_migration(
            &format!("{v:04}_table_{v}.sql"),
            &format!(
                "CREATE TABLE t_{v} (id SERIAL PRIMARY KEY, note TEXT NOT NULL);\nINSERT INTO t_{v} (note) VALUES ('v{v}; with a semicolon');\nINSERT INTO ran (version) VALUES ({v});"
            ),
        );
    }
}

/// The port of the PgBouncer that `scripts/services.sh pg-extras` starts in `pool_mode`
/// `transaction` (`DBWARDEN_TEST_PGBOUNCER_TX_PORT`, 6442) or `session`
/// (`DBWARDEN_TEST_PGBOUNCER_SESSION_PORT`, 6443), checked to answer: a test that needs it fails
/// loudly without it.
pub fn pgbouncer_port(session: bool) -> u16 {
    let (var, default) = if session {
        ("DBWARDEN_TEST_PGBOUNCER_SESSION_PORT", "6443")
    } else {
        ("DBWARDEN_TEST_PGBOUNCER_TX_PORT", "6442")
    };
    let p: u16 = crate::server_url(var, default)
        .parse()
        .expect("a port number");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], p));
    assert!(
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)).is_ok(),
        "PgBouncer is not listening on {addr} ({var}): start it with `scripts/services.sh pg-extras`"
    );
    p
}
