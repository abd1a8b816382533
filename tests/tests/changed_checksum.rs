//! An applied migration whose file changed stops the run (exit 2, names the file) unless
//! `--allow-changed`.

use dbwarden_tests::{Sandbox, sqlite_count, sqlite_query};

#[test]
fn a_changed_applied_file_stops_the_run_unless_allowed() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration("0002_b.sql", "CREATE TABLE b (x INTEGER);");
    assert_eq!(sb.run(&["migrate"]).code, 0);
    sb.write_migration("0002_b.sql", "CREATE TABLE b (x INTEGER, y TEXT);");
    sb.write_migration("0003_c.sql", "CREATE TABLE c (x INTEGER);");
    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(r.stderr_lines().len(), 1, "{r:?}");
    assert!(r.stderr.contains("0002_b.sql"), "{r:?}");
    assert!(r.stderr.contains("--allow-changed"), "{r:?}");
    let db = sb.db();
    assert_eq!(
        sqlite_count(&db, "SELECT count(*) FROM dbwarden_migrations"),
        2
    );
    assert_eq!(
        sqlite_count(&db, "SELECT count(*) FROM sqlite_master WHERE name = 'c'"),
        0
    );
    // The refusal leaves the status as the last good run left it (only the token is spent).
    assert_eq!(
        sqlite_query(&db, "SELECT state FROM dbwarden_lock"),
        ["COMPLETE"]
    );

    let r = sb.run(&["migrate", "--allow-changed"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("changed after it was applied"), "{r:?}");
    assert_eq!(
        sqlite_count(&db, "SELECT count(*) FROM dbwarden_migrations"),
        3
    );
}

#[test]
fn crlf_line_endings_do_not_change_the_checksum() {
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_a.sql",
        "CREATE TABLE a (x INTEGER);\nCREATE TABLE b (x INTEGER);\n",
    );
    assert_eq!(sb.run(&["migrate"]).code, 0);
    sb.write_migration(
        "0001_a.sql",
        "CREATE TABLE a (x INTEGER);\r\nCREATE TABLE b (x INTEGER);\r\n",
    );
    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
}
