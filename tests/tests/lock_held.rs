//! While another runner holds the lock: skip, wait-then-give-up, and what lock-status says.

use std::time::Duration;

use dbwarden_tests::{Run, Sandbox, signal, slow_select, sqlite_count};
use rustix::process::Signal;

/// Start a runner that holds the lock for a while (a slow migration) and wait until it does.
fn start_holder(sb: &Sandbox, extra: &[&str]) -> std::process::Child {
    sb.write_migration(
        "0001_ran.sql",
        "CREATE TABLE ran (version INTEGER PRIMARY KEY);",
    );
    sb.write_migration(
        "0002_slow.sql",
        &format!("CREATE TABLE slow AS {};", slow_select(8)),
    );
    let mut args = vec!["migrate"];
    args.extend_from_slice(extra);
    let child = sb.spawn(&args);
    sb.wait_status(extra, Duration::from_secs(30), |v| {
        v["held"] == true && v["status"]["state"] == "RUNNING"
    });
    child
}

fn stop(child: std::process::Child) {
    signal(child.id(), Signal::KILL);
    let _ = Run::wait(child, Duration::from_secs(10));
}

#[test]
fn skip_if_locked_exits_0_with_one_line_and_touches_nothing() {
    let sb = Sandbox::new();
    let holder = start_holder(&sb, &[]);
    let before = sqlite_count(&sb.db(), "SELECT fencing_token FROM dbwarden_lock");
    let r = sb.run(&["migrate", "--skip-if-locked"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.stderr_lines().len(), 1, "{r:?}");
    assert!(r.stderr.contains("skipped"), "{r:?}");
    assert!(r.stderr.contains(&format!("pid={}", holder.id())), "{r:?}");
    assert!(r.stdout.is_empty());
    // No acquisition happened (the token is unchanged) and no history row was written.
    assert_eq!(
        sqlite_count(&sb.db(), "SELECT fencing_token FROM dbwarden_lock"),
        before
    );
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM dbwarden_migrations WHERE version = 2"
        ),
        0
    );
    stop(holder);
    // The declined run is visible in the audit table once the next holder has run (the
    // holder's migration had SQLite's write lock, so the row waited in the spool).
    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    let rows = dbwarden_tests::sqlite_query(
        &sb.db(),
        "SELECT reason FROM dbwarden_lock_audit WHERE action = 'lock_conflict'",
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0].contains("--skip-if-locked"), "{rows:?}");
}

#[test]
fn wait_1s_gives_up_with_exit_3_after_about_a_second_naming_the_holder() {
    let sb = Sandbox::new();
    let holder = start_holder(&sb, &[]);
    let r = sb.run(&["migrate", "--wait", "1s"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert!(r.elapsed >= Duration::from_millis(1000), "{:?}", r.elapsed);
    assert!(r.elapsed < Duration::from_secs(5), "{:?}", r.elapsed);
    assert_eq!(r.stderr_lines().len(), 1, "{r:?}");
    assert!(r.stderr.contains("lock busy: held by host="), "{r:?}");
    assert!(r.stderr.contains(&format!("pid={}", holder.id())), "{r:?}");
    assert!(r.stderr.contains("token 1"), "{r:?}");
    // --wait 0 tries once
    let r = sb.run(&["migrate", "--wait", "0"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert!(r.elapsed < Duration::from_secs(1), "{:?}", r.elapsed);
    stop(holder);
}

#[test]
fn lock_status_reports_a_healthy_holder_with_pid_host_and_token() {
    let sb = Sandbox::new();
    let holder = start_holder(&sb, &[]);
    let (code, v) = sb.status(&[]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["verdict"], "HEALTHY");
    assert_eq!(v["engine"], "sqlite");
    assert_eq!(v["grade"], "B");
    assert_eq!(v["held"], true);
    assert_eq!(v["holder"]["pid"], holder.id());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(v["holder"]["host"], host.trim());
    assert_eq!(v["fencing_token"], 1);
    assert!(v["heartbeat_age_s"].as_f64().unwrap() < 45.0);
    // The human view names the same things.
    let r = sb.run(&["lock-status"]);
    assert_eq!(r.code, 0);
    assert!(r.stdout.starts_with("HEALTHY"), "{r:?}");
    assert!(r.stdout.contains(&format!("pid={}", holder.id())), "{r:?}");
    assert!(r.stdout.contains("fencing token     1"), "{r:?}");
    stop(holder);
}

#[test]
fn a_paused_holder_is_reported_stuck_and_keeps_its_lock() {
    let sb = Sandbox::new();
    let short = ["--lock-ttl", "2s", "--heartbeat-interval", "500ms"];
    let holder = start_holder(&sb, &short);
    signal(holder.id(), Signal::STOP);
    let v = sb.wait_status(&short, Duration::from_secs(10), |v| v["verdict"] == "STUCK");
    assert_eq!(v["held"], true);
    assert!(v["heartbeat_age_s"].as_f64().unwrap() > 2.0, "{v}");
    let r = sb.run(&[
        "lock-status",
        "--lock-ttl",
        "2s",
        "--heartbeat-interval",
        "500ms",
    ]);
    assert_eq!(r.code, 10, "{r:?}");
    assert!(r.stdout.starts_with("STUCK"), "{r:?}");
    assert!(r.stdout.contains("next step"), "{r:?}");
    // The kernel still holds its flock: nobody else may start.
    let r = sb.run(&["migrate", "--wait", "0"]);
    assert_eq!(r.code, 3, "{r:?}");
    signal(holder.id(), Signal::CONT);
    let done = Run::wait(holder, Duration::from_secs(120));
    assert_eq!(done.code, 0, "{done:?}");
    let (code, v) = sb.status(&[]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")));
}
