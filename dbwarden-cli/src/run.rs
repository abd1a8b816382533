//! `dbwarden run -- <command>`: hold the lock while another program runs (a different migration
//! tool, a backup, a restore). The child learns its fencing token from the environment, is told
//! about signals, and is stopped (SIGTERM, then SIGKILL) if the lock is lost.

use std::process::Stdio;
use std::time::Duration;

use dbwarden_core::config::Settings;
use dbwarden_core::events::Events;
use dbwarden_core::runner::{self, Acquired, Interrupt};
use dbwarden_core::wait::Mode;
use dbwarden_core::{Error, ExitCode, HolderInfo, MigrationLock, Wait};
use rustix::process::{Pid, Signal, kill_process};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::RunArgs;
use crate::common::{layer, put, put_hooks, settings};
use crate::engines;
use crate::hooks::Hooks;

fn send(pid: Option<u32>, sig: Signal) {
    if let Some(p) = pid.and_then(|p| Pid::from_raw(p as i32)) {
        let _ = kill_process(p, sig);
    }
}

fn signal_name(n: i32) -> &'static str {
    match n {
        1 => "SIGHUP",
        2 => "SIGINT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => "signal",
    }
}

/// `program` as the shell would find it on PATH.
fn find_on_path(program: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| {
                p.metadata()
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
    })
}

/// `dbwarden run`: its settings, then [`run`].
pub async fn command(a: RunArgs) -> Result<ExitCode, Error> {
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
    run(lock.as_ref(), outer.as_deref(), &settings, &a, kill_after).await
}

pub async fn run(
    lock: &dyn MigrationLock,
    outer: Option<&dyn MigrationLock>,
    settings: &Settings,
    args: &RunArgs,
    kill_after: Duration,
) -> Result<ExitCode, Error> {
    let hooks = Hooks::start(settings);
    let mut outer_lease = None;
    let r = run_with(
        lock,
        outer.map(|o| (o, &mut outer_lease)),
        settings,
        args,
        kill_after,
        &hooks.events(),
    )
    .await;
    // The outer lock (`--lock-url`) last, after the database lock; once lost, only dropped.
    if let Some(lease) = outer_lease.filter(|l: &dbwarden_core::Lease| !l.is_lost())
        && let Err(e) = lease.release().await
    {
        tracing::warn!("could not release the outer lock ({e}); it expires within its ttl");
    }
    // Before the exit, whatever the outcome: the hooks this run started, each bounded.
    hooks.finish().await;
    r
}

async fn run_with(
    lock: &dyn MigrationLock,
    outer: Option<(&dyn MigrationLock, &mut Option<dbwarden_core::Lease>)>,
    settings: &Settings,
    args: &RunArgs,
    kill_after: Duration,
    events: &Events,
) -> Result<ExitCode, Error> {
    let program = args.command.first().cloned().unwrap_or_default();
    let mode = if args.shared {
        Mode::Shared
    } else {
        Mode::Exclusive
    };
    let holder = HolderInfo::current(
        settings.owner.clone(),
        format!(
            "dbwarden run{} -- {program}",
            if args.shared { " --shared" } else { "" }
        ),
    );
    // Find the program before taking the lock: a typo must not bump the token or create files.
    if !program.contains('/') && find_on_path(&program).is_none() {
        eprintln!("dbwarden: error: cannot start {program:?}: not found on PATH");
        return Ok(ExitCode(127));
    }
    // Signals are ours from before the acquire, so none can kill us while a child runs unlocked.
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return Err(Error::usage("cannot install signal handlers"));
    };
    let heartbeat = settings.heartbeat(lock.default_ttl())?;
    let (interrupt_tx, interrupt) = Interrupt::new();
    // The outer lock first (`--lock-url`), in the same mode and with the same wait; the
    // database lock inside it is lost with it, and it is given back last.
    let outer_lost = match outer {
        None => None,
        Some((o, slot)) => {
            let acquired = tokio::select! {
                r = runner::acquire_or_decline(
                    o,
                    &holder,
                    mode,
                    Wait::from_duration(settings.wait),
                    args.skip_if_locked,
                    settings.heartbeat(o.default_ttl())?,
                    &interrupt,
                ) => r,
                _ = term.recv() => Err(Error::Interrupted),
                _ = int.recv() => Err(Error::Interrupted),
            };
            match acquired? {
                Acquired::Lease(lease) => Some(slot.insert(*lease).lost_signal()),
                Acquired::Skipped(info) => {
                    eprintln!("dbwarden: skipped (--skip-if-locked): outer lock busy: {info}");
                    return Ok(ExitCode::OK);
                }
            }
        }
    };
    let acquired = tokio::select! {
        r = runner::acquire_or_decline(
            lock,
            &holder,
            mode,
            Wait::from_duration(settings.wait),
            args.skip_if_locked,
            heartbeat,
            &interrupt,
        ) => r,
        _ = term.recv() => { let _ = interrupt_tx.send(true); Err(Error::Interrupted) }
        _ = int.recv() => { let _ = interrupt_tx.send(true); Err(Error::Interrupted) }
    };
    let mut lease = match acquired? {
        Acquired::Lease(lease) => *lease,
        Acquired::Skipped(info) => {
            eprintln!("dbwarden: skipped (--skip-if-locked): lock busy: {info}");
            return Ok(ExitCode::OK);
        }
    };
    if let Some(outer) = outer_lost {
        lease.tie_to(outer);
    }
    let watch = events.took(lock, &lease);

    let mut child = match tokio::process::Command::new(&program)
        .args(&args.command[1..])
        .env("DBWARDEN_FENCING_TOKEN", lease.fencing_token().to_string())
        .env("DBWARDEN_EXECUTION_ID", holder.execution_id.to_string())
        .env("DBWARDEN_NAMESPACE", lock.namespace().as_str())
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            let released = runner::finish_command(lease, false).await;
            watch.ended::<()>(&[], &Ok(()), &released);
            released?;
            eprintln!("dbwarden: error: cannot start {program:?}: {e}");
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Ok(ExitCode(code));
        }
    };
    let pid = child.id();
    let lost_signal = lease.lost_signal();
    let mut lost: Option<String> = None;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let status = loop {
        let deadline = kill_at;
        tokio::select! {
            status = child.wait() => break status,
            _ = term.recv() => send(pid, Signal::TERM),
            _ = int.recv() => send(pid, Signal::INT),
            reason = lost_signal.lost(), if lost.is_none() => {
                eprintln!("dbwarden: lock lost: {reason}; sending SIGTERM to {program} (pid {})", pid.unwrap_or(0));
                send(pid, Signal::TERM);
                kill_at = Some(tokio::time::Instant::now() + kill_after);
                lost = Some(reason);
            }
            _ = async { tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)).await }, if deadline.is_some() => {
                eprintln!("dbwarden: {program} did not stop within {}; sending SIGKILL", dbwarden_core::duration::human(kill_after));
                send(pid, Signal::KILL);
                kill_at = None;
            }
        }
    };
    let status = status.map_err(|e| Error::database(format!("waiting for {program}: {e}")))?;
    if let Some(reason) = lost {
        drop(lease); // lost: write nothing more
        watch.ended::<()>(&[], &Err(Error::Lost(reason.clone())), &Ok(()));
        return Err(Error::Lost(reason));
    }
    use std::os::unix::process::ExitStatusExt;
    let code = match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => {
            eprintln!(
                "dbwarden: {program} was killed by signal {sig} ({})",
                signal_name(sig)
            );
            128 + sig
        }
        _ => 1,
    };
    let released = runner::finish_command(lease, code == 0).await;
    watch.ended::<()>(&[], &Ok(()), &released);
    released?;
    Ok(ExitCode(u8::try_from(code).unwrap_or(1)))
}
