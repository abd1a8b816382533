//! Benchmark 11, the application behind a blocked migration: an application transaction has
//! read table `s` and stays open for `hold`; meanwhile `migrate` runs `ALTER TABLE s ADD
//! COLUMN`, and a probe reads `s` every 100 ms, each read timed. Unbounded, the `ALTER` waits in
//! the table's lock queue and every read queues behind it for as long as the application holds
//! the table; dbwarden's `lock_timeout` (default 2 s) lets it wait only that long per attempt.
//! Reported: the probe's p99 and longest read, dbwarden (default settings) against sqlx-cli
//! 0.9.0, which sets no lock timeout. PostgreSQL and MariaDB (a metadata lock there).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sqlx::Connection;

use crate::engine::{Engine, Kind};
use crate::error::{Result, fail};
use crate::process::{Invocation, Outcome, Tools};
use crate::report::{Row, Verdict};
use crate::stats::{ms, summarize};

pub const NAME: &str = "11. application reads behind a blocked `ALTER` (probe every 100 ms)";

/// dbwarden's default `lock_timeout`: the goal is that no read waits much longer.
const LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// One connection of the application's, on either engine.
enum Conn {
    Pg(sqlx::PgConnection),
    My(sqlx::MySqlConnection),
}

impl Conn {
    async fn open(kind: Kind, url: &str) -> Result<Conn> {
        Ok(match kind {
            Kind::MariaDb => Conn::My(sqlx::MySqlConnection::connect(url).await?),
            _ => Conn::Pg(sqlx::PgConnection::connect(url).await?),
        })
    }

    async fn exec(&mut self, sql: &'static str) -> Result<()> {
        match self {
            Conn::Pg(c) => {
                sqlx::raw_sql(sql).execute(c).await?;
            }
            Conn::My(c) => {
                sqlx::raw_sql(sql).execute(c).await?;
            }
        }
        Ok(())
    }
}

/// One blocked run of `migrate`: every probe read's time, and how the migration ended.
async fn once(
    engine: &Engine,
    tools: &Tools,
    hold: Duration,
    tool: &dyn Fn(&str, &std::path::Path) -> Result<Invocation>,
) -> Result<(Vec<Duration>, Outcome)> {
    let dir = tools
        .work
        .join(format!("blocked-{:?}-{}", engine.kind, rand_tag()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("0001_add.sql"),
        "ALTER TABLE s ADD COLUMN c INTEGER;\n",
    )?;
    engine
        .with_fresh("blocked", async |db| {
            let kind = engine.kind;
            let mut app = Conn::open(kind, &db.url).await?;
            app.exec("CREATE TABLE s (id INTEGER); INSERT INTO s VALUES (1)")
                .await?;
            app.exec("BEGIN; SELECT count(*) FROM s").await?;
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            let mut reader = Conn::open(kind, &db.url).await?;
            let probe = tokio::spawn(async move {
                let mut reads = Vec::new();
                while !flag.load(Ordering::SeqCst) {
                    let t0 = Instant::now();
                    reader.exec("SELECT count(*) FROM s").await?;
                    reads.push(t0.elapsed());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok::<_, crate::error::BenchError>(reads)
            });
            let migrate = tools.spawn(&tool(&db.url, &dir)?, false, false)?;
            tokio::time::sleep(hold).await;
            app.exec("COMMIT").await?;
            let outcome = tokio::time::timeout(Duration::from_secs(120), migrate.finish())
                .await
                .map_err(|_| fail("migrate did not end within 120 s of the table's release"))??;
            stop.store(true, Ordering::SeqCst);
            let reads = probe.await.map_err(|e| fail(e.to_string()))??;
            Ok((reads, outcome))
        })
        .await
}

/// A tag that keeps two runs' folders apart.
fn rand_tag() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// p99 and longest read over `repeats` runs of one tool, and every run's outcome.
async fn measure(
    engine: &Engine,
    tools: &Tools,
    hold: Duration,
    repeats: usize,
    tool: &dyn Fn(&str, &std::path::Path) -> Result<Invocation>,
) -> Result<(crate::stats::Summary, Vec<Outcome>)> {
    let mut reads = Vec::new();
    let mut outcomes = Vec::new();
    for _ in 0..repeats {
        let (r, o) = once(engine, tools, hold, tool).await?;
        reads.extend(r);
        outcomes.push(o);
    }
    Ok((summarize(&reads), outcomes))
}

pub async fn run(engine: &Engine, tools: &Tools, hold: Duration, repeats: usize) -> Row {
    let ns = dbwarden_core::Namespace::default();
    let dbwarden = |url: &str, dir: &std::path::Path| {
        Ok(tools.dbwarden_migrate(url, ns.as_str(), dir).args([
            "--lock-retries",
            "1000",
            "--wait",
            "10m",
        ]))
    };
    let ours = match measure(engine, tools, hold, repeats, &dbwarden).await {
        Ok(m) => m,
        Err(e) => return Row::not_measured(NAME, e.to_string()),
    };
    let sqlx = |url: &str, dir: &std::path::Path| tools.sqlx_migrate(url, dir);
    let peer = match measure(engine, tools, hold, repeats, &sqlx).await {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!("blocked ALTER, sqlx-cli: {e}");
            None
        }
    };
    let (s, outcomes) = &ours;
    let all_ok = outcomes.iter().all(Outcome::ok);
    let goal = LOCK_TIMEOUT + Duration::from_millis(500);
    let mut detail = format!(
        "application holds the table {:.0} s, {repeats} run(s), {} reads; dbwarden `lock_timeout` {} (default), {}",
        hold.as_secs_f64(),
        s.n,
        ms(LOCK_TIMEOUT),
        crate::process::exit_summary(outcomes),
    );
    let result = match &peer {
        Some((p, peer_outcomes)) => {
            detail.push_str(&format!(
                "; sqlx-cli 0.9.0: p99 {}, max {} ({} reads, {})",
                ms(p.p99),
                ms(p.max),
                p.n,
                crate::process::exit_summary(peer_outcomes)
            ));
            format!(
                "dbwarden p99 {}, max {}; sqlx-cli max {} ({:.1}× longer)",
                ms(s.p99),
                ms(s.max),
                ms(p.max),
                p.max.as_secs_f64() / s.max.as_secs_f64().max(1e-9)
            )
        }
        None => {
            detail.push_str("; sqlx-cli not measured");
            format!("dbwarden p99 {}, max {}", ms(s.p99), ms(s.max))
        }
    };
    Row::new(NAME)
        .result(result)
        .goal(
            format!("max ≤ lock_timeout + 0.5 s = {}", ms(goal)),
            Verdict::goal(s.max <= goal && all_ok),
        )
        .detail(detail)
}
