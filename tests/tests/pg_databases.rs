//! PostgreSQL advisory locks are per database: while database A is being migrated,
//! `lock-status` on database B (same namespace, same key) says AVAILABLE, and a migrate on B
//! proceeds at once.

use std::time::Duration;

use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox};

#[test]
fn a_lock_on_database_a_never_blocks_database_b() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration("0002_slow.sql", "SELECT pg_sleep(30);");
    let a = PgDb::new();
    let b = PgDb::new();
    let holder = a.spawn(&sb, &["migrate"]);
    a.wait_status(&sb, Duration::from_secs(30), |v| {
        v["held"] == true && v["status"]["migration_version"] == 2
    });

    let (code, v) = b.status(&sb, &[]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
    assert_eq!(v["held"], false, "{v}");
    // Migrate on B: --wait 0, so any conflict with A would be exit 3.
    let sb_b = Sandbox::new();
    sb_b.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb_b.write_migration("0002_quick.sql", "CREATE TABLE quick (x INTEGER);");
    let r = b.run(&sb_b, &["migrate", "--wait", "0"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.elapsed < Duration::from_secs(10), "{r:?}");
    assert_eq!(
        b.count("SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"),
        2
    );
    // A is still held the whole time.
    let (code, v) = a.status(&sb, &[]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("HEALTHY")), "{v}");
    // Done: stop A's holder (its database is dropped with the test).
    dbwarden_tests::signal(holder.id(), rustix::process::Signal::KILL);
    let _ = Run::wait(holder, Duration::from_secs(10));
}
