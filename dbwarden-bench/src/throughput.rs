//! Benchmarks 4 and 7: `dbwarden migrate` against `sqlx migrate run` on the same folder of 300
//! trivial migrations, each run on its own fresh database, alternated A B A B; peak RSS of both
//! from the same runs; and both tools' exit counts with 8 processes at once.

use std::path::Path;

use crate::engine::Engine;
use crate::error::{Result, fail};
use crate::process::{Invocation, Outcome, Tools, exit_summary};
use crate::report::{Row, Verdict};
use crate::stats::{median_f64, ms, summarize};

pub const THROUGHPUT: &str = "4. migrate time ÷ sqlx-cli";
pub const PEER_STAMPEDE: &str = "4b. 8 processes at once";
pub const RSS: &str = "7. peak RSS ÷ sqlx-cli";
pub const BIG_FILE: &str = "4d. one 100 000-statement file ÷ sqlx-cli";
const ALONE: &str = "4/7. migrate alone (no peer)";

/// Which tool a run used.
#[derive(Clone, Copy)]
enum Tool {
    Dbwarden,
    Sqlx,
}

fn invocation(tools: &Tools, tool: Tool, url: &str, ns: &str, dir: &Path) -> Result<Invocation> {
    match tool {
        Tool::Dbwarden => Ok(tools.dbwarden_migrate(url, ns, dir)),
        Tool::Sqlx => tools.sqlx_migrate(url, dir),
    }
}

/// One run of `tool` on a fresh database, with its peak RSS.
async fn one(engine: &Engine, tools: &Tools, tool: Tool, dir: &Path) -> Result<Outcome> {
    let out = engine
        .with_fresh("throughput", async |fresh| {
            let inv = invocation(tools, tool, &fresh.url, fresh.namespace.as_str(), dir)?;
            tools.run(&inv, true).await
        })
        .await?;
    if !out.ok() {
        let who = match tool {
            Tool::Dbwarden => "dbwarden migrate",
            Tool::Sqlx => "sqlx migrate run",
        };
        return Err(fail(format!("{who} failed: {}", out.last_error)));
    }
    Ok(out)
}

/// `count` processes of `tool` at once on a fresh database.
async fn at_once(
    engine: &Engine,
    tools: &Tools,
    tool: Tool,
    dir: &Path,
    count: usize,
) -> Result<Vec<Outcome>> {
    let (_, outcomes) = engine
        .with_fresh("peer_stampede", async |fresh| {
            let inv = invocation(tools, tool, &fresh.url, fresh.namespace.as_str(), dir)?;
            tools.run_many(&inv, count).await
        })
        .await?;
    Ok(outcomes)
}

fn mb(kb: f64) -> String {
    format!("{:.1} MB", kb / 1024.0)
}

/// Rows 4, 4b and 7 for an engine sqlx-cli supports.
pub async fn versus_sqlx(engine: &Engine, tools: &Tools, dir: &Path, pairs: usize) -> Vec<Row> {
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut ratios = Vec::new();
    let mut rss_ratios = Vec::new();
    for _ in 0..pairs {
        let pair = async {
            let a = one(engine, tools, Tool::Dbwarden, dir).await?;
            let b = one(engine, tools, Tool::Sqlx, dir).await?;
            Ok::<_, crate::error::BenchError>((a, b))
        }
        .await;
        match pair {
            Ok((a, b)) => {
                ratios.push(a.wall.as_secs_f64() / b.wall.as_secs_f64());
                if let (Some(x), Some(y)) = (a.rss_kb, b.rss_kb) {
                    rss_ratios.push(x as f64 / y as f64);
                }
                ours.push(a);
                theirs.push(b);
            }
            Err(e) => {
                return vec![
                    Row::not_measured(THROUGHPUT, e.to_string()),
                    Row::not_measured(RSS, e.to_string()),
                ];
            }
        }
    }
    let walls = |v: &[Outcome]| summarize(&v.iter().map(|o| o.wall).collect::<Vec<_>>());
    let rss = |v: &[Outcome]| {
        median_f64(
            &v.iter()
                .filter_map(|o| o.rss_kb)
                .map(|k| k as f64)
                .collect::<Vec<_>>(),
        )
    };
    let (w_ours, w_theirs) = (walls(&ours), walls(&theirs));
    let r = median_f64(&ratios);
    let mut rows = vec![
        Row::new(THROUGHPUT)
            .result(format!("{r:.2}×"))
            .goal("≤ 1.0×", Verdict::goal(r <= 1.0))
            .detail(format!(
                "median of {pairs} A/B pairs; dbwarden median {}, sqlx-cli median {} ({} migrations, fresh database each)",
                ms(w_ours.median),
                ms(w_theirs.median),
                crate::migrations::TRIVIAL_COUNT
            )),
    ];
    rows.push(if rss_ratios.is_empty() {
        Row::not_measured(RSS, "/usr/bin/time not found")
    } else {
        let rr = median_f64(&rss_ratios);
        Row::new(RSS)
            .result(format!("{rr:.2}×"))
            .goal("≤ 1.5×", Verdict::goal(rr <= 1.5))
            .detail(format!(
                "dbwarden {}, sqlx-cli {} (median max RSS of the runs of row 4)",
                mb(rss(&ours)),
                mb(rss(&theirs))
            ))
    });
    let counts = async {
        let a = at_once(engine, tools, Tool::Dbwarden, dir, 8).await?;
        let b = at_once(engine, tools, Tool::Sqlx, dir, 8).await?;
        Ok::<_, crate::error::BenchError>((a, b))
    }
    .await;
    rows.push(match counts {
        Ok((a, b)) => {
            let all = a.iter().all(|o| o.ok());
            Row::new(PEER_STAMPEDE)
                .result(format!(
                    "dbwarden {}/8, sqlx-cli {}/8 exit 0",
                    a.iter().filter(|o| o.ok()).count(),
                    b.iter().filter(|o| o.ok()).count()
                ))
                .goal("dbwarden 8/8", Verdict::goal(all))
                .detail(format!(
                    "fresh database each; dbwarden: {}; sqlx-cli: {}",
                    exit_summary(&a),
                    exit_summary(&b)
                ))
        }
        Err(e) => Row::not_measured(PEER_STAMPEDE, e.to_string()),
    });
    rows
}

/// Row 4d: one big data migration, dbwarden against sqlx-cli on fresh databases, alternated.
pub async fn big_file(engine: &Engine, tools: &Tools, dir: &Path, pairs: usize) -> Row {
    let mut ratios = Vec::new();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..pairs {
        let pair = async {
            let a = one(engine, tools, Tool::Dbwarden, dir).await?;
            let b = one(engine, tools, Tool::Sqlx, dir).await?;
            Ok::<_, crate::error::BenchError>((a, b))
        }
        .await;
        match pair {
            Ok((a, b)) => {
                ratios.push(a.wall.as_secs_f64() / b.wall.as_secs_f64());
                ours.push(a.wall);
                theirs.push(b.wall);
            }
            Err(e) => return Row::not_measured(BIG_FILE, e.to_string()),
        }
    }
    let r = median_f64(&ratios);
    Row::new(BIG_FILE)
        .result(format!("{r:.2}×"))
        .goal("≤ 1.0×", Verdict::goal(r <= 1.0))
        .detail(format!(
            "median of {pairs} A/B pairs; dbwarden median {}, sqlx-cli median {} ({} INSERTs in one file after a CREATE TABLE, fresh database each)",
            ms(summarize(&ours).median),
            ms(summarize(&theirs).median),
            crate::migrations::BIG_STATEMENTS
        ))
}

/// Row for an engine without a sqlx-cli driver: dbwarden's own time and RSS.
pub async fn alone(engine: &Engine, tools: &Tools, dir: &Path, runs: usize) -> Row {
    let mut outs = Vec::new();
    for _ in 0..runs {
        match one(engine, tools, Tool::Dbwarden, dir).await {
            Ok(o) => outs.push(o),
            Err(e) => return Row::not_measured(ALONE, e.to_string()),
        }
    }
    let w = summarize(&outs.iter().map(|o| o.wall).collect::<Vec<_>>());
    let rss = median_f64(
        &outs
            .iter()
            .filter_map(|o| o.rss_kb)
            .map(|k| k as f64)
            .collect::<Vec<_>>(),
    );
    Row::new(ALONE)
        .result(format!("{}, RSS {}", ms(w.median), mb(rss)))
        .goal("report (sqlx-cli has no driver here)", Verdict::Reported)
        .detail(format!(
            "median of {runs} runs of {} migrations on fresh databases",
            crate::migrations::TRIVIAL_COUNT
        ))
}
