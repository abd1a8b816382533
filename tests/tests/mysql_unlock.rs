//! `dbwarden unlock` on MySQL: shows the holder, honours `--holder`, `KILL`s the holder's
//! session (which frees the named lock), bumps the fencing token and is audited; the killed
//! holder stops with exit 4.

use std::time::Duration;

use dbwarden_tests::mysql::TestDb;
use dbwarden_tests::{Run, Sandbox};

#[test]
fn unlocking_a_live_holder_kills_its_session_fences_it_out_and_is_audited() {
    let (sb, db) = (Sandbox::new(), TestDb::new());
    let short = ["--lock-ttl", "3s", "--heartbeat-interval", "1s"];
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INT);");
    sb.write_migration(
        "0002_long.sql",
        "INSERT INTO a VALUES (1);\nSELECT SLEEP(30);\nCREATE TABLE after_unlock (x INT);",
    );
    let mut args = vec!["migrate", "-u", &db.url];
    args.extend_from_slice(&short);
    let holder = sb.spawn(&args);
    let url = ["-u", db.url.as_str()];
    let held = sb.wait_status(&url, Duration::from_secs(60), |v| {
        v["held"] == true && v["status"]["migration_version"] == 2
    });
    db.wait_running("SELECT SLEEP(30)", Duration::from_secs(30));
    let execution = held["holder"]["execution_id"].as_str().unwrap().to_owned();
    let token = held["fencing_token"].as_u64().unwrap();

    // --holder naming someone else changes nothing.
    let other = uuid::Uuid::new_v4().to_string();
    let r = sb.run(&["unlock", "--yes", "--holder", &other, "-u", &db.url]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains(&execution), "{r:?}");
    assert_eq!(sb.status(&url).1["held"], true);

    // Without --yes and without a terminal: refused before anything is shown or done.
    let r = sb.run(&["unlock", "-u", &db.url]);
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(sb.status(&url).1["held"], true);

    let r = sb.run(&["unlock", "--yes", "--holder", &execution, "-u", &db.url]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.starts_with("HEALTHY"),
        "the holder is shown first: {r:?}"
    );
    assert!(r.stderr.contains(&execution), "{r:?}");
    assert!(
        r.stderr.contains("SLEEP(30)"),
        "the holder's statement is shown: {r:?}"
    );

    let r = Run::wait(holder, Duration::from_secs(30));
    assert_eq!(r.code, 4, "the killed holder must stop: {r:?}");
    assert!(r.stderr.contains("lock lost"), "{r:?}");
    assert!(!db.has_table("after_unlock"));
    assert_eq!(
        db.query(
            "SELECT CONCAT(state, ':', statements_done) FROM dbwarden_migrations WHERE version = 2"
        ),
        ["RUNNING:1"]
    );
    let (code, v) = sb.status(&url);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
    assert_eq!(v["fencing_token"], token + 1, "unlock bumps the token: {v}");
    assert_eq!(
        db.query("SELECT CONCAT(action, ' ', holder_execution_id) FROM dbwarden_lock_audit"),
        [format!("forced_unlock {execution}")]
    );
    // Nothing is left to unlock.
    let r = sb.run(&["unlock", "--yes", "-u", &db.url]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("nothing to unlock"), "{r:?}");
}
