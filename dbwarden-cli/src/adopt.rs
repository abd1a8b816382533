//! `dbwarden adopt` and `dbwarden baseline`, and `migrate --adopt`'s adoption before it runs:
//! the plan shown (and confirmed), then recorded under the lock.

use std::io::Write;

use dbwarden_core::adopt;
use dbwarden_core::config::Settings;
use dbwarden_core::migration::{self, Migration};
use dbwarden_core::{Error, ExitCode, HolderInfo, MigrationLock, Wait};

use crate::common::{
    confirm, ensure_can_confirm, layer, open_for_folder, put, put_hooks, settings,
};
use crate::hooks::Hooks;
use crate::{engines, output};

/// The options `adopt` and `baseline` run with.
fn adopt_options(
    settings: &Settings,
    lock: &dyn MigrationLock,
    allow_changed: bool,
    if_needed: bool,
    events: dbwarden_core::events::Events,
) -> Result<adopt::AdoptOptions, Error> {
    Ok(adopt::AdoptOptions {
        wait: Wait::from_duration(settings.wait),
        heartbeat: settings.heartbeat(lock.default_ttl())?,
        allow_changed,
        if_needed,
        events,
    })
}

/// `migrate --adopt`: adopt another tool's history if there is one to adopt, then go on.
pub(crate) async fn adopt_first(
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    settings: &Settings,
    allow_changed: bool,
    events: dbwarden_core::events::Events,
) -> Result<(), Error> {
    let theirs = adopt::other_tools(lock).await?;
    if theirs.iter().all(|h| h.rows.is_empty()) || !lock.read_history().await?.is_empty() {
        return Ok(());
    }
    let history = adopt::choose(&theirs, None)?;
    let plan = adopt::plan(history, migrations)?;
    adopt::check_changed(&plan, migrations, allow_changed)?;
    let holder = HolderInfo::current(settings.owner.clone(), "dbwarden migrate --adopt");
    let opts = adopt_options(settings, lock, allow_changed, true, events)?;
    if adopt::adopt(lock, migrations, &holder, Some(plan.tool), &plan, &opts)
        .await?
        .is_some()
    {
        eprintln!("dbwarden: adopted: {} (audited)", plan.summary());
    }
    Ok(())
}

pub(crate) async fn adopt_command(a: crate::cli::AdoptArgs) -> Result<ExitCode, Error> {
    let mut flags = layer(&a.common);
    put(&mut flags, "migrations", &a.migrations);
    put(&mut flags, "wait", &a.wait);
    put_hooks(&mut flags, &a.hooks);
    let settings = settings(&a.common, flags)?;
    let from = a.from.as_deref().map(adopt::Tool::parse).transpose()?;
    let lock = engines::open(&settings)?;
    let dialect = engines::migration_dialect(lock.as_ref(), &settings)?;
    let migrations = migration::load_dir(&settings.migrations, dialect)?;
    if lock.other_tools().is_none() {
        return Err(Error::usage(
            "this engine cannot read other tools' history tables: adopt works on PostgreSQL, MySQL/MariaDB and SQLite; use `dbwarden baseline <VERSION>`",
        ));
    }
    let ours = lock.read_history().await?;
    if !ours.is_empty() {
        return Err(Error::usage(format!(
            "this database already has dbwarden history ({} row(s)): nothing to adopt",
            ours.len()
        )));
    }
    let theirs = adopt::other_tools(lock.as_ref()).await?;
    let history = adopt::choose(&theirs, from)?;
    let plan = adopt::plan(history, &migrations)?;
    adopt::check_changed(&plan, &migrations, a.allow_changed)?;
    if !a.dry_run {
        ensure_can_confirm(a.yes, "adopt another tool's history")?;
    }
    let out = &mut std::io::stdout();
    let _ = writeln!(
        out,
        "{} ({}): {}",
        plan.tool,
        plan.tool.table(),
        plan.summary()
    );
    for i in &plan.applied {
        let _ = writeln!(
            out,
            "  {:>6}  {}  applied{}",
            i.version,
            i.description,
            if i.file { "" } else { " (no file here)" }
        );
    }
    if let Some(v) = plan.review {
        let _ = writeln!(out, "  {v:>6}  left unfinished: halts for review");
    }
    if a.dry_run {
        let _ = writeln!(out, "dry run: nothing was imported");
        return Ok(ExitCode::OK);
    }
    confirm(
        a.yes,
        &format!(
            "record these {} migration(s) as applied",
            plan.applied.len()
        ),
    )?;
    let holder = HolderInfo::current(None, "dbwarden adopt");
    let hooks = Hooks::start(&settings);
    let opts = adopt_options(
        &settings,
        lock.as_ref(),
        a.allow_changed,
        false,
        hooks.events(),
    )?;
    let adopted = adopt::adopt(lock.as_ref(), &migrations, &holder, from, &plan, &opts).await;
    hooks.finish().await;
    if let Some(done) = adopted? {
        eprintln!(
            "dbwarden: adopted {} migration(s) from {} (audited); `dbwarden migrate` applies only what is new",
            done.applied.len(),
            done.tool
        );
    }
    Ok(ExitCode::OK)
}

pub(crate) async fn baseline_command(a: crate::cli::BaselineArgs) -> Result<ExitCode, Error> {
    let (settings, lock, dialect) = open_for_folder(&a.common, &a.migrations, &a.wait, &a.hooks)?;
    let migrations = migration::load_dir(&settings.migrations, dialect)?;
    let history = lock.read_history().await?;
    let versions = adopt::baseline_plan(&migrations, &history, a.version)?;
    if !a.dry_run {
        ensure_can_confirm(a.yes, "record a baseline")?;
    }
    println!(
        "baseline at version {}: {} migration(s) to record as applied without running:",
        a.version,
        versions.len()
    );
    for m in migrations.iter().filter(|m| versions.contains(&m.version)) {
        println!("  {:>6}  {}", m.version, m.description);
    }
    if a.dry_run {
        println!("dry run: nothing was recorded");
        return Ok(ExitCode::OK);
    }
    confirm(
        a.yes,
        &format!(
            "record {} migration(s) as applied without running them",
            versions.len()
        ),
    )?;
    let holder = HolderInfo::current(None, "dbwarden baseline");
    let hooks = Hooks::start(&settings);
    let opts = adopt_options(&settings, lock.as_ref(), false, false, hooks.events())?;
    let progress = output::LineProgress::new(false, true);
    let recorded = adopt::baseline(
        lock.as_ref(),
        &migrations,
        &holder,
        a.version,
        &opts,
        &progress,
    )
    .await;
    hooks.finish().await;
    recorded?;
    Ok(ExitCode::OK)
}
