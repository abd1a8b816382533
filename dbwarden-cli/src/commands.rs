//! One function per subcommand.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use dbwarden_core::adopt;
use dbwarden_core::lock::UnlockOutcome;
use dbwarden_core::migration::{self, Migration};
use dbwarden_core::runner::{self, Look, MigrateOptions, Outcome, Resolution};
use dbwarden_core::{AuditRecord, Error, ExitCode, HolderInfo, MigrationLock, Wait, verdict};

use crate::cli::{Cli, Command};
use crate::common::{
    LockReading, confirm, ensure_can_confirm, interrupt_on_signals, layer, put, put_hooks,
    read_lock, settings,
};
use crate::hooks::Hooks;
use crate::{engines, output};

pub async fn run(cli: Cli) -> Result<ExitCode, Error> {
    let verbose = cli.verbose;
    match cli.command {
        Command::Migrate(a) if a.targets.is_some() => {
            let path = a.targets.clone().unwrap_or_default();
            crate::fleet::migrate(a, &path).await
        }
        Command::Migrate(a) => {
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
            let outcome = match &outer {
                Some(outer) => {
                    runner::migrate_within(
                        outer.as_ref(),
                        lock.as_ref(),
                        &migrations,
                        &holder,
                        opts,
                        &settings,
                        &progress,
                        &interrupt,
                    )
                    .await
                }
                None => {
                    runner::migrate(
                        lock.as_ref(),
                        &migrations,
                        &holder,
                        &opts,
                        &progress,
                        &interrupt,
                    )
                    .await
                }
            };
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
                        let mut v = serde_json::to_value(&report).unwrap_or_default();
                        v["outcome"] = "applied".into();
                        v["execution_id"] = holder.execution_id.to_string().into();
                        println!("{v}");
                    }
                }
            }
            Ok(ExitCode::OK)
        }
        Command::LockStatus(a) => {
            if let Some(path) = &a.targets {
                return crate::fleet::lock_status(&a, path).await;
            }
            let settings = settings(&a.common, layer(&a.common))?;
            let lock = engines::open(&settings)?;
            let fallback_ttl = settings.lock_ttl.unwrap_or(lock.default_ttl());
            if a.format.as_deref() == Some("openmetrics") {
                return lock_status_openmetrics(lock.as_ref(), &settings, fallback_ttl).await;
            }
            let json = a.json || a.format.as_deref() == Some("json");
            loop {
                let LockReading {
                    obs,
                    shared,
                    ttl,
                    verdict,
                } = read_lock(lock.as_ref(), fallback_ttl).await?;
                if json {
                    let mut v = output::status_json(&obs, verdict, ttl);
                    v["shared_holders"] = serde_json::to_value(&shared).unwrap_or_default();
                    println!("{v}");
                } else {
                    if a.watch {
                        print!("\x1b[2J\x1b[H");
                    }
                    print!(
                        "{}",
                        output::status_human(&obs, verdict, ttl, color_stdout())
                    );
                    for h in &shared {
                        println!(
                            "  {:<18}host={} pid={} owner={} execution={}",
                            "shared holder", h.host, h.pid, h.owner, h.execution_id
                        );
                    }
                }
                let _ = std::io::stdout().flush();
                if !a.watch {
                    return Ok(verdict.exit_code());
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = tokio::signal::ctrl_c() => return Ok(verdict.exit_code()),
                }
            }
        }
        Command::Unlock(a) => {
            let mut flags = layer(&a.common);
            put_hooks(&mut flags, &a.hooks);
            let settings = settings(&a.common, flags)?;
            let expected = a
                .holder
                .as_deref()
                .map(|h| {
                    uuid::Uuid::parse_str(h).map_err(|_| {
                        Error::usage(format!("--holder {h:?} is not an execution id (a UUID)"))
                    })
                })
                .transpose()?;
            let lock = engines::open(&settings)?;
            ensure_can_confirm(a.yes, "remove this lock")?;
            let obs = lock.observe().await?;
            let ttl = verdict::judged_ttl(&obs, settings.lock_ttl.unwrap_or(lock.default_ttl()));
            let verdict = verdict::decide(&obs, ttl);
            eprint!(
                "{}",
                output::status_human(&obs, verdict, ttl, color_stdout())
            );
            confirm(a.yes, "remove this lock")?;
            let me = HolderInfo::current(None, "dbwarden unlock");
            let record = AuditRecord::new(
                lock.namespace(),
                "forced_unlock",
                &me,
                format!("dbwarden unlock (verdict was {verdict})"),
            );
            match dbwarden_core::unlock::force(lock.as_ref(), expected, &record).await? {
                UnlockOutcome::Unlocked { holder } => {
                    eprintln!(
                        "dbwarden: unlocked namespace {}: a live holder stops at its next heartbeat, and its writes are fenced out (audited)",
                        lock.namespace()
                    );
                    let hooks = Hooks::start(&settings);
                    hooks.events().unlocked(
                        lock.as_ref(),
                        &me,
                        holder.as_ref().or(obs.holder.as_ref()),
                        obs.fencing_token,
                        verdict,
                    );
                    hooks.finish().await;
                    Ok(ExitCode::OK)
                }
                UnlockOutcome::NothingToUnlock => {
                    eprintln!(
                        "dbwarden: nothing to unlock in namespace {}",
                        lock.namespace()
                    );
                    Ok(ExitCode::OK)
                }
                UnlockOutcome::HolderMismatch { actual } => Err(Error::usage(format!(
                    "--holder does not match: the lock belongs to execution {}; nothing changed",
                    actual.map_or_else(|| "none".to_owned(), |u| u.to_string())
                ))),
            }
        }
        Command::Resolve(a) => {
            let mut flags = layer(&a.common);
            put(&mut flags, "migrations", &a.migrations);
            put(&mut flags, "wait", &a.wait);
            put_hooks(&mut flags, &a.hooks);
            let settings = settings(&a.common, flags)?;
            let lock = engines::open(&settings)?;
            let dialect = engines::migration_dialect(lock.as_ref(), &settings)?;
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
        Command::Run(a) => {
            let mut flags = layer(&a.common);
            put(&mut flags, "wait", &a.wait);
            put(&mut flags, "owner", &a.owner);
            put(&mut flags, "lock_url", &a.lock_url);
            put_hooks(&mut flags, &a.hooks);
            let mut settings = settings(&a.common, flags)?;
            // Inside the outer lock, a node-local database lock (Galera, a look-alike) is only
            // the inner one.
            settings.outer_lease = settings.lock_url.is_some();
            let kill_after = dbwarden_core::duration::parse("--kill-after", &a.kill_after)?;
            let lock = engines::open(&settings)?;
            let outer = engines::engines().open_outer(&settings)?;
            crate::run::run(lock.as_ref(), outer.as_deref(), &settings, &a, kill_after).await
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "dbwarden", &mut std::io::stdout());
            Ok(ExitCode::OK)
        }
        Command::Adopt(a) => crate::adopt::adopt_command(a).await,
        Command::Baseline(a) => crate::adopt::baseline_command(a).await,
        Command::Revert(a) => crate::revert::revert(a, verbose).await,
        Command::Status(a) => crate::survey::status(a).await,
        Command::Validate(a) => crate::survey::validate(a).await,
        Command::Wait(a) => crate::survey::wait(a).await,
        Command::Exporter(a) => crate::exporter::serve(a).await,
        Command::History(a) => {
            let settings = settings(&a.common, layer(&a.common))?;
            let lock = engines::open(&settings)?;
            let rows = lock.read_history().await?;
            if a.json {
                println!("{}", serde_json::to_string(&rows).unwrap_or_default());
            } else {
                print!("{}", output::history_table(&rows));
            }
            Ok(ExitCode::OK)
        }
    }
}

/// Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org).
fn color_stdout() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
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

/// `lock-status --format openmetrics`: the exposition on stdout, exit 0 whenever it was written
/// (a database that did not answer is `dbwarden_up 0`, and the error goes to stderr).
async fn lock_status_openmetrics(
    lock: &dyn dbwarden_core::MigrationLock,
    settings: &dbwarden_core::config::Settings,
    fallback_ttl: Duration,
) -> Result<ExitCode, Error> {
    let started = std::time::Instant::now();
    let database = dbwarden_core::url::redact(&settings.database_url);
    let target = crate::metrics::Target {
        engine: lock.engine(),
        namespace: settings.namespace.as_str(),
        database: &database,
    };
    let text = match read_lock(lock, fallback_ttl).await {
        Ok(r) => crate::metrics::exposition(&target, &r.obs, r.verdict, r.ttl, started.elapsed()),
        Err(e) if e.is_unreachable() || e.is_busy() => {
            eprintln!(
                "dbwarden: error: {}",
                dbwarden_core::error::one_line(&e.to_string())
            );
            crate::metrics::unreachable(&target, started.elapsed())
        }
        Err(e) => return Err(e),
    };
    print!("{text}");
    let _ = std::io::stdout().flush();
    Ok(ExitCode::OK)
}
