//! `dbwarden unlock`: shows the holder, needs --yes without a terminal, honours --holder,
//! fences the holder out and is audited.

use std::time::Duration;

use dbwarden_tests::{Run, Sandbox, signal, slow_select, sqlite_count};
use rustix::process::Signal;

#[test]
fn unlocking_a_dead_holder_is_audited_and_fences_it_out() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration(
        "0002_slow.sql",
        &format!("CREATE TABLE slow AS {};", slow_select(6)),
    );
    let holder = sb.spawn(&["migrate"]);
    // Held, and the status row written: the holder is past its acquisition.
    let held = sb.wait_status(&[], Duration::from_secs(30), |v| {
        v["held"] == true && v["status"]["state"] == "RUNNING"
    });
    let execution = held["holder"]["execution_id"].as_str().unwrap().to_owned();
    signal(holder.id(), Signal::KILL);
    let _ = Run::wait(holder, Duration::from_secs(10));
    let (code, v) = sb.status(&[]);
    assert_eq!(code, 11, "{v}\nheld was: {held}\nfiles: {:?}", sb.listing());

    // --holder with someone else's id changes nothing.
    let other = uuid::Uuid::new_v4().to_string();
    let r = sb.run(&["unlock", "--yes", "--holder", &other]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains(&execution), "{r:?}");
    assert_eq!(sb.status(&[]).0, 11);

    let r = sb.run(&["unlock", "--yes", "--holder", &execution]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.starts_with("DEAD"),
        "the holder is shown first: {r:?}"
    );
    assert!(r.stderr.contains(&execution), "{r:?}");
    let (code, v) = sb.status(&[]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
    assert_eq!(
        v["fencing_token"], 2,
        "unlock bumps the token so the old holder is fenced out"
    );
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM dbwarden_lock_audit WHERE action = 'forced_unlock'"
        ),
        1
    );
    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"
        ),
        2
    );
}

#[test]
fn unlocking_a_live_holder_makes_it_stop_with_exit_4() {
    let sb = Sandbox::new();
    let short = ["--lock-ttl", "3s", "--heartbeat-interval", "1s"];
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration(
        "0002_journaled.sql",
        &format!(
            "-- dbwarden:no-transaction\nCREATE TABLE IF NOT EXISTS s1 AS {slow};\nCREATE TABLE IF NOT EXISTS s2 AS {slow};\nCREATE TABLE IF NOT EXISTS s3 AS {slow};",
            slow = slow_select(2)
        ),
    );
    let mut args = vec!["migrate"];
    args.extend_from_slice(&short);
    let holder = sb.spawn(&args);
    // Inside migration 2: its journal row is written with the status row's version.
    sb.wait_status(&short, Duration::from_secs(30), |v| {
        v["held"] == true
            && v["status"]["state"] == "RUNNING"
            && v["status"]["migration_version"] == 2
    });
    let r = sb.run(&["unlock", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.starts_with("HEALTHY"),
        "the holder is shown first: {r:?}"
    );
    let done_at_unlock = sqlite_count(
        &sb.db(),
        "SELECT coalesce(max(statements_done), 0) FROM dbwarden_migrations WHERE version = 2",
    );
    let r = Run::wait(holder, Duration::from_secs(60));
    assert_eq!(r.code, 4, "the old holder must notice and stop: {r:?}");
    assert!(r.stderr.contains("lock lost"), "{r:?}");
    // It stopped before its next statement: at most the statement in flight at the unlock
    // completed (SQLite serialises it with the unlock), nothing after it.
    let done = sqlite_count(
        &sb.db(),
        "SELECT statements_done FROM dbwarden_migrations WHERE version = 2",
    );
    assert!(
        done <= done_at_unlock + 1 && done < 3,
        "statements_done {done_at_unlock} -> {done}"
    );
    // The next runner takes over with a newer token and finishes the idempotent rest.
    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(sqlite_count(&sb.db(), "SELECT fencing_token FROM dbwarden_lock") >= 2);
}
