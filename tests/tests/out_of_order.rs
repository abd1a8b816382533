//! A migration pending below the highest applied version is refused by default (exit 2, one
//! line naming it and the flag, nothing written: the look sees it before the lock is taken),
//! and applied in version order with `--allow-out-of-order` or `allow_out_of_order = true`.
//! An applied file that changed is refused at the same point, before the lock.

use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox, sqlite_count};

/// The engine under test: how to run dbwarden on it and count rows there.
trait Db {
    fn run(&self, sb: &Sandbox, args: &[&str]) -> Run;
    fn count(&self, sb: &Sandbox, sql: &str) -> i64;
}

struct Sqlite;
impl Db for Sqlite {
    fn run(&self, sb: &Sandbox, args: &[&str]) -> Run {
        sb.run(args)
    }
    fn count(&self, sb: &Sandbox, sql: &str) -> i64 {
        sqlite_count(&sb.db(), sql)
    }
}

impl Db for PgDb {
    fn run(&self, sb: &Sandbox, args: &[&str]) -> Run {
        PgDb::run(self, sb, args)
    }
    fn count(&self, _sb: &Sandbox, sql: &str) -> i64 {
        PgDb::count(self, sql)
    }
}

fn token(db: &dyn Db, sb: &Sandbox) -> i64 {
    db.count(sb, "SELECT max(fencing_token) FROM dbwarden_lock")
}

fn refused_then_allowed(db: &dyn Db) {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration("0003_c.sql", "CREATE TABLE c (x INTEGER);");
    let r = db.run(&sb, &["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    let t = token(db, &sb);

    sb.write_migration("0002_b.sql", "CREATE TABLE b (x INTEGER);");
    let r = db.run(&sb, &["migrate"]);
    assert_eq!(r.code, 2, "{r:?}");
    let lines = r.stderr_lines();
    assert_eq!(lines.len(), 1, "{r:?}");
    assert!(
        lines[0].contains("out of order")
            && lines[0].contains("0002_b.sql")
            && lines[0].contains("--allow-out-of-order"),
        "{r:?}"
    );
    assert_eq!(
        token(db, &sb),
        t,
        "nothing written: the lock was never taken"
    );
    assert_eq!(db.count(&sb, "SELECT count(*) FROM dbwarden_migrations"), 2);

    let r = db.run(&sb, &["migrate", "--allow-out-of-order"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        db.count(
            &sb,
            "SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"
        ),
        3
    );

    // A changed applied file: refused before the lock too (the token stays).
    let t = token(db, &sb);
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER, y INTEGER);");
    sb.write_migration("0004_d.sql", "CREATE TABLE d (x INTEGER);");
    let r = db.run(&sb, &["migrate"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("changed after it was applied"), "{r:?}");
    assert_eq!(token(db, &sb), t, "nothing written");
}

#[test]
fn sqlite_out_of_order_is_refused_before_the_lock_unless_allowed() {
    refused_then_allowed(&Sqlite);
}

#[test]
fn postgres_out_of_order_is_refused_before_the_lock_unless_allowed() {
    refused_then_allowed(&PgDb::new());
}

#[test]
fn the_config_key_allows_it_and_a_bad_value_is_exit_2() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration("0003_c.sql", "CREATE TABLE c (x INTEGER);");
    assert_eq!(sb.run(&["migrate"]).code, 0);
    sb.write_migration("0002_b.sql", "CREATE TABLE b (x INTEGER);");

    std::fs::write(
        sb.path().join("dbwarden.toml"),
        "allow_out_of_order = \"maybe\"\n",
    )
    .unwrap();
    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("allow_out_of_order"), "{r:?}");

    std::fs::write(
        sb.path().join("dbwarden.toml"),
        "allow_out_of_order = true\n",
    )
    .unwrap();
    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"
        ),
        3
    );
}
