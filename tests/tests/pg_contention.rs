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
