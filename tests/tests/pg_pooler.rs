//! PostgreSQL behind PgBouncer (Debian's, started by `scripts/services.sh pg-extras`):
//! in transaction pooling mode the lock session's backend would be handed to others between
//! transactions, so `migrate` refuses with exit 2 and a message naming the fix, having written
//! nothing; in session pooling mode everything works, including concurrent runners.

use std::time::Duration;

use dbwarden_tests::pg::{PgDb, pgbouncer_port};
use dbwarden_tests::{Run, Sandbox, assert_exclusive_tokens};

fn migrations(sb: &Sandbox) {
    sb.write_migration(
        "0001_ran.sql",
        "CREATE TABLE ran (version INTEGER PRIMARY KEY);\nINSERT INTO ran VALUES (1);",
    );
    sb.write_migration(
        "0002_more.sql",
        "INSERT INTO ran VALUES (2);\nSELECT pg_sleep(0.3);",
    );
}

#[test]
fn transaction_pooling_is_refused_with_the_fix_and_nothing_written() {
    let tx_port = pgbouncer_port(false);
    let sb = Sandbox::new();
    migrations(&sb);
    let db = PgDb::new();
    let url = db.url_on_port(tx_port);
    let r = sb.run(&["migrate", "-u", &url]);
    assert_eq!(r.code, 2, "{r:?}");
    let lines = r.stderr_lines();
    assert_eq!(lines.len(), 1, "{r:?}");
    assert!(lines[0].contains("transaction pooler"), "{r:?}");
    assert!(lines[0].contains("use a direct URL"), "{r:?}");
    assert!(lines[0].contains(&format!("127.0.0.1:{tx_port}")), "{r:?}");
    assert_eq!(
        db.count("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"),
        0,
        "nothing may be created through a transaction pooler"
    );
}

#[test]
fn session_pooling_works_with_concurrent_runners() {
    let session_port = pgbouncer_port(true);
    let sb = Sandbox::new();
    migrations(&sb);
    let db = PgDb::new();
    let url = db.url_on_port(session_port);
    let children: Vec<_> = (0..4).map(|_| sb.spawn(&["migrate", "-u", &url])).collect();
    let runs: Vec<Run> = children
        .into_iter()
        .map(|c| Run::wait(c, Duration::from_secs(60)))
        .collect();
    for r in &runs {
        assert_eq!(r.code, 0, "{r:?}");
    }
    assert_eq!(
        runs.iter()
            .filter(|r| r.stderr.contains("applied 2 migration(s)"))
            .count(),
        1,
        "{runs:?}"
    );
    assert_eq!(db.count("SELECT count(*) FROM ran"), 2);
    // Each run that held the lock alone got its own token; the others found nothing pending
    // under the shared lock once the first was done.
    assert_exclusive_tokens(&runs, db.count("SELECT fencing_token FROM dbwarden_lock"));
    let r = sb.run(&["lock-status", "-u", &url]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.starts_with("AVAILABLE"), "{r:?}");
}
