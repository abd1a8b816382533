//! PostgreSQL: the lock is the Python dbwarden's advisory key, so a session holding that key
//! (another tool, the Python runner) excludes `dbwarden migrate` and the other way round;
//! `--wait 0` gives exit 3 naming the holder, `--skip-if-locked` exits 0 with an audit row;
//! the tables can live in another schema.

use std::time::Duration;

use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox};

/// The Python dbwarden's keys, computed independently:
/// `python3 -c "import hashlib; h = hashlib.md5(b'dbwarden:default:primary').hexdigest(); print(int(h[:16], 16) & 0x7FFFFFFFFFFFFFFF)"`
const DEFAULT_KEY: i64 = 6_544_297_242_513_093_592;
const BILLING_KEY: i64 = 3_215_595_141_490_753_274;

#[test]
fn a_foreign_session_holding_the_python_key_excludes_dbwarden() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    let db = PgDb::new();
    let mut python = db.client();
    let pid = python.backend_pid();
    assert_eq!(
        python.query(&format!("SELECT pg_try_advisory_lock({DEFAULT_KEY})")),
        ["true"]
    );

    let r = db.run(&sb, &["migrate", "--wait", "0"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert!(r.stderr.contains(&format!("backend pid {pid}")), "{r:?}");
    let (code, v) = db.status(&sb, &[]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("HEALTHY")), "{v}");
    assert!(
        v["session_id"].as_str().unwrap().contains(&pid.to_string()),
        "{v}"
    );
    assert!(v["discrepancy"].as_str().is_some(), "{v}");
    assert!(v["notes"].to_string().contains("another tool"), "{v}");
    // A session calling itself dbwarden with no status row is a runner about to claim the lock
    // (between taking it and writing its row), and lock-status says so.
    python.exec("SET application_name = 'dbwarden'");
    let (code, v) = db.status(&sb, &[]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("HEALTHY")), "{v}");
    assert!(v["notes"].to_string().contains("dbwarden runner"), "{v}");
    python.exec("SET application_name = 'python'");

    let r = db.run(&sb, &["migrate", "--skip-if-locked"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("skipped"), "{r:?}");
    assert_eq!(
        db.count("SELECT count(*) FROM dbwarden_lock_audit WHERE action = 'lock_conflict'"),
        2
    );
    assert_eq!(db.count("SELECT count(*) FROM dbwarden_migrations"), 0);

    // Waiting: the run proceeds as soon as the foreign session lets go.
    let waiter = db.spawn(&sb, &["migrate", "--wait", "30s"]);
    std::thread::sleep(Duration::from_millis(700));
    python.query(&format!("SELECT pg_advisory_unlock({DEFAULT_KEY})"));
    let r = Run::wait(waiter, Duration::from_secs(30));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(db.count("SELECT count(*) FROM dbwarden_migrations"), 1);
}

#[test]
fn a_running_dbwarden_excludes_a_python_runner_of_the_same_namespace_only() {
    let sb = Sandbox::new();
    sb.write_migration("0001_slow.sql", "SELECT pg_sleep(20);");
    let db = PgDb::new();
    let holder = db.spawn(&sb, &["migrate", "--namespace", "billing"]);
    sb.wait_status(
        &["-u", db.url.as_str(), "--namespace", "billing"],
        Duration::from_secs(30),
        |v| v["held"] == true,
    );
    let mut python = db.client();
    assert_eq!(
        python.query(&format!("SELECT pg_try_advisory_lock({BILLING_KEY})")),
        ["false"],
        "the Python key of namespace billing is held by dbwarden"
    );
    assert_eq!(
        python.query(&format!("SELECT pg_try_advisory_lock({DEFAULT_KEY})")),
        ["true"],
        "another namespace is free"
    );
    dbwarden_tests::signal(holder.id(), rustix::process::Signal::KILL);
    let _ = Run::wait(holder, Duration::from_secs(10));
}

#[test]
fn tables_live_in_the_configured_schema() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    let db = PgDb::new();
    let run = |args: &[&str]| {
        let mut full = args.to_vec();
        full.extend_from_slice(&["-u", db.url.as_str()]);
        let out = sb
            .cmd(&full)
            .env("DBWARDEN_SCHEMA", "ops")
            .env("DBWARDEN_HISTORY_TABLE", "schema_history")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert_eq!(run(&["migrate"]).0, Some(0));
    assert_eq!(
        db.count("SELECT count(*) FROM ops.schema_history WHERE state = 'APPLIED'"),
        1
    );
    assert_eq!(db.count("SELECT fencing_token FROM ops.dbwarden_lock"), 1);
    assert_eq!(
        db.count("SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'dbwarden%'"),
        0
    );
    let (code, out) = run(&["lock-status", "--json"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("\"fencing_token\":1"), "{out}");
    let (code, out) = run(&["history", "--json"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("\"APPLIED\""), "{out}");
}
