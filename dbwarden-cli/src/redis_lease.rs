//! `migrate --redis-url`: hold the Redis lease (the one application replicas take at start-up,
//! same namespace) around the database lock (see `dbwarden_redis::migrate_in_lease`).

use dbwarden_core::Error;
use dbwarden_core::config::Settings;
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

pub use dbwarden_redis::migrate_in_lease as migrate;
