//! `dbwarden run -- <command>`: hold the lock while another program runs (a different migration
//! tool, a backup, a restore). The child learns its fencing token from the environment, is told
//! about signals, and is stopped (SIGTERM, then SIGKILL) if the lock is lost.

use std::process::Stdio;
use std::time::Duration;

use dbwarden_core::config::Settings;
use dbwarden_core::wait::{self, Mode};
use dbwarden_core::{AuditRecord, Error, ExitCode, HolderInfo, LockState, MigrationLock, Wait};
use rustix::process::{Pid, Signal, kill_process};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::RunArgs;

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

pub async fn run(
    lock: &dyn MigrationLock,
    settings: &Settings,
    args: &RunArgs,
    kill_after: Duration,
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
    let wait = if args.skip_if_locked {
        Wait::No
    } else {
        Wait::from_duration(settings.wait)
    };
    let heartbeat = settings.heartbeat(lock.default_ttl())?;
    let mut lease = match wait::acquire_mode(lock, &holder, mode, wait, heartbeat).await {
        Ok(lease) => lease,
        Err(Error::Busy(info)) => {
            let why = if args.skip_if_locked {
                "declined: --skip-if-locked and another holder is running"
            } else {
                "declined: lock still busy when --wait ran out"
            };
            let record = AuditRecord::new(lock.namespace(), "lock_conflict", &holder, why)
                .about(info.holder.as_ref());
            if let Err(e) = lock.audit(&record).await {
                tracing::warn!("could not write the lock_conflict audit row: {e}");
            }
            if args.skip_if_locked {
                eprintln!("dbwarden: skipped (--skip-if-locked): lock busy: {info}");
                return Ok(ExitCode::OK);
            }
            return Err(Error::Busy(info));
        }
        Err(e) => return Err(e),
    };

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
            let token = lease.fencing_token();
            if let Some(store) = lease.store() {
                let _ = store.set_state(token, LockState::Failed, None).await;
            }
            let _ = lease.release().await;
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
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return Err(Error::usage("cannot install signal handlers"));
    };
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
    let token = lease.fencing_token();
    if let Some(store) = lease.store() {
        let state = if code == 0 {
            LockState::Complete
        } else {
            LockState::Failed
        };
        if let Err(e) = store.set_state(token, state, None).await {
            tracing::warn!("could not record the final state: {e}");
        }
    }
    lease.release().await?;
    Ok(ExitCode(u8::try_from(code).unwrap_or(1)))
}
