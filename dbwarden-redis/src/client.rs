//! Where the lease lives: one Redis server or a Redis Cluster, and the connections to it.
//!
//! URL forms (parsed without connecting):
//! - `redis://[user[:password]@]host[:port][/db]`: one server (or a primary behind a fixed address);
//! - `redis+cluster://[user[:password]@]host1:port1,host2:port2,...`: a Redis Cluster, given by
//!   any of its nodes (the client discovers the rest). Every key of a namespace carries the hash
//!   tag `{<namespace>}`, so the lock, the fence counter and the holder share one slot.
//! - `redis+sentinel://[user[:password]@]host1:port1,host2:port2/<service>[/db][?replicas=N]`:
//!   the primary of `<service>` as the listed sentinels name it, asked again after a failover.
//!   The user and password are the primary's (the sentinels are reached without). Every lease
//!   write is confirmed on `N` replicas (default 1) before it counts (`WAIT`; docs/design.md).
//!
//! `rediss://` (TLS) is refused with a clear error: this build carries no TLS stack.

use std::sync::Arc;
use std::time::Duration;

use dbwarden_core::Error;
use dbwarden_core::error::one_line;
use dbwarden_core::url::redact;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use crate::sentinel::{SentinelConn, Sentinels};

/// A Redis server or cluster to hold leases on. Cheap to clone; connects only when used.
///
/// ```
/// use dbwarden_redis::RedisClient;
/// let single = RedisClient::from_url("redis://127.0.0.1:6379")?;
/// let cluster = RedisClient::from_url("redis+cluster://127.0.0.1:7001,127.0.0.1:7002")?;
/// let from_crate: RedisClient = redis::Client::open("redis://127.0.0.1/").unwrap().into();
/// # Ok::<(), dbwarden_core::Error>(())
/// ```
#[derive(Clone)]
pub struct RedisClient {
    kind: Kind,
    /// What error messages name: host:port list, never a password.
    target: String,
}

#[derive(Clone)]
enum Kind {
    Single(redis::Client),
    /// The cluster client, plus one plain client per given node for the release channel
    /// (classic pub/sub messages reach every node of a cluster).
    Cluster {
        nodes: Vec<redis::Client>,
        urls: Vec<String>,
    },
    /// The primary the sentinels name, and how many replicas confirm a lease write.
    Sentinel {
        sentinels: Arc<Sentinels>,
        replicas: u32,
    },
}

impl std::fmt::Debug for RedisClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClient")
            .field("target", &self.target)
            .finish()
    }
}

fn bad_url(url: &str, detail: impl std::fmt::Display) -> Error {
    Error::usage(format!(
        "invalid Redis URL {:?}: {}; use redis://[user:password@]host:port[/db], redis+cluster://host1:port1,host2:port2 or redis+sentinel://host1:port1,host2:port2/<service>[/db][?replicas=N]",
        redact(url),
        one_line(&detail.to_string())
    ))
}

/// `user:password@` (with its `@`, or empty) and what follows the URL's last `@`.
fn split_login(rest: &str) -> (&str, &str) {
    rest.split_at(rest.rfind('@').map_or(0, |at| at + 1))
}

/// A client for each `redis://` URL, and their `host:port`s as error messages show them.
fn open_each(urls: &[String]) -> redis::RedisResult<(Vec<redis::Client>, String)> {
    let nodes = urls
        .iter()
        .map(|u| redis::Client::open(u.as_str()))
        .collect::<redis::RedisResult<Vec<_>>>()?;
    let shown: Vec<String> = nodes
        .iter()
        .map(|c| c.get_connection_info().addr().to_string())
        .collect();
    Ok((nodes, shown.join(",")))
}

impl RedisClient {
    /// Parse a `redis://`, `redis+cluster://` or `redis+sentinel://` URL (see the module docs).
    /// Nothing is connected.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let scheme = dbwarden_core::url::scheme(url).unwrap_or_default();
        match scheme.as_str() {
            "redis" => {
                let client = redis::Client::open(url).map_err(|e| bad_url(url, e))?;
                Ok(client.into())
            }
            "rediss" => Err(Error::usage(format!(
                "{:?}: rediss:// (TLS) is not supported by this build of dbwarden; use redis:// over a trusted network or a TLS tunnel",
                redact(url)
            ))),
            "redis+cluster" => {
                let (login, hosts) = split_login(&url["redis+cluster://".len().min(url.len())..]);
                let hosts = hosts.trim_end_matches('/');
                if hosts.split(',').any(|h| h.trim().is_empty()) {
                    return Err(bad_url(
                        url,
                        "no node given; list host:port pairs separated by commas",
                    ));
                }
                if hosts.contains(['/', '?', '#']) {
                    return Err(bad_url(
                        url,
                        "a cluster URL takes no database number or options (a cluster has only db 0)",
                    ));
                }
                let urls: Vec<String> = hosts
                    .split(',')
                    .map(|h| format!("redis://{login}{h}"))
                    .collect();
                let (nodes, shown) = open_each(&urls).map_err(|_| {
                    bad_url(url, "every node must be host:port, separated by commas")
                })?;
                Ok(RedisClient {
                    target: format!("redis cluster {shown}"),
                    kind: Kind::Cluster { nodes, urls },
                })
            }
            "redis+sentinel" => Self::sentinel_from_url(url),
            _ => Err(bad_url(
                url,
                "not a redis://, redis+cluster:// or redis+sentinel:// URL",
            )),
        }
    }

    fn sentinel_from_url(url: &str) -> Result<Self, Error> {
        let rest = &url["redis+sentinel://".len().min(url.len())..];
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (login, rest) = split_login(rest);
        let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
        if hosts.is_empty() || hosts.split(',').any(|h| h.trim().is_empty()) {
            return Err(bad_url(
                url,
                "no sentinel given; list host:port pairs separated by commas",
            ));
        }
        let mut segments = path.split('/').filter(|p| !p.is_empty());
        let service = segments.next().ok_or_else(|| {
            bad_url(
                url,
                "no service name: the path names the primary the sentinels monitor, e.g. /mymaster",
            )
        })?;
        let db = segments.next().unwrap_or("0");
        if segments.next().is_some() {
            return Err(bad_url(url, "the path is /<service>[/db], nothing more"));
        }
        let mut replicas = 1;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("replicas", n)) => {
                    replicas = n.parse().map_err(|_| {
                        bad_url(
                            url,
                            "replicas= takes a whole number (0 turns confirmation off)",
                        )
                    })?;
                }
                _ => {
                    return Err(bad_url(
                        url,
                        format!("unknown option {pair:?}; the only one is replicas=N"),
                    ));
                }
            }
        }
        // The primary's login and db, decoded by the redis crate from a URL of the same shape.
        let node_info = redis::Client::open(format!("redis://{login}127.0.0.1/{db}"))
            .map_err(|e| bad_url(url, e))?
            .get_connection_info()
            .redis_settings()
            .clone();
        let db = node_info.db();
        let sentinel_urls: Vec<String> = hosts.split(',').map(|h| format!("redis://{h}")).collect();
        let (_, shown) = open_each(&sentinel_urls)
            .map_err(|_| bad_url(url, "every sentinel must be host:port, separated by commas"))?;
        let node = redis::sentinel::SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(node_info);
        let sentinels = Sentinels::new(&sentinel_urls, service.to_owned(), node, db)
            .map_err(|e| bad_url(url, e))?;
        Ok(RedisClient {
            target: format!("redis sentinel {shown} service {service}"),
            kind: Kind::Sentinel {
                sentinels: Arc::new(sentinels),
                replicas,
            },
        })
    }

    /// How many replicas confirm each lease write unless the lock says otherwise: the URL's
    /// `replicas=` behind Sentinel (default 1), none elsewhere.
    pub fn default_replicas(&self) -> u32 {
        match &self.kind {
            Kind::Sentinel { replicas, .. } => *replicas,
            _ => 0,
        }
    }

    /// `host:port` (or `redis cluster h1:p1,h2:p2`), never a password.
    pub fn target(&self) -> &str {
        &self.target
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.kind, Kind::Cluster { .. })
    }

    /// A reconnecting connection for lock operations and heartbeats, set up within
    /// `connect_timeout`; every answer is awaited at most `response_timeout`.
    pub(crate) async fn connect(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Conn, Error> {
        let attempt = async {
            match &self.kind {
                Kind::Single(client) => {
                    let cfg = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(connect_timeout))
                        .set_response_timeout(Some(response_timeout))
                        .set_number_of_retries(1)
                        .set_min_delay(Duration::from_millis(50))
                        .set_max_delay(Duration::from_millis(500));
                    client
                        .get_connection_manager_with_config(cfg)
                        .await
                        .map(Conn::Single)
                }
                Kind::Cluster { urls, .. } => {
                    ClusterClientBuilder::new(urls.iter().map(String::as_str))
                        .connection_timeout(connect_timeout)
                        .response_timeout(response_timeout)
                        .retries(2)
                        .min_retry_wait(20)
                        .max_retry_wait(500)
                        .build()?
                        .get_async_connection()
                        .await
                        .map(|c| Conn::Cluster(Box::new(c)))
                }
                Kind::Sentinel { sentinels, .. } => {
                    SentinelConn::connect(sentinels.clone(), connect_timeout, response_timeout)
                        .await
                        .map(Conn::Sentinel)
                }
            }
        };
        match tokio::time::timeout(connect_timeout, attempt).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(self.error(e)),
            Err(_) => Err(Error::unreachable(
                &self.target,
                format!(
                    "no connection within connect_timeout ({}); check that Redis runs there and that the network allows it",
                    dbwarden_core::duration::human(connect_timeout)
                ),
            )),
        }
    }

    /// The clients a release-channel subscriber may use, in order of preference (behind
    /// Sentinel: the primary named now, or none while the sentinels cannot name one).
    pub(crate) async fn pubsub_clients(&self, within: Duration) -> Vec<redis::Client> {
        match &self.kind {
            Kind::Single(c) => vec![c.clone()],
            Kind::Cluster { nodes, .. } => nodes.clone(),
            Kind::Sentinel { sentinels, .. } => match sentinels.primary(within).await {
                Ok(c) => vec![c],
                Err(e) => {
                    tracing::debug!("release channel: no primary from the sentinels: {e}");
                    Vec::new()
                }
            },
        }
    }

    /// Map a Redis error: the server could not be reached (or refused us) vs. anything else.
    pub(crate) fn error(&self, e: RedisError) -> Error {
        use redis::ErrorKind as K;
        let unreachable = crate::sentinel::moved(&e)
            || e.is_cluster_error()
            || matches!(
                e.kind(),
                K::AuthenticationFailed
                    | K::ClusterConnectionNotFound
                    | K::MasterNameNotFoundBySentinel
                    | K::NoValidReplicasFoundBySentinel
            );
        if unreachable {
            Error::unreachable(
                &self.target,
                format!(
                    "{}; check that Redis runs there and that the URL's host, port and password are right",
                    redact(&e.to_string())
                ),
            )
        } else {
            Error::database_from(
                format!("redis {}: {}", self.target, redact(&e.to_string())),
                RedisSource(e),
            )
        }
    }
}

/// The Redis client's error, kept as the source of a dbwarden error (downcast to reach its
/// kind and code), and shown, in `Display` and `Debug` alike, with any password redacted. The
/// client's error itself stays inside: its own text may carry the URL.
pub struct RedisSource(RedisError);

impl RedisSource {
    pub fn kind(&self) -> redis::ErrorKind {
        self.0.kind()
    }

    /// The server's error code (`WRONGTYPE`, `NOSCRIPT`, ...), where it sent one.
    pub fn code(&self) -> Option<&str> {
        self.0.code()
    }
}

impl std::fmt::Display for RedisSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact(&self.0.to_string()))
    }
}

impl std::fmt::Debug for RedisSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RedisSource({self})")
    }
}

/// No further source: the client's own chain is not walked, so nothing unredacted is shown.
impl std::error::Error for RedisSource {}

impl From<redis::Client> for RedisClient {
    fn from(client: redis::Client) -> Self {
        RedisClient {
            target: client.get_connection_info().addr().to_string(),
            kind: Kind::Single(client),
        }
    }
}

/// A connection to a single server (reconnects on its own) or to a cluster.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(Box<ClusterConnection>),
    Sentinel(SentinelConn),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_error_is_kept_as_the_source_with_its_password_redacted() {
        use std::error::Error as _;
        let c = RedisClient::from_url("redis://127.0.0.1:6379").unwrap();
        let raw = RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "bad reply",
            "from redis://:hunter2@10.0.0.1:6379".to_owned(),
        ));
        let e = c.error(raw);
        let source = e.source().expect("the client's error is kept");
        let kept = source
            .downcast_ref::<RedisSource>()
            .expect("as a RedisSource");
        assert_eq!(kept.kind(), redis::ErrorKind::UnexpectedReturnType);
        for shown in [
            e.to_string(),
            format!("{e:?}"),
            source.to_string(),
            format!("{source:?}"),
        ] {
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }

    #[test]
    fn urls_are_checked_without_connecting() {
        assert_eq!(
            RedisClient::from_url("redis://127.0.0.1:6379")
                .unwrap()
                .target(),
            "127.0.0.1:6379"
        );
        let c = RedisClient::from_url("redis+cluster://:pw@127.0.0.1:7001,127.0.0.1:7002").unwrap();
        assert!(c.is_cluster());
        assert_eq!(c.target(), "redis cluster 127.0.0.1:7001,127.0.0.1:7002");
        let s = RedisClient::from_url("redis+sentinel://:pw@127.0.0.1:26379,127.0.0.1:26380/svc/2")
            .unwrap();
        assert_eq!(
            s.target(),
            "redis sentinel 127.0.0.1:26379,127.0.0.1:26380 service svc"
        );
        assert_eq!(
            s.default_replicas(),
            1,
            "behind Sentinel a replica confirms by default"
        );
        let off = RedisClient::from_url("redis+sentinel://127.0.0.1:26379/svc?replicas=0").unwrap();
        assert_eq!(off.default_replicas(), 0);
        assert_eq!(c.default_replicas(), 0);
        for bad in [
            "redis+sentinel://127.0.0.1:26379",
            "redis+sentinel:///svc",
            "redis+sentinel://:s3cret@127.0.0.1:26379/svc?replicas=two",
            "redis+sentinel://127.0.0.1:26379/svc?wait=1",
            "redis+sentinel://:s3cret@127.0.0.1:26379/svc/1/extra",
            "redis://127.0.0.1:notaport",
            "redis://:s3cret@127.0.0.1:6379/x",
            "redis+cluster://127.0.0.1:7001/3",
            "redis+cluster://",
            "postgres://x",
        ] {
            let e = RedisClient::from_url(bad).unwrap_err();
            assert_eq!(e.exit_code().code(), 2, "{bad}: {e}");
            let msg = e.to_string();
            assert!(!msg.contains("s3cret"), "{msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
        let tls = RedisClient::from_url("rediss://h:6380").unwrap_err();
        assert!(tls.to_string().contains("TLS"), "{tls}");
    }
}
