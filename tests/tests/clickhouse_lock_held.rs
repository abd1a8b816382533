//! ClickHouse: lock-status names a holder's owner and its lease, a namespace whose table name
//! could collide after mapping stays independent, and a holder stopped within its lease still
//! blocks others. Declined runs on every engine: `lock_held.rs`'s `every_engine`.

use std::time::Duration;

use dbwarden_tests::clickhouse::TestDb;
use dbwarden_tests::{Run, Sandbox, signal};
use rustix::process::Signal;

#[test]
fn a_held_lock_names_its_owner_and_lease_and_a_lookalike_namespace_stays_free() {
    let db = TestDb::new();
    let sb = Sandbox::new();
    let url = db.url();
    sb.write_migration(
        "0001_log.sql",
        "CREATE TABLE log (stmt String) ENGINE = Log;",
    );
    sb.write_migration(
        "0002_slow.sql",
        "SELECT sleep(3);\nSELECT sleep(3);\nINSERT INTO log VALUES ('2');",
    );
    let ns = ["--namespace", "billing.v2"];
    let mut a_args = vec!["migrate", "-u", url.as_str(), "--owner", "deploy-7"];
    a_args.extend_from_slice(&ns);
    let a = sb.spawn(&a_args);
    let mut st_args = vec!["-u", url.as_str()];
    st_args.extend_from_slice(&ns);
    let held = sb.wait_status(&st_args, Duration::from_secs(30), |v| v["held"] == true);
    assert_eq!(held["verdict"], "HEALTHY", "{held}");
    assert_eq!(held["engine"], "clickhouse");
    assert_eq!(held["grade"], "C");
    assert_eq!(held["holder"]["pid"], a.id(), "{held}");
    assert_eq!(held["holder"]["owner"], "deploy-7", "{held}");
    assert!(held["expires_at"].is_string(), "{held}");

    // `billing_v2` maps to a different lock table than `billing.v2`: independent.
    let (code, other) = sb.status(&["-u", &url, "--namespace", "billing_v2"]);
    assert_eq!(
        (code, other["verdict"].as_str()),
        (0, Some("AVAILABLE")),
        "{other}"
    );
    assert_eq!(other["held"], false);

    let ra = Run::wait(a, Duration::from_secs(60));
    assert_eq!(ra.code, 0, "{ra:?}");
    assert_eq!(db.lines("SELECT stmt FROM log"), ["2"]);
    let (code, v) = sb.status(&st_args);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
}

#[test]
fn a_holder_stopped_within_its_lease_still_blocks_others_and_goes_on_when_woken() {
    let db = TestDb::new();
    let sb = Sandbox::new();
    let url = db.url();
    sb.write_migration("0001_slow.sql", "SELECT sleep(3);\nSELECT sleep(3);");
    // A long lease: the stop must stay well inside it however slow the machine is.
    let lease = ["--lock-ttl", "30s", "--heartbeat-interval", "2s"];
    let mut a_args = vec!["migrate", "-u", url.as_str()];
    a_args.extend_from_slice(&lease);
    let a = sb.spawn(&a_args);
    sb.wait_status(&["-u", &url], Duration::from_secs(30), |v| {
        v["held"] == true
    });
    signal(a.id(), Signal::STOP);
    // Within its lease a frozen holder still blocks everyone.
    let mut b = vec!["migrate", "-u", url.as_str(), "--wait", "0"];
    b.extend_from_slice(&lease);
    assert_eq!(sb.run(&b).code, 3);
    signal(a.id(), Signal::CONT);
    let ra = Run::wait(a, Duration::from_secs(60));
    assert_eq!(
        ra.code, 0,
        "a holder woken within its lease goes on: {ra:?}"
    );
}
