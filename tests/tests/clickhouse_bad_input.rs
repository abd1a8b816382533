//! ClickHouse bad input: a clear one-line error, exit 2, no password, nothing created.

use dbwarden_tests::Sandbox;
use dbwarden_tests::clickhouse::{TestDb, base_url};

#[test]
fn bad_urls_missing_databases_and_unreachable_servers_exit_2_without_the_password() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x UInt8) ENGINE = Log;");
    let host = base_url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    for (url, says) in [
        ("clickhouse://u:hunter2@h:notaport/db".to_owned(), "port"),
        (
            "clickhouse://u:hunter2@h/db;drop".to_owned(),
            "invalid database",
        ),
        ("https://u:hunter2@h/?database=db".to_owned(), "https"),
        (
            format!("clickhouse://u:hunter2@{host}/db?colour=blue"),
            "unknown parameter",
        ),
        (
            "clickhouse://u:hunter2@127.0.0.1:1/db".to_owned(),
            "cannot reach 127.0.0.1:1",
        ),
        (
            format!(
                "http://{host}/?database=dbw_does_not_exist_{}",
                std::process::id()
            ),
            "does not exist",
        ),
    ] {
        for cmd in [&["migrate"][..], &["lock-status"], &["history"]] {
            let mut args = cmd.to_vec();
            args.extend_from_slice(&["-u", &url]);
            let r = sb.run(&args);
            assert_eq!(r.code, 2, "{url}: {r:?}");
            assert!(r.stderr.contains(says), "{url}: {r:?}");
            assert!(!r.stderr.contains("hunter2"), "{url}: {r:?}");
            assert_eq!(r.stderr_lines().len(), 1, "one line: {r:?}");
        }
    }
}

#[test]
fn lock_status_and_history_create_nothing() {
    let db = TestDb::new();
    let sb = Sandbox::new();
    let url = db.url();
    let (code, v) = sb.status(&["-u", &url]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
    let r = sb.run(&["history", "-u", &url, "--json"]);
    assert_eq!((r.code, r.stdout.trim()), (0, "[]"), "{r:?}");
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x UInt8) ENGINE = Log;");
    let r = sb.run(&["migrate", "-u", &url, "--dry-run"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        db.lines(&format!(
            "SELECT name FROM system.tables WHERE database = '{}'",
            db.name
        ))
        .is_empty(),
        "nothing created"
    );
}
