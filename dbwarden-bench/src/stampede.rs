//! Benchmark 3, stampede: N `dbwarden migrate` processes started at once on a fresh database
//! with 300 trivial migrations, against one process alone on another fresh database. And
//! benchmark 5, nothing-pending start-up: `dbwarden migrate` when everything is applied, the path
//! every replica takes.

use std::path::Path;
use std::time::Duration;

use crate::engine::{Engine, Kind};
use crate::error::Result;
use crate::process::{Tools, exit_summary};
use crate::report::{Row, Verdict};
use crate::stats::{median_f64, ms, ratio, summarize};

pub const STAMPEDE: &str = "3. stampede ÷ one process";
pub const STARTUP: &str = "5. nothing-pending start-up";
/// Goal: the stampede takes at most this many times one process's time.
const GOAL_RATIO: f64 = 1.3;

/// One repetition: (single wall, stampede wall, every stampede exit 0?, summary).
async fn once(
    engine: &Engine,
    tools: &Tools,
    dir: &Path,
    processes: usize,
) -> Result<(Duration, Duration, bool, String)> {
    let single = engine
        .with_fresh("single", async |db| {
            let inv = tools.dbwarden_migrate(&db.url, db.namespace.as_str(), dir);
            tools.run(&inv, false).await
        })
        .await?;
    if !single.ok() {
        return Err(format!("one process alone failed: {}", single.last_error).into());
    }
    let (wall, outcomes) = engine
        .with_fresh("stampede", async |db| {
            let inv = tools.dbwarden_migrate(&db.url, db.namespace.as_str(), dir);
            tools.run_many(&inv, processes).await
        })
        .await?;
    let all_ok = outcomes.iter().all(|o| o.ok());
    Ok((single.wall, wall, all_ok, exit_summary(&outcomes)))
}

pub async fn stampede(
    engine: &Engine,
    tools: &Tools,
    dir: &Path,
    processes: usize,
    repeats: usize,
) -> Row {
    let mut ratios = Vec::new();
    let mut details = Vec::new();
    let mut all_ok = true;
    for _ in 0..repeats {
        match once(engine, tools, dir, processes).await {
            Ok((one, many, ok, summary)) => {
                ratios.push(ratio(many, one));
                all_ok &= ok;
                details.push(format!("{} vs {} alone, {summary}", ms(many), ms(one)));
            }
            Err(e) => return Row::not_measured(STAMPEDE, e.to_string()),
        }
    }
    let r = median_f64(&ratios);
    let goal_met = r <= GOAL_RATIO && all_ok;
    Row::new(STAMPEDE)
        .result(format!(
            "{r:.2}×, {}",
            if all_ok {
                "all exit 0"
            } else {
                "NOT all exit 0"
            }
        ))
        .goal(
            format!("≤ {GOAL_RATIO}×, {processes}/{processes} exit 0"),
            Verdict::goal(goal_met),
        )
        .detail(format!(
            "{processes} processes, {} migrations, median of {repeats}: {}",
            crate::migrations::TRIVIAL_COUNT,
            details.join("; ")
        ))
}

pub async fn startup(engine: &Engine, tools: &Tools, dir: &Path, runs: usize) -> Row {
    let row = engine
        .with_fresh("startup", async |fresh| {
            let inv = tools.dbwarden_migrate(&fresh.url, fresh.namespace.as_str(), dir);
            let first = tools.run(&inv, false).await?;
            if !first.ok() {
                return Err(format!("applying the migrations failed: {}", first.last_error).into());
            }
            let mut walls = Vec::with_capacity(runs);
            let mut failures = Vec::new();
            for _ in 0..runs {
                let o = tools.run(&inv, false).await?;
                walls.push(o.wall);
                if !o.ok() {
                    failures.push(o);
                }
            }
            Ok((walls, failures))
        })
        .await;
    let (walls, failures) = match row {
        Ok(r) => r,
        Err(e) => return Row::not_measured(STARTUP, e.to_string()),
    };
    let s = summarize(&walls);
    let goal = Duration::from_millis(30);
    let (goal_text, verdict) = match engine.kind {
        Kind::Postgres | Kind::MariaDb | Kind::Sqlite => (
            format!("≤ {}", ms(goal)),
            Verdict::goal(s.median <= goal && failures.is_empty()),
        ),
        _ => ("report".to_owned(), Verdict::Reported),
    };
    let mut detail = format!(
        "median of {} runs, p99 {}; {} migrations applied",
        s.n,
        ms(s.p99),
        crate::migrations::TRIVIAL_COUNT
    );
    if let Some(f) = failures.first() {
        detail.push_str(&format!(
            "; {} runs failed: {}",
            failures.len(),
            f.last_error
        ));
    }
    Row::new(STARTUP)
        .result(ms(s.median))
        .goal(goal_text, verdict)
        .detail(detail)
}
