//! `dbwarden exporter` scraped by a real Prometheus (Debian's `prometheus`, started by this test
//! on free loopback ports, scraping every 2 s within 2 s): while a PostgreSQL holder runs, is paused
//! (SIGSTOP) and is killed (kill -9), Prometheus's query API shows the verdict series go
//! HEALTHY → STUCK → DEAD → AVAILABLE with the engine, namespace and redacted database labels.
//! Beside it, a target that refuses and one whose link holds are `dbwarden_up 0` with a growing
//! error counter (the held one within the scrape's timeout, never costing the page), a
//! SQLite target with a pending migration counts it, `promtool check metrics` passes on the
//! page, and no password reaches a label.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dbwarden_tests::pg::PgDb;
use dbwarden_tests::proxy::{Fault, FaultProxy, host_port};
use dbwarden_tests::{Sandbox, free_port, promtool_check_metrics, signal};
use rustix::process::Signal;

/// A plain HTTP GET on loopback: (status line, body).
fn get(port: u16, path: &str) -> Option<(String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_owned(), body.to_owned()))
}

/// `%`-encode a PromQL query for a URL.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A process killed (and reaped) when the test ends, however it ends.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Prometheus {
    port: u16,
    _daemon: Daemon,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scraping `127.0.0.1:<exporter>` every 2 s, each scrape within 2 s.
    fn start(exporter: u16) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n  evaluation_interval: 2s\nscrape_configs:\n  - job_name: dbwarden\n    static_configs:\n      - targets: ['127.0.0.1:{exporter}']\n"
            ),
        )
        .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus (scripts/services.sh prometheus installs Debian's package)");
        let p = Prometheus {
            port,
            _daemon: Daemon(child),
            _dir: dir,
        };
        let t0 = Instant::now();
        while !get(port, "/-/ready").is_some_and(|(status, _)| status.contains(" 200")) {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "prometheus not ready on 127.0.0.1:{port} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// The instant vector of `query`: each series' labels and value.
    fn query(&self, query: &str) -> Vec<(serde_json::Value, f64)> {
        let (status, body) = get(self.port, &format!("/api/v1/query?query={}", encode(query)))
            .expect("prometheus answers");
        assert!(status.contains(" 200"), "{query}: {status} {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["metric"].clone(),
                    r["value"][1].as_str().unwrap().parse().unwrap(),
                )
            })
            .collect()
    }

    /// Until `query` returns at least one series (at most 30 s); its series.
    fn wait_for(&self, query: &str) -> Vec<(serde_json::Value, f64)> {
        let t0 = Instant::now();
        loop {
            let r = self.query(query);
            if !r.is_empty() {
                return r;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "Prometheus never answered {query}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

#[test]
fn prometheus_sees_a_holder_go_healthy_stuck_dead_available() {
    let sb = Sandbox::new();
    let db = PgDb::new();
    // A password in a URL (trust auth ignores it) must never reach a label or the page.
    let url = db.url.replacen("root@", "root:s3cret-pw@", 1);
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    let sqlite = format!("sqlite://{}", sb.db().display());
    assert_eq!(sb.run(&["migrate", "-u", &sqlite]).code, 0);
    sb.write_migration("0002_b.sql", "CREATE TABLE b (x INTEGER);");
    // A target whose link holds (packets swallowed, connection open): it must cost its own
    // series, not the page.
    let held = FaultProxy::start(&host_port(&db.url));
    held.set(Fault::Hold);
    let held_url = held.url(&db.url);
    let config = sb.path().join("exporter.toml");
    std::fs::write(
        &config,
        format!(
            "[[exporter.targets]]\ndatabase_url = \"{url}\"\nnamespaces = [\"default\", \"billing\"]\n\n\
             [[exporter.targets]]\ndatabase_url = \"{sqlite}\"\nmigrations = \"{}\"\n\n\
             [[exporter.targets]]\ndatabase_url = \"postgres://root:s3cret-pw@127.0.0.1:1/nothing\"\n\n\
             [[exporter.targets]]\ndatabase_url = \"{held_url}\"\nnamespaces = [\"held\"]\n",
            sb.migrations().display()
        ),
    )
    .unwrap();
    let port = free_port();
    let exporter = Daemon(
        sb.cmd(&[
            "exporter",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--config",
            &config.display().to_string(),
        ])
        .env("DBWARDEN_CONNECT_TIMEOUT", "2s")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let t0 = Instant::now();
    while get(port, "/").is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the exporter never served"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Without Prometheus's timeout header a scrape gives each target 10 s less half a second.
    let t0 = Instant::now();
    let (status, page) = get(port, "/metrics").expect("a page");
    assert!(status.contains(" 200"), "{status}");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "a held target must not hold the page past the scrape timeout: {:?}",
        t0.elapsed()
    );
    let held_up =
        format!("dbwarden_up{{engine=\"postgres\",namespace=\"held\",database=\"{held_url}\"}} 0");
    assert!(page.contains(&held_up), "{page}");
    assert!(!page.contains("s3cret-pw"), "{page}");
    promtool_check_metrics(&page);
    assert_eq!(get(port, "/nope").unwrap().0, "HTTP/1.1 404 Not Found");

    let prom = Prometheus::start(port);
    let verdict = |v: &str| {
        format!(
            "dbwarden_lock_verdict{{engine=\"postgres\",namespace=\"default\",verdict=\"{v}\"}} == 1"
        )
    };
    let series = prom.wait_for(&verdict("AVAILABLE"));
    let labels = &series[0].0;
    assert_eq!(labels["job"], "dbwarden");
    let shown = labels["database"].as_str().unwrap();
    assert!(
        shown.contains("root:***@") && !shown.contains("s3cret"),
        "the database label is the redacted URL: {labels}"
    );
    // The other namespace of the same database is a series of its own.
    prom.wait_for(
        "dbwarden_lock_verdict{engine=\"postgres\",namespace=\"billing\",verdict=\"AVAILABLE\"} == 1",
    );
    // The SQLite target counts its pending migration; the unreachable one is down, with errors.
    let pending = prom.wait_for("dbwarden_migrations{engine=\"sqlite\",standing=\"pending\"}");
    assert_eq!(pending[0].1, 1.0, "{pending:?}");
    prom.wait_for("dbwarden_last_run_success{engine=\"sqlite\"} == 1");
    prom.wait_for("dbwarden_up{database=~\".*127.0.0.1:1/nothing\"} == 0");
    prom.wait_for("dbwarden_exporter_scrape_errors_total{database=~\".*127.0.0.1:1/nothing\"} > 1");
    prom.wait_for("dbwarden_up{namespace=\"held\"} == 0");

    let holder = sb.spawn(&[
        "run",
        "-u",
        &url,
        "--lock-ttl",
        "2s",
        "--heartbeat-interval",
        "500ms",
        "--",
        "sh",
        "-c",
        "exec sleep 120 >/dev/null 2>&1",
    ]);
    prom.wait_for(&verdict("HEALTHY"));
    prom.wait_for("dbwarden_lock_held{engine=\"postgres\",namespace=\"default\"} == 1");
    signal(holder.id(), Signal::STOP);
    prom.wait_for(&verdict("STUCK"));
    prom.wait_for("dbwarden_lock_heartbeat_age_seconds{namespace=\"default\"} > 2");
    dbwarden_tests::kill9(holder);
    prom.wait_for(&verdict("DEAD"));
    assert_eq!(sb.run(&["run", "-u", &url, "--", "true"]).code, 0);
    prom.wait_for(&verdict("AVAILABLE"));
    // Exactly one verdict is 1 per target now, and the billing namespace never moved.
    let on = prom.query("sum by (namespace, database) (dbwarden_lock_verdict) != 1");
    assert!(on.is_empty(), "{on:?}");
    assert_eq!(
        prom.query("dbwarden_lock_verdict{namespace=\"billing\",verdict=\"AVAILABLE\"} == 1")
            .len(),
        1
    );
    drop(exporter);
}

#[test]
fn bad_exporter_input_is_exit_2() {
    let sb = Sandbox::new();
    // An address that cannot be bound.
    let r = sb.run(&["exporter", "--listen", "256.0.0.1:1"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("cannot listen"), "{r:?}");
    // The exporter started on a config holding `targets`; it must refuse before serving.
    let config = sb.path().join("bad.toml");
    let start = |targets: &str| {
        std::fs::write(&config, targets).unwrap();
        sb.run(&[
            "exporter",
            "--listen",
            "127.0.0.1:0",
            "--config",
            &config.display().to_string(),
        ])
    };
    // A target with a bad URL.
    let r = start("[[exporter.targets]]\ndatabase_url = \"nosuch://x\"\n");
    assert_eq!(r.code, 2, "{r:?}");
    // The same database and namespace twice (here: URLs differing only in the password) would
    // give duplicate series, which fail the whole scrape: refused, without the password.
    let r = start(
        "[[exporter.targets]]\ndatabase_url = \"postgres://root:first-pw@127.0.0.1:1/x\"\n\n\
         [[exporter.targets]]\ndatabase_url = \"postgres://root:second-pw@127.0.0.1:1/x\"\nnamespaces = [\"default\"]\n",
    );
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("listed twice"), "{r:?}");
    assert!(!r.stderr.contains("-pw"), "{r:?}");
}
