//! Benchmark 8, the readiness gate: 16 `dbwarden wait` processes start before a slow `migrate`
//! (about 1.5 s); how long after that migrate's process exits each gate exits, p50 and p99. Run
//! plain and with the migrate Redis-guarded (`--redis-url`). Negative: the gate opened before the
//! migrate process had exited (it releases the lock, then exits). Goal: p99 within 100 ms.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::{Engine, Kind};
use crate::error::Result;
use crate::process::{Outcome, Tools, exit_summary};
use crate::report::{Row, Verdict};

pub const NAME: &str = "8. readiness gate: `wait` exit after `migrate` exit (16 gates)";
pub const GUARDED: &str = "8b. readiness gate, Redis-guarded `migrate`";
const GATES: usize = 16;
const GOAL_MS: f64 = 100.0;

/// One table, then one migration that keeps the lock about 1.5 s.
fn folder(dir: &Path, kind: Kind) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("0001_gate_table.sql"),
        "CREATE TABLE gate_table (id INTEGER PRIMARY KEY);\n",
    )?;
    let slow = match kind {
        Kind::MariaDb => "DO SLEEP(1.5);\n",
        _ => "SELECT pg_sleep(1.5);\n",
    };
    std::fs::write(dir.join("0002_slow.sql"), slow)?;
    Ok(dir.to_path_buf())
}

async fn timed(r: crate::process::Running) -> Result<(Instant, Outcome)> {
    let o = r.finish().await?;
    Ok((Instant::now(), o))
}

/// One run: every gate's exit minus the migrate's exit (ms), and every process's outcome.
async fn once(
    engine: &Engine,
    tools: &Tools,
    dir: &Path,
    redis: Option<&str>,
) -> Result<(Vec<f64>, Vec<Outcome>)> {
    engine
        .with_fresh("gate", async |db| {
            let ns = db.namespace.as_str();
            let dir_s = dir.display().to_string();
            let mut wait = tools.dbwarden(&[
                "wait",
                "-u",
                &db.url,
                "--namespace",
                ns,
                "--migrations",
                &dir_s,
                "--timeout",
                "60s",
            ]);
            if let Some(url) = redis {
                // The gates listen for the lease's release on Redis too.
                wait = wait.args(["--redis-url", url]);
            }
            let mut gates = Vec::with_capacity(GATES);
            for _ in 0..GATES {
                gates.push(tokio::spawn(timed(tools.spawn(&wait, false, false)?)));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            let mut migrate = tools.dbwarden_migrate(&db.url, ns, dir);
            if let Some(url) = redis {
                migrate = migrate.args(["--redis-url", url]);
            }
            let (migrate_end, migrate_outcome) =
                timed(tools.spawn(&migrate, false, false)?).await?;
            let mut latencies = Vec::with_capacity(GATES);
            let mut outcomes = vec![migrate_outcome];
            for g in gates {
                let (end, o) = g.await.map_err(|e| crate::error::fail(e.to_string()))??;
                let ms = if end >= migrate_end {
                    (end - migrate_end).as_secs_f64() * 1000.0
                } else {
                    -((migrate_end - end).as_secs_f64() * 1000.0)
                };
                latencies.push(ms);
                outcomes.push(o);
            }
            Ok((latencies, outcomes))
        })
        .await
}

/// The nearest-rank percentile of signed values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub async fn run(engine: &Engine, tools: &Tools, repeats: usize, redis: Option<&str>) -> Row {
    let name = if redis.is_some() { GUARDED } else { NAME };
    let dir = match folder(
        &tools.work.join(format!("gate-{:?}", engine.kind)),
        engine.kind,
    ) {
        Ok(d) => d,
        Err(e) => return Row::not_measured(name, e.to_string()),
    };
    let mut all = Vec::new();
    let mut outcomes = Vec::new();
    for _ in 0..repeats {
        match once(engine, tools, &dir, redis).await {
            Ok((l, o)) => {
                all.extend(l);
                outcomes.extend(o);
            }
            Err(e) => return Row::not_measured(name, e.to_string()),
        }
    }
    all.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&all, 50.0), percentile(&all, 99.0));
    let all_ok = outcomes.iter().all(|o| o.ok());
    Row::new(name)
        .result(format!("p50 {p50:.1} ms, p99 {p99:.1} ms"))
        .goal(
            format!("p99 ≤ {GOAL_MS:.0} ms, every process exit 0"),
            Verdict::goal(p99 <= GOAL_MS && all_ok),
        )
        .detail(format!(
            "{} gates over {repeats} run(s); {}; min {:.1} ms, max {:.1} ms",
            all.len(),
            exit_summary(&outcomes),
            all.first().copied().unwrap_or(f64::NAN),
            all.last().copied().unwrap_or(f64::NAN)
        ))
}
