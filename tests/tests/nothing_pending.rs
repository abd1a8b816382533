//! Where the engine has a shared lock (SQLite, PostgreSQL), `migrate` first looks under it
//! whether anything is pending: replicas that start together with nothing to do check side by
//! side instead of taking the exclusive lock one after another. A look changes nothing (no token
//! bump, no status row), and a run with something pending still needs the exclusive lock.

use std::time::Duration;

use dbwarden_tests::Sandbox;
use dbwarden_tests::pg::PgDb;

/// `dbwarden <head> <target> <tail>`: `target` is `-u URL` (or nothing for the sandbox's SQLite).
fn argv<'a>(head: &[&'a str], target: &[&'a str], tail: &[&'a str]) -> Vec<&'a str> {
    let mut v = head.to_vec();
    v.extend_from_slice(target);
    v.extend_from_slice(tail);
    v
}

fn token(sb: &Sandbox, target: &[&str]) -> u64 {
    let (_, v) = sb.status(target);
    v["status"]["fencing_token"]
        .as_u64()
        .unwrap_or_else(|| panic!("no token in {v}"))
}

fn case(sb: &Sandbox, target: &[&str], has_table: &dyn Fn(&str) -> bool) {
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INT);");
    let r = sb.run(&argv(&["migrate"], target, &[]));
    assert_eq!(r.code, 0, "{r:?}");
    let before = token(sb, target);

    // A reader holds the shared lock (an application replica under `run --shared`).
    let mut reader = sb.spawn(&argv(&["run", "--shared"], target, &["--", "sleep", "30"]));
    sb.wait_status(target, Duration::from_secs(20), |v| {
        v["shared_holders"].as_array().is_some_and(|a| a.len() == 1)
    });

    // Nothing pending: the run looks beside the reader and is done at once.
    let r = sb.run(&argv(&["migrate", "--wait", "0"], target, &[]));
    assert_eq!(
        r.code, 0,
        "a run with nothing to do must not need the lock alone: {r:?}"
    );
    assert!(
        r.stderr
            .contains("applied 0 migration(s), 1 already applied"),
        "{r:?}"
    );
    assert_eq!(token(sb, target), before, "a look must not bump the token");

    // Something pending: the writer needs the exclusive lock, which the reader still excludes.
    sb.write_migration("0002_b.sql", "CREATE TABLE b (x INT);");
    let r = sb.run(&argv(&["migrate", "--wait", "0"], target, &[]));
    assert_eq!(r.code, 3, "{r:?}");
    assert!(r.stderr.contains("shared by 1 holder(s)"), "{r:?}");
    assert!(!has_table("b"), "migration 2 ran beside a shared holder");

    let _ = reader.kill();
    let _ = reader.wait();
    let r = sb.run(&argv(&["migrate", "--wait", "30s"], target, &[]));
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr
            .contains("applied 1 migration(s), 1 already applied"),
        "{r:?}"
    );
    assert!(has_table("b"));
    assert_eq!(token(sb, target), before + 1);

    // A doubt is never settled by the look: a changed applied file still gets its refusal
    // (exit 2, naming the file) from the exclusive path, and nothing is written.
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INT, y INT);");
    let r = sb.run(&argv(&["migrate", "--wait", "30s"], target, &[]));
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("0001_a.sql"), "{r:?}");
    assert_eq!(token(sb, target), before + 2, "the exclusive path decided");
}

#[test]
fn sqlite() {
    let sb = Sandbox::new();
    let db = sb.path().join("dbwarden.db");
    case(&sb, &[], &|t| {
        dbwarden_tests::sqlite_count(
            &db,
            &format!("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '{t}'"),
        ) == 1
    });
}

#[test]
fn postgres() {
    let sb = Sandbox::new();
    let db = PgDb::new();
    case(&sb, &["-u", &db.url], &|t| {
        db.count(&format!(
            "SELECT COUNT(*) FROM pg_tables WHERE tablename = '{t}'"
        )) == 1
    });
}
