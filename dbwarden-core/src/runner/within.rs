//! A `migrate` run inside an outer lock every runner shares (`lock_url`, e.g. the Redis lease
//! application replicas take at start-up, same namespace), so CI and replicas guard the same
//! entry point. Order: the outer lock first (the same wait policy), then the database lock
//! inside the run; released in reverse. If the outer lock is lost, the database lease is lost
//! with it (`MigrateOptions::outer_lost`): the run stops before its next statement and exits 4.

use super::{Acquired, Interrupt, MigrateOptions, Outcome, Progress, acquire_or_decline, migrate};
use crate::config::Settings;
use crate::migration::Migration;
use crate::{Error, HolderInfo, MigrationLock, wait};

/// `migrate` on `lock` while holding `outer` (see [`crate::registry::Registry::open_outer`]);
/// without an outer lock, [`migrate`] itself. The CLI and the facade both run this.
#[allow(clippy::too_many_arguments)]
pub async fn migrate_within(
    outer: Option<&dyn MigrationLock>,
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    holder: &HolderInfo,
    mut opts: MigrateOptions,
    settings: &Settings,
    progress: &dyn Progress,
    interrupt: &Interrupt,
) -> Result<Outcome, Error> {
    let Some(outer) = outer else {
        return migrate(lock, migrations, holder, &opts, progress, interrupt).await;
    };
    let heartbeat = settings.heartbeat(outer.default_ttl())?;
    let lease = match acquire_or_decline(
        outer,
        holder,
        wait::Mode::Exclusive,
        opts.wait,
        opts.skip_if_locked,
        heartbeat,
        interrupt,
    )
    .await?
    {
        Acquired::Lease(lease) => *lease,
        Acquired::Skipped(info) => return Ok(Outcome::Skipped(info)),
    };
    opts.outer_lost = Some(lease.lost_signal());
    let result = migrate(lock, migrations, holder, &opts, progress, interrupt).await;
    if lease.is_lost() {
        drop(lease);
    } else if let Err(e) = lease.release().await {
        tracing::warn!(
            "could not release the outer {} lock ({e}); it expires within its ttl",
            outer.engine()
        );
    }
    result
}
