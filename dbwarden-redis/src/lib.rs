//! dbwarden-redis: the Redis lease (grade C, see [`lock`]) that application replicas wrap their
//! start-up migrations in, on one Redis server or a Redis Cluster.
//!
//! ```no_run
//! # async fn migrate() {}
//! # async fn demo() -> Result<(), dbwarden_core::Error> {
//! use std::time::Duration;
//! use dbwarden_core::Wait;
//! use dbwarden_redis::{RedisClient, RedisLock};
//!
//! let client = RedisClient::from_url("redis://127.0.0.1:6379")?;
//! let lock = RedisLock::new(client, "default").ttl(Duration::from_secs(60));
//! lock.run(Wait::Up(Duration::from_secs(300)), |lease| async move {
//!     // lease.fencing_token(); lease.lost() resolves if the lease is lost
//!     migrate().await
//! })
//! .await?;
//! # Ok(()) }
//! ```
//!
//! The same lock is a [`MigrationLock`], so the CLI uses it for `lock-status -u redis://…`,
//! `unlock -u redis://…` and `migrate --redis-url …` (held around the database lock). Redis keeps
//! no migration tables: `migrate -u redis://…` is a usage error.
#![forbid(unsafe_code)]

pub mod client;
pub mod lock;
pub mod status;
mod wake;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dbwarden_core::config::Settings;
use dbwarden_core::error::BusyInfo;
use dbwarden_core::lock::UnlockOutcome;
use dbwarden_core::{
    Attempt, AuditRecord, Error, FencingToken, Grade, HeartbeatConfig, HistoryRow, HolderInfo,
    Lease, LostSignal, MigrationLock, Namespace, Observation, Wait,
};
use tokio::sync::OnceCell;

use client::Conn;
pub use client::RedisClient;
use lock::{Acquired, Holding, Keys, RedisHeld};
use wake::ReleaseListener;

/// The lease ttl when none is configured (SPEC §6).
pub const DEFAULT_TTL: Duration = Duration::from_secs(60);

/// The shortest ttl accepted: below it a renewal could not reliably beat the expiry.
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// A Redis lease for one namespace. Cheap to clone: clones share one connection and one
/// release-channel subscription, so many tasks can wait on the same lock.
///
/// Configuration is checked when the lock is used: an invalid namespace or ttl makes
/// [`acquire`](Self::acquire), [`run`](Self::run) and every other call fail with a usage error
/// (`Error::is_misconfigured`). Use [`RedisLock::try_new`] to check the namespace up front.
#[derive(Clone)]
pub struct RedisLock {
    client: RedisClient,
    namespace: Namespace,
    invalid: Option<String>,
    ttl: Duration,
    heartbeat_interval: Option<Duration>,
    connect_timeout: Duration,
    statement_timeout: Duration,
    owner: Option<String>,
    shared: Arc<Shared>,
}

struct Shared {
    keys: Keys,
    conn: OnceCell<Conn>,
    listener: ReleaseListener,
}

/// What the closure of [`RedisLock::run`] gets: the fencing token, the lost-signal, and fenced
/// writes with this lease's token.
#[derive(Debug, Clone)]
pub struct LeaseHandle {
    token: FencingToken,
    holder: HolderInfo,
    lost: LostSignal,
    lock: RedisLock,
}

impl LeaseHandle {
    /// Strictly increasing with every acquire of this namespace; pass it with every write.
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    pub fn holder(&self) -> &HolderInfo {
        &self.holder
    }

    /// Resolves (with the reason) if the lease is lost.
    pub async fn lost(&self) -> String {
        self.lost.lost().await
    }

    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// `Err(Error::Lost)` once the lease is lost: call before each step that writes.
    pub fn check(&self) -> Result<(), Error> {
        self.lost.check()
    }

    pub fn lost_signal(&self) -> LostSignal {
        self.lost.clone()
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
        let listener = ReleaseListener::new(
            keys.released.clone(),
            client.pubsub_clients(),
            connect_timeout,
        );
        RedisLock {
            client,
            namespace,
            invalid,
            ttl: DEFAULT_TTL,
            heartbeat_interval: None,
            connect_timeout,
            statement_timeout: Duration::from_secs(30),
            owner: None,
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

    /// The lease for `namespace` at a `redis://` or `redis+cluster://` URL (see [`client`]).
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
        let listener = ReleaseListener::new(
            self.shared.keys.released.clone(),
            self.client.pubsub_clients(),
            d,
        );
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

    /// The owner label other processes see (default `host:pid`).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    pub fn keys(&self) -> &Keys {
        &self.shared.keys
    }

    pub fn client(&self) -> &RedisClient {
        &self.client
    }

    /// The renewal schedule: every ttl/3 unless set, lost after ttl − interval without renewal.
    pub fn heartbeat_config(&self) -> HeartbeatConfig {
        HeartbeatConfig {
            interval: self.heartbeat_interval.unwrap_or(self.ttl / 3),
            ttl: self.ttl,
        }
    }

    fn check_config(&self) -> Result<(), Error> {
        if let Some(e) = &self.invalid {
            return Err(Error::usage(e.clone()));
        }
        if self.ttl.is_zero() {
            return Err(Error::usage(
                "the Redis lease ttl must be greater than 0 (e.g. 60s)",
            ));
        }
        if self.ttl < MIN_TTL {
            return Err(Error::usage(format!(
                "the Redis lease ttl {} is too short: use at least {}",
                dbwarden_core::duration::human(self.ttl),
                dbwarden_core::duration::human(MIN_TTL)
            )));
        }
        self.heartbeat_config().validate()
    }

    async fn conn(&self) -> Result<Conn, Error> {
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
    /// can also watch [`LeaseHandle::lost`] itself to stop cleanly.
    pub async fn run<F, Fut, T>(&self, wait: Wait, work: F) -> Result<T, Error>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let lease = self.acquire(wait).await?;
        let handle = LeaseHandle {
            token: lease.fencing_token(),
            holder: lease.holder().clone(),
            lost: lease.lost_signal(),
            lock: self.clone(),
        };
        let lost = lease.lost_signal();
        let out = tokio::select! {
            biased;
            reason = lost.lost() => return Err(Error::Lost(reason)),
            out = work(handle) => out,
        };
        if let Some(reason) = lease.lost_signal().reason() {
            return Err(Error::Lost(reason));
        }
        lease.release().await?;
        Ok(out)
    }

    /// `Ok` while `token` is the newest fencing token of the namespace, [`Error::Lost`] once a
    /// later holder (or `dbwarden unlock`) has moved it on. For writes to Redis itself prefer
    /// [`fenced_set`](Self::fenced_set), which checks and writes atomically.
    pub async fn check_fence(&self, token: FencingToken) -> Result<(), Error> {
        self.check_config()?;
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

/// The lock for `settings.redis_url` (or `database_url` when it is a Redis URL) and
/// `settings.namespace`, with the configured ttl (default 60 s) and timeouts. Validates the URL
/// without connecting.
pub fn from_settings(settings: &Settings) -> Result<Box<dyn MigrationLock>, Error> {
    Ok(Box::new(lock_for_url(&settings.database_url, settings)?))
}

/// The Redis lock at `url` configured from `settings` (used for `migrate --redis-url`).
pub fn lock_for_url(url: &str, settings: &Settings) -> Result<RedisLock, Error> {
    let ttl = settings.lock_ttl.unwrap_or(DEFAULT_TTL);
    let lock = RedisLock::try_new(RedisClient::from_url(url)?, settings.namespace.as_str())?
        .connect_timeout(settings.connect_timeout)
        .statement_timeout(settings.statement_timeout)
        .ttl(ttl)
        .heartbeat_interval(settings.heartbeat_interval);
    lock.check_config()?;
    Ok(lock)
}

#[async_trait]
impl MigrationLock for RedisLock {
    fn engine(&self) -> &'static str {
        "redis"
    }

    fn grade(&self) -> Grade {
        Grade::C
    }

    fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    async fn try_acquire(&self, holder: &HolderInfo) -> Result<Attempt, Error> {
        self.check_config()?;
        let mut conn = self.conn().await?;
        let keys = &self.shared.keys;
        let lease_id = uuid::Uuid::new_v4().simple().to_string();
        let mut json = serde_json::to_value(holder).map_err(Error::database)?;
        json["namespace"] = self.namespace.as_str().into();
        let found = lock::try_acquire(&mut conn, keys, &lease_id, self.ttl, &json.to_string())
            .await
            .map_err(|e| self.client.error(e))?;
        match found {
            Acquired::Yes { token } => Ok(Attempt::Acquired(Box::new(RedisHeld {
                holding: Arc::new(Holding {
                    conn,
                    client: self.client.clone(),
                    keys: keys.clone(),
                    lease_id,
                    ttl: self.ttl,
                }),
                token,
                released: false,
            }))),
            Acquired::Busy {
                record,
                pttl_ms,
                now_ms,
            } => Ok(Attempt::Busy(BusyInfo {
                age: record.as_ref().map(|r| {
                    Duration::from_millis(now_ms.saturating_sub(r.acquired_at_ms).max(0) as u64)
                }),
                fencing_token: record.as_ref().map(|r| r.fencing_token),
                note: (pttl_ms >= 0)
                    .then(|| format!("lease expires in {pttl_ms} ms unless renewed")),
                holder: record.map(|r| r.holder()),
            })),
        }
    }

    async fn wait_for_release(&self, max: Duration) {
        self.shared.listener.wait(max).await;
    }

    async fn observe(&self) -> Result<Observation, Error> {
        self.check_config()?;
        let mut conn = self.conn().await?;
        let snap = status::snapshot(&mut conn, &self.shared.keys)
            .await
            .map_err(|e| self.client.error(e))?;
        let mut notes = Vec::new();
        if snap.lease_id.is_some() && snap.record.is_none() {
            notes.push(format!(
                "{} is held but has no holder record (written by another tool?)",
                self.shared.keys.lock
            ));
        }
        notes.push(
            "Redis lease: only its ttl frees it when the holder dies; it keeps no migration history"
                .to_owned(),
        );
        let held = snap.lease_id.is_some();
        Ok(Observation {
            engine: self.engine(),
            grade: self.grade(),
            namespace: self.namespace.to_string(),
            held,
            holder: snap.record.as_ref().map(|r| r.holder()),
            fencing_token: snap.record.as_ref().map(|r| r.fencing_token).or(snap.fence),
            last_heartbeat_at: snap
                .record
                .as_ref()
                .map(|r| lock::ms_to_time(r.heartbeat_at_ms)),
            server_now: snap.now,
            expires_at: snap.expires_at(),
            session_id: snap.lease_id.as_ref().map(|id| format!("lease {id}")),
            status: snap.status_row(self.namespace.as_str()),
            notes,
        })
    }

    async fn force_unlock(
        &self,
        expected: Option<uuid::Uuid>,
        audit: &AuditRecord,
    ) -> Result<UnlockOutcome, Error> {
        self.check_config()?;
        let mut conn = self.conn().await?;
        let keys = &self.shared.keys;
        // Compare-and-delete on the lease id we looked at; retry if it changed meanwhile.
        for _ in 0..5 {
            let snap = status::snapshot(&mut conn, keys)
                .await
                .map_err(|e| self.client.error(e))?;
            let current = snap.record.as_ref().map(|r| r.execution_id);
            if let Some(want) = expected
                && current != Some(want)
            {
                return Ok(UnlockOutcome::HolderMismatch { actual: current });
            }
            let Some(lease_id) = snap.lease_id else {
                return Ok(UnlockOutcome::NothingToUnlock);
            };
            let holder = snap.record.map(|r| r.holder());
            let record = audit.clone().about(holder.as_ref());
            if status::unlock(&mut conn, keys, &lease_id, &record)
                .await
                .map_err(|e| self.client.error(e))?
            {
                return Ok(UnlockOutcome::Unlocked { holder });
            }
        }
        Err(Error::database(
            "the Redis lease changed hands five times while unlocking; run `dbwarden lock-status` and try again",
        ))
    }

    async fn audit(&self, record: &AuditRecord) -> Result<(), Error> {
        self.check_config()?;
        let mut conn = self.conn().await?;
        status::audit(&mut conn, &self.shared.keys, record)
            .await
            .map_err(|e| self.client.error(e))
    }

    async fn read_history(&self) -> Result<Vec<HistoryRow>, Error> {
        Err(Error::usage(
            "Redis keeps no migration history: point -u at the database (postgres://, mysql://, sqlite://, ...) and pass the Redis URL as --redis-url",
        ))
    }

    fn default_ttl(&self) -> Duration {
        DEFAULT_TTL
    }
}
