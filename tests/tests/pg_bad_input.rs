//! PostgreSQL bad input: one clear line on stderr, exit 2, no password shown, nothing written.

use dbwarden_tests::pg::{PgDb, base_url, with_port};
use dbwarden_tests::{Run, Sandbox};

fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb
}

fn rejects(sb: &Sandbox, args: &[&str], needle: &str) -> Run {
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
    assert!(r.stdout.is_empty(), "{r:?}");
    assert!(
        !r.stderr.contains("hunter2") && !r.stdout.contains("hunter2"),
        "password leaked: {r:?}"
    );
    r
}

#[test]
fn wrong_database_or_user_is_unreachable_too() {
    let sb = sandbox();
    let url = format!(
        "{}?password=hunter2",
        dbwarden_tests::pg::with_database(&base_url(), "dbw_no_such_database")
    );
    rejects(&sb, &["migrate", "-u", &url], "dbw_no_such_database");
}

#[test]
fn bad_urls() {
    let sb = sandbox();
    rejects(
        &sb,
        &[
            "migrate",
            "-u",
            "postgres://u:hunter2@127.0.0.1:notaport/db",
        ],
        "invalid PostgreSQL URL",
    );
    rejects(
        &sb,
        &["lock-status", "-u", "postgresql://u:hunter2@[::1/db"],
        "invalid PostgreSQL URL",
    );
    rejects(
        &sb,
        &[
            "migrate",
            "-u",
            &with_port(&base_url(), 5432),
            "--namespace",
            "a b",
        ],
        "invalid namespace",
    );
    let r = sb
        .cmd(&["migrate", "-u", &base_url()])
        .env("DBWARDEN_SCHEMA", "x;drop")
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(2), "{r:?}");
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("invalid schema"),
        "{r:?}"
    );
}

/// `postgresql://` is the same engine as `postgres://`. What every engine's read-only
/// commands leave (nothing) and its unreachable server: `bad_input.rs`'s `every_engine`.
#[test]
fn the_postgresql_scheme_is_the_same_engine() {
    let sb = sandbox();
    let db = PgDb::new();
    let alt = db.url.replacen("postgres://", "postgresql://", 1);
    assert!(alt.starts_with("postgresql://"), "{alt}");
    let r = sb.run(&["lock-status", "-u", &alt, "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("\"AVAILABLE\""), "{r:?}");
    let r = sb.run(&["migrate", "-u", &alt]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(db.count("SELECT count(*) FROM dbwarden_migrations"), 1);
}

/// A server that answers `version()` as CockroachDB (a `version()` of our own ahead of
/// pg_catalog on the search path: the real server is not installable here) is refused before
/// anything is written, naming the outer lease; inside a Redis lease every runner shares, the
/// run goes ahead.
#[test]
fn a_look_alike_server_is_refused_unless_a_shared_lease_holds_the_run() {
    let sb = sandbox();
    let db = PgDb::new();
    db.exec(
        "CREATE SCHEMA fake; CREATE FUNCTION fake.version() RETURNS text LANGUAGE sql AS $$ SELECT 'CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu)'::text $$",
    );
    let url = format!(
        "{}?options=-c%20search_path%3Dpublic,fake,pg_catalog",
        db.url
    );
    let r = sb.run(&["migrate", "-u", &url]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("is CockroachDB") && r.stderr.contains("--redis-url"),
        "{r:?}"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'dbwarden%'"),
        0,
        "nothing written"
    );
    let redis = dbwarden_tests::redis_util::redis_url();
    let r = sb.run(&["migrate", "-u", &url, "--redis-url", &redis]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(db.count("SELECT count(*) FROM dbwarden_migrations"), 1);
}
