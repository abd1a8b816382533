//! `dbwarden revert`: down files, newest first, under the lock.

use std::io::IsTerminal;

use dbwarden_core::migration::{self, Migration};
use dbwarden_core::revert::{self, RevertOptions, Target};
use dbwarden_core::{Error, ExitCode, HolderInfo, Wait};

use crate::cli::RevertArgs;
use crate::common::{
    confirm, ensure_can_confirm, interrupt_on_signals, layer, put, put_hooks, settings,
};
use crate::hooks::Hooks;
use crate::{engines, output};

pub async fn revert(a: RevertArgs, verbose: u8) -> Result<ExitCode, Error> {
    let mut flags = layer(&a.common);
    put(&mut flags, "migrations", &a.migrations);
    put(&mut flags, "wait", &a.wait);
    put(&mut flags, "recovery_policy", &a.recovery_policy);
    put(&mut flags, "owner", &a.owner);
    put_hooks(&mut flags, &a.hooks);
    let settings = settings(&a.common, flags)?;
    let target = match (a.to, a.steps) {
        (Some(v), None) => Target::To(v),
        (None, Some(n)) => Target::Steps(n),
        _ => {
            return Err(Error::usage(
                "give exactly one of --to VERSION and --steps N",
            ));
        }
    };
    let lock = engines::open(&settings)?;
    let dialect = engines::migration_dialect(lock.as_ref(), &settings)?;
    let migrations = migration::load_dir_with_downs(&settings.migrations, dialect, true)?;
    let history = lock.read_history().await?;
    let plan = revert::plan(&migrations, &history, target, a.allow_changed, false)?;
    if plan.is_empty() {
        eprintln!("dbwarden: nothing to revert");
        if a.json {
            println!(
                "{}",
                serde_json::json!({"outcome": "nothing_to_revert", "reverted": []})
            );
        }
        return Ok(ExitCode::OK);
    }
    if a.dry_run {
        print_plan(&plan, a.json);
        return Ok(ExitCode::OK);
    }
    ensure_can_confirm(a.yes, "revert migrations")?;
    if !a.yes {
        print_plan(&plan, false);
    }
    confirm(
        a.yes,
        &format!(
            "revert these {} migration(s) (their down files destroy what they created)",
            plan.len()
        ),
    )?;
    let hooks = Hooks::start(&settings);
    let opts = RevertOptions {
        target,
        wait: Wait::from_duration(settings.wait),
        heartbeat: settings.heartbeat(lock.default_ttl())?,
        recovery_policy: settings.recovery_policy,
        allow_changed: a.allow_changed,
        sqlx_compat: settings.sqlx_compat,
        events: hooks.events(),
        lock_retry: settings.lock_retry(),
    };
    let holder = HolderInfo::current(settings.owner.clone(), "dbwarden revert");
    let progress = output::LineProgress::new(std::io::stderr().is_terminal(), verbose > 0);
    let interrupt = interrupt_on_signals();
    let report = revert::revert(
        lock.as_ref(),
        &migrations,
        &holder,
        &opts,
        &progress,
        &interrupt,
    )
    .await;
    progress.finish();
    hooks.finish().await;
    let report = report?;
    let versions: Vec<String> = report
        .reverted
        .iter()
        .map(|r| r.version.to_string())
        .collect();
    eprintln!(
        "dbwarden: reverted {} migration(s) ({}); fencing token {} (audited); `dbwarden migrate` applies them again",
        report.reverted.len(),
        versions.join(", "),
        report.fencing_token
    );
    if a.json {
        output::print_outcome(&report, "reverted", holder.execution_id);
    }
    Ok(ExitCode::OK)
}

fn print_plan(plan: &[&Migration], json: bool) {
    let downs: Vec<&Migration> = plan.iter().filter_map(|m| m.down.as_deref()).collect();
    if json {
        let list: Vec<_> = downs
            .iter()
            .map(|d| {
                serde_json::json!({
                    "version": d.version,
                    "description": d.description,
                    "file": d.path.display().to_string(),
                    "statements": d.statements.len(),
                    "mode": d.mode.label(),
                    "no_transaction": !d.mode.is_transaction(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"outcome": "dry_run", "revert": list})
        );
        return;
    }
    println!("{} migration(s) to revert, newest first:", downs.len());
    for d in downs {
        println!(
            "  {:>6}  {}  ({}, {} statement(s), {}: {})",
            d.version,
            d.description,
            d.path.display(),
            d.statements.len(),
            d.mode.label(),
            d.mode.reason()
        );
    }
}
