//! `dbwarden lock-status`: who holds the lock, and is it healthy (a fleet: `fleet.rs`).

use std::io::Write;
use std::time::Duration;

use dbwarden_core::{Error, ExitCode};

use crate::cli::StatusArgs;
use crate::common::{LockReading, layer, read_lock, settings};
use crate::output::color_stdout;
use crate::{engines, output};

pub async fn lock_status(a: StatusArgs) -> Result<ExitCode, Error> {
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
