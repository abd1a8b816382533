//! Many runners start at once: exactly one applies, the others wait, all exit 0, and nothing
//! runs twice. (sqlx-cli 0.9 run the same way leaves most processes exiting 1.)

use dbwarden_tests::{Run, Sandbox, assert_exclusive_tokens, sqlite_count};
use std::time::Duration;

/// 300 migrations, each creating a table and inserting its version into a shared table whose
/// primary key makes a second run of any migration fail loudly.
fn three_hundred(sb: &Sandbox) {
    sb.write_migration(
        "0001_ran.sql",
        "CREATE TABLE ran (version INTEGER PRIMARY KEY);\nINSERT INTO ran VALUES (1);",
    );
    for v in 2..=300 {
        sb.write_migration(
            &format!("{v:04}_table_{v}.sql"),
            &format!(
                "CREATE TABLE t_{v} (id INTEGER PRIMARY KEY, note TEXT NOT NULL);\nINSERT INTO t_{v} (note) VALUES ('v{v}; with a semicolon');\nINSERT INTO ran VALUES ({v});"
            ),
        );
    }
}

fn stampede(sb: &Sandbox, n: usize) -> Vec<Run> {
    let children: Vec<_> = (0..n).map(|_| sb.spawn(&["migrate"])).collect();
    children
        .into_iter()
        .map(|c| Run::wait(c, Duration::from_secs(180)))
        .collect()
}

#[test]
fn sixteen_runners_on_a_fresh_sqlite_file_all_exit_0_and_apply_each_migration_once() {
    for round in 1..=5 {
        let sb = Sandbox::new();
        three_hundred(&sb);
        let runs = stampede(&sb, 16);
        for (i, r) in runs.iter().enumerate() {
            assert_eq!(r.code, 0, "round {round} runner {i}: {r:?}");
        }
        let db = sb.db();
        assert_eq!(
            sqlite_count(&db, "SELECT count(*) FROM dbwarden_migrations"),
            300
        );
        assert_eq!(
            sqlite_count(
                &db,
                "SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"
            ),
            300
        );
        assert_eq!(sqlite_count(&db, "SELECT count(*) FROM ran"), 300);
        assert_eq!(
            sqlite_count(
                &db,
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name LIKE 't\\_%' ESCAPE '\\'"
            ),
            299
        );
        // Exactly one runner applied everything; the others found nothing pending.
        let appliers: Vec<_> = runs
            .iter()
            .filter(|r| r.stderr.contains("applied 300 migration(s)"))
            .collect();
        assert_eq!(appliers.len(), 1, "round {round}: {runs:?}");
        assert_eq!(
            runs.iter()
                .filter(|r| r
                    .stderr
                    .contains("applied 0 migration(s), 300 already applied"))
                .count(),
            15
        );
        // Every run that held the lock alone bumped the token once, each to its own value; the
        // rest looked under the shared lock after the apply, and bumped nothing (at least one did:
        // the look is not skipped).
        let alone = assert_exclusive_tokens(
            &runs,
            sqlite_count(
                &db,
                "SELECT fencing_token FROM dbwarden_lock WHERE namespace = 'default'",
            ),
        );
        assert!(
            alone < runs.len(),
            "every runner took the lock alone: {runs:?}"
        );
        assert!(
            !sb.path().join("dbwarden.db.dbwarden-lock").exists(),
            "lock file left behind"
        );
    }
}

#[test]
fn sixteen_runners_with_nothing_pending_all_exit_0_and_change_nothing() {
    let sb = Sandbox::new();
    three_hundred(&sb);
    assert_eq!(sb.run(&["migrate"]).code, 0);
    let before = dbwarden_tests::sqlite_query(
        &sb.db(),
        "SELECT group_concat(version || ':' || execution_id, ',') FROM dbwarden_migrations",
    );
    for (i, r) in stampede(&sb, 16).iter().enumerate() {
        assert_eq!(r.code, 0, "runner {i}: {r:?}");
        assert!(
            r.stderr
                .contains("applied 0 migration(s), 300 already applied"),
            "{r:?}"
        );
    }
    let after = dbwarden_tests::sqlite_query(
        &sb.db(),
        "SELECT group_concat(version || ':' || execution_id, ',') FROM dbwarden_migrations",
    );
    assert_eq!(before, after);
}

/// The same claim on every engine: eight runners started at once over a fresh database, three
/// rounds; every runner exits 0, each statement ran exactly once, each migration is APPLIED
/// once, and the lock ends AVAILABLE.
mod every_engine {
    use dbwarden_tests::Run;
    use dbwarden_tests::chaos::{ClickHouse, MySql, Postgres, Redis, Sqlite, Target};
    use dbwarden_tests::modes::Case;
    use std::time::Duration;

    fn eight_at_once(target: &dyn Target) {
        for round in 1..=3 {
            let case = Case::relaxed(target);
            case.log_table();
            for v in 2..=8 {
                case.inserts(v, 2);
            }
            let children: Vec<_> = (0..8).map(|_| case.spawn_migrate(&[])).collect();
            let runs: Vec<Run> = children
                .into_iter()
                .map(|c| Run::wait(c, Duration::from_secs(120)))
                .collect();
            for (i, r) in runs.iter().enumerate() {
                assert_eq!(
                    r.code,
                    0,
                    "[{}] round {round} runner {i}: {r:?}",
                    target.name()
                );
            }
            let ids: Vec<String> = (2..=8)
                .flat_map(|v| (1..=2).map(move |s| format!("m{v}.s{s}")))
                .collect();
            case.assert_each_ran_once(&ids.iter().map(String::as_str).collect::<Vec<_>>());
            assert_eq!(
                case.applied(),
                (1..=8).collect::<Vec<u64>>(),
                "round {round}"
            );
            // One holder applied everything: one token on every row.
            let tokens = case.tokens();
            assert!(tokens.windows(2).all(|w| w[0] == w[1]), "{tokens:?}");
            case.assert_available();
        }
    }

    #[test]
    fn sqlite() {
        eight_at_once(&Sqlite);
    }

    #[test]
    fn postgres() {
        eight_at_once(&Postgres::default());
    }

    #[test]
    fn mysql() {
        eight_at_once(&MySql::default());
    }

    #[test]
    fn clickhouse() {
        eight_at_once(&ClickHouse::default());
    }

    #[test]
    fn redis() {
        eight_at_once(&Redis::default());
    }
}
