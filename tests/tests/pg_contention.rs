//! PostgreSQL: 32 runners start at once on a fresh database: exactly one applies the 300
//! migrations, the others wait (woken by NOTIFY) and find nothing pending, all exit 0, and
//! nothing runs twice (the side table `ran` has a primary key on the version).

use std::time::{Duration, Instant};

use dbwarden_tests::pg::{PgDb, numbered_migrations};
use dbwarden_tests::{Run, Sandbox, assert_exclusive_tokens};

const RUNNERS: usize = 32;

fn stampede(db: &PgDb, sb: &Sandbox, n: usize) -> Vec<Run> {
    let children: Vec<_> = (0..n).map(|_| db.spawn(sb, &["migrate"])).collect();
    children
        .into_iter()
        .map(|c| Run::wait(c, Duration::from_secs(180)))
        .collect()
}

#[test]
fn thirty_two_runners_on_a_fresh_database_all_exit_0_and_apply_each_migration_once() {
    let sb = Sandbox::new();
    numbered_migrations(&sb, 300);
    for round in 1..=5 {
        let db = PgDb::new();
        let t0 = Instant::now();
        let runs = stampede(&db, &sb, RUNNERS);
        let wall = t0.elapsed();
        for (i, r) in runs.iter().enumerate() {
            assert_eq!(r.code, 0, "round {round} runner {i}: {r:?}");
        }
        let mut c = db.client();
        assert_eq!(
            c.count("SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"),
            300
        );
        assert_eq!(c.count("SELECT count(*) FROM dbwarden_migrations"), 300);
        assert_eq!(c.count("SELECT count(*) FROM ran"), 300);
        assert_eq!(
            c.count("SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename ~ '^t_[0-9]+$'"),
            299
        );
        // Exactly one runner applied everything; the others found nothing pending.
        let appliers = runs
            .iter()
            .filter(|r| r.stderr.contains("applied 300 migration(s)"))
            .count();
        assert_eq!(appliers, 1, "round {round}: {runs:?}");
        assert_eq!(
            runs.iter()
                .filter(|r| r
                    .stderr
                    .contains("applied 0 migration(s), 300 already applied"))
                .count(),
            RUNNERS - 1
        );
        // One history row per version, all written by the same holder and token.
        assert_eq!(
            c.count(
                "SELECT count(DISTINCT (execution_id, fencing_token)) FROM dbwarden_migrations"
            ),
            1
        );
        // Every run that held the lock alone got its own token; the others looked under the
        // shared lock after the apply (at least one did: the look is not skipped).
        let alone = assert_exclusive_tokens(
            &runs,
            c.count("SELECT fencing_token FROM dbwarden_lock WHERE namespace = 'default'"),
        );
        assert!(
            alone < RUNNERS,
            "every runner took the lock alone: {runs:?}"
        );
        assert_eq!(
            c.query("SELECT state FROM dbwarden_lock WHERE namespace = 'default'"),
            ["COMPLETE"]
        );
        // Nobody was declined or had to break a lock.
        assert_eq!(c.count("SELECT count(*) FROM dbwarden_lock_audit"), 0);
        eprintln!("round {round}: {RUNNERS} runners in {wall:?}");
    }
}

#[test]
fn thirty_two_runners_with_nothing_pending_all_exit_0_and_change_nothing() {
    let sb = Sandbox::new();
    numbered_migrations(&sb, 300);
    let db = PgDb::new();
    assert_eq!(db.run(&sb, &["migrate"]).code, 0);
    let snapshot = "SELECT string_agg(version || ':' || execution_id || ':' || fencing_token, ',' ORDER BY version) FROM dbwarden_migrations";
    let before = db.query(snapshot);
    let t0 = Instant::now();
    for (i, r) in stampede(&db, &sb, RUNNERS).iter().enumerate() {
        assert_eq!(r.code, 0, "runner {i}: {r:?}");
        assert!(
            r.stderr
                .contains("applied 0 migration(s), 300 already applied"),
            "{r:?}"
        );
    }
    eprintln!(
        "{RUNNERS} runners with nothing pending in {:?}",
        t0.elapsed()
    );
    assert_eq!(db.query(snapshot), before);
    assert_eq!(db.count("SELECT count(*) FROM ran"), 300);
    // Nobody needed the lock alone: every run looked under the shared lock, no token moved.
    assert_eq!(db.count("SELECT fencing_token FROM dbwarden_lock"), 1);
}

#[test]
fn first_runs_of_eight_namespaces_at_once_create_the_tables_without_failing() {
    // Different namespaces do not exclude each other, so their first runs create the shared
    // status and audit tables concurrently (CREATE TABLE IF NOT EXISTS alone can fail there
    // with a unique violation in pg_type).
    let sb = Sandbox::new();
    sb.write_migration("0001_noop.sql", "SELECT 1;");
    for round in 1..=3 {
        let db = PgDb::new();
        let children: Vec<_> = (0..8)
            .map(|i| {
                let ns = format!("ns{i}");
                let table = format!("history_{i}");
                db.spawn(
                    &sb,
                    &["migrate", "--namespace", &ns, "--history-table", &table],
                )
            })
            .collect();
        for (i, c) in children.into_iter().enumerate() {
            let r = Run::wait(c, Duration::from_secs(60));
            assert_eq!(r.code, 0, "round {round} namespace ns{i}: {r:?}");
        }
        assert_eq!(db.count("SELECT count(*) FROM dbwarden_lock"), 8);
        assert_eq!(
            db.count("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'history\\_%'"),
            8
        );
    }
}

#[test]
fn runners_waiting_for_a_migration_hold_one_connection_each_and_then_find_nothing_to_do() {
    // 64 replicas waiting on a server with the default max_connections = 100: at two
    // connections each (a kept session plus the LISTEN one) they filled it, and the rest were
    // refused and retried. A run that waits only to look again now waits on one connection.
    const WAITERS: usize = 24;
    let sb = Sandbox::new();
    sb.write_migration("0001_slow.sql", "SELECT pg_sleep(6);");
    sb.write_migration("0002_table.sql", "CREATE TABLE t2 (id int PRIMARY KEY);");
    let db = PgDb::new();
    let holder = db.spawn(&sb, &["migrate"]);
    db.wait_for(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'SELECT pg_sleep(6)%'",
        Duration::from_secs(30),
    );
    let t0 = Instant::now();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| db.spawn(&sb, &["migrate", "--wait", "60s"]))
        .collect();
    // Sample while the holder still sleeps, after the waiters settled.
    let mut c = db.client();
    let sessions = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'";
    let mut most = 0;
    while t0.elapsed() < Duration::from_secs(4) {
        if t0.elapsed() > Duration::from_millis(2500) {
            most = most.max(c.count(sessions));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The holder's lock session and heartbeat connection, this test's client, one each.
    assert!(
        most <= WAITERS as i64 + 3,
        "{WAITERS} waiting runners held {most} sessions (holder and test client included)"
    );
    let applied = Run::wait(holder, Duration::from_secs(60));
    assert_eq!(applied.code, 0, "{applied:?}");
    assert!(
        applied.stderr.contains("applied 2 migration(s)"),
        "{applied:?}"
    );
    for (i, w) in waiters.into_iter().enumerate() {
        let r = Run::wait(w, Duration::from_secs(90));
        assert_eq!(r.code, 0, "waiter {i}: {r:?}");
        assert!(
            r.stderr
                .contains("applied 0 migration(s), 2 already applied"),
            "waiter {i}: {r:?}"
        );
    }
    assert_eq!(db.count("SELECT count(*) FROM dbwarden_migrations"), 2);
    // Nobody took the lock alone after the holder: the token is the holder's.
    assert_eq!(db.count("SELECT fencing_token FROM dbwarden_lock"), 1);
}
