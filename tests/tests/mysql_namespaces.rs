//! Namespaces of 64 characters make lock names longer than MySQL's 64: they get a readable
//! prefix plus an md5 suffix, distinct and stable, so two long namespaces sharing a prefix do
//! not block each other.

use std::time::Duration;

use dbwarden_mysql::lock::lock_name;
use dbwarden_tests::mysql::TestDb;
use dbwarden_tests::{Run, Sandbox};

#[test]
fn two_long_namespaces_sharing_a_prefix_do_not_block_each_other() {
    let db = TestDb::new();
    let ns_a = format!("{}a", "n".repeat(63));
    let ns_b = format!("{}b", "n".repeat(63));
    let (name_a, name_b) = (lock_name(&db.name, &ns_a), lock_name(&db.name, &ns_b));
    assert_ne!(name_a, name_b);
    assert!(name_a.chars().count() <= 64 && name_b.chars().count() <= 64);
    assert_eq!(name_a, lock_name(&db.name, &ns_a), "stable");

    // Each namespace has its own migrations and history table in the same database.
    let (a, b) = (Sandbox::new(), Sandbox::new());
    a.write_migration("0001_a.sql", "CREATE TABLE a1 (x INT);\nSELECT SLEEP(4);");
    b.write_migration("0001_b.sql", "CREATE TABLE b1 (x INT);");
    let args_a = [
        "-u",
        db.url.as_str(),
        "--namespace",
        ns_a.as_str(),
        "--history-table",
        "hist_a",
    ];
    let args_b = [
        "-u",
        db.url.as_str(),
        "--namespace",
        ns_b.as_str(),
        "--history-table",
        "hist_b",
    ];
    let mut run_a = vec!["migrate"];
    run_a.extend_from_slice(&args_a);
    let holder = a.spawn(&run_a);
    let held = a.wait_status(&args_a, Duration::from_secs(60), |v| v["held"] == true);
    let session = held["session_id"].as_str().unwrap().to_owned();
    // The server sees A's session on A's long, hashed name, and B's name free.
    let id = session.trim_start_matches("connection ");
    assert_eq!(
        db.query(&format!("SELECT IS_USED_LOCK('{name_a}')")),
        [id.to_owned()]
    );
    assert_eq!(
        db.query(&format!("SELECT IS_USED_LOCK('{name_b}')")),
        ["NULL"]
    );
    let (code, v) = b.status(&args_b);
    assert_eq!(
        (code, v["verdict"].as_str(), v["held"].as_bool()),
        (0, Some("AVAILABLE"), Some(false)),
        "{v}"
    );

    // B is not blocked by A: it takes its own lock at the first try.
    let mut run_b = vec!["migrate", "--wait", "0"];
    run_b.extend_from_slice(&args_b);
    let r = b.run(&run_b);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("applied 1 migration(s)"), "{r:?}");
    assert_eq!(
        a.status(&args_a).1["held"],
        true,
        "A was still running meanwhile"
    );

    let r = Run::wait(holder, Duration::from_secs(60));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        db.query("SELECT GROUP_CONCAT(namespace, '=', fencing_token ORDER BY namespace) FROM dbwarden_lock"),
        [format!("{ns_a}=1,{ns_b}=1")]
    );
    assert!(db.has_table("a1") && db.has_table("b1"));
}
