//! `dbwarden migrate` over one database (a fleet: `fleet.rs`), and its `--dry-run`.

use std::io::IsTerminal;
use std::time::Duration;

use dbwarden_core::adopt;
use dbwarden_core::migration::{self, Migration};
use dbwarden_core::runner::{self, Look, MigrateOptions, Outcome};
use dbwarden_core::{Error, ExitCode, HolderInfo, MigrationLock, Wait};

use crate::cli::MigrateArgs;
use crate::common::{interrupt_on_signals, settings};
use crate::hooks::Hooks;
use crate::{engines, output};

pub async fn migrate(a: MigrateArgs, verbose: u8) -> Result<ExitCode, Error> {
    let mut settings = settings(&a.common, crate::common::migrate_flags(&a))?;
    // The outer lock is held around the run itself, not around an adoption first.
    settings.outer_lease = settings.lock_url.is_some() && !a.adopt;
    let lock = engines::open(&settings)?;
    let dialect = engines::migration_dialect(lock.as_ref(), &settings)?;
    // With their down files: a revert a previous run left half-done is recognised.
    let migrations = migration::load_dir_with_downs(&settings.migrations, dialect, false)?;
    let outer = engines::engines().open_outer(&settings)?;
    if a.dry_run || a.sql {
        return dry_run(lock.as_ref(), &migrations, a.to, a.json, a.sql).await;
    }
    let hooks = Hooks::start(&settings);
    if a.adopt {
        let adopted = crate::adopt::adopt_first(
            lock.as_ref(),
            &migrations,
            &settings,
            a.allow_changed,
            hooks.events(),
        )
        .await;
        if let Err(e) = adopted {
            hooks.finish().await;
            return Err(e);
        }
    }
    let mut opts = match MigrateOptions::from_settings(&settings, lock.default_ttl()) {
        Ok(opts) => opts,
        Err(e) => {
            hooks.finish().await;
            return Err(e);
        }
    };
    opts.skip_if_locked = a.skip_if_locked;
    if a.skip_if_locked {
        opts.wait = Wait::No;
    }
    opts.to = a.to;
    opts.allow_changed = a.allow_changed;
    let holder = HolderInfo::current(settings.owner.clone(), "dbwarden migrate");
    let progress = output::LineProgress::new(std::io::stderr().is_terminal(), verbose > 0);
    let interrupt = interrupt_on_signals();
    opts.events = hooks.events();
    let outcome = runner::migrate_within(
        outer.as_deref(),
        lock.as_ref(),
        &migrations,
        &holder,
        opts,
        &settings,
        &progress,
        &interrupt,
    )
    .await;
    progress.finish();
    // Before the exit, whatever the outcome: the hooks this run started, each bounded.
    hooks.finish().await;
    match outcome? {
        Outcome::Skipped(info) => {
            eprintln!("dbwarden: skipped (--skip-if-locked): lock busy: {info}");
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({"outcome": "skipped", "busy": info.to_string()})
                );
            }
        }
        Outcome::Done(report) => {
            let token = match report.look {
                Some(Look::SharedLock) => format!(
                    "checked under the shared lock; fencing token {} unchanged",
                    report.fencing_token
                ),
                Some(Look::Snapshot) => format!(
                    "checked in one consistent read; fencing token {} unchanged",
                    report.fencing_token
                ),
                None => format!("fencing token {}", report.fencing_token),
            };
            eprintln!(
                "dbwarden: applied {} migration(s), {} already applied, in {}; {token}",
                report.applied.len(),
                report.already_applied,
                dbwarden_core::duration::human(Duration::from_millis(report.elapsed_ms)),
            );
            if a.json {
                output::print_outcome(&report, "applied", holder.execution_id);
            }
        }
    }
    Ok(ExitCode::OK)
}

async fn dry_run(
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    to: Option<i64>,
    json: bool,
    sql: bool,
) -> Result<ExitCode, Error> {
    let history = lock.read_history().await?;
    if history.is_empty() {
        let theirs = adopt::other_tools(lock).await?;
        if let Some(h) = adopt::unadopted(true, &theirs, None) {
            eprintln!(
                "dbwarden: note: `migrate` would refuse: {}",
                adopt::refusal(h)
            );
        }
    }
    let applied: std::collections::HashSet<i64> = history
        .iter()
        .filter(|r| r.state == dbwarden_core::HistoryState::Applied)
        .map(|r| r.version)
        .collect();
    let pending: Vec<&Migration> = migrations
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .filter(|m| to.is_none_or(|to| m.version <= to))
        .collect();
    if sql && !json {
        print!("{}", output::plan_sql(&pending));
        return Ok(ExitCode::OK);
    }
    if json {
        let list: Vec<_> = pending
            .iter()
            .map(|m| {
                serde_json::json!({
                    "version": m.version,
                    "description": m.description,
                    "statements": m.statements.len(),
                    "mode": m.mode.label(),
                    "reason": m.mode.reason(),
                    "no_transaction": !m.mode.is_transaction(),
                    "statements_sql": sql.then(|| (0..m.statements.len()).map(|i| m.statement(i)).collect::<Vec<_>>()),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"outcome": "dry_run", "pending": list})
        );
    } else {
        println!(
            "{} pending migration(s) (dry run, no lock taken):",
            pending.len()
        );
        for m in pending {
            println!(
                "  {:>6}  {}  ({} statement(s), {}: {})",
                m.version,
                m.description,
                m.statements.len(),
                m.mode.label(),
                m.mode.reason()
            );
        }
    }
    Ok(ExitCode::OK)
}
