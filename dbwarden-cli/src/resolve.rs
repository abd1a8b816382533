//! `dbwarden resolve`: a human's decision on a migration halted for review (audited).

use dbwarden_core::migration;
use dbwarden_core::runner::{self, Resolution};
use dbwarden_core::{Error, ExitCode, HolderInfo, Wait};

use crate::cli::ResolveArgs;
use crate::common::{confirm, open_for_folder};
use crate::hooks::Hooks;

pub async fn resolve(a: ResolveArgs) -> Result<ExitCode, Error> {
    let (settings, lock, dialect) = open_for_folder(&a.common, &a.migrations, &a.wait, &a.hooks)?;
    let migrations = migration::load_dir_with_downs(&settings.migrations, dialect, false)?;
    let resolution = if a.retry {
        Resolution::Retry
    } else if a.mark_applied {
        Resolution::MarkApplied
    } else {
        Resolution::Abandon
    };
    confirm(
        a.yes,
        &format!(
            "resolve migration {} with --{}",
            a.version,
            resolution.as_str().replace('_', "-")
        ),
    )?;
    let holder = HolderInfo::current(None, "dbwarden resolve");
    let heartbeat = settings.heartbeat(lock.default_ttl())?;
    let hooks = Hooks::start(&settings);
    let done = runner::resolve(
        lock.as_ref(),
        &migrations,
        &holder,
        a.version,
        resolution,
        Wait::from_duration(settings.wait),
        heartbeat,
        &hooks.events(),
        settings.lock_retry(),
    )
    .await;
    hooks.finish().await;
    let done = done?;
    eprintln!("dbwarden: {done}");
    Ok(ExitCode::OK)
}
