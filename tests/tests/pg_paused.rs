//! PostgreSQL: a holder paused with SIGSTOP keeps its session (and so the lock) but stops
//! heartbeating: `lock-status` says STUCK (exit 10), other runners are refused (exit 3) rather
//! than breaking a lock whose session is alive; after SIGCONT the holder finishes normally.

use std::time::Duration;

use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox, signal};
use rustix::process::Signal;

#[test]
fn a_paused_holder_is_stuck_not_broken_and_finishes_after_sigcont() {
    let sb = Sandbox::new();
    let short = ["--heartbeat-interval", "1s", "--lock-ttl", "3s"];
    sb.write_migration(
        "0001_ran.sql",
        "CREATE TABLE ran (version INTEGER PRIMARY KEY);\nINSERT INTO ran VALUES (1);",
    );
    sb.write_migration(
        "0002_slow.sql",
        "INSERT INTO ran VALUES (2);\nSELECT pg_sleep(6);",
    );
    let db = PgDb::new();
    let mut args = vec!["migrate"];
    args.extend_from_slice(&short);
    let holder = db.spawn(&sb, &args);
    db.wait_for(
        "SELECT count(*) FROM dbwarden_lock WHERE state = 'RUNNING' AND migration_version = 2",
        Duration::from_secs(60),
    );
    signal(holder.id(), Signal::STOP);
    let mut status_args = vec!["-u", db.url.as_str()];
    status_args.extend_from_slice(&short);
    let v = sb.wait_status(&status_args, Duration::from_secs(20), |v| {
        v["verdict"] == "STUCK"
    });
    assert_eq!(v["held"], true, "{v}");
    let (code, _) = sb.status(&status_args);
    assert_eq!(code, 10);
    let mut run = vec!["migrate", "--wait", "0"];
    run.extend_from_slice(&short);
    let r = db.run(&sb, &run);
    assert_eq!(r.code, 3, "a live session's lock is never broken: {r:?}");
    signal(holder.id(), Signal::CONT);
    let r = Run::wait(holder, Duration::from_secs(60));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        db.query("SELECT string_agg(version::text, ',' ORDER BY version) FROM ran"),
        ["1,2"]
    );
    let (code, v) = sb.status(&status_args);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
}
