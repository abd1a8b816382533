//! ClickHouse: a holder paused (SIGSTOP) past its lease is replaced; after SIGCONT it finds itself
//! fenced out before its next statement, exits 4, and nothing it would have written appears.

use std::time::{Duration, Instant};

use dbwarden_tests::clickhouse::TestDb;
use dbwarden_tests::{Run, Sandbox, signal};
use rustix::process::Signal;

const LEASE: [&str; 4] = ["--lock-ttl", "3s", "--heartbeat-interval", "1s"];

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn a_holder_paused_past_its_lease_is_fenced_out_before_its_next_statement() {
    let db = TestDb::new();
    let sb = Sandbox::new();
    let url = db.url();
    sb.write_migration(
        "0001_log.sql",
        "CREATE TABLE log (stmt String) ENGINE = Log;",
    );
    sb.write_migration(
        "0002_paused.sql",
        "INSERT INTO log VALUES ('2.1');\n\
         SELECT sleep(3);\n\
         SELECT sleep(3);\n\
         INSERT INTO log VALUES ('2.4');\n\
         INSERT INTO log VALUES ('2.5');\n",
    );
    sb.write_migration("0003_after.sql", "INSERT INTO log VALUES ('3');");
    let mut a_args = vec!["migrate", "-u", url.as_str()];
    a_args.extend_from_slice(&LEASE);
    let a = sb.spawn(&a_args);
    wait_until(
        "A's first statement of migration 2",
        Duration::from_secs(60),
        || {
            db.count_or_zero(
                "SELECT count() FROM dbwarden_migrations WHERE version = 2 AND statements_done = 1",
            ) >= 1
        },
    );
    // A is inside `SELECT sleep(3)` (statement 2): freeze it there, past its 3 s lease.
    signal(a.id(), Signal::STOP);
    let dead = sb.wait_status(&["-u", &url], Duration::from_secs(15), |v| {
        v["verdict"] == "DEAD"
    });
    assert_eq!(dead["held"], false, "{dead}");

    // B breaks the stale lock and resumes A's migration at the idempotent SELECT.
    let mut b_args = a_args.clone();
    b_args.extend_from_slice(&["--wait", "1m"]);
    let b = sb.spawn(&b_args);
    wait_until("B's acquire", Duration::from_secs(30), || {
        db.fence_tokens().len() == 2
    });
    // Wake A while B holds the lock.
    signal(a.id(), Signal::CONT);
    let ra = Run::wait(a, Duration::from_secs(60));
    assert_eq!(ra.code, 4, "A must stop as fenced out: {ra:?}");
    assert!(ra.stderr.contains("lock lost"), "{ra:?}");
    let rb = Run::wait(b, Duration::from_secs(60));
    assert_eq!(rb.code, 0, "{rb:?}");
    assert!(rb.stderr.contains("resuming at statement 2"), "{rb:?}");

    // Every row once: A wrote nothing after its pause, B did the rest.
    assert_eq!(
        db.lines("SELECT stmt FROM log ORDER BY stmt"),
        ["2.1", "2.4", "2.5", "3"]
    );
    // A (token 1) never journaled past statement 1, never touched migration 3, and wrote no
    // final state.
    assert_eq!(
        db.count("SELECT max(statements_done) FROM dbwarden_migrations WHERE fencing_token = 1 AND version = 2"),
        1
    );
    assert_eq!(
        db.count("SELECT count() FROM dbwarden_migrations WHERE fencing_token = 1 AND version = 3"),
        0
    );
    assert_eq!(
        db.count("SELECT count() FROM dbwarden_lock WHERE fencing_token = 1 AND state IN ('COMPLETE', 'FAILED', 'AVAILABLE')"),
        0
    );
    assert_eq!(
        db.lines(
            "SELECT version, argMax(state, (fencing_token, seq)), max(fencing_token) FROM dbwarden_migrations \
             GROUP BY version ORDER BY version"
        ),
        ["1\tAPPLIED\t1", "2\tAPPLIED\t2", "3\tAPPLIED\t2"]
    );
    assert_eq!(
        db.count("SELECT count() FROM dbwarden_lock_audit WHERE action = 'broken_stale_lock'"),
        1
    );
    let (code, v) = sb.status(&["-u", &url]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
}
