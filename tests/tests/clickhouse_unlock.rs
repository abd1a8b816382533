//! ClickHouse `dbwarden unlock`: shows the holder, needs --yes without a terminal, honours
//! --holder, fences a live holder out (it exits 4 before its next statement), and is audited.

use std::time::Duration;

use dbwarden_tests::clickhouse::TestDb;
use dbwarden_tests::{Run, Sandbox};

#[test]
fn unlocking_a_live_holder_fences_it_out_and_the_next_run_resumes() {
    let db = TestDb::new();
    let sb = Sandbox::new();
    let url = db.url();
    sb.write_migration(
        "0001_log.sql",
        "CREATE TABLE log (stmt String) ENGINE = Log;",
    );
    sb.write_migration(
        "0002_long.sql",
        "INSERT INTO log VALUES ('2.1');\nSELECT sleep(3);\nSELECT sleep(3);\nINSERT INTO log VALUES ('2.4');",
    );
    let a = sb.spawn(&["migrate", "-u", &url]);
    let held = sb.wait_status(&["-u", &url], Duration::from_secs(30), |v| {
        v["held"] == true && v["status"]["migration_version"] == 2
    });
    let exec = held["holder"]["execution_id"].as_str().unwrap().to_owned();

    let r = sb.run(&["unlock", "-u", &url]);
    assert_eq!(r.code, 2, "no terminal and no --yes: {r:?}");
    let other = uuid::Uuid::new_v4().to_string();
    let r = sb.run(&["unlock", "-u", &url, "--yes", "--holder", &other]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains(&exec), "names the real holder: {r:?}");
    assert!(db.has_table("dbwarden_lock_default"), "nothing changed");

    let r = sb.run(&["unlock", "-u", &url, "--yes", "--holder", &exec]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.starts_with("HEALTHY"),
        "the holder is shown first: {r:?}"
    );
    assert!(r.stderr.contains(&exec), "{r:?}");
    assert!(!db.has_table("dbwarden_lock_default"));

    let ra = Run::wait(a, Duration::from_secs(60));
    assert_eq!(ra.code, 4, "the unlocked holder stops: {ra:?}");
    assert_eq!(
        db.lines("SELECT stmt FROM log"),
        ["2.1"],
        "nothing after the unlock"
    );
    let (code, v) = sb.status(&["-u", &url]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
    assert_eq!(v["fencing_token"], 2, "unlock bumped the fence");
    assert_eq!(
        db.count("SELECT count() FROM dbwarden_lock_audit WHERE action = 'forced_unlock'"),
        1
    );

    // The next run finds migration 2 half-done and resumes at its idempotent SELECT.
    let r = sb.run(&["migrate", "-u", &url]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("resuming at statement"), "{r:?}");
    assert_eq!(
        db.lines("SELECT stmt FROM log ORDER BY stmt"),
        ["2.1", "2.4"]
    );
    assert_eq!(db.fence_tokens(), [1, 2, 3]);
    let r = sb.run(&["unlock", "-u", &url, "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("nothing to unlock"), "{r:?}");
}
