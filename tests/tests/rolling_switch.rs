//! A rolling switch from sqlx on PostgreSQL: during the rollout, old replicas still run
//! sqlx's migrator at start-up while new ones run dbwarden. After `adopt`, dbwarden takes the
//! lock sqlx's migrator takes and writes `_sqlx_migrations` as sqlx does, so neither tool runs
//! a migration the other ran.
//!
//! The old replicas here are `sqlx_replica` (sqlx's `Migrator::run`, what an application's
//! `sqlx::migrate!().run(&pool)` does). sqlx-cli 0.9's `migrate run` takes no lock at all
//! (sqlx-cli/src/migrate.rs calls `apply` without `lock`), so several sqlx-cli processes race
//! each other whoever else is there; the second test shows that with them in the mix no
//! migration still commits twice and every dbwarden process still succeeds.

use std::process::{Command, Stdio};
use std::time::Duration;

use dbwarden_tests::peers::{sqlx_cli, sqlx_migrate};
use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox};

const PENDING: i64 = 50;

/// A database sqlx-cli migrated (one migration) and dbwarden adopted, with `PENDING` more
/// migrations in the folder; each logs itself into `ran` once per run of it.
fn adopted_with_pending() -> (Sandbox, PgDb) {
    let sb = Sandbox::new();
    let db = PgDb::new();
    sb.write_migration(
        "0_ran.sql",
        "CREATE TABLE ran (version int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());\n",
    );
    assert_eq!(sqlx_migrate(&db.url, &sb.migrations()).code, 0);
    let r = db.run(&sb, &["adopt", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    for v in 1..=PENDING {
        sb.write_migration(
            &format!("{v}_step_{v}.sql"),
            &format!(
                "INSERT INTO ran (version) VALUES ({v});\nSELECT pg_sleep(0.03);\nCREATE TABLE step_{v} (id int);\n"
            ),
        );
    }
    (sb, db)
}

fn replica(db: &PgDb, sb: &Sandbox) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_sqlx_replica"))
        .arg(&db.url)
        .arg(sb.migrations())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sqlx_replica")
}

fn sqlx_cli_process(db: &PgDb, sb: &Sandbox) -> std::process::Child {
    Command::new(sqlx_cli())
        .args(["migrate", "run", "--database-url", &db.url, "--source"])
        .arg(sb.migrations())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sqlx-cli")
}

/// Every migration ran exactly once, both tools' tables record all of them, and a last
/// dbwarden run (which records what sqlx ran last) finds nothing to do.
fn each_ran_once(db: &PgDb, sb: &Sandbox) {
    let runs = db.query(
        "SELECT string_agg(version || 'x' || n, ',' ORDER BY version) FROM (SELECT version, count(*) AS n FROM ran GROUP BY version) c",
    );
    let want: Vec<String> = (1..=PENDING).map(|v| format!("{v}x1")).collect();
    assert_eq!(runs, [want.join(",")], "each migration ran exactly once");
    assert_eq!(
        db.count("SELECT count(*) FROM _sqlx_migrations WHERE success"),
        PENDING + 1
    );
    let r = db.run(sb, &["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        db.count("SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"),
        PENDING + 1
    );
    assert_eq!(
        db.count("SELECT count(*) FROM ran"),
        PENDING,
        "the last run applied nothing"
    );
}

/// Four old replicas and four dbwarden runners; with `staggered`, the replicas start once the
/// dbwarden runner that won is half-way through (without sqlx's lock they would start
/// applying the migration it is in and fail on it).
fn mixed_fleet(staggered: bool) {
    let (sb, db) = adopted_with_pending();
    let mut children = Vec::new();
    for _ in 0..4 {
        children.push(("dbwarden", db.spawn(&sb, &["migrate"])));
        if !staggered {
            children.push(("sqlx replica", replica(&db, &sb)));
        }
    }
    if staggered {
        db.wait_for(
            "SELECT count(*) FROM ran HAVING count(*) >= 10",
            Duration::from_secs(60),
        );
        for _ in 0..4 {
            children.push(("sqlx replica", replica(&db, &sb)));
        }
    }
    for (who, c) in children {
        let r = Run::wait(c, Duration::from_secs(120));
        assert_eq!(r.code, 0, "{who}: {r:?}");
    }
    each_ran_once(&db, &sb);
}

#[test]
fn four_sqlx_migrator_replicas_and_four_dbwarden_runners_at_once() {
    for _ in 0..3 {
        mixed_fleet(false);
    }
}

#[test]
fn old_replicas_starting_while_dbwarden_migrates_wait_for_it() {
    for _ in 0..2 {
        mixed_fleet(true);
    }
}

#[test]
fn with_sqlx_cli_processes_in_the_mix_nothing_commits_twice_and_dbwarden_succeeds() {
    let (sb, db) = adopted_with_pending();
    let mut children = Vec::new();
    for i in 0..8 {
        children.push(if i % 2 == 0 {
            ("sqlx-cli", sqlx_cli_process(&db, &sb))
        } else {
            ("dbwarden", db.spawn(&sb, &["migrate"]))
        });
    }
    let mut sqlx_failed = 0;
    for (who, c) in children {
        let r = Run::wait(c, Duration::from_secs(120));
        if who == "dbwarden" {
            assert_eq!(r.code, 0, "{who}: {r:?}");
        } else if r.code != 0 {
            sqlx_failed += 1;
        }
    }
    eprintln!("sqlx-cli processes that failed their race (they take no lock): {sqlx_failed} of 4");
    each_ran_once(&db, &sb);
}
