//! A holder paused with SIGSTOP in the middle of a migration, on every engine.
//!
//! Where the lock is a server session (SQLite's flock, PostgreSQL advisory locks, MySQL
//! `GET_LOCK`) the paused process still owns it: lock-status says STUCK (exit 10), other runners
//! are refused after `--wait` (exit 3) and break nothing, and after SIGCONT the holder finishes.
//! Where the lock is a lease (ClickHouse, the Redis lease) it runs out: a successor takes over
//! and finishes, and the paused holder, once resumed, is fenced out -- it exits 4 and writes
//! nothing more. Either way every statement ran exactly once.

use std::time::Duration;

use dbwarden_tests::chaos::{ClickHouse, MySql, Postgres, Redis, Sqlite, Target};
use dbwarden_tests::modes::Case;
use dbwarden_tests::signal;
use rustix::process::Signal;

fn paused_holder(target: &dyn Target) {
    // A session lock outlives the pause, so its holder must heartbeat again at once after
    // SIGCONT: give that first beat a whole second. A lease must run out during the pause.
    let case = if target.lease_expires() {
        Case::new(target)
    } else {
        Case::patient(target)
    };
    case.log_table();
    case.slow_idempotent(2, 3000);
    case.inserts(3, 1);
    let holder = case.spawn_guarded(&[]);
    let pid = holder.id();
    case.wait_inside(2, 1);
    signal(pid, Signal::STOP);

    if !target.lease_expires() {
        let v = case.wait_status(Duration::from_secs(30), |code, v| {
            v["verdict"] == "STUCK" && code == 10
        });
        assert_eq!(v["holder"]["pid"].as_u64(), Some(u64::from(pid)), "{v}");
        let r = case.migrate(&["--wait", "1s"]);
        assert_eq!(r.code, 3, "[{}] {r:?}", target.name());
        assert!(r.stderr.contains("lock busy"), "{r:?}");
        assert_eq!(case.ran("m2.s3"), 0, "nobody went past the paused holder");

        signal(pid, Signal::CONT);
        let r = holder.wait(Duration::from_secs(60));
        assert_eq!(
            r.code,
            0,
            "[{}] the resumed holder finishes: {r:?}",
            target.name()
        );
        case.assert_each_ran_once(&["m2.s1", "m2.s3", "m3.s1"]);
        assert_eq!(case.applied(), [1, 2, 3]);
        let tokens = case.tokens();
        assert!(tokens.windows(2).all(|w| w[0] == w[1]), "{tokens:?}");
    } else {
        let successor = case.spawn_guarded(&[]);
        // Well past the 2 s lease: the successor has taken it (and, where nothing else holds
        // it back, finished).
        std::thread::sleep(Duration::from_secs(5));
        signal(pid, Signal::CONT);
        let paused = holder.wait(Duration::from_secs(60));
        let next = successor.wait(Duration::from_secs(60));
        assert_eq!(
            paused.code,
            4,
            "[{}] the resumed holder lost its lease: {paused:?}",
            target.name()
        );
        assert_eq!(next.code, 0, "[{}] {next:?}", target.name());
        case.assert_each_ran_once(&["m2.s1", "m2.s3", "m3.s1"]);
        assert_eq!(case.applied(), [1, 2, 3]);
        let tokens = case.tokens();
        assert!(
            tokens[0] < tokens[2],
            "migration 3 carries the successor's newer token: {tokens:?}"
        );
    }
    case.assert_available();
}

#[test]
fn sqlite() {
    paused_holder(&Sqlite);
}

#[test]
fn postgres() {
    paused_holder(&Postgres::default());
}

#[test]
fn mysql() {
    paused_holder(&MySql::default());
}

#[test]
fn clickhouse() {
    paused_holder(&ClickHouse::default());
}

#[test]
fn redis() {
    paused_holder(&Redis::default());
}
