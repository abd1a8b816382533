//! A `migrate` run inside the Redis lease (the one application replicas take at start-up, same
//! namespace), so CI and replicas guard the same entry point: `dbwarden migrate --redis-url` and
//! the `dbwarden` crate's `Migrator::redis_url`. Order: Redis lease first (same wait policy),
//! then the database lock inside the runner; released in reverse. If the Redis lease is lost,
//! the database lease is lost with it (`MigrateOptions::outer_lost`): the run stops before its
//! next statement and exits 4.

use dbwarden_core::config::Settings;
use dbwarden_core::migration::Migration;
use dbwarden_core::runner::{self, Interrupt, MigrateOptions, Outcome, Progress};
use dbwarden_core::{Error, HolderInfo, MigrationLock, wait};

use crate::RedisLock;

/// Run `runner::migrate` on `lock` while holding `redis`'s lease.
#[allow(clippy::too_many_arguments)]
pub async fn migrate_in_lease(
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
    let lease = match runner::acquire_or_decline(
        redis,
        holder,
        wait::Mode::Exclusive,
        opts.wait,
        opts.skip_if_locked,
        heartbeat,
        interrupt,
    )
    .await?
    {
        runner::Acquired::Lease(lease) => *lease,
        runner::Acquired::Skipped(info) => return Ok(Outcome::Skipped(info)),
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
