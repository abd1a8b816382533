//! The library API for application replicas: [`RedisLock`] (builder, `acquire`, `run`, fenced
//! writes) and the [`LeaseHandle`] that `run` passes to its closure. The lease itself is core's
//! [`Lease`]: the watchdog renews it every ttl/3 and fires its lost-signal.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dbwarden_core::{
    Error, FencingToken, HeartbeatConfig, HolderInfo, Lease, LostSignal, Namespace, Wait,
};
use tokio::sync::OnceCell;

use crate::client::{Conn, RedisClient};
use crate::keys::Keys;
use crate::replication::Confirm;
use crate::wake::ReleaseListener;
use crate::{DEFAULT_TTL, MIN_TTL, status};

/// A Redis lease for one namespace. Cheap to clone: clones share one connection and one
/// release-channel subscription, so many tasks can wait on the same lock.
///
/// Configuration is checked when the lock is used: an invalid namespace or ttl makes
/// [`acquire`](Self::acquire), [`run`](Self::run) and every other call fail with a usage error
/// (`Error::is_misconfigured`). Use [`RedisLock::try_new`] to check the namespace up front.
#[derive(Clone)]
pub struct RedisLock {
    pub(crate) client: RedisClient,
    pub(crate) namespace: Namespace,
    invalid: Option<String>,
    pub(crate) ttl: Duration,
    heartbeat_interval: Option<Duration>,
    pub(crate) connect_timeout: Duration,
    statement_timeout: Duration,
    owner: Option<String>,
    /// Replicas that confirm each lease write; `None`: the client's default.
    replicas: Option<u32>,
    /// Where [`RedisLock::run`] reports a lost lease.
    events: dbwarden_core::events::Events,
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) keys: Keys,
    conn: OnceCell<Conn>,
    pub(crate) listener: ReleaseListener,
}

/// What the closure of [`RedisLock::run`] gets: the fencing token, the lost-signal (what it
/// derefs to: `lost()`, `is_lost()`, `check()` before each step that writes), and fenced writes
/// with this lease's token.
#[derive(Debug, Clone)]
pub struct LeaseHandle {
    token: FencingToken,
    lost: LostSignal,
    lock: RedisLock,
}

impl std::ops::Deref for LeaseHandle {
    type Target = LostSignal;

    fn deref(&self) -> &LostSignal {
        &self.lost
    }
}

impl LeaseHandle {
    /// Strictly increasing with every acquire of this namespace; pass it with every write.
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// [`RedisLock::fenced_set`] with this lease's token.
    pub async fn fenced_set(&self, key: &str, value: impl AsRef<[u8]>) -> Result<(), Error> {
        self.lock.fenced_set(self.token, key, value).await
    }

    /// [`RedisLock::check_fence`] with this lease's token.
    pub async fn check_fence(&self) -> Result<(), Error> {
        self.lock.check_fence(self.token).await
    }
}

fn command_line() -> String {
    let mut s = std::env::args().collect::<Vec<_>>().join(" ");
    if s.len() > 200 {
        let mut cut = 200;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

impl RedisLock {
    /// The lease for `namespace` on `client` (a [`RedisClient`] or a `redis::Client`), ttl 60 s.
    /// Nothing is connected yet; a bad namespace is reported by the first call that uses it.
    pub fn new(client: impl Into<RedisClient>, namespace: &str) -> Self {
        let client = client.into();
        let (namespace, invalid) = match Namespace::new(namespace) {
            Ok(ns) => (ns, None),
            Err(e) => (Namespace::default(), Some(e.to_string())),
        };
        let connect_timeout = Duration::from_secs(10);
        let keys = Keys::new(namespace.as_str());
        let listener = ReleaseListener::new(keys.released.clone(), client.clone(), connect_timeout);
        RedisLock {
            client,
            namespace,
            invalid,
            ttl: DEFAULT_TTL,
            heartbeat_interval: None,
            connect_timeout,
            statement_timeout: Duration::from_secs(30),
            owner: None,
            replicas: None,
            events: Default::default(),
            shared: Arc::new(Shared {
                keys,
                conn: OnceCell::new(),
                listener,
            }),
        }
    }

    /// Like [`new`](Self::new), but an invalid namespace is an error right away.
    pub fn try_new(client: impl Into<RedisClient>, namespace: &str) -> Result<Self, Error> {
        let lock = Self::new(client, namespace);
        lock.check_config()?;
        Ok(lock)
    }

    /// The lease for `namespace` at a `redis://` or `redis+cluster://` URL (see [`client`](crate::client)).
    pub fn from_url(url: &str, namespace: &str) -> Result<Self, Error> {
        Self::try_new(RedisClient::from_url(url)?, namespace)
    }

    /// How long the lease lives without renewal (default 60 s, at least [`MIN_TTL`]). A holder
    /// that dies blocks the namespace for at most this long.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How often the lease is renewed (default ttl/3; `3 × interval` must not exceed the ttl).
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = Some(interval);
        self
    }

    /// Bound on setting up a connection (default 10 s). Set before first use.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        let listener =
            ReleaseListener::new(self.shared.keys.released.clone(), self.client.clone(), d);
        self.shared = Arc::new(Shared {
            keys: self.shared.keys.clone(),
            conn: OnceCell::new(),
            listener,
        });
        self
    }

    /// Bound on each answer from Redis (default 30 s). Set before first use.
    pub fn statement_timeout(mut self, d: Duration) -> Self {
        self.statement_timeout = d;
        self
    }

    /// How many replicas must acknowledge every acquire and renewal (`WAIT`) before it counts:
    /// an unconfirmed acquire is released again and fails, an unconfirmed renewal is a failed
    /// heartbeat. Default: the URL's `replicas=` behind Sentinel (1 unless given), else 0.
    /// Not available on a Redis Cluster.
    pub fn confirm_replicas(mut self, replicas: u32) -> Self {
        self.replicas = Some(replicas);
        self
    }

    /// What each lease write waits for, if anything: the replicas, for at most half a heartbeat
    /// interval (so a holder whose renewals go unconfirmed is told it lost the lease by
    /// `ttl − interval/2`, before the copy on the replicas expires) and half a statement timeout.
    pub(crate) fn confirm(&self) -> Option<Confirm> {
        let replicas = self
            .replicas
            .unwrap_or_else(|| self.client.default_replicas());
        let within = (self.heartbeat_config().interval / 2).min(self.statement_timeout / 2);
        Confirm::new(replicas, within)
    }

    /// The owner label other processes see (default `host:pid`).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Report lock events of [`run`](Self::run) -- a lost lease (`lock_lost`) -- to a sink of
    /// the application's (see [`dbwarden_core::events`]).
    pub fn events(mut self, events: dbwarden_core::events::Events) -> Self {
        self.events = events;
        self
    }

    /// The renewal schedule: every ttl/3 unless set, lost after ttl − interval without renewal.
    pub fn heartbeat_config(&self) -> HeartbeatConfig {
        HeartbeatConfig {
            interval: self.heartbeat_interval.unwrap_or(self.ttl / 3),
            ttl: self.ttl,
        }
    }

    pub(crate) fn check_config(&self) -> Result<(), Error> {
        if let Some(e) = &self.invalid {
            return Err(Error::usage(e.clone()));
        }
        if self.ttl.is_zero() {
            return Err(Error::usage(
                "the Redis lease ttl must be greater than 0 (e.g. 60s)",
            ));
        }
        if self.client.is_cluster() && self.confirm().is_some() {
            return Err(Error::usage(
                "confirming lease writes on replicas (WAIT) is not available on a Redis Cluster; drop confirm_replicas",
            ));
        }
        self.heartbeat_config().validate_lease("Redis", MIN_TTL)
    }

    /// The lock's connection, once its configuration checked out.
    pub(crate) async fn conn(&self) -> Result<Conn, Error> {
        self.check_config()?;
        self.shared
            .conn
            .get_or_try_init(|| {
                self.client
                    .connect(self.connect_timeout, self.statement_timeout)
            })
            .await
            .cloned()
    }

    /// Take the lease, waiting per `wait` (woken by releases, with a capped jittered poll as a
    /// safety net), and start renewing it every ttl/3. Busy after the wait: [`Error::Busy`].
    pub async fn acquire(&self, wait: Wait) -> Result<Lease, Error> {
        self.check_config()?;
        let holder = HolderInfo::current(self.owner.clone(), command_line());
        dbwarden_core::wait::acquire(self, &holder, wait, self.heartbeat_config()).await
    }

    /// Run `work` under the lease and release it afterwards. If the lease is lost while `work`
    /// runs, `work` is cancelled at its next await and the result is [`Error::Lost`]; `work`
    /// can also watch the handle's [`lost()`](LostSignal::lost) itself to stop cleanly.
    pub async fn run<F, Fut, T>(&self, wait: Wait, work: F) -> Result<T, Error>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let lease = self.acquire(wait).await?;
        let handle = LeaseHandle {
            token: lease.fencing_token(),
            lost: lease.lost_signal(),
            lock: self.clone(),
        };
        let lost = lease.lost_signal();
        let watch = self.events.took(self, &lease);
        let out = tokio::select! {
            biased;
            reason = lost.lost() => Err(reason),
            out = work(handle) => Ok(out),
        };
        let reason = out.as_ref().err().cloned().or_else(|| lost.reason());
        if let Some(reason) = reason {
            drop(lease);
            watch.ended::<()>(&[], &Err(Error::Lost(reason.clone())), &Ok(()));
            return Err(Error::Lost(reason));
        }
        let released = lease.release().await;
        watch.ended::<()>(&[], &Ok(()), &released);
        released?;
        out.map_err(Error::Lost)
    }

    /// `Ok` while `token` is the newest fencing token of the namespace, [`Error::Lost`] once a
    /// later holder (or `dbwarden unlock`) has moved it on. For writes to Redis itself prefer
    /// [`fenced_set`](Self::fenced_set), which checks and writes atomically.
    pub async fn check_fence(&self, token: FencingToken) -> Result<(), Error> {
        let mut conn = self.conn().await?;
        let current = status::fence(&mut conn, &self.shared.keys)
            .await
            .map_err(|e| self.client.error(e))?;
        if current == Some(token.0) {
            Ok(())
        } else {
            Err(self.fenced_out(token, current))
        }
    }

    /// `SET key value` only if `token` is still the namespace's newest fencing token, in one
    /// script; otherwise nothing is written and the result is [`Error::Lost`]. On a Redis
    /// Cluster `key` must carry the namespace's hash tag, e.g. `app:{<namespace>}:config`.
    pub async fn fenced_set(
        &self,
        token: FencingToken,
        key: &str,
        value: impl AsRef<[u8]>,
    ) -> Result<(), Error> {
        self.check_config()?;
        if self.client.is_cluster() && status::hash_tag(key) != Some(self.namespace.as_str()) {
            return Err(Error::usage(format!(
                "on a Redis Cluster a fenced key must carry the hash tag {{{ns}}} (e.g. app:{{{ns}}}:data), so it shares the fence's slot; got {key:?}",
                ns = self.namespace
            )));
        }
        let mut conn = self.conn().await?;
        let written = status::fenced_set(&mut conn, &self.shared.keys, token, key, value.as_ref())
            .await
            .map_err(|e| self.client.error(e))?;
        if written {
            Ok(())
        } else {
            let current = status::fence(&mut conn, &self.shared.keys)
                .await
                .ok()
                .flatten();
            Err(self.fenced_out(token, current))
        }
    }

    fn fenced_out(&self, token: FencingToken, current: Option<u64>) -> Error {
        Error::Lost(format!(
            "fenced out: token {token} is stale, the fence of namespace {} is now {}",
            self.namespace,
            current.map_or_else(|| "unset".to_owned(), |c| c.to_string())
        ))
    }
}

impl std::fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLock")
            .field("target", &self.client.target())
            .field("namespace", &self.namespace)
            .field("ttl", &self.ttl)
            .finish()
    }
}
