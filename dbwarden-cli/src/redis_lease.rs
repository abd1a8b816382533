//! `migrate --redis-url`: hold the Redis lease (the one application replicas take at start-up,
//! same namespace) around the database lock, so CI and replicas guard the same entry point.
//! Order: Redis lease first (same wait policy), then the database lock inside the runner;
//! released in reverse. If the Redis lease is lost, the database lease is lost with it
//! (`MigrateOptions::outer_lost`): the run stops before its next statement and exits 4.

use dbwarden_core::config::Settings;
use dbwarden_core::migration::Migration;
use dbwarden_core::runner::{self, Interrupt, MigrateOptions, Outcome, Progress};
use dbwarden_core::{AuditRecord, Error, HolderInfo, MigrationLock, Wait, wait};
use dbwarden_redis::RedisLock;

/// The Redis lock for `--redis-url`, checked without connecting (bad URL, ttl: exit 2).
pub fn open(settings: &Settings) -> Result<Option<RedisLock>, Error> {
    let Some(url) = settings.redis_url.as_deref() else {
        return Ok(None);
    };
    let lock = dbwarden_redis::lock_for_url(url, settings).map_err(|e| match e {
        Error::Usage(m) => Error::usage(format!("--redis-url: {m}")),
        other => other,
    })?;
    Ok(Some(lock))
}

/// Run `runner::migrate` while holding the Redis lease.
#[allow(clippy::too_many_arguments)]
pub async fn migrate(
    redis: &RedisLock,
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    holder: &HolderInfo,
    mut opts: MigrateOptions,
    settings: &Settings,
    progress: &dyn Progress,
    interrupt: &Interrupt,
) -> Result<Outcome, Error> {
    let heartbeat = settings.heartbeat(redis.default_ttl())?;
    let wait = if opts.skip_if_locked {
        Wait::No
    } else {
        opts.wait
    };
    let acquired = tokio::select! {
        r = wait::acquire(redis, holder, wait, heartbeat) => r,
        _ = interrupt.wait() => Err(Error::Interrupted),
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(Error::Busy(info)) => {
            let why = if opts.skip_if_locked {
                "declined: --skip-if-locked and another holder has the Redis lease"
            } else {
                "declined: the Redis lease was still held when --wait ran out"
            };
            let record = AuditRecord::new(redis.namespace(), "lock_conflict", holder, why)
                .about(info.holder.as_ref());
            if let Err(e) = redis.audit(&record).await {
                tracing::warn!("could not write the lock_conflict audit entry to Redis: {e}");
            }
            return if opts.skip_if_locked {
                Ok(Outcome::Skipped(*info))
            } else {
                Err(Error::Busy(info))
            };
        }
        Err(e) => return Err(e),
    };
    opts.outer_lost = Some(lease.lost_signal());
    let result = runner::migrate(lock, migrations, holder, &opts, progress, interrupt).await;
    if lease.is_lost() {
        drop(lease);
    } else if let Err(e) = lease.release().await {
        tracing::warn!("could not release the Redis lease ({e}); it expires within its ttl");
    }
    result
}
