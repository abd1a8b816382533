//! The server ends the lock session under a running holder (`KILL <connection id>`, as a DBA
//! or a failover would): the named lock is gone at once, so the runner must stop, exit 4 and
//! write nothing more, even though its process is alive and well.

use std::time::Duration;

use dbwarden_tests::mysql::TestDb;
use dbwarden_tests::{Run, Sandbox};

const SHORT: [&str; 4] = ["--lock-ttl", "3s", "--heartbeat-interval", "1s"];

/// Everything the run has recorded, except the heartbeat's liveness timestamp.
fn recorded(db: &TestDb) -> Vec<String> {
    let mut v = db.query(
        "SELECT CONCAT_WS('|', state, fencing_token, migration_version, execution_id, db_connection_id) FROM dbwarden_lock",
    );
    v.extend(db.query(
        "SELECT CONCAT_WS('|', version, state, statements_done, fencing_token, COALESCE(CAST(finished_at AS CHAR), '-')) FROM dbwarden_migrations ORDER BY version",
    ));
    v.push(
        db.count("SELECT COUNT(*) FROM dbwarden_lock_audit")
            .to_string(),
    );
    v
}

#[test]
fn killing_the_lock_connection_during_a_long_statement_stops_the_runner_with_exit_4() {
    let (sb, db) = (Sandbox::new(), TestDb::new());
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INT);");
    sb.write_migration(
        "0002_long.sql",
        "INSERT INTO a VALUES (1);\nSELECT SLEEP(30);\nCREATE TABLE after_kill (x INT);",
    );
    sb.write_migration("0003_later.sql", "CREATE TABLE later (x INT);");
    let mut args = vec!["migrate", "-u", &db.url];
    args.extend_from_slice(&SHORT);
    let holder = sb.spawn(&args);
    db.wait_count(
        "SELECT COUNT(*) FROM dbwarden_migrations WHERE version = 2 AND statements_done = 1",
        1,
        Duration::from_secs(60),
    );
    db.wait_running("SELECT SLEEP(30)", Duration::from_secs(30));
    let v = sb.status(&["-u", &db.url]).1;
    assert_eq!(v["verdict"], "HEALTHY", "{v}");
    let conn_id = v["status"]["db_connection_id"].as_str().unwrap().to_owned();
    assert_eq!(v["session_id"], format!("connection {conn_id}"), "{v}");
    let before = recorded(&db);
    db.exec(&format!("KILL {conn_id}"));

    let r = Run::wait(holder, Duration::from_secs(30));
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("lock lost"), "{r:?}");
    assert!(
        r.elapsed < Duration::from_secs(25),
        "the runner waited for SLEEP(30) instead of noticing the kill: {r:?}"
    );
    // Nothing more was written: no statement after the kill, no journal entry, no final state.
    assert_eq!(recorded(&db), before);
    assert!(!db.has_table("after_kill"));
    assert!(!db.has_table("later"));
    assert_eq!(
        db.query(
            "SELECT CONCAT(state, ':', statements_done) FROM dbwarden_migrations WHERE version = 2"
        ),
        ["RUNNING:1"]
    );
    // The lock is free and the row still says RUNNING: the next run will inspect it.
    let (code, v) = sb.status(&["-u", &db.url]);
    assert_eq!((code, v["verdict"].as_str()), (11, Some("DEAD")), "{v}");
}

/// The holder's idle liveness session ends while the holder lives (a DBA's `KILL`, a network
/// cut of that one connection): a waiting runner would now take it for dead and kill its lock
/// session, so the holder must find out at its next heartbeat and stop (exit 4) before its
/// next statement.
#[test]
fn losing_the_liveness_session_stops_the_runner_with_exit_4() {
    let (sb, db) = (Sandbox::new(), TestDb::new());
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INT);");
    sb.write_migration(
        "0002_long.sql",
        "INSERT INTO a VALUES (1);\nSELECT SLEEP(8);\nCREATE TABLE after_kill (x INT);",
    );
    let mut args = vec!["migrate", "-u", &db.url];
    args.extend_from_slice(&SHORT);
    let holder = sb.spawn(&args);
    db.wait_running("SELECT SLEEP(8)", Duration::from_secs(30));
    let v = sb.status(&["-u", &db.url]).1;
    assert_eq!(v["verdict"], "HEALTHY", "{v}");
    let conn_id = v["status"]["db_connection_id"].as_str().unwrap().to_owned();
    let alive = db.query(&format!(
        "SELECT CAST(IS_USED_LOCK('dbwarden.alive.{conn_id}') AS SIGNED)"
    ));
    assert_ne!(alive, ["NULL"], "the holder keeps a liveness session");
    assert_ne!(alive[0], conn_id, "on a connection of its own");
    db.exec(&format!("KILL {}", alive[0]));

    let r = Run::wait(holder, Duration::from_secs(30));
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("liveness session"), "{r:?}");
    assert!(!db.has_table("after_kill"), "nothing ran after the loss");
    let (code, v) = sb.status(&["-u", &db.url]);
    assert_eq!((code, v["verdict"].as_str()), (11, Some("DEAD")), "{v}");
}
