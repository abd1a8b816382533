//! PostgreSQL `dbwarden unlock`: shows the holder first, honours `--holder`, terminates the
//! holder's backend (`pg_terminate_backend`), bumps the fencing token, and audits it; the
//! holder stops with exit 4 and the next run proceeds.

use std::time::Duration;

use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox};

#[test]
fn unlocking_a_live_holder_terminates_its_session_fences_and_audits() {
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_a.sql",
        "CREATE TABLE ran (version INTEGER PRIMARY KEY);\nINSERT INTO ran VALUES (1);\nCREATE TABLE knob (secs FLOAT8 NOT NULL);\nINSERT INTO knob VALUES (60);",
    );
    sb.write_migration(
        "0002_long.sql",
        "INSERT INTO ran VALUES (2);\nSELECT pg_sleep((SELECT secs FROM knob));",
    );
    let db = PgDb::new();
    let holder = db.spawn(&sb, &["migrate"]);
    let held = db.wait_status(&sb, Duration::from_secs(30), |v| {
        v["held"] == true && v["status"]["migration_version"] == 2
    });
    let execution = held["holder"]["execution_id"].as_str().unwrap().to_owned();
    let backend = held["status"]["db_connection_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Without --yes and without a terminal: refused, nothing changed.
    let r = db.run(&sb, &["unlock"]);
    assert_eq!(r.code, 2, "{r:?}");
    // --holder naming someone else: refused, names the real holder, nothing changed.
    let other = uuid::Uuid::new_v4().to_string();
    let r = db.run(&sb, &["unlock", "--yes", "--holder", &other]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains(&execution), "{r:?}");
    assert_eq!(db.status(&sb, &[]).1["held"], true);

    db.wait_knob_sleep();
    db.exec("UPDATE knob SET secs = 0");
    let r = db.run(&sb, &["unlock", "--yes", "--holder", &execution]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.starts_with("HEALTHY"),
        "the holder is shown first: {r:?}"
    );
    assert!(r.stderr.contains(&execution), "{r:?}");
    assert!(
        r.stderr.contains(&format!("backend pid {backend}")),
        "{r:?}"
    );

    let h = Run::wait(holder, Duration::from_secs(30));
    assert_eq!(h.code, 4, "the unlocked holder must stop: {h:?}");

    let mut c = db.client();
    assert_eq!(
        c.count(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = {backend}"
        )),
        0,
        "the holder's backend was terminated"
    );
    let (code, v) = db.status(&sb, &[]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
    assert_eq!(v["fencing_token"], 2, "unlock bumps the token: {v}");
    let audit = c.rows("SELECT action, holder_execution_id, reason FROM dbwarden_lock_audit");
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(audit[0][0], "forced_unlock");
    assert_eq!(audit[0][1], execution);
    assert!(
        audit[0][2].contains(&format!("terminated backend {backend}")),
        "{audit:?}"
    );
    // Nothing of the interrupted migration survived; the next run applies it.
    assert_eq!(
        c.query("SELECT string_agg(version::text, ',') FROM ran"),
        ["1"]
    );
    let r = db.run(&sb, &["migrate", "--wait", "0"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        c.query("SELECT string_agg(version::text, ',' ORDER BY version) FROM ran"),
        ["1,2"]
    );
    assert_eq!(db.status(&sb, &[]).1["fencing_token"], 3);
}

#[test]
fn unlocking_a_dead_holder_clears_it_and_nothing_to_unlock_is_said() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration("0002_slow.sql", "SELECT pg_sleep(60);");
    let db = PgDb::new();
    let r = db.run(&sb, &["unlock", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("nothing to unlock"), "{r:?}");
    let holder = db.spawn(&sb, &["migrate"]);
    db.wait_status(&sb, Duration::from_secs(30), |v| {
        v["held"] == true && v["status"]["migration_version"] == 2
    });
    dbwarden_tests::signal(holder.id(), rustix::process::Signal::KILL);
    let _ = Run::wait(holder, Duration::from_secs(10));
    db.wait_status(&sb, Duration::from_secs(10), |v| v["verdict"] == "DEAD");
    let r = db.run(&sb, &["unlock", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.starts_with("DEAD"), "{r:?}");
    let (code, v) = db.status(&sb, &[]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
    assert_eq!(
        db.count("SELECT count(*) FROM dbwarden_lock_audit WHERE action = 'forced_unlock'"),
        1
    );
}
