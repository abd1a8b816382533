//! Named locks are server-wide: two databases on the same server must migrate at the same time
//! without blocking each other, and lock-status on one never reports the other's holder.
//! (One of them is reached through a `mariadb://` URL: the same engine.)

use std::time::Duration;

use dbwarden_tests::mysql::TestDb;
use dbwarden_tests::{Run, Sandbox};

#[test]
fn two_databases_on_one_server_migrate_at_once_and_report_only_their_own_holder() {
    let (db_a, db_b) = (TestDb::new(), TestDb::new());
    let url_b = db_b.mariadb_url();
    let sb = Sandbox::new();
    // The same migrations and the same (default) namespace in both.
    sb.write_migration("0001_t.sql", "CREATE TABLE t (x INT);");
    sb.write_migration(
        "0002_slow.sql",
        "INSERT INTO t VALUES (2);\nSELECT SLEEP(4);",
    );
    let holder_a = sb.spawn(&["migrate", "-u", &db_a.url]);
    let a = sb.wait_status(&["-u", &db_a.url], Duration::from_secs(60), |v| {
        v["held"] == true && v["status"]["migration_version"] == 2
    });
    // B starts while A holds its lock and must not wait for it (--wait 0 would exit 3).
    let holder_b = sb.spawn(&["migrate", "--wait", "0", "-u", &url_b]);
    let b = sb.wait_status(&["-u", &url_b], Duration::from_secs(60), |v| {
        v["held"] == true && v["status"]["migration_version"] == 2
    });
    let (exec_a, exec_b) = (&a["holder"]["execution_id"], &b["holder"]["execution_id"]);
    assert_ne!(exec_a, exec_b);
    assert_ne!(a["session_id"], b["session_id"]);
    // Both held at the same moment, each reported with its own holder only.
    let now_a = sb.status(&["-u", &db_a.url]).1;
    assert_eq!(
        (now_a["verdict"].as_str(), &now_a["holder"]["execution_id"]),
        (Some("HEALTHY"), exec_a),
        "{now_a}"
    );
    assert_eq!(now_a["session_id"], a["session_id"], "{now_a}");
    assert!(now_a["discrepancy"].is_null(), "{now_a}");

    let (ra, rb) = (
        Run::wait(holder_a, Duration::from_secs(60)),
        Run::wait(holder_b, Duration::from_secs(60)),
    );
    assert_eq!((ra.code, rb.code), (0, 0), "{ra:?}\n{rb:?}");
    for db in [&db_a, &db_b] {
        assert_eq!(
            db.count("SELECT COUNT(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"),
            2
        );
        assert_eq!(db.count("SELECT fencing_token FROM dbwarden_lock"), 1);
        assert_eq!(db.count("SELECT COUNT(*) FROM t"), 1);
    }
    // Once both are done, each database shows its own finished run.
    for (url, exec) in [(&db_a.url, exec_a), (&url_b, exec_b)] {
        let (code, v) = sb.status(&["-u", url]);
        assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
        assert_eq!(&v["status"]["execution_id"], exec, "{v}");
    }
}
