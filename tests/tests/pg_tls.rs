//! PostgreSQL over TLS (rustls): `sslmode=require` encrypts the lock session and the heartbeat
//! connection; `sslmode=verify-full` against the server's self-signed (snakeoil) certificate is
//! refused with exit 2 before anything is written.

use std::time::Duration;

use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox};

fn with_sslmode(url: &str, mode: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}sslmode={mode}")
}

#[test]
fn sslmode_require_encrypts_every_dbwarden_connection() {
    let db = PgDb::new();
    assert_eq!(
        db.query("SHOW ssl"),
        ["on"],
        "the test server must offer TLS (Debian's default, snakeoil certificate)"
    );
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_slow.sql",
        "CREATE TABLE a (x INTEGER);\nSELECT pg_sleep(2);",
    );
    let url = with_sslmode(&db.url, "require");
    let holder = sb.spawn(&["migrate", "-u", &url]);
    db.wait_for(
        "SELECT count(*) FROM dbwarden_lock WHERE state = 'RUNNING'",
        Duration::from_secs(30),
    );
    let sessions = db.query(
        "SELECT s.ssl::text FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.datname = current_database() AND a.application_name = 'dbwarden'",
    );
    assert!(
        sessions.len() >= 2,
        "lock session and heartbeat: {sessions:?}"
    );
    assert!(sessions.iter().all(|s| s == "true"), "{sessions:?}");
    let r = Run::wait(holder, Duration::from_secs(60));
    assert_eq!(r.code, 0, "{r:?}");
}

#[test]
fn sslmode_verify_full_refuses_an_untrusted_certificate() {
    let db = PgDb::new();
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    let r = sb.run(&["migrate", "-u", &with_sslmode(&db.url, "verify-full")]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("certificate"), "{r:?}");
    assert_eq!(
        db.count("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"),
        0
    );
}
