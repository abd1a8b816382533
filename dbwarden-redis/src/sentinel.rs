//! Redis behind Sentinel (`redis+sentinel://`): the sentinels name the current primary, and are
//! asked again whenever the connection to it fails, a request to it is abandoned before its
//! answer (the caller's own timeout: a heartbeat into a primary that froze or whose link holds),
//! or it answers as a replica (`READONLY`, `MASTERDOWN`): a failover moved the primary. One connection is shared by every clone, so a
//! script and the `WAIT` that confirms it on the replicas always travel on the same connection
//! (see [`crate::replication`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};
use tokio::sync::Mutex;

/// Where the primary of one Sentinel-monitored service is asked for.
pub(crate) struct Sentinels {
    sentinel: Mutex<Sentinel>,
    /// The service (master) name the sentinels monitor.
    service: String,
    /// How to log in to the primary and its replicas (user, password, db): the URL's.
    node: SentinelNodeConnectionInfo,
    db: i64,
}

impl Sentinels {
    /// `sentinel_urls`: one `redis://host:port` per sentinel. Nothing is connected.
    pub fn new(
        sentinel_urls: &[String],
        service: String,
        node: SentinelNodeConnectionInfo,
        db: i64,
    ) -> redis::RedisResult<Self> {
        Ok(Sentinels {
            sentinel: Mutex::new(Sentinel::build(sentinel_urls.to_vec())?),
            service,
            node,
            db,
        })
    }

    /// A client for the primary the sentinels name now (checked to answer as a primary).
    pub async fn primary(&self, within: Duration) -> redis::RedisResult<redis::Client> {
        let ask = async {
            let mut sentinel = self.sentinel.lock().await;
            sentinel
                .async_master_for(&self.service, Some(&self.node))
                .await
        };
        tokio::time::timeout(within, ask).await.unwrap_or_else(|_| {
            Err(RedisError::from((
                ErrorKind::Io,
                "no answer from the sentinels and the primary they name within connect_timeout",
            )))
        })
    }
}

/// A connection to whichever server is the primary now. Clones share it.
#[derive(Clone)]
pub(crate) struct SentinelConn {
    sentinels: Arc<Sentinels>,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    current: Arc<Mutex<Option<MultiplexedConnection>>>,
    /// Set when a request was dropped before its answer: the connection is not trusted again.
    abandoned: Arc<AtomicBool>,
}

/// Marks the connection abandoned if the request it guards is dropped before it finished.
struct InFlight(Arc<AtomicBool>);

impl InFlight {
    fn done(self) {
        std::mem::forget(self);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// An error after which the primary is asked for again: the connection broke, or the server
/// it reached is no longer (or not yet) a writable primary.
pub(crate) fn moved(e: &RedisError) -> bool {
    use redis::ServerErrorKind as S;
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Server(S::ReadOnly | S::MasterDown | S::BusyLoading)
        )
}

/// The same for an error the server answered inside a reply (a pipeline's, say).
fn moved_server(e: &redis::ServerError) -> bool {
    use redis::ServerErrorKind as S;
    matches!(e.kind(), Some(S::ReadOnly | S::MasterDown | S::BusyLoading))
}

impl SentinelConn {
    /// Resolve the primary and connect to it, within `connect_timeout`.
    pub async fn connect(
        sentinels: Arc<Sentinels>,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> redis::RedisResult<Self> {
        let conn = SentinelConn {
            sentinels,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(response_timeout)),
            connect_timeout,
            current: Arc::new(Mutex::new(None)),
            abandoned: Arc::new(AtomicBool::new(false)),
        };
        conn.connection().await?;
        Ok(conn)
    }

    async fn connection(&self) -> redis::RedisResult<MultiplexedConnection> {
        let mut current = self.current.lock().await;
        if self.abandoned.swap(false, Ordering::Relaxed) && current.take().is_some() {
            tracing::debug!(
                "redis sentinel: asking for the primary again after an abandoned request"
            );
        }
        if let Some(c) = current.as_ref() {
            return Ok(c.clone());
        }
        let primary = self.sentinels.primary(self.connect_timeout).await?;
        let c = primary
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        *current = Some(c.clone());
        Ok(c)
    }

    /// Await a request on the current connection (marked abandoned if dropped before its answer),
    /// and forget the primary if the request failed, or any of its `values` was refused, as on a
    /// server that is no longer the primary.
    async fn settle<T>(
        &self,
        request: impl Future<Output = redis::RedisResult<T>>,
        values: impl Fn(&T) -> &[Value],
    ) -> redis::RedisResult<T> {
        let guard = InFlight(self.abandoned.clone());
        let r = request.await;
        guard.done();
        let why: Option<&(dyn std::fmt::Display + Sync)> = match &r {
            Err(e) => moved(e).then_some(e),
            Ok(reply) => values(reply).iter().find_map(|v| match v {
                Value::ServerError(e) if moved_server(e) => Some(e as _),
                _ => None,
            }),
        };
        if let Some(why) = why {
            tracing::debug!("redis sentinel: asking for the primary again after: {why}");
            *self.current.lock().await = None;
        }
        r
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut c = self.connection().await?;
            self.settle(c.req_packed_command(cmd), std::slice::from_ref)
                .await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut c = self.connection().await?;
            self.settle(
                c.req_packed_commands(pipeline, offset, count),
                Vec::as_slice,
            )
            .await
        })
    }

    fn get_db(&self) -> i64 {
        self.sentinels.db
    }
}
