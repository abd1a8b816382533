//! Bad input on MySQL URLs: one clear line on stderr, exit 2, no password, nothing created.

use dbwarden_tests::mysql::TestDb;
use dbwarden_tests::{Run, Sandbox};

fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INT);");
    sb
}

/// Run `args` and check docs/design.md §8: exit 2, one line naming `needle`, no password, no files.
fn rejects(sb: &Sandbox, args: &[&str], needle: &str) -> Run {
    let before = sb.listing();
    let r = sb.run(args);
    assert_eq!(r.code, 2, "{args:?}: {r:?}");
    let lines = r.stderr_lines();
    assert_eq!(lines.len(), 1, "{args:?}: expected one line, got {r:?}");
    assert!(lines[0].starts_with("dbwarden: "), "{r:?}");
    assert!(
        lines[0].to_lowercase().contains(&needle.to_lowercase()),
        "{args:?}: {:?} does not mention {needle:?}",
        lines[0]
    );
    assert!(
        !r.stderr.contains("hunter2") && !r.stdout.contains("hunter2"),
        "password leaked: {r:?}"
    );
    assert!(r.stdout.is_empty(), "{r:?}");
    assert_eq!(sb.listing(), before, "{args:?} created or removed files");
    r
}

#[test]
fn bad_urls_are_rejected_before_connecting() {
    let sb = sandbox();
    rejects(
        &sb,
        &["migrate", "-u", "mysql://root:hunter2@127.0.0.1:3306"],
        "names no database",
    );
    rejects(
        &sb,
        &["migrate", "-u", "mariadb://root:hunter2@127.0.0.1:3306/"],
        "names no database",
    );
    rejects(
        &sb,
        &[
            "migrate",
            "-u",
            "mysql://root:hunter2@127.0.0.1:notaport/db",
        ],
        "invalid database URL",
    );
    rejects(
        &sb,
        &["lock-status", "-u", "mysql:root:hunter2@127.0.0.1/db"],
        "invalid database URL",
    );
    rejects(
        &sb,
        &[
            "migrate",
            "-u",
            "mysql://root@127.0.0.1:3306/app",
            "--history-table",
            "x`; DROP TABLE y",
        ],
        "invalid history_table",
    );
    rejects(
        &sb,
        &[
            "migrate",
            "-u",
            "mysql://root@127.0.0.1:3306/app",
            "--namespace",
            "a'b",
        ],
        "invalid namespace",
    );
}

#[test]
fn a_missing_database_is_reported_and_not_created() {
    let sb = sandbox();
    let db = TestDb::new();
    let missing = format!("{}_missing", db.name);
    let url = db.url.replace(&db.name, &missing);
    rejects(&sb, &["migrate", "-u", &url], "unknown database");
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = '{missing}'"
        )),
        0
    );
}
