//! While another runner holds the MySQL lock: a waiter takes over as soon as the holder
//! releases, and a paused holder shows as STUCK. What every engine does for a declined run
//! (`--skip-if-locked`, `--wait 0`, `--wait 1s`) is `lock_held.rs`'s `every_engine`.

use std::time::{Duration, Instant};

use dbwarden_tests::mysql::TestDb;
use dbwarden_tests::{Run, Sandbox, signal};
use rustix::process::Signal;

/// Start a runner whose second migration sleeps `secs` on the server; wait until it holds.
fn start_holder(sb: &Sandbox, db: &TestDb, secs: u32, extra: &[&str]) -> std::process::Child {
    sb.write_migration(
        "0001_ran.sql",
        "CREATE TABLE ran (version INT PRIMARY KEY);",
    );
    sb.write_migration(
        "0002_slow.sql",
        &format!("INSERT INTO ran VALUES (2);\nSELECT SLEEP({secs});"),
    );
    let mut args = vec!["migrate", "-u", &db.url];
    args.extend_from_slice(extra);
    let child = sb.spawn(&args);
    sb.wait_status(&["-u", &db.url], Duration::from_secs(60), |v| {
        v["held"] == true && v["status"]["migration_version"] == 2
    });
    child
}

/// The waiter has a migration the holder does not (written after the holder read its folder):
/// it must take the lock over on release and apply it, with the next token.
#[test]
fn a_waiter_takes_over_when_the_holder_releases() {
    let (sb, db) = (Sandbox::new(), TestDb::new());
    let holder = start_holder(&sb, &db, 3, &[]);
    sb.write_migration("0003_after.sql", "INSERT INTO ran VALUES (3);");
    let waiter = sb.spawn(&["migrate", "--wait", "60s", "-u", &db.url]);
    let h = Run::wait(holder, Duration::from_secs(60));
    let released = Instant::now();
    let w = Run::wait(waiter, Duration::from_secs(60));
    eprintln!(
        "hand-over: the waiter exited {:?} after the holder",
        released.elapsed()
    );
    assert_eq!(h.code, 0, "{h:?}");
    assert_eq!(w.code, 0, "{w:?}");
    assert!(h.stderr.contains("applied 2 migration(s)"), "{h:?}");
    assert!(
        w.stderr
            .contains("applied 1 migration(s), 2 already applied"),
        "{w:?}"
    );
    assert!(w.stderr.contains("fencing token 2"), "{w:?}");
    assert_eq!(db.count("SELECT fencing_token FROM dbwarden_lock"), 2);
    assert_eq!(
        db.query("SELECT GROUP_CONCAT(version ORDER BY version) FROM ran"),
        ["2,3"]
    );
}

/// A waiter with nothing of its own to do: once the holder is done it finds everything
/// applied in one consistent read and exits 0 without taking the lock or a token.
#[test]
fn a_waiter_with_the_same_migrations_finds_them_applied_and_takes_no_token() {
    let (sb, db) = (Sandbox::new(), TestDb::new());
    let holder = start_holder(&sb, &db, 2, &[]);
    let waiter = sb.spawn(&["migrate", "--wait", "60s", "-u", &db.url]);
    let h = Run::wait(holder, Duration::from_secs(60));
    let w = Run::wait(waiter, Duration::from_secs(60));
    assert_eq!(h.code, 0, "{h:?}");
    assert_eq!(w.code, 0, "{w:?}");
    assert!(
        w.stderr
            .contains("applied 0 migration(s), 2 already applied")
            && w.stderr
                .contains("checked in one consistent read; fencing token 1 unchanged"),
        "{w:?}"
    );
    assert_eq!(db.count("SELECT fencing_token FROM dbwarden_lock"), 1);
}

#[test]
fn a_paused_holder_is_stuck_and_carries_on_when_resumed() {
    let (sb, db) = (Sandbox::new(), TestDb::new());
    let short = ["--lock-ttl", "3s", "--heartbeat-interval", "1s"];
    let holder = start_holder(&sb, &db, 6, &short);
    signal(holder.id(), Signal::STOP);
    let mut args = vec!["-u", db.url.as_str()];
    args.extend_from_slice(&short);
    let v = sb.wait_status(&args, Duration::from_secs(30), |v| v["verdict"] == "STUCK");
    assert_eq!(v["held"], true, "{v}");
    assert_eq!(v["holder"]["pid"], holder.id(), "{v}");
    assert_eq!(sb.status(&args).0, 10);
    signal(holder.id(), Signal::CONT);
    let r = Run::wait(holder, Duration::from_secs(60));
    assert_eq!(r.code, 0, "the session kept the lock while paused: {r:?}");
    assert_eq!(
        db.count("SELECT COUNT(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"),
        2
    );
}

/// Runners queued behind a holder, with work that stays pending after it (a migration that
/// fails every time): each must take the lock in turn and report the failure (exit 1). A waiter
/// whose blocking `GET_LOCK` got the lock looks while it holds it; were it to give the lock
/// back to look, the next blocked waiter would take it to look too, and so on, with nobody
/// claiming it until every `--wait` ran out (exit 3).
#[test]
fn queued_runners_with_failing_work_each_take_the_lock_in_turn() {
    let (sb, db) = (Sandbox::new(), TestDb::new());
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INT);");
    assert_eq!(sb.run(&["migrate", "-u", &db.url]).code, 0);
    sb.write_migration("0002_bad.sql", "SELECT * FROM no_such_table;");
    let holder = sb.spawn(&["run", "-u", &db.url, "--", "sleep", "2"]);
    sb.wait_status(&["-u", &db.url], Duration::from_secs(20), |v| {
        v["verdict"] == "HEALTHY"
    });
    let waiters: Vec<_> = (0..4)
        .map(|_| sb.spawn(&["migrate", "-u", &db.url, "--wait", "15s"]))
        .collect();
    let h = Run::wait(holder, Duration::from_secs(30));
    assert_eq!(h.code, 0, "{h:?}");
    let runs: Vec<_> = waiters
        .into_iter()
        .map(|c| Run::wait(c, Duration::from_secs(60)))
        .collect();
    for r in &runs {
        assert_eq!(r.code, 1, "{runs:?}");
        assert!(r.stderr.contains("no_such_table"), "{r:?}");
    }
    // The first migrate, the `run`, and one claim per waiter.
    assert_eq!(db.count("SELECT fencing_token FROM dbwarden_lock"), 6);
}
