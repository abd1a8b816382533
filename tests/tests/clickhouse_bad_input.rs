//! ClickHouse bad input: a clear one-line error, exit 2, no password, nothing created. An
//! unreachable server and the read-only commands on every engine: `bad_input.rs`.

use dbwarden_tests::Sandbox;
use dbwarden_tests::clickhouse::base_url;

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
