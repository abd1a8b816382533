//! PostgreSQL: a `-- dbwarden:no-transaction` migration with `CREATE INDEX CONCURRENTLY`
//! completes while four other runners wait. Waiters poll `pg_try_advisory_lock` and never
//! block inside `pg_advisory_lock` (a blocked waiter holds a snapshot, which CREATE INDEX
//! CONCURRENTLY waits for: a deadlock).

use std::time::Duration;

use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox};

#[test]
fn create_index_concurrently_completes_while_four_runners_wait() {
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_big.sql",
        "CREATE TABLE big (id INTEGER NOT NULL, note TEXT);\nINSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, 300000) g;",
    );
    sb.write_migration(
        "0002_index.sql",
        "-- dbwarden:no-transaction\nSELECT pg_sleep(1.5);\nCREATE INDEX CONCURRENTLY big_note ON big (note);\nCREATE UNIQUE INDEX CONCURRENTLY big_id ON big (id);",
    );
    sb.write_migration("0003_after.sql", "CREATE TABLE after_index (x INTEGER);");
    let db = PgDb::new();
    let holder = db.spawn(&sb, &["migrate"]);
    // The holder is in migration 2 (its first statement sleeps): start four more runners.
    db.wait_for(
        "SELECT count(*) FROM dbwarden_migrations WHERE version = 2 AND state = 'RUNNING'",
        Duration::from_secs(60),
    );
    let waiters: Vec<_> = (0..4).map(|_| db.spawn(&sb, &["migrate"])).collect();
    // All four are polling before the index builds start (the holder's lock session and
    // heartbeat connection, and one connection per waiting runner: the one it listens on).
    db.wait_for(
        "SELECT (count(*) >= 6)::int FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'dbwarden'",
        Duration::from_secs(30),
    );
    let r = Run::wait(holder, Duration::from_secs(90));
    assert_eq!(r.code, 0, "the holder: {r:?}");
    assert!(r.stderr.contains("applied 3 migration(s)"), "{r:?}");
    for w in waiters {
        let r = Run::wait(w, Duration::from_secs(90));
        assert_eq!(r.code, 0, "a waiter: {r:?}");
        assert!(
            r.stderr
                .contains("applied 0 migration(s), 3 already applied"),
            "{r:?}"
        );
    }
    let mut c = db.client();
    assert_eq!(
        c.query("SELECT string_agg(c.relname || ':' || i.indisvalid, ',' ORDER BY c.relname) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname IN ('big_id', 'big_note')"),
        ["big_id:true,big_note:true"]
    );
    assert_eq!(
        c.query("SELECT state || ':' || statements_done || '/' || statements_total FROM dbwarden_migrations WHERE version = 2"),
        ["APPLIED:3/3"]
    );
    // The waiters found nothing pending under the shared lock once the holder released: only
    // the holder ever held the lock alone.
    assert_eq!(c.query("SELECT fencing_token FROM dbwarden_lock"), ["1"]);
}
