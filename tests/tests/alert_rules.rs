//! The alert rules shipped in examples/prometheus: `promtool check rules` accepts them,
//! `promtool test rules` proves that each alert fires on recorded series and resolves when they
//! recover, and every metric they name is one `dbwarden exporter` really serves.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dbwarden_tests::Sandbox;

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/prometheus")
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(examples())
        .output()
        .expect("promtool (scripts/services.sh promtool installs it)");
    assert!(
        out.status.success(),
        "promtool {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_shipped_rules_are_valid_and_each_alert_fires_and_resolves() {
    promtool(&["check", "rules", "dbwarden-alerts.yml"]);
    promtool(&["test", "rules", "dbwarden-alerts.test.yml"]);
    // Every alert of the rules file is exercised by the test file.
    let rules = std::fs::read_to_string(examples().join("dbwarden-alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(examples().join("dbwarden-alerts.test.yml")).unwrap();
    for line in rules.lines() {
        if let Some(name) = line.trim().strip_prefix("- alert: ") {
            assert!(
                tests.contains(&format!("alertname: {name}")),
                "{name} has no promtool test"
            );
        }
    }
}

#[test]
fn every_metric_the_rules_and_the_dashboard_name_is_served_by_the_exporter() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    assert_eq!(sb.run(&["migrate"]).code, 0);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut exporter = sb
        .cmd(&["exporter", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // A holder, so that the series only a held lock has are on the page too.
    let mut holder = sb.spawn(&["run", "--", "sh", "-c", "exec sleep 60 >/dev/null 2>&1"]);
    let t0 = Instant::now();
    let page = loop {
        let got = TcpStream::connect(("127.0.0.1", port))
            .ok()
            .and_then(|mut s| {
                s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
                let mut body = String::new();
                s.read_to_string(&mut body).ok()?;
                Some(body)
            });
        if let Some(p) = got
            && p.contains("dbwarden_lock_held{engine=\"sqlite\",namespace=\"default\",database=\"sqlite://dbwarden.db\"} 1")
        {
            break p;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no exporter");
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = exporter.kill();
    let _ = exporter.wait();
    let _ = holder.kill();
    let _ = holder.wait();
    let rules = std::fs::read_to_string(examples().join("dbwarden-alerts.yml")).unwrap();
    let mut exprs: Vec<String> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
        .map(str::to_owned)
        .collect();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(examples().join("../grafana/dbwarden-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            exprs.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    let mut named = 0;
    for expr in &exprs {
        for (i, _) in expr.match_indices("dbwarden_") {
            let name: String = expr[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            named += 1;
            assert!(
                page.contains(&format!("\n{name}{{")),
                "{expr:?} uses {name}, which the exporter does not serve:\n{page}"
            );
        }
    }
    assert!(
        named >= 12,
        "the rules and panels name the exporter's metrics"
    );
}
