//! PostgreSQL: the lock session is terminated (`pg_terminate_backend`) while a long migration
//! runs. The server freed the lock with the session, so the runner must stop: it exits 4 and
//! writes nothing after the loss; the next run recovers.

use std::time::Duration;

use dbwarden_tests::Sandbox;
use dbwarden_tests::pg::PgDb;

#[test]
fn a_terminated_lock_session_makes_the_runner_exit_4_and_write_nothing_more() {
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_ran.sql",
        "CREATE TABLE ran (version INTEGER PRIMARY KEY);\nINSERT INTO ran VALUES (1);\nCREATE TABLE knob (secs FLOAT8 NOT NULL);\nINSERT INTO knob VALUES (60);",
    );
    sb.write_migration(
        "0002_long.sql",
        "INSERT INTO ran VALUES (2);\nSELECT pg_sleep((SELECT secs FROM knob));",
    );
    sb.write_migration("0003_after.sql", "INSERT INTO ran VALUES (3);");
    let db = PgDb::new();
    // A short heartbeat, so a beat after the loss would have had every chance to write.
    let runner = db.spawn(
        &sb,
        &["migrate", "--heartbeat-interval", "1s", "--lock-ttl", "3s"],
    );
    db.wait_for(
        "SELECT count(*) FROM dbwarden_lock WHERE state = 'RUNNING' AND migration_version = 2",
        Duration::from_secs(60),
    );
    db.wait_knob_sleep();
    std::thread::sleep(Duration::from_millis(1500)); // a heartbeat or two have happened
    let mut c = db.client();
    let before = c.rows(
        "SELECT extract(epoch FROM last_heartbeat_at)::float8, fencing_token, db_connection_id FROM dbwarden_lock",
    )[0]
        .clone();
    let backend = &before[2];
    c.exec("UPDATE knob SET secs = 0");
    let terminated_at = c.query(&format!(
        "SELECT extract(epoch FROM clock_timestamp())::float8 FROM (SELECT pg_terminate_backend({backend})) t"
    ))[0]
        .parse::<f64>()
        .unwrap();

    let r = dbwarden_tests::Run::wait(runner, Duration::from_secs(60));
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("lock lost"), "{r:?}");
    assert!(
        r.stderr.contains(backend.as_str()),
        "names the session: {r:?}"
    );
    // Wait a few heartbeat intervals more: nothing may appear.
    std::thread::sleep(Duration::from_secs(2));

    // Nothing written after the loss: the status row is as it was (RUNNING, heartbeat not
    // newer than the termination), migration 1 only, no audit row.
    let after = c.rows(
        "SELECT extract(epoch FROM last_heartbeat_at)::float8, fencing_token, state, migration_version FROM dbwarden_lock",
    )[0]
        .clone();
    let hb: f64 = after[0].parse().unwrap();
    assert!(
        hb <= terminated_at,
        "a heartbeat was written after the loss: {after:?}"
    );
    assert_eq!(after[1], before[1]);
    assert_eq!((after[2].as_str(), after[3].as_str()), ("RUNNING", "2"));
    assert_eq!(
        c.query("SELECT string_agg(version || ':' || state, ',' ORDER BY version) FROM dbwarden_migrations"),
        ["1:APPLIED"]
    );
    assert_eq!(
        c.count(&format!(
            "SELECT count(*) FROM dbwarden_migrations WHERE finished_at > to_timestamp({terminated_at})"
        )),
        0
    );
    assert_eq!(
        c.query("SELECT string_agg(version::text, ',') FROM ran"),
        ["1"]
    );
    assert_eq!(c.count("SELECT count(*) FROM dbwarden_lock_audit"), 0);

    let (code, v) = db.status(&sb, &[]);
    assert_eq!((code, v["verdict"].as_str()), (11, Some("DEAD")), "{v}");

    let r = db.run(&sb, &["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        c.query("SELECT string_agg(version::text, ',' ORDER BY version) FROM ran"),
        ["1,2,3"]
    );
}
