//! A SQLite lock file whose flock nobody holds, left by someone else: what core's takeover judge
//! decides from what the engine reports about its writer. Another host's file and a live
//! process's file are never taken over (exit 3, the file stays, the message says what to do);
//! a dead process's file on this host is, at once, and audited.

use std::process::{Command, Stdio};

use dbwarden_tests::{Sandbox, sqlite_count};

/// This host, as dbwarden names it in a lock file.
fn host() -> String {
    dbwarden_core::holder::hostname()
}

/// A lock file as a holder writes it, with nobody holding its flock.
fn leave_lock_file(sb: &Sandbox, host: &str, pid: u32) {
    let body = serde_json::json!({
        "pid": pid,
        "host": host,
        "execution_id": "3f2a9c1e-0000-4000-8000-000000000017",
        "namespace": "default",
        "start_time": "2026-12-01T03:00:00Z",
        "heartbeat_at": "2026-12-01T03:00:05Z",
        "owner": "left-behind",
        "command": "dbwarden migrate",
        "fencing_token": 0,
    });
    std::fs::write(
        sb.path().join("dbwarden.db.dbwarden-lock"),
        body.to_string(),
    )
    .unwrap();
}

fn one_migration(sb: &Sandbox) {
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
}

#[test]
fn another_hosts_lock_file_is_never_taken_over() {
    let sb = Sandbox::new();
    one_migration(&sb);
    leave_lock_file(&sb, "some-other-host", 4242);
    let r = sb.run(&["migrate", "--wait", "0"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert!(
        r.stderr.contains("written by host some-other-host")
            && r.stderr.contains("never removed automatically"),
        "{r:?}"
    );
    assert!(sb.path().join("dbwarden.db.dbwarden-lock").exists());
    assert!(
        !sb.db().exists()
            || sqlite_count(
                &sb.db(),
                "SELECT count(*) FROM sqlite_master WHERE name = 'a'"
            ) == 0
    );
}

#[test]
fn a_live_processs_lock_file_is_never_taken_over() {
    let sb = Sandbox::new();
    one_migration(&sb);
    // Alive for as long as the test may take (the first `dbwarden` call may build the binary
    // first); killed below.
    let mut live = Command::new("sleep")
        .arg("600")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    leave_lock_file(&sb, &host(), live.id());
    let r = sb.run(&["migrate", "--wait", "0"]);
    let _ = live.kill();
    let _ = live.wait();
    assert_eq!(r.code, 3, "{r:?}");
    assert!(
        r.stderr.contains(&format!("pid {} named in", live.id()))
            && r.stderr.contains("is alive but does not hold the lock"),
        "{r:?}"
    );
    assert!(sb.path().join("dbwarden.db.dbwarden-lock").exists());
}

#[test]
fn a_dead_processs_lock_file_is_taken_over_at_once_and_audited() {
    let sb = Sandbox::new();
    one_migration(&sb);
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    leave_lock_file(&sb, &host(), pid);
    let r = sb.run(&["migrate", "--wait", "0"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM dbwarden_lock_audit WHERE action = 'broken_stale_lock' AND holder LIKE '%left-behind%'"
        ),
        1
    );
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"
        ),
        1
    );
}
