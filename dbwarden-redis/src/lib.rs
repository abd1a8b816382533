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
//! URLs: `redis://[user:password@]host:port[/db]` for one server,
//! `redis+cluster://[user:password@]host1:port1,host2:port2,…` for a Redis Cluster (any of its
//! nodes; see [`client`]). A `redis::Client` converts into a [`RedisClient`] too.
//!
//! The same lock is a [`MigrationLock`], so the CLI uses it for `lock-status -u redis://…`,
//! `unlock -u redis://…` and `migrate --redis-url …` (held around the database lock). Redis keeps
//! no migration tables: `migrate -u redis://…` is a usage error.
#![forbid(unsafe_code)]

pub mod client;
mod keys;
mod lease;
pub mod lock;
mod replication;
mod sentinel;
mod shared;
pub mod status;
mod wake;

use std::time::Duration;

use async_trait::async_trait;
pub use client::RedisClient;
use dbwarden_core::config::Settings;
use dbwarden_core::unlock::{Broke, Sighting};
use dbwarden_core::{
    Attempt, AuditRecord, Error, Grade, HolderInfo, MigrationLock, Observation, SharedLock, WakeUp,
};
pub use lease::{LeaseHandle, RedisLock};

/// The lease ttl when none is configured (docs/design.md §7).
pub const DEFAULT_TTL: Duration = Duration::from_secs(60);

/// The shortest ttl accepted: below it a renewal could not reliably beat the expiry.
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// This engine in the registry (`dbwarden_core::registry`): its name, URL schemes and factory.
pub static ENGINE: dbwarden_core::registry::Engine = dbwarden_core::registry::Engine {
    name: "redis",
    schemes: &["redis", "rediss", "redis+cluster", "redis+sentinel"],
    open: from_settings,
    lease_lock: false,
};

/// The lock for `settings.database_url` (a Redis URL: `lock-status`/`unlock -u redis://…`) and
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
impl SharedLock for RedisLock {
    async fn try_acquire_shared(&self, holder: &HolderInfo) -> Result<Attempt, Error> {
        lock::try_enter(self, holder, true).await
    }

    async fn shared_holders(&self) -> Result<Vec<HolderInfo>, Error> {
        let mut conn = self.conn().await?;
        shared::holders(&mut conn, &self.shared.keys)
            .await
            .map_err(|e| self.client.error(e))
    }
}

#[async_trait]
impl WakeUp for RedisLock {
    async fn wait_for_release(&self, max: Duration) {
        self.shared.listener.wait(max).await;
    }
}

#[async_trait]
impl MigrationLock for RedisLock {
    fn identity(&self) -> dbwarden_core::Identity<'_> {
        dbwarden_core::Identity {
            engine: "redis",
            grade: Grade::C,
            namespace: &self.namespace,
            reach: Some(dbwarden_core::Reach {
                target: self.client.target().to_owned(),
                connect_timeout: self.connect_timeout,
            }),
        }
    }

    fn wake_up(&self) -> Option<&dyn WakeUp> {
        Some(self)
    }

    fn shared(&self) -> Option<&dyn SharedLock> {
        Some(self)
    }

    async fn try_acquire(&self, holder: &HolderInfo) -> Result<Attempt, Error> {
        lock::try_enter(self, holder, false).await
    }

    async fn observe(&self) -> Result<Observation, Error> {
        let mut conn = self.conn().await?;
        let snap = status::snapshot(&mut conn, &self.shared.keys)
            .await
            .map_err(|e| self.client.error(e))?;
        let mut o = Observation::new(
            self.engine(),
            self.grade(),
            self.namespace.as_str(),
            snap.now,
        );
        o.notes.push(
            "Redis lease: only its ttl frees it when the holder dies; it keeps no migration history"
                .to_owned(),
        );
        let Some(lease_id) = &snap.lease_id else {
            // Not held; the fence still says how far the tokens went.
            o.fencing_token = snap.fence;
            return Ok(o);
        };
        let r = snap.record.as_ref();
        Ok(o.held_lease(
            r.map(|r| (r.holder(), keys::ms_to_time(r.acquired_at_ms))),
            r.map(|r| r.fencing_token).or(snap.fence).unwrap_or(0),
            format!("lease {lease_id} of {}", self.shared.keys.lock),
            r.map(|r| keys::ms_to_time(r.heartbeat_at_ms)),
            snap.expires_at(),
        ))
    }

    async fn sight(&self) -> Result<Sighting, Error> {
        let mut conn = self.conn().await?;
        let snap = status::snapshot(&mut conn, &self.shared.keys)
            .await
            .map_err(|e| self.client.error(e))?;
        Ok(Sighting {
            current: snap.record.as_ref().map(|r| r.execution_id),
            anything: snap.lease_id.is_some(),
            holder: snap.record.map(|r| r.holder()),
            session: snap.lease_id,
            ..Sighting::default()
        })
    }

    /// Compare-and-delete on the lease id seen, the fence bump and the audit in one script.
    async fn break_lock(
        &self,
        seen: &Sighting,
        _expected: Option<uuid::Uuid>,
        record: AuditRecord,
    ) -> Result<Broke, Error> {
        let Some(lease_id) = &seen.session else {
            return Ok(Broke::Changed);
        };
        let mut conn = self.conn().await?;
        let removed = status::unlock(&mut conn, &self.shared.keys, lease_id, &record)
            .await
            .map_err(|e| self.client.error(e))?;
        Ok(if removed {
            Broke::Unlocked
        } else {
            Broke::Changed
        })
    }

    async fn audit(&self, record: &AuditRecord) -> Result<(), Error> {
        let mut conn = self.conn().await?;
        status::audit(&mut conn, &self.shared.keys, record)
            .await
            .map_err(|e| self.client.error(e))
    }

    fn default_ttl(&self) -> Duration {
        DEFAULT_TTL
    }
}
