//! Benchmark 10, exporter scrape: `dbwarden exporter` (the release build) serving 50 targets --
//! 10 PostgreSQL databases × 5 namespaces, each database's default namespace migrated, each
//! target with its migrations folder so pending counts are computed -- scraped over HTTP as Prometheus scrapes
//! it. What is timed is one whole `GET /metrics`, from the request to the last byte.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::engine::{Engine, Fresh};
use crate::error::{Result, fail};
use crate::process::Tools;
use crate::report::{Row, Verdict};
use crate::stats::{ms, summarize};

pub const NAME: &str = "10. exporter scrape, 50 targets";
const DATABASES: usize = 10;
const NAMESPACES: [&str; 5] = ["default", "billing", "search", "audit", "jobs"];
/// Goal: a scrape fits a fifth of Prometheus's default 10 s scrape timeout.
const GOAL: Duration = Duration::from_secs(2);

pub async fn run(engine: &Engine, tools: &Tools, dir: &Path, scrapes: usize) -> Row {
    let mut fresh = Vec::new();
    let mut r = Ok(Row::new(NAME));
    for _ in 0..DATABASES {
        match engine.fresh("scrape").await {
            Ok(f) => fresh.push(f),
            Err(e) => {
                r = Err(e);
                break;
            }
        }
    }
    if r.is_ok() {
        r = measure(tools, &fresh, dir, scrapes).await;
    }
    for f in fresh {
        engine.drop_fresh(f).await;
    }
    r.unwrap_or_else(|e| Row::not_measured(NAME, e.to_string()))
}

async fn measure(tools: &Tools, fresh: &[Fresh], dir: &Path, scrapes: usize) -> Result<Row> {
    let mut config = String::new();
    for f in fresh {
        // The folder creates tables, so one namespace applies it; the other four read as
        // 300 pending, which the exporter counts all the same.
        let out = tools
            .run(&tools.dbwarden_migrate(&f.url, "default", dir), false)
            .await?;
        if !out.ok() {
            return Err(fail(format!("migrate failed: {}", out.last_error)));
        }
        config.push_str(&format!(
            "[[exporter.targets]]\ndatabase_url = {:?}\nnamespaces = {:?}\nmigrations = {:?}\n\n",
            f.url,
            NAMESPACES,
            dir.display().to_string()
        ));
    }
    let work = tools.work.join("scrape");
    std::fs::create_dir_all(&work)?;
    let file = work.join("dbwarden.toml");
    std::fs::write(&file, config)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let log = std::fs::File::create(work.join("exporter.log"))?;
    let mut exporter = tokio::process::Command::new(&tools.dbwarden)
        .args(["exporter", "--listen", &addr, "--config"])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()?;
    let t0 = Instant::now();
    let first = loop {
        match scrape(&addr).await {
            Ok(page) => break page,
            Err(_) if t0.elapsed() < Duration::from_secs(15) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let series = first.lines().filter(|l| l.starts_with("dbwarden_")).count();
    let up = first
        .lines()
        .filter(|l| l.starts_with("dbwarden_up{") && l.ends_with(" 1"))
        .count();
    let mut samples = Vec::with_capacity(scrapes);
    let mut bytes = 0;
    for _ in 0..scrapes {
        let t = Instant::now();
        let page = scrape(&addr).await?;
        samples.push(t.elapsed());
        bytes = page.len();
    }
    let _ = exporter.kill().await;
    let s = summarize(&samples);
    let targets = DATABASES * NAMESPACES.len();
    Ok(Row::new(NAME)
        .result(format!("median {}, p99 {}", ms(s.median), ms(s.p99)))
        .goal(
            format!("≤ {} median", ms(GOAL)),
            Verdict::goal(s.median <= GOAL),
        )
        .detail(format!(
            "{targets} targets ({DATABASES} databases × {} namespaces, each with the 300-file folder; default applied, the others all pending), {up} reachable; {series} series, {bytes} bytes; median of {scrapes} scrapes, max {}; {} per target",
            NAMESPACES.len(),
            ms(s.max),
            ms(s.median / targets as u32)
        )))
}

/// One `GET /metrics` over a new connection, as Prometheus sends it; the body.
async fn scrape(addr: &str) -> Result<String> {
    let mut c = tokio::net::TcpStream::connect(addr).await?;
    c.write_all(
        format!(
            "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\nX-Prometheus-Scrape-Timeout-Seconds: 10\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), c.read_to_end(&mut buf))
        .await
        .map_err(|_| fail("no full answer within 15 s"))??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(fail("not an HTTP answer"));
    };
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(fail(format!(
            "answered {}",
            head.lines().next().unwrap_or("")
        )));
    }
    Ok(body.to_owned())
}
