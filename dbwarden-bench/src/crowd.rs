//! Benchmark 9, a crowd past the server's connection limit: 64 and 256 `dbwarden migrate`
//! processes started at once against a server that takes 100 connections (PostgreSQL's
//! `max_connections` as configured, MariaDB's set to 100 for the run and restored after), on a
//! fresh database with 300 trivial migrations. Wall time ÷ (one process alone + the same crowd
//! with nothing pending): what the crowd costs the run beyond its own start-up. And 1000 runners
//! as tasks of this process (the library, as an application would embed it): all succeed.
//!
//! The peak number of server connections is sampled every 10 ms from a connection opened before
//! the crowd starts (so the sampler itself never waits for a slot); it is one of the peak.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dbwarden_core::HolderInfo;
use dbwarden_core::runner::{self, Interrupt, MigrateOptions, Outcome, Silent};
use sqlx::{AssertSqlSafe, Connection};

use crate::engine::{Engine, Fresh, Kind};
use crate::error::{Result, fail};
use crate::process::{Tools, exit_summary};
use crate::report::{Row, Verdict};
use crate::stats::{median_f64, ms, ratio};

pub const SMALL: &str = "9. crowd of 64, max_connections 100";
pub const LARGE: &str = "9b. crowd of 256, max_connections 100";
pub const TASKS: &str = "9c. 1000 runners as tasks in one process";
/// The connection limit the crowd meets.
pub const LIMIT: u64 = 100;
/// Goal at 256: the crowd's run takes at most this many times (alone + nothing pending).
const GOAL_RATIO: f64 = 1.2;
/// How long each runner may wait for the lock (as replicas would be started).
const WAIT: &str = "120s";
const SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// The side connection that watches the server's connection count (and, on MariaDB, sets the
/// limit for the run and puts it back).
enum Watch {
    Postgres(sqlx::PgConnection),
    MariaDb {
        conn: sqlx::MySqlConnection,
        /// `@@GLOBAL.max_connections` before the bench changed it.
        saved: Option<u64>,
    },
}

/// What the watch saw during one piece of work.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    peak: u64,
    /// Connections the server refused for want of a slot (MariaDB's counter; `None` where the
    /// server keeps none).
    refused: Option<u64>,
}

impl Watch {
    async fn open(engine: &Engine) -> Result<Watch> {
        match engine.kind {
            Kind::Postgres => Ok(Watch::Postgres(
                sqlx::PgConnection::connect(&engine.servers.postgres).await?,
            )),
            Kind::MariaDb => Ok(Watch::MariaDb {
                conn: sqlx::MySqlConnection::connect(&engine.servers.mariadb).await?,
                saved: None,
            }),
            other => Err(fail(format!("{} has no connection limit", other.title()))),
        }
    }

    /// The server's connection limit for the run: MariaDB's is set to [`LIMIT`] (and put back by
    /// [`Watch::restore`]); PostgreSQL's needs a restart to change, so it is read as it is.
    async fn limit(&mut self) -> Result<u64> {
        match self {
            Watch::Postgres(c) => {
                let v: String = sqlx::query_scalar("SHOW max_connections")
                    .fetch_one(&mut *c)
                    .await?;
                v.parse()
                    .map_err(|_| fail(format!("max_connections {v:?}")))
            }
            Watch::MariaDb { conn, saved } => {
                let before: u64 = sqlx::query_scalar("SELECT @@GLOBAL.max_connections")
                    .fetch_one(&mut *conn)
                    .await?;
                if saved.is_none() {
                    *saved = Some(before);
                }
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "SET GLOBAL max_connections = {LIMIT}"
                )))
                .execute(&mut *conn)
                .await?;
                Ok(LIMIT)
            }
        }
    }

    /// Put MariaDB's limit back as it was (on the watch's own connection, which stays open
    /// whatever the crowd did).
    async fn restore(&mut self) {
        if let Watch::MariaDb {
            conn,
            saved: Some(v),
        } = self
        {
            let set = sqlx::raw_sql(AssertSqlSafe(format!("SET GLOBAL max_connections = {v}")))
                .execute(&mut *conn)
                .await;
            if let Err(e) = set {
                eprintln!(
                    "  warning: could not restore MariaDB's max_connections to {v}: {e}; run `SET GLOBAL max_connections = {v}`"
                );
            }
        }
    }

    /// Client connections now (this one included).
    async fn connections(&mut self) -> Result<u64> {
        Ok(match self {
            Watch::Postgres(c) => {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'",
                )
                .fetch_one(&mut *c)
                .await?;
                n as u64
            }
            Watch::MariaDb { conn, .. } => status(conn, "Threads_connected").await?,
        })
    }

    async fn refused(&mut self) -> Result<Option<u64>> {
        Ok(match self {
            Watch::Postgres(_) => None,
            Watch::MariaDb { conn, .. } => {
                Some(status(conn, "Connection_errors_max_connections").await?)
            }
        })
    }

    /// Run `work` while sampling the connection count.
    async fn during<T>(&mut self, work: impl std::future::Future<Output = T>) -> Result<(T, Seen)> {
        let refused_before = self.refused().await?;
        let done = AtomicBool::new(false);
        let work = async {
            let r = work.await;
            done.store(true, Ordering::SeqCst);
            r
        };
        let sample = async {
            let mut peak = 0;
            while !done.load(Ordering::SeqCst) {
                peak = peak.max(self.connections().await?);
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
            Ok::<u64, crate::error::BenchError>(peak)
        };
        let (r, peak) = tokio::join!(work, sample);
        let peak = peak?;
        let refused = match (refused_before, self.refused().await?) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        Ok((r, Seen { peak, refused }))
    }
}

async fn status(conn: &mut sqlx::MySqlConnection, name: &str) -> Result<u64> {
    let (_, v): (String, String) =
        sqlx::query_as(AssertSqlSafe(format!("SHOW GLOBAL STATUS LIKE '{name}'")))
            .fetch_one(&mut *conn)
            .await?;
    v.parse().map_err(|_| fail(format!("{name} = {v:?}")))
}

/// The history of `fresh` holds each of the `expected` migrations exactly once.
async fn history_check(engine: &Engine, fresh: &Fresh, expected: u32) -> Result<()> {
    let sql = "SELECT COUNT(*), COUNT(DISTINCT version) FROM dbwarden_migrations";
    let (rows, distinct): (i64, i64) = match engine.kind {
        Kind::Postgres => {
            let mut c = sqlx::PgConnection::connect(&fresh.url).await?;
            sqlx::query_as(sql).fetch_one(&mut c).await?
        }
        _ => {
            let mut c = sqlx::MySqlConnection::connect(&fresh.url).await?;
            sqlx::query_as(sql).fetch_one(&mut c).await?
        }
    };
    if rows != i64::from(expected) || distinct != i64::from(expected) {
        return Err(fail(format!(
            "history holds {rows} rows for {distinct} versions, expected {expected} once each"
        )));
    }
    Ok(())
}

/// One repetition at one crowd size.
struct Once {
    alone: Duration,
    nothing_pending: Duration,
    fresh: Duration,
    all_ok: bool,
    summary: String,
    seen: Seen,
}

async fn once(
    engine: &Engine,
    tools: &Tools,
    dir: &Path,
    processes: usize,
    watch: &mut Watch,
) -> Result<Once> {
    let migrate = |db: &Fresh| {
        tools
            .dbwarden_migrate(&db.url, db.namespace.as_str(), dir)
            .args(["--wait", WAIT])
    };
    let alone = engine
        .with_fresh("crowd1", async |db| tools.run(&migrate(db), false).await)
        .await?;
    if !alone.ok() {
        return Err(fail(format!(
            "one process alone failed: {}",
            alone.last_error
        )));
    }
    let (nothing_pending, np_ok) = engine
        .with_fresh("crowdnp", async |db| {
            let first = tools.run(&migrate(db), false).await?;
            if !first.ok() {
                return Err(fail(format!(
                    "applying the migrations failed: {}",
                    first.last_error
                )));
            }
            let (wall, outcomes) = tools.run_many(&migrate(db), processes).await?;
            Ok((wall, exit_summary(&outcomes)))
        })
        .await?;
    let (fresh, all_ok, summary, seen) = engine
        .with_fresh("crowd", async |db| {
            let (ran, seen) = watch
                .during(tools.run_many(&migrate(db), processes))
                .await?;
            let (wall, outcomes) = ran?;
            let all_ok = outcomes.iter().all(|o| o.ok());
            let mut summary = exit_summary(&outcomes);
            match history_check(engine, db, crate::migrations::TRIVIAL_COUNT).await {
                Ok(()) => summary.push_str(", each migration once"),
                Err(e) => summary.push_str(&format!(", WRONG: {e}")),
            }
            Ok((wall, all_ok, summary, seen))
        })
        .await?;
    Ok(Once {
        alone: alone.wall,
        nothing_pending,
        fresh,
        all_ok,
        summary: format!("{summary}; nothing pending: {np_ok}"),
        seen,
    })
}

/// Rows 9 and 9b for `engine` (PostgreSQL or MariaDB).
pub async fn run(engine: &Engine, tools: &Tools, dir: &Path, repeats: usize) -> Vec<Row> {
    let sizes = [(SMALL, 64), (LARGE, 256)];
    let mut watch = match Watch::open(engine).await {
        Ok(w) => w,
        Err(e) => {
            return sizes
                .iter()
                .map(|(name, _)| Row::not_measured(name, e.to_string()))
                .collect();
        }
    };
    let limit = watch.limit().await;
    let mut rows = Vec::new();
    for (name, processes) in sizes {
        let row = match &limit {
            Ok(limit) => {
                let at = Size {
                    name,
                    processes,
                    limit: *limit,
                };
                measure(engine, tools, dir, &at, repeats, &mut watch)
                    .await
                    .unwrap_or_else(|e| Row::not_measured(name, e.to_string()))
            }
            Err(e) => Row::not_measured(name, format!("reading the connection limit: {e}")),
        };
        rows.push(row);
    }
    watch.restore().await;
    rows
}

/// One crowd size against one connection limit.
struct Size {
    name: &'static str,
    processes: usize,
    limit: u64,
}

async fn measure(
    engine: &Engine,
    tools: &Tools,
    dir: &Path,
    at: &Size,
    repeats: usize,
    watch: &mut Watch,
) -> Result<Row> {
    let Size {
        name,
        processes,
        limit,
    } = *at;
    let mut ratios = Vec::new();
    let mut details = Vec::new();
    let mut all_ok = true;
    let mut peak = 0;
    for _ in 0..repeats {
        let o = once(engine, tools, dir, processes, watch).await?;
        let r = ratio(o.fresh, o.alone + o.nothing_pending);
        ratios.push(r);
        all_ok &= o.all_ok;
        peak = peak.max(o.seen.peak);
        let refused = o
            .seen
            .refused
            .map(|n| format!(", {n} connections refused"))
            .unwrap_or_default();
        details.push(format!(
            "{r:.2}: {} vs {} alone + {} nothing pending, peak {} connections{refused}, {}",
            ms(o.fresh),
            ms(o.alone),
            ms(o.nothing_pending),
            o.seen.peak,
            o.summary
        ));
    }
    let r = median_f64(&ratios);
    let verdict = if processes >= 256 {
        Verdict::goal(r <= GOAL_RATIO && all_ok)
    } else {
        Verdict::Reported
    };
    let goal = if processes >= 256 {
        format!("≤ {GOAL_RATIO}×, {processes}/{processes} exit 0")
    } else {
        "report".to_owned()
    };
    Ok(Row::new(name)
        .result(format!(
            "{r:.2}×, peak {peak}/{limit} connections, {}",
            if all_ok {
                "all exit 0"
            } else {
                "NOT all exit 0"
            }
        ))
        .goal(goal, verdict)
        .detail(format!(
            "{processes} processes, {} migrations, max_connections {limit}, median of {repeats}: {}",
            crate::migrations::TRIVIAL_COUNT,
            details.join("; ")
        )))
}

/// Row 9c: `count` runners as tasks of this process, each with its own lock object (as many
/// replicas' worth of the library), on one fresh PostgreSQL database.
pub async fn tasks(engine: &Engine, dir: &Path, count: usize) -> Row {
    let r = async {
        let mut watch = Watch::open(engine).await?;
        let limit = watch.limit().await?;
        let migrations = Arc::new(
            dbwarden_core::migration::load_dir(dir, dbwarden_core::migration::Dialect::Postgres)
                .map_err(dbwarden_core::Error::from)?,
        );
        engine
            .with_fresh("crowdtasks", async |db| {
                let mut settings = engine.settings(db);
                settings.wait = Duration::from_secs(120);
                let t0 = Instant::now();
                let mut handles = Vec::with_capacity(count);
                for _ in 0..count {
                    let lock = engine.lock(&settings)?;
                    let opts = MigrateOptions::from_settings(&settings, lock.default_ttl())?;
                    let migrations = migrations.clone();
                    handles.push(tokio::spawn(async move {
                        let holder = HolderInfo::current(None, "bench crowd task");
                        runner::migrate(
                            lock.as_ref(),
                            &migrations,
                            &holder,
                            &opts,
                            &Silent,
                            &Interrupt::never(),
                        )
                        .await
                    }));
                }
                let (results, seen) = watch
                    .during(async {
                        let mut results = Vec::with_capacity(count);
                        for h in handles {
                            results.push(h.await);
                        }
                        results
                    })
                    .await?;
                let wall = t0.elapsed();
                let mut ok = 0;
                let mut applied = 0;
                let mut first_failure = None;
                for r in results {
                    match r {
                        Ok(Ok(Outcome::Done(report))) => {
                            ok += 1;
                            applied += report.applied.len();
                        }
                        Ok(Ok(Outcome::Skipped(_))) => {
                            first_failure.get_or_insert_with(|| "skipped".to_owned());
                        }
                        Ok(Err(e)) => {
                            first_failure.get_or_insert_with(|| e.to_string());
                        }
                        Err(e) => {
                            first_failure.get_or_insert_with(|| e.to_string());
                        }
                    }
                }
                let history = history_check(engine, db, crate::migrations::TRIVIAL_COUNT).await;
                Ok((wall, ok, applied, first_failure, seen, history, limit))
            })
            .await
    }
    .await;
    let (wall, ok, applied, first_failure, seen, history, limit) = match r {
        Ok(r) => r,
        Err(e) => return Row::not_measured(TASKS, e.to_string()),
    };
    let all = ok == count && history.is_ok();
    let mut detail = format!(
        "{count} tasks, each its own lock object, `runner::migrate` of {} migrations on one fresh database, --wait {WAIT}: wall {}; {applied} migrations applied in all",
        crate::migrations::TRIVIAL_COUNT,
        ms(wall)
    );
    match history {
        Ok(()) => detail.push_str(", each once in the history"),
        Err(e) => detail.push_str(&format!("; WRONG: {e}")),
    }
    if let Some(f) = first_failure {
        detail.push_str(&format!("; first failure: {f}"));
    }
    Row::new(TASKS)
        .result(format!(
            "{ok}/{count} succeeded, peak {}/{limit} connections",
            seen.peak
        ))
        .goal(
            "all succeed, peak ≤ max_connections",
            Verdict::goal(all && seen.peak <= limit),
        )
        .detail(detail)
}
