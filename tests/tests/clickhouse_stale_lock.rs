//! ClickHouse stale locks: eight processes race to break the same stale lock and exactly one
//! wins (one RENAME succeeds); a lock stamped in the future is a clock-skew error and is left
//! alone.

use std::time::Duration;

use dbwarden_tests::clickhouse::TestDb;
use dbwarden_tests::{Run, Sandbox};

#[test]
fn eight_processes_race_to_break_one_stale_lock_and_exactly_one_wins() {
    let db = TestDb::new();
    let sb = Sandbox::new();
    let url = db.url();
    sb.write_migration(
        "0001_log.sql",
        "CREATE TABLE log (stmt String) ENGINE = Log;",
    );
    assert_eq!(sb.run(&["migrate", "-u", &url]).code, 0);
    let mut tokens_before = db.fence_tokens().len();
    for round in 1..=3 {
        // A dead holder's lock: newest row a minute old, 3 s lease.
        db.fabricate_stale_lock("dbwarden_lock_default", 60, 3);
        let v = round + 1;
        sb.write_migration(
            &format!("{v:04}_round{round}.sql"),
            &format!("INSERT INTO log VALUES ('{round}');\nSELECT sleep(1);"),
        );
        let children: Vec<_> = (0..8)
            .map(|_| sb.spawn(&["migrate", "-u", &url, "--wait", "1m"]))
            .collect();
        let runs: Vec<Run> = children
            .into_iter()
            .map(|c| Run::wait(c, Duration::from_secs(90)))
            .collect();
        for r in &runs {
            assert_eq!(r.code, 0, "round {round}: {r:?}");
        }
        let breakers = runs
            .iter()
            .filter(|r| r.stderr.contains("broke a stale lock"))
            .count();
        assert_eq!(breakers, 1, "round {round}: exactly one breaker: {runs:?}");
        assert_eq!(
            db.count("SELECT count() FROM dbwarden_lock_audit WHERE action = 'broken_stale_lock'"),
            round as i64,
            "one audit row per broken lock"
        );
        assert_eq!(
            db.tables_like("dbwarden_lock_default_stale_").len(),
            round,
            "one tombstone per broken lock"
        );
        assert!(
            !db.has_table("dbwarden_lock_default"),
            "released at the end"
        );
        let tokens = db.fence_tokens();
        assert_eq!(
            tokens.len(),
            tokens_before + 8,
            "eight acquisitions, one at a time"
        );
        tokens_before = tokens.len();
        assert_eq!(
            db.count(&format!("SELECT count() FROM log WHERE stmt = '{round}'")),
            1,
            "the round's migration ran once"
        );
    }
}

#[test]
fn a_lock_stamped_in_the_future_is_a_clock_skew_error_and_is_left_alone() {
    let db = TestDb::new();
    let sb = Sandbox::new();
    let url = db.url();
    sb.write_migration(
        "0001_log.sql",
        "CREATE TABLE log (stmt String) ENGINE = Log;",
    );
    // age -600: ten minutes in the future of the server clock.
    db.query(
        "CREATE TABLE dbwarden_lock_default ENGINE = Log AS SELECT 'holder' AS kind, \
         '6f1c0a4e-0000-4000-8000-000000000001' AS execution_id, 'other' AS host, toUInt32(7) AS pid, \
         'o' AS owner, 'c' AS command, toUInt32(now()) AS started_at, now() + 600 AS at, \
         toUInt64(0) AS fencing_token, toUInt32(3) AS ttl_s, toUInt64(0) AS seq",
    );
    let r = sb.run(&["migrate", "-u", &url, "--wait", "0"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("clock skew"), "{r:?}");
    assert!(r.stderr.contains("dbwarden unlock"), "{r:?}");
    assert!(
        db.has_table("dbwarden_lock_default"),
        "never broken automatically"
    );
    assert!(!db.has_table("log"));
    let (code, v) = sb.status(&["-u", &url]);
    assert_eq!(code, 0, "{v}");
    assert!(v.to_string().contains("clock skew"), "{v}");
}
