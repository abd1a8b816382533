//! The engines under test: where each server is, how a benchmark gets a fresh database (or
//! namespace) of its own and drops it, the lock the library builds for it, and the trivial round
//! trip every lock cost is divided by.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use dbwarden_core::config::{LockKind, Settings};
use dbwarden_core::{MigrationLock, Namespace};
// Database names are generated here (`dbwb_<tag>_<pid>_<n>`), never taken from input, so
// interpolating them is safe.
use sqlx::{AssertSqlSafe, Connection};

use crate::error::{Result, fail};

/// One engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Postgres,
    MariaDb,
    Sqlite,
    Redis,
    ClickHouse,
    Etcd,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::Postgres,
        Kind::MariaDb,
        Kind::Sqlite,
        Kind::Redis,
        Kind::ClickHouse,
        Kind::Etcd,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Kind::Postgres => "PostgreSQL",
            Kind::MariaDb => "MariaDB",
            Kind::Sqlite => "SQLite",
            Kind::Redis => "Redis",
            Kind::ClickHouse => "ClickHouse",
            Kind::Etcd => "etcd",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        match s.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" | "pg" => Some(Kind::Postgres),
            "mariadb" | "mysql" => Some(Kind::MariaDb),
            "sqlite" => Some(Kind::Sqlite),
            "redis" => Some(Kind::Redis),
            "clickhouse" | "ch" => Some(Kind::ClickHouse),
            "etcd" => Some(Kind::Etcd),
            _ => None,
        }
    }

    /// `dbwarden migrate` works here (Redis and etcd keep no migration tables).
    pub fn has_tables(self) -> bool {
        !matches!(self, Kind::Redis | Kind::Etcd)
    }

    /// sqlx-cli can migrate this engine.
    pub fn has_sqlx_peer(self) -> bool {
        matches!(self, Kind::Postgres | Kind::MariaDb | Kind::Sqlite)
    }

    /// What the trivial round trip is on this engine.
    pub fn round_trip_name(self) -> &'static str {
        match self {
            Kind::Redis => "PING",
            Kind::Etcd => "a linearizable GET",
            Kind::ClickHouse => "SELECT 1 over HTTP",
            _ => "SELECT 1",
        }
    }
}

/// Where the servers are (`DBWARDEN_BENCH_<ENGINE>_URL` overrides each).
#[derive(Debug, Clone)]
pub struct Servers {
    pub postgres: String,
    pub mariadb: String,
    pub redis: String,
    pub clickhouse: String,
    /// ClickHouse's `cluster` (`DBWARDEN_BENCH_CLICKHOUSE_CLUSTER`): databases are created and
    /// dropped `ON CLUSTER`, and the lock is the cluster's.
    pub clickhouse_cluster: Option<String>,
    pub etcd: String,
}

impl Servers {
    pub fn from_env() -> Self {
        let var = |name: &str, default: &str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_owned())
        };
        Servers {
            postgres: var(
                "DBWARDEN_BENCH_POSTGRES_URL",
                "postgres://root@127.0.0.1:5432/test",
            ),
            mariadb: var(
                "DBWARDEN_BENCH_MARIADB_URL",
                "mysql://root@127.0.0.1:3306/test",
            ),
            redis: var("DBWARDEN_BENCH_REDIS_URL", "redis://127.0.0.1:6379"),
            clickhouse: var(
                "DBWARDEN_BENCH_CLICKHOUSE_URL",
                "clickhouse://127.0.0.1:8123/default",
            ),
            clickhouse_cluster: std::env::var("DBWARDEN_BENCH_CLICKHOUSE_CLUSTER")
                .ok()
                .filter(|v| !v.is_empty()),
            etcd: var(
                "DBWARDEN_BENCH_ETCD_URL",
                "etcd://127.0.0.1:2379,127.0.0.1:2381,127.0.0.1:2383",
            ),
        }
    }
}

/// A database (or, on Redis, a namespace) that one benchmark creates, uses alone and drops.
#[derive(Debug, Clone)]
pub struct Fresh {
    pub url: String,
    pub namespace: Namespace,
    /// Database name, SQLite folder, or Redis namespace.
    name: String,
}

/// One engine on its local server.
pub struct Engine {
    pub kind: Kind,
    pub servers: Servers,
    work: PathBuf,
    /// The lock the runs take (`lock = "lease"` on PostgreSQL, else the native one).
    pub lock: LockKind,
    /// A PgBouncer port in transaction mode the fresh databases are reached through (the
    /// databases themselves are created and dropped directly).
    pub pooler: Option<u16>,
}

/// Makes every fresh database name of this process unique.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// `url` with its database (first path segment) replaced by `db`, query kept.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority_end = base
        .find("://")
        .map(|i| i + 3)
        .and_then(|start| base[start..].find('/').map(|j| start + j))
        .unwrap_or(base.len());
    let mut out = format!("{}/{db}", &base[..authority_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// `url` with its port replaced by `port` (host kept).
fn with_port(url: &str, port: u16) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let host = match hostport.rsplit_once(':') {
        Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h,
        _ => hostport,
    };
    format!("{scheme}://{userinfo}{host}:{port}{tail}")
}

/// `http://host:port` of a `clickhouse://[user@]host:port/db` URL.
fn clickhouse_http(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    format!("http://{host}")
}

impl Engine {
    pub fn new(kind: Kind, servers: Servers, work: PathBuf) -> Self {
        Engine {
            kind,
            servers,
            work,
            lock: LockKind::Native,
            pooler: None,
        }
    }

    /// The same PostgreSQL with `lock = "lease"`, reached directly or through the PgBouncer in
    /// transaction mode on `pooler` (`None` for other engines).
    pub fn lease(&self, pooler: Option<u16>) -> Option<Engine> {
        if self.kind != Kind::Postgres {
            return None;
        }
        let tag = pooler.map_or("lease".to_owned(), |p| format!("lease-pooled-{p}"));
        let mut e = Engine::new(self.kind, self.servers.clone(), self.work.join(tag));
        e.lock = LockKind::Lease;
        e.pooler = pooler;
        Some(e)
    }

    /// The same PostgreSQL with `sslmode=disable` added to its URL, to tell the TLS set-up
    /// apart from dbwarden's own work (`None` for other engines, or when the URL already says
    /// what it wants).
    pub fn without_tls(&self) -> Option<Engine> {
        if self.kind != Kind::Postgres || self.servers.postgres.contains("sslmode=") {
            return None;
        }
        let mut servers = self.servers.clone();
        let sep = if servers.postgres.contains('?') {
            '&'
        } else {
            '?'
        };
        servers.postgres = format!("{}{sep}sslmode=disable", servers.postgres);
        Some(Engine::new(self.kind, servers, self.work.join("no-tls")))
    }

    /// Settings for `fresh`, as the CLI would resolve them with nothing else configured.
    pub fn settings(&self, fresh: &Fresh) -> Settings {
        Settings {
            database_url: fresh.url.clone(),
            namespace: fresh.namespace.clone(),
            lock: self.lock,
            cluster: match self.kind {
                Kind::ClickHouse => self.servers.clickhouse_cluster.clone(),
                _ => None,
            },
            ..Settings::default()
        }
    }

    /// The library's lock for `settings`, through the registry as the CLI opens it.
    pub fn lock(
        &self,
        settings: &Settings,
    ) -> std::result::Result<Box<dyn MigrationLock>, dbwarden_core::Error> {
        // The same registry as the CLI's.
        dbwarden::engines().open(settings)
    }

    /// A new database (namespace on Redis) named after `tag`.
    pub async fn fresh(&self, tag: &str) -> Result<Fresh> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("dbwb_{tag}_{}_{n}", std::process::id());
        let default_ns = Namespace::default();
        let fresh = match self.kind {
            Kind::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.servers.postgres).await?;
                sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
                    .execute(&mut c)
                    .await?;
                let mut url = with_database(&self.servers.postgres, &name);
                if let Some(port) = self.pooler {
                    url = with_port(&url, port);
                }
                Fresh {
                    url,
                    namespace: default_ns,
                    name,
                }
            }
            Kind::MariaDb => {
                let mut c = sqlx::MySqlConnection::connect(&self.servers.mariadb).await?;
                sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
                    .execute(&mut c)
                    .await?;
                let url = with_database(&self.servers.mariadb, &name);
                Fresh {
                    url,
                    namespace: default_ns,
                    name,
                }
            }
            Kind::Sqlite => {
                let dir = self.work.join(&name);
                std::fs::create_dir_all(&dir)?;
                let file = dir.join("bench.db");
                // An empty file is an empty database; sqlx-cli does not create a missing one.
                std::fs::File::create(&file)?;
                Fresh {
                    url: format!("sqlite://{}", file.display()),
                    namespace: default_ns,
                    name: dir.display().to_string(),
                }
            }
            Kind::Redis => Fresh {
                url: self.servers.redis.clone(),
                namespace: Namespace::new(&name)?,
                name,
            },
            // A key prefix of its own.
            Kind::Etcd => Fresh {
                url: format!("{}/{name}", self.servers.etcd),
                namespace: default_ns,
                name,
            },
            Kind::ClickHouse => {
                self.clickhouse_admin()
                    .query(&format!("CREATE DATABASE `{name}`{}", self.on_cluster()))
                    .execute()
                    .await?;
                Fresh {
                    url: with_database(&self.servers.clickhouse, &name),
                    namespace: default_ns,
                    name,
                }
            }
        };
        Ok(fresh)
    }

    /// Run `work` on a new database (see [`Engine::fresh`]) and drop it afterwards, whatever
    /// `work` returned: no early `?` can leave a database behind.
    pub async fn with_fresh<T>(
        &self,
        tag: &str,
        work: impl AsyncFnOnce(&Fresh) -> Result<T>,
    ) -> Result<T> {
        let fresh = self.fresh(tag).await?;
        let r = work(&fresh).await;
        self.drop_fresh(fresh).await;
        r
    }

    /// Drop what [`Engine::fresh`] created, ending any session still inside it. Best effort: a
    /// failure is printed, not fatal.
    pub async fn drop_fresh(&self, fresh: Fresh) {
        if let Err(e) = self.try_drop(&fresh).await {
            eprintln!(
                "  warning: could not drop {} {}: {e}",
                self.kind.title(),
                fresh.name
            );
        }
    }

    async fn try_drop(&self, fresh: &Fresh) -> Result<()> {
        let name = &fresh.name;
        match self.kind {
            Kind::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.servers.postgres).await?;
                sqlx::query(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                )))
                .execute(&mut c)
                .await?;
            }
            Kind::MariaDb => {
                let mut c = sqlx::MySqlConnection::connect(&self.servers.mariadb).await?;
                let ids: Vec<i64> = sqlx::query_scalar(
                    "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()",
                )
                .bind(name)
                .fetch_all(&mut c)
                .await?;
                for id in ids {
                    // The session may end by itself meanwhile.
                    let _ = sqlx::raw_sql(AssertSqlSafe(format!("KILL {id}")))
                        .execute(&mut c)
                        .await;
                }
                sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS `{name}`")))
                    .execute(&mut c)
                    .await?;
            }
            Kind::Sqlite => std::fs::remove_dir_all(name)?,
            Kind::Redis => {
                let mut c = redis::Client::open(self.servers.redis.as_str())?
                    .get_multiplexed_async_connection()
                    .await?;
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("dbwarden:{{{name}}}:*"))
                    .query_async(&mut c)
                    .await?;
                if !keys.is_empty() {
                    redis::cmd("DEL")
                        .arg(&keys)
                        .query_async::<()>(&mut c)
                        .await?;
                }
            }
            Kind::ClickHouse => {
                self.clickhouse_admin()
                    .query(&format!(
                        "DROP DATABASE IF EXISTS `{name}`{}",
                        self.on_cluster()
                    ))
                    .execute()
                    .await?;
            }
            Kind::Etcd => etcd::drop_prefix(&self.servers.etcd, name).await?,
        }
        Ok(())
    }

    fn on_cluster(&self) -> String {
        self.servers
            .clickhouse_cluster
            .as_ref()
            .map_or_else(String::new, |c| format!(" ON CLUSTER `{c}`"))
    }

    fn clickhouse_admin(&self) -> clickhouse::Client {
        clickhouse::Client::default()
            .with_url(clickhouse_http(&self.servers.clickhouse))
            .with_compression(clickhouse::Compression::None)
            .with_validation(false)
    }

    /// The server's version (SQLite: the linked library's).
    pub async fn version(&self) -> Result<String> {
        let v = match self.kind {
            Kind::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.servers.postgres).await?;
                sqlx::query_scalar::<_, String>("SHOW server_version")
                    .fetch_one(&mut c)
                    .await?
            }
            Kind::MariaDb => {
                let mut c = sqlx::MySqlConnection::connect(&self.servers.mariadb).await?;
                sqlx::query_scalar::<_, String>("SELECT VERSION()")
                    .fetch_one(&mut c)
                    .await?
            }
            Kind::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
                sqlx::query_scalar::<_, String>("SELECT sqlite_version()")
                    .fetch_one(&mut c)
                    .await?
            }
            Kind::Redis => {
                let mut c = redis::Client::open(self.servers.redis.as_str())?
                    .get_multiplexed_async_connection()
                    .await?;
                let info: String = redis::cmd("INFO").arg("server").query_async(&mut c).await?;
                info.lines()
                    .find_map(|l| l.strip_prefix("redis_version:"))
                    .unwrap_or("unknown")
                    .trim()
                    .to_owned()
            }
            Kind::ClickHouse => {
                self.clickhouse_admin()
                    .query("SELECT version()")
                    .fetch_one::<String>()
                    .await?
            }
            Kind::Etcd => etcd::version(&self.servers.etcd).await?,
        };
        Ok(v)
    }

    /// `n` timed trivial round trips on one connection of the kind the engine's lock uses, after
    /// a warm-up (connection set-up and statement preparation are not counted).
    pub async fn round_trips(&self, fresh: &Fresh, n: usize) -> Result<Vec<Duration>> {
        const WARM_UP: usize = 50;
        let mut samples = Vec::with_capacity(n);
        macro_rules! timed {
            ($op:expr) => {
                for i in 0..WARM_UP + n {
                    let t = Instant::now();
                    $op;
                    if i >= WARM_UP {
                        samples.push(t.elapsed());
                    }
                }
            };
        }
        match self.kind {
            // Through a transaction pooler a named prepared statement may be gone on the next
            // backend: the simple protocol there, as the lease's own statements go.
            Kind::Postgres if self.pooler.is_some() => {
                let mut c = sqlx::PgConnection::connect(&fresh.url).await?;
                timed!(sqlx::raw_sql("SELECT 1").execute(&mut c).await?);
            }
            Kind::Postgres => {
                let mut c = sqlx::PgConnection::connect(&fresh.url).await?;
                timed!(
                    sqlx::query_scalar::<_, i32>("SELECT 1")
                        .fetch_one(&mut c)
                        .await?
                );
            }
            Kind::MariaDb => {
                let mut c = sqlx::MySqlConnection::connect(&fresh.url).await?;
                timed!(
                    sqlx::query_scalar::<_, i64>("SELECT 1")
                        .fetch_one(&mut c)
                        .await?
                );
            }
            Kind::Sqlite => {
                let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&fresh.url)?;
                let mut c = sqlx::SqliteConnection::connect_with(&opts).await?;
                timed!(
                    sqlx::query_scalar::<_, i64>("SELECT 1")
                        .fetch_one(&mut c)
                        .await?
                );
            }
            Kind::Redis => {
                let mut c = redis::Client::open(fresh.url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?;
                timed!(redis::cmd("PING").query_async::<String>(&mut c).await?);
            }
            Kind::ClickHouse => {
                let db = fresh.name.clone();
                let c = self.clickhouse_admin().with_database(db);
                timed!(c.query("SELECT 1").fetch_one::<u8>().await?);
            }
            Kind::Etcd => {
                let mut c = etcd::Client::new(&self.servers.etcd).await?;
                timed!(c.get(&fresh.name).await?);
            }
        }
        Ok(samples)
    }

    /// Is the server there at all? (A clear "not measured" beats a timeout per benchmark.)
    pub async fn reachable(&self) -> Result<()> {
        tokio::time::timeout(Duration::from_secs(10), self.version())
            .await
            .map_err(|_| fail("no answer within 10 s"))?
            .map(|_| ())
    }
}

/// What the rows on etcd need of the cluster besides the lock. Without the `etcd` feature each
/// says how to get it (the rows are then "not measured").
#[cfg(feature = "etcd")]
mod etcd {
    use crate::error::Result;

    pub struct Client(etcd_client::Client);

    impl Client {
        /// A client of the cluster of an `etcd://h1:p1,h2:p2` URL.
        pub async fn new(url: &str) -> Result<Client> {
            let hosts = url.trim_start_matches("etcd://");
            let hosts = hosts.split('/').next().unwrap_or(hosts);
            let endpoints: Vec<String> = hosts.split(',').map(|h| format!("http://{h}")).collect();
            Ok(Client(etcd_client::Client::connect(endpoints, None).await?))
        }

        /// One linearizable read (the trivial round trip).
        pub async fn get(&mut self, key: &str) -> Result<()> {
            self.0.get(key, None).await?;
            Ok(())
        }
    }

    pub async fn version(url: &str) -> Result<String> {
        Ok(Client::new(url)
            .await?
            .0
            .status()
            .await?
            .version()
            .to_owned())
    }

    /// Delete every key under `prefix/`.
    pub async fn drop_prefix(url: &str, prefix: &str) -> Result<()> {
        let opts = etcd_client::DeleteOptions::new().with_prefix();
        let mut c = Client::new(url).await?;
        c.0.delete(format!("{prefix}/"), Some(opts)).await?;
        Ok(())
    }
}

#[cfg(not(feature = "etcd"))]
mod etcd {
    use crate::error::{Result, fail};

    const UNBUILT: &str = "built without the etcd feature (scripts/bench.sh builds with it)";

    pub struct Client;

    impl Client {
        pub async fn new(_: &str) -> Result<Client> {
            Err(fail(UNBUILT))
        }

        pub async fn get(&mut self, _: &str) -> Result<()> {
            Err(fail(UNBUILT))
        }
    }

    pub async fn version(_: &str) -> Result<String> {
        Err(fail(UNBUILT))
    }

    pub async fn drop_prefix(_: &str, _: &str) -> Result<()> {
        Ok(())
    }
}
