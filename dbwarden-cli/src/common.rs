//! What every command shares: its settings from flags, environment and file; confirmation on a
//! terminal; the interrupt set by SIGINT/SIGTERM; and the lock as lock-status reads it.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use dbwarden_core::config::{self, Layer, Settings};
use dbwarden_core::runner::Interrupt;
use dbwarden_core::{Error, HolderInfo, MigrationLock, verdict};

use crate::cli::Common;

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
    let mut obs = lock.observe().await?;
    obs.notes.extend(waits_for(lock, &obs).await);
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

/// What a live holder's migration waits for right now: the sessions that hold the table or
/// metadata lock it asked for (PostgreSQL, MySQL/MariaDB; their state and age, never their
/// query text). Between attempts, a holder retrying under `lock_timeout` waits for nobody.
/// Best effort: a failed read says nothing.
async fn waits_for(lock: &dyn MigrationLock, obs: &dbwarden_core::Observation) -> Vec<String> {
    let Some(session) = obs
        .status
        .as_ref()
        .filter(|s| obs.held && s.state.is_active())
        .and_then(|s| s.db_connection_id.as_deref())
    else {
        return Vec::new();
    };
    match lock.blockers(session).await {
        Ok(found) => found
            .into_iter()
            .map(|b| {
                format!(
                    "the holder's migration waits for a lock held by {b}; under lock_timeout it gives up and retries"
                )
            })
            .collect(),
        Err(_) => Vec::new(),
    }
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

/// The settings of a command that works on the migrations folder under the lock
/// (`--migrations`, `--wait`, hooks: `resolve`, `baseline`), its lock, and the dialect its
/// files are cut in.
pub(crate) fn open_for_folder(
    common: &Common,
    migrations: &Option<String>,
    wait: &Option<String>,
    hooks: &crate::cli::HookArgs,
) -> Result<
    (
        Settings,
        Box<dyn dbwarden_core::MigrationLock>,
        dbwarden_core::migration::Dialect,
    ),
    Error,
> {
    let mut flags = layer(common);
    put(&mut flags, "migrations", migrations);
    put(&mut flags, "wait", wait);
    put_hooks(&mut flags, hooks);
    let settings = settings(common, flags)?;
    let lock = crate::engines::open(&settings)?;
    let dialect = crate::engines::migration_dialect(lock.as_ref(), &settings)?;
    Ok((settings, lock, dialect))
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

/// The settings layer of `migrate`'s own flags, on top of the common ones: one place, so a
/// fleet run (`--targets`) sees exactly the flags a single run sees, and refuses the ones it
/// cannot honour instead of dropping them.
pub(crate) fn migrate_flags(a: &crate::cli::MigrateArgs) -> Layer {
    let mut flags = layer(&a.common);
    put(&mut flags, "migrations", &a.migrations);
    put(&mut flags, "wait", &a.wait);
    put(&mut flags, "lock_url", &a.lock_url);
    put(&mut flags, "recovery_policy", &a.recovery_policy);
    put(&mut flags, "lock_timeout", &a.lock_timeout);
    put(&mut flags, "lock_retries", &a.lock_retries);
    put(&mut flags, "owner", &a.owner);
    put_hooks(&mut flags, &a.hooks);
    if a.allow_out_of_order {
        flags.insert("allow_out_of_order".into(), "true".into());
    }
    flags
}
