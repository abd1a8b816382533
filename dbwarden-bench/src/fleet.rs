//! Benchmark 12, fleets (`--only fleet`). PostgreSQL: `dbwarden migrate --targets FILE
//! --parallel 16` over N fresh databases (5 small migrations each) against ⌈N/16⌉ × one target
//! alone, with the peak of dbwarden's sessions sampled from `pg_stat_activity` and every
//! history checked; the same N by a shell loop of `dbwarden migrate` and of `sqlx migrate run`,
//! one database after another, for comparison; and the nothing-pending pass over the fleet.
//! SQLite: 1000 tenant files through `sqlite://dir/*.db`, first pass and nothing-pending pass.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, Connection};

use crate::engine::{Engine, Fresh};
use crate::error::{Result, fail};
use crate::process::Tools;
use crate::report::{Row, Verdict};
use crate::stats::{ms, ratio};

pub const FLEET: &str = "12. fleet of 200 databases, --parallel 16";
pub const LOOPS: &str = "12b. the same 200 by shell loops, one after another";
pub const NOTHING: &str = "12c. fleet of 200, nothing pending";
pub const SQLITE: &str = "12d. 1000 SQLite tenant files (`sqlite://dir/*.db`)";
pub const TWO: &str = "12e. two fleets at once over the same 200 databases";
pub const SCHEMAS: &str = "12f. 300 schemas in one database, --parallel 16";

/// Goal: two fleet processes at once over the same targets take at most this share of the
/// same two runs one after the other (the first applies, the second finds nothing pending).
const TWO_GOAL: f64 = 0.7;
/// Schemas in row 12f.
const SCHEMA_COUNT: usize = 300;

const PARALLEL: usize = 16;
/// Goal: the fleet takes at most this many times ⌈N/16⌉ one-target runs.
const GOAL_RATIO: f64 = 1.25;
/// Goal: a nothing-pending pass over 1000 SQLite files.
const SQLITE_NOTHING_GOAL: Duration = Duration::from_secs(10);

/// Five small migrations: two tables, a row, a column, an index.
fn folder(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let files = [
        (
            "0001_users.sql",
            "CREATE TABLE users (id BIGINT PRIMARY KEY, email VARCHAR(200));",
        ),
        ("0002_ledger.sql", "CREATE TABLE ledger (what VARCHAR(50));"),
        ("0003_seed.sql", "INSERT INTO ledger VALUES ('seeded');"),
        (
            "0004_name.sql",
            "ALTER TABLE users ADD COLUMN name VARCHAR(100);",
        ),
        (
            "0005_index.sql",
            "CREATE INDEX users_email ON users (email);",
        ),
    ];
    for (name, sql) in files {
        std::fs::write(dir.join(name), sql)?;
    }
    Ok(dir.to_path_buf())
}

/// `n` fresh databases.
async fn databases(engine: &Engine, tag: &str, n: usize) -> Result<Vec<Fresh>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(engine.fresh(tag).await?);
    }
    Ok(out)
}

async fn drop_all(engine: &Engine, dbs: Vec<Fresh>) {
    for db in dbs {
        engine.drop_fresh(db).await;
    }
}

/// How many databases of `dbs` hold 5 APPLIED rows and one seed row (each migration once).
async fn applied_once(dbs: &[Fresh]) -> usize {
    let mut ok = 0;
    for db in dbs {
        let Ok(mut c) = sqlx::PgConnection::connect(&db.url).await else {
            continue;
        };
        let q = "SELECT (SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED') * 10 + (SELECT count(*) FROM ledger)";
        if let Ok(n) = sqlx::query_scalar::<_, i64>(AssertSqlSafe(q))
            .fetch_one(&mut c)
            .await
            && n == 51
        {
            ok += 1;
        }
        let _ = c.close().await;
    }
    ok
}

/// Samples the most sessions named `dbwarden` the server holds at once, until stopped.
struct Peak {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicI64>,
    task: tokio::task::JoinHandle<()>,
}

impl Peak {
    async fn start(admin_url: &str) -> Result<Peak> {
        let mut c = sqlx::PgConnection::connect(admin_url).await?;
        let (stop, peak) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicI64::new(0)),
        );
        let (s, p) = (stop.clone(), peak.clone());
        let task = tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                let q = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dbwarden'";
                if let Ok(n) = sqlx::query_scalar::<_, i64>(q).fetch_one(&mut c).await {
                    p.fetch_max(n, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = c.close().await;
        });
        Ok(Peak { stop, peak, task })
    }

    async fn finish(self) -> i64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.peak.load(Ordering::Relaxed)
    }
}

/// `dbwarden migrate --parallel 16 --targets FILE --migrations DIR`.
fn fleet(tools: &Tools, file: &Path, dir: &Path) -> crate::process::Invocation {
    let parallel = PARALLEL.to_string();
    tools
        .dbwarden(&["migrate", "--parallel", &parallel, "--targets"])
        .arg(file)
        .arg("--migrations")
        .arg(dir)
}

/// The targets file of `dbs`, one URL per line.
fn targets_file(tools: &Tools, name: &str, dbs: &[Fresh]) -> Result<PathBuf> {
    let path = tools.work.join(name);
    let text: String = dbs.iter().map(|d| format!("{}\n", d.url)).collect();
    std::fs::write(&path, text)?;
    Ok(path)
}

pub async fn postgres(engine: &Engine, tools: &Tools, n: usize) -> Vec<Row> {
    match postgres_rows(engine, tools, n).await {
        Ok(rows) => rows,
        Err(e) => [FLEET, LOOPS, NOTHING, TWO, SCHEMAS]
            .into_iter()
            .map(|r| Row::not_measured(r, e.to_string()))
            .collect(),
    }
}

async fn postgres_rows(engine: &Engine, tools: &Tools, n: usize) -> Result<Vec<Row>> {
    let dir = folder(&tools.work.join("fleet-m5"))?;
    // One target alone, median of 3.
    let mut alone = Vec::new();
    for _ in 0..3 {
        let one = engine
            .with_fresh("fleet_one", async |db| {
                let inv = tools
                    .dbwarden(&["migrate", "-u", &db.url, "--migrations"])
                    .arg(&dir);
                tools.run(&inv, false).await
            })
            .await?;
        if !one.ok() {
            return Err(fail(format!("one target alone failed: {}", one.last_error)));
        }
        alone.push(one.wall);
    }
    alone.sort();
    let one = alone[1];

    let fleet_dbs = databases(engine, "fleet", n).await?;
    let r = fleet_pass(engine, tools, &dir, &fleet_dbs).await;
    let two = match &r {
        Ok(_) => two_at_once(engine, tools, &dir, n).await,
        Err(_) => Err(fail("the fleet pass failed")),
    };
    let loops = match &r {
        Ok(_) => shell_loops(engine, tools, &dir, n).await,
        Err(_) => Err(fail("the fleet pass failed")),
    };
    drop_all(engine, fleet_dbs).await;
    let (first, nothing, peak, good) = r?;
    let nothing_wall = nothing;
    let rounds = n.div_ceil(PARALLEL) as u32;
    let r = ratio(first, one * rounds);
    let bound = PARALLEL * 2 + 2;
    let met = r <= GOAL_RATIO && good == n && peak as usize <= bound;
    let fleet = Row::new(FLEET)
        .result(format!("{r:.2}×, {good}/{n} applied once, peak {peak} sessions"))
        .goal(
            format!("≤ {GOAL_RATIO}×, all applied once, ≤ {bound} sessions"),
            Verdict::goal(met),
        )
        .detail(format!(
            "fleet wall {} vs ⌈{n}/{PARALLEL}⌉ = {rounds} × one target alone {} (median of 3); 5 migrations per database; peak dbwarden sessions sampled every 20 ms from pg_stat_activity",
            ms(first),
            ms(one)
        ));
    // A missing peer (sqlx-cli) costs this row only.
    let loops = match loops {
        Ok((dbw_loop, sqlx_loop)) => Row::new(LOOPS)
        .result(format!(
            "fleet {:.2}× of the dbwarden loop, {:.2}× of the sqlx-cli loop",
            ratio(first, dbw_loop),
            ratio(first, sqlx_loop)
        ))
        .goal("report", Verdict::Reported)
        .detail(format!(
            "`for url in …; do dbwarden migrate -u $url; done` {} ; `sqlx migrate run` loop {} ; fleet --parallel {PARALLEL} {}",
            ms(dbw_loop),
            ms(sqlx_loop),
            ms(first)
        )),
        Err(e) => Row::not_measured(LOOPS, e.to_string()),
    };
    let nothing = Row::new(NOTHING)
        .result(ms(nothing))
        .goal("report", Verdict::Reported)
        .detail(format!(
            "the same fleet run again: every target looks first and takes no lock ({n} targets, --parallel {PARALLEL})"
        ));
    let two = match two {
        Ok((wall, good)) => {
            let one_after_other = first + nothing_wall;
            let r = ratio(wall, one_after_other);
            Row::new(TWO)
                .result(format!("{r:.2}×, {good}/{n} applied once, both exit 0"))
                .goal(
                    format!("≤ {TWO_GOAL}× the two one after the other"),
                    Verdict::goal(r <= TWO_GOAL && good == n),
                )
                .detail(format!(
                    "two `migrate --targets` processes started together {} ; one after the other: the first pass {} + the nothing-pending pass {} = {}",
                    ms(wall),
                    ms(first),
                    ms(nothing_wall),
                    ms(one_after_other)
                ))
        }
        Err(e) => Row::not_measured(TWO, e.to_string()),
    };
    let schemas = match schemas(engine, tools, &dir).await {
        Ok(row) => row,
        Err(e) => Row::not_measured(SCHEMAS, e.to_string()),
    };
    Ok(vec![fleet, loops, nothing, two, schemas])
}

/// Two fleet processes started together over the same `n` fresh databases (two CI jobs):
/// (wall until both ended, databases applied once).
async fn two_at_once(
    engine: &Engine,
    tools: &Tools,
    dir: &Path,
    n: usize,
) -> Result<(Duration, usize)> {
    let dbs = databases(engine, "fleet_two", n).await?;
    let r = async {
        let file = targets_file(tools, "fleet-two.txt", &dbs)?;
        let inv = fleet(tools, &file, dir);
        let t0 = Instant::now();
        let (a, b) = tokio::join!(tools.run(&inv, false), tools.run(&inv, false));
        let wall = t0.elapsed();
        let (a, b) = (a?, b?);
        if !a.ok() || !b.ok() {
            return Err(fail(format!(
                "two fleets at once: {} {}",
                a.last_error, b.last_error
            )));
        }
        Ok((wall, applied_once(&dbs).await))
    }
    .await;
    drop_all(engine, dbs).await;
    r
}

/// Row 12f: `SCHEMA_COUNT` schemas of one fresh database, each its own target (its own
/// history and status rows, its own namespace, the migrations' names in it by `search_path`).
async fn schemas(engine: &Engine, tools: &Tools, dir: &Path) -> Result<Row> {
    engine
        .with_fresh("fleet_schemas", async |db| {
            let mut c = sqlx::PgConnection::connect(&db.url).await?;
            let mut text = String::new();
            for i in 0..SCHEMA_COUNT {
                // Generated names: nothing to quote.
                let schema = format!("tenant_{i:03}");
                sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                    .execute(&mut c)
                    .await?;
                text.push_str(&format!(
                    "[[targets]]\nname = \"{schema}\"\ndatabase_url = \"{}?options=-c%20search_path%3D{schema}\"\nschema = \"{schema}\"\nnamespace = \"{schema}\"\n",
                    db.url
                ));
            }
            let file = tools.work.join("fleet-schemas.toml");
            std::fs::write(&file, text)?;
                    let inv = fleet(tools, &file, dir);
            let peak = Peak::start(&engine.servers.postgres).await?;
            let out = tools.run(&inv, false).await;
            let peak = peak.finish().await;
            let out = out?;
            if !out.ok() {
                return Err(fail(format!("the schema fleet failed: {}", out.last_error)));
            }
            let mut good = 0;
            for i in 0..SCHEMA_COUNT {
                let q = format!(
                    "SELECT (SELECT count(*) FROM tenant_{i:03}.dbwarden_migrations WHERE state = 'APPLIED') * 10 + (SELECT count(*) FROM tenant_{i:03}.ledger)"
                );
                if sqlx::query_scalar::<_, i64>(AssertSqlSafe(q))
                    .fetch_one(&mut c)
                    .await
                    .is_ok_and(|n| n == 51)
                {
                    good += 1;
                }
            }
            let _ = c.close().await;
            let bound = PARALLEL * 2 + 2;
            let met = good == SCHEMA_COUNT && peak as usize <= bound;
            Ok(Row::new(SCHEMAS)
                .result(format!(
                    "{}, {good}/{SCHEMA_COUNT} applied once, peak {peak} sessions",
                    ms(out.wall)
                ))
                .goal(
                    format!("all applied once, ≤ {bound} sessions"),
                    Verdict::goal(met),
                )
                .detail(format!(
                    "{SCHEMA_COUNT} schemas of one database, each a target with its own schema and namespace, 5 migrations each, one process"
                )))
        })
        .await
}

/// The fleet's first pass and its nothing-pending pass: (first wall, second wall, peak
/// sessions during the first, databases applied once).
async fn fleet_pass(
    engine: &Engine,
    tools: &Tools,
    dir: &Path,
    dbs: &[Fresh],
) -> Result<(Duration, Duration, i64, usize)> {
    let file = targets_file(tools, "fleet-targets.txt", dbs)?;
    let inv = fleet(tools, &file, dir);
    let peak = Peak::start(&engine.servers.postgres).await?;
    let first = tools.run(&inv, false).await;
    let peak = peak.finish().await;
    let first = first?;
    if !first.ok() {
        return Err(fail(format!("the fleet failed: {}", first.last_error)));
    }
    let second = tools.run(&inv, false).await?;
    if !second.ok() {
        return Err(fail(format!(
            "the nothing-pending pass failed: {}",
            second.last_error
        )));
    }
    Ok((first.wall, second.wall, peak, applied_once(dbs).await))
}

/// A shell loop's time over `n` fresh databases: `dbwarden migrate` one after another, then
/// `sqlx migrate run` the same way.
async fn shell_loops(
    engine: &Engine,
    tools: &Tools,
    dir: &Path,
    n: usize,
) -> Result<(Duration, Duration)> {
    let mut walls = Vec::new();
    for tool in ["dbwarden", "sqlx"] {
        let dbs = databases(engine, "fleet_loop", n).await?;
        let t0 = Instant::now();
        let mut failed = None;
        for db in &dbs {
            let inv = match tool {
                "dbwarden" => tools
                    .dbwarden(&["migrate", "-u", &db.url, "--migrations"])
                    .arg(dir),
                _ => tools.sqlx_migrate(&db.url, dir)?,
            };
            let o = tools.run(&inv, false).await?;
            if !o.ok() {
                failed = Some(o.last_error);
                break;
            }
        }
        walls.push(t0.elapsed());
        drop_all(engine, dbs).await;
        if let Some(e) = failed {
            return Err(fail(format!("the {tool} loop failed: {e}")));
        }
    }
    Ok((walls[0], walls[1]))
}

pub async fn sqlite(tools: &Tools, n: usize) -> Row {
    match sqlite_row(tools, n).await {
        Ok(row) => row,
        Err(e) => Row::not_measured(SQLITE, e.to_string()),
    }
}

async fn sqlite_row(tools: &Tools, n: usize) -> Result<Row> {
    let dir = folder(&tools.work.join("fleet-sqlite-m5"))?;
    let tenants = tools
        .work
        .join(format!("fleet-sqlite-{}", std::process::id()));
    std::fs::create_dir_all(&tenants)?;
    for i in 0..n {
        std::fs::File::create(tenants.join(format!("t{i:04}.db")))?;
    }
    let file = tools.work.join("fleet-sqlite.txt");
    std::fs::write(&file, format!("sqlite://{}/*.db\n", tenants.display()))?;
    let inv = fleet(tools, &file, &dir);
    let first = tools.run(&inv, false).await?;
    let second = tools.run(&inv, false).await;
    let _ = std::fs::remove_dir_all(&tenants);
    let second = second?;
    if !first.ok() || !second.ok() {
        return Err(fail(format!(
            "the SQLite fleet failed: {} {}",
            first.last_error, second.last_error
        )));
    }
    let met = second.wall <= SQLITE_NOTHING_GOAL;
    Ok(Row::new(SQLITE)
        .result(format!(
            "nothing pending {}, first pass {}",
            ms(second.wall),
            ms(first.wall)
        ))
        .goal(
            format!("nothing pending ≤ {}", ms(SQLITE_NOTHING_GOAL)),
            Verdict::goal(met),
        )
        .detail(format!(
            "{n} empty files, 5 migrations each, --parallel {PARALLEL}, one process"
        )))
}
