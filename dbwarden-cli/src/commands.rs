//! One function per subcommand.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use dbwarden_core::adopt;
use dbwarden_core::config::{self, Layer, Settings};
use dbwarden_core::lock::UnlockOutcome;
use dbwarden_core::migration::{self, Migration};
use dbwarden_core::runner::{self, Interrupt, Look, MigrateOptions, Outcome, Resolution};
use dbwarden_core::{AuditRecord, Error, ExitCode, HolderInfo, MigrationLock, Wait, verdict};

use crate::cli::{Cli, Command, Common};
use crate::hooks::Hooks;
use crate::{engines, output, redis_lease};

pub async fn run(cli: Cli) -> Result<ExitCode, Error> {
    let verbose = cli.verbose;
    match cli.command {
        Command::Migrate(a) => {
            let mut flags = layer(&a.common);
            put(&mut flags, "migrations", &a.migrations);
            put(&mut flags, "wait", &a.wait);
            put(&mut flags, "redis_url", &a.redis_url);
            put(&mut flags, "recovery_policy", &a.recovery_policy);
            put(&mut flags, "lock_timeout", &a.lock_timeout);
            put(&mut flags, "lock_retries", &a.lock_retries);
            put(&mut flags, "owner", &a.owner);
            put_hooks(&mut flags, &a.hooks);
            if a.allow_out_of_order {
                flags.insert("allow_out_of_order".into(), "true".into());
            }
            let mut settings = settings(&a.common, flags)?;
            // The Redis lease is held around the run itself, not around an adoption first.
            settings.outer_lease = settings.redis_url.is_some() && !a.adopt;
            let lock = engines::open(&settings)?;
            let dialect = engines::migration_dialect(lock.as_ref(), &settings)?;
            // With their down files: a revert a previous run left half-done is recognised.
            let migrations = migration::load_dir_with_downs(&settings.migrations, dialect, false)?;
            let redis = redis_lease::open(&settings)?;
            if a.dry_run || a.sql {
                return dry_run(lock.as_ref(), &migrations, a.to, a.json, a.sql).await;
            }
            let hooks = Hooks::start(&settings);
            if a.adopt {
                let adopted = adopt_first(
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
            let outcome = match &redis {
                Some(redis) => {
                    redis_lease::migrate(
                        redis,
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
            match lock.force_unlock(expected, &record).await? {
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
            put_hooks(&mut flags, &a.hooks);
            let settings = settings(&a.common, flags)?;
            let kill_after = dbwarden_core::duration::parse("--kill-after", &a.kill_after)?;
            let lock = engines::open(&settings)?;
            crate::run::run(lock.as_ref(), &settings, &a, kill_after).await
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "dbwarden", &mut std::io::stdout());
            Ok(ExitCode::OK)
        }
        Command::Adopt(a) => adopt_command(a).await,
        Command::Baseline(a) => baseline_command(a).await,
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

/// What `lock-status` (every format) and the exporter read of a lock.
pub(crate) struct LockReading {
    pub obs: dbwarden_core::Observation,
    pub shared: Vec<HolderInfo>,
    pub ttl: Duration,
    pub verdict: dbwarden_core::Verdict,
}

/// The lock's state and verdict: a holder is judged by the ttl it recorded, `fallback_ttl` only
/// when it recorded none.
pub(crate) async fn read_lock(
    lock: &dyn MigrationLock,
    fallback_ttl: Duration,
) -> Result<LockReading, Error> {
    let obs = lock.observe().await?;
    let shared = match lock.shared() {
        Some(s) => s.shared_holders().await?,
        None => Vec::new(),
    };
    let ttl = verdict::judged_ttl(&obs, fallback_ttl);
    let verdict = verdict::decide_with_shared(&obs, ttl, shared.len());
    Ok(LockReading {
        obs,
        shared,
        ttl,
        verdict,
    })
}

/// Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org).
fn color_stdout() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

pub(crate) fn put(layer: &mut Layer, key: &str, value: &Option<String>) {
    if let Some(v) = value {
        layer.insert(key.to_owned(), v.clone());
    }
}

/// `--hook` and `--hook-timeout` into the flags layer.
pub(crate) fn put_hooks(layer: &mut Layer, h: &crate::cli::HookArgs) {
    put(layer, "hook", &h.hook);
    put(layer, "hook_timeout", &h.hook_timeout);
}

pub(crate) fn layer(c: &Common) -> Layer {
    let mut l = Layer::new();
    put(&mut l, "database_url", &c.database_url);
    put(&mut l, "namespace", &c.namespace);
    put(&mut l, "lock_ttl", &c.lock_ttl);
    put(&mut l, "heartbeat_interval", &c.heartbeat_interval);
    put(&mut l, "history_table", &c.history_table);
    put(&mut l, "lock", &c.lock);
    l
}

/// flag > environment > config file > default.
pub(crate) fn settings(common: &Common, flags: Layer) -> Result<Settings, Error> {
    let cwd = std::env::current_dir()
        .map_err(|e| Error::usage(format!("cannot read the current directory: {e}")))?;
    let file = config::load_file(common.config.as_deref(), &cwd)?;
    let env = config::env_layer(std::env::vars());
    config::resolve(&[&flags, &env, &file])
}

/// Without `--yes` there must be a terminal to ask on; checked before anything is shown.
pub(crate) fn ensure_can_confirm(yes: bool, what: &str) -> Result<(), Error> {
    if yes || std::io::stdin().is_terminal() {
        Ok(())
    } else {
        Err(Error::usage(format!(
            "refusing to {what} without --yes: no terminal to confirm on"
        )))
    }
}

/// `--yes`, or a terminal where a human types `yes`.
pub(crate) fn confirm(yes: bool, what: &str) -> Result<(), Error> {
    if yes {
        return Ok(());
    }
    ensure_can_confirm(yes, what)?;
    eprint!("{what}? type yes to confirm: ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| Error::usage(format!("cannot read the confirmation: {e}")))?;
    if line.trim() == "yes" {
        Ok(())
    } else {
        Err(Error::usage(format!("not confirmed; did not {what}")))
    }
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
async fn adopt_first(
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

async fn adopt_command(a: crate::cli::AdoptArgs) -> Result<ExitCode, Error> {
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

async fn baseline_command(a: crate::cli::BaselineArgs) -> Result<ExitCode, Error> {
    let mut flags = layer(&a.common);
    put(&mut flags, "migrations", &a.migrations);
    put(&mut flags, "wait", &a.wait);
    put_hooks(&mut flags, &a.hooks);
    let settings = settings(&a.common, flags)?;
    let lock = engines::open(&settings)?;
    let dialect = engines::migration_dialect(lock.as_ref(), &settings)?;
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

/// SIGINT/SIGTERM set the interrupt: the runner stops between statements and releases.
pub(crate) fn interrupt_on_signals() -> Interrupt {
    let (tx, interrupt) = Interrupt::new();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        eprintln!("dbwarden: signal received: finishing the current statement, then releasing");
        let _ = tx.send(true);
        // Keep the sender alive so the interrupt stays set.
        std::future::pending::<()>().await;
    });
    interrupt
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
