//! `lock-status --format openmetrics`: what a scrape of the textfile shows while a holder runs,
//! is paused (SIGSTOP) and is killed, checked by Prometheus's own `promtool check metrics`
//! (installed by scripts/services.sh; the test fails loudly without it).

use std::time::{Duration, Instant};

use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox, signal};
use rustix::process::Signal;

/// The exposition, checked by promtool; exit 0 whatever the verdict.
fn scrape(sb: &Sandbox, url: &str) -> String {
    let r = sb.run(&["lock-status", "--format", "openmetrics", "-u", url]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.ends_with("# EOF\n"), "{r:?}");
    dbwarden_tests::promtool_check_metrics(&r.stdout);
    r.stdout
}

/// The value of the one series of `name` whose labels contain `label` (None: no such series).
fn value(text: &str, name: &str, label: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .next()
}

/// The one verdict series at 1.
fn verdict(text: &str) -> String {
    let on: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("dbwarden_lock_verdict{") && l.ends_with(" 1"))
        .collect();
    assert_eq!(on.len(), 1, "exactly one verdict is 1: {text}");
    let v = on[0].split("verdict=\"").nth(1).unwrap();
    v[..v.find('"').unwrap()].to_owned()
}

fn wait_verdict(sb: &Sandbox, url: &str, want: &str) -> String {
    let t0 = Instant::now();
    loop {
        let text = scrape(sb, url);
        if verdict(&text) == want {
            return text;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never {want}; last scrape:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn postgres_holder_healthy_stuck_dead_available() {
    let sb = Sandbox::new();
    let db = PgDb::new();
    // A password in the URL (trust auth ignores it) must never reach a label.
    let url = db.url.replacen("root@", "root:s3cret-pw@", 1);
    let text = scrape(&sb, &url);
    assert_eq!(verdict(&text), "AVAILABLE");
    assert_eq!(value(&text, "dbwarden_up", ""), Some(1.0));
    assert_eq!(value(&text, "dbwarden_lock_held", ""), Some(0.0));
    assert!(!text.contains("s3cret-pw"), "{text}");
    assert!(text.contains("engine=\"postgres\""), "{text}");

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
        // The command must not keep the holder's stdout/stderr open once the holder is killed.
        "exec sleep 60 >/dev/null 2>&1",
    ]);
    // HEALTHY comes as soon as the advisory lock is held; the holder's own ttl once its claim
    // wrote the status row a moment later.
    let t0 = Instant::now();
    let text = loop {
        let text = wait_verdict(&sb, &url, "HEALTHY");
        if value(&text, "dbwarden_lock_ttl_seconds", "") == Some(2.0) {
            break text;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never claimed: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(value(&text, "dbwarden_lock_held", ""), Some(1.0));
    assert!(value(&text, "dbwarden_lock_heartbeat_age_seconds", "").unwrap() < 2.0);
    let started = value(&text, "dbwarden_lock_holder_start_time_seconds", "").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - started).abs() < 60.0, "{started} vs {now}");
    let token = value(&text, "dbwarden_lock_fencing_token", "").unwrap();
    assert!(token >= 1.0);

    // Paused: the session keeps the lock, the heartbeat ages past the ttl.
    signal(holder.id(), Signal::STOP);
    let text = wait_verdict(&sb, &url, "STUCK");
    assert!(value(&text, "dbwarden_lock_heartbeat_age_seconds", "").unwrap() > 2.0);
    // Killed: the server frees the lock, the status row still says RUNNING.
    dbwarden_tests::kill9(holder);
    let text = wait_verdict(&sb, &url, "DEAD");
    assert_eq!(value(&text, "dbwarden_lock_held", ""), Some(0.0));
    // A clean run afterwards: AVAILABLE, the token has moved on.
    let r = sb.run(&["run", "-u", &url, "--", "true"]);
    assert_eq!(r.code, 0, "{r:?}");
    let text = wait_verdict(&sb, &url, "AVAILABLE");
    assert!(value(&text, "dbwarden_lock_fencing_token", "").unwrap() > token);
}

#[test]
fn an_unreachable_database_is_up_0_with_exit_0() {
    let sb = Sandbox::new();
    let url = "postgres://root:s3cret-pw@127.0.0.1:1/nothing";
    let r: Run = sb.run(&["lock-status", "--format", "openmetrics", "-u", url]);
    assert_eq!(r.code, 0, "the exposition was written: {r:?}");
    let text = scrape(&sb, url);
    assert_eq!(value(&text, "dbwarden_up", ""), Some(0.0));
    assert!(!text.contains("dbwarden_lock_verdict"), "{text}");
    assert!(r.stderr.contains("cannot reach"), "{r:?}");
    assert!(!text.contains("s3cret-pw") && !r.stderr.contains("s3cret-pw"));
}

#[test]
fn sqlite_after_a_migrate_is_available_with_its_token() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    assert_eq!(sb.run(&["migrate"]).code, 0);
    let text = scrape(&sb, "sqlite://dbwarden.db");
    assert_eq!(verdict(&text), "AVAILABLE");
    assert_eq!(value(&text, "dbwarden_lock_fencing_token", ""), Some(1.0));
    assert!(text.contains("engine=\"sqlite\""), "{text}");
}

#[test]
fn bad_input_is_exit_2_with_nothing_on_stdout() {
    let sb = Sandbox::new();
    let r = sb.run(&["lock-status", "--format", "openmetrics", "-u", "nosuch://x"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stdout.is_empty(), "{r:?}");
    let r = sb.run(&["lock-status", "--format", "yaml"]);
    assert_eq!(r.code, 2, "{r:?}");
}
