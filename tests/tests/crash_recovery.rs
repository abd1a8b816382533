//! A holder killed with `kill -9` mid-migration: lock-status says DEAD, the next run inspects,
//! re-runs or resumes safely (or halts for review), and nothing is applied twice.

use std::time::Duration;

use dbwarden_tests::{
    Run, Sandbox, kill9, signal, slow_select, sqlite_count, sqlite_query, sqlite_write_locked,
};
use rustix::process::Signal;

/// Wait until the history table satisfies `sql` (a count query returning >= 1).
fn wait_for(sb: &Sandbox, sql: &str) {
    let t0 = std::time::Instant::now();
    loop {
        if sb.db().exists() {
            let ok = std::panic::catch_unwind(|| sqlite_count(&sb.db(), sql)).unwrap_or(0);
            if ok >= 1 {
                return;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "timed out waiting for: {sql}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_transactional_migration_is_rolled_back_reported_dead_and_rerun_once() {
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_ran.sql",
        "CREATE TABLE ran (version INTEGER PRIMARY KEY);",
    );
    sb.write_migration(
        "0002_slow.sql",
        &format!(
            "INSERT INTO ran VALUES (2);\nCREATE TABLE slow AS {};",
            slow_select(4)
        ),
    );
    sb.write_migration("0003_after.sql", "INSERT INTO ran VALUES (3);");

    let holder = sb.spawn(&["migrate"]);
    wait_for(
        &sb,
        "SELECT count(*) FROM dbwarden_migrations WHERE version = 1",
    );
    std::thread::sleep(Duration::from_millis(300)); // now inside migration 2's transaction
    kill9(holder);

    let (code, status) = sb.status(&[]);
    assert_eq!(code, 11, "{status}");
    assert_eq!(status["verdict"], "DEAD");
    assert_eq!(status["held"], false);
    assert_eq!(status["status"]["state"], "RUNNING");

    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("previous holder died"), "{r:?}");
    let db = sb.db();
    assert_eq!(
        sqlite_query(&db, "SELECT group_concat(version) FROM ran"),
        ["2,3"]
    );
    assert_eq!(
        sqlite_count(
            &db,
            "SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"
        ),
        3
    );
    assert_eq!(sqlite_count(&db, "SELECT count(*) FROM slow"), 1);
    // Fencing tokens strictly increase across the crash: run 1 wrote v1 with token 1, the
    // recovering run wrote v2 and v3 with token 2.
    assert_eq!(
        sqlite_query(
            &db,
            "SELECT group_concat(fencing_token) FROM (SELECT fencing_token FROM dbwarden_migrations ORDER BY version)"
        ),
        ["1,2,2"]
    );
    assert_eq!(
        sqlite_count(
            &db,
            "SELECT count(*) FROM dbwarden_lock_audit WHERE action = 'broken_stale_lock'"
        ),
        1
    );
    let (code, status) = sb.status(&[]);
    assert_eq!((code, status["verdict"].as_str()), (0, Some("AVAILABLE")));
    // And one more run: nothing pending, seen under the shared lock; the token stays 2.
    let r = sb.run(&["migrate"]);
    assert!(
        r.stderr
            .contains("applied 0 migration(s), 3 already applied")
            && r.stderr.contains("fencing token 2 unchanged"),
        "{r:?}"
    );
    assert_eq!(
        sqlite_count(&db, "SELECT fencing_token FROM dbwarden_lock"),
        2
    );
}

/// A five-statement migration that runs outside a transaction (journaled per statement); the
/// third statement is slow, and killed.
/// A journaled (no-transaction) migration killed inside its third statement, a slow and
/// non-idempotent `CREATE TABLE … AS`: on SQLite each statement runs in one transaction with
/// its journal entry, so the kill rolls that statement back with its entry.
fn journaled(sb: &Sandbox) {
    sb.write_migration("0001_log.sql", "CREATE TABLE log (stmt TEXT PRIMARY KEY);");
    sb.write_migration(
        "0002_journaled.sql",
        &format!(
            "-- dbwarden:no-transaction\n\
             INSERT INTO log VALUES ('2.1');\n\
             INSERT INTO log VALUES ('2.2');\n\
             CREATE TABLE slow AS {};\n\
             CREATE TABLE d (x INTEGER);\n\
             CREATE TABLE e (x INTEGER);\n",
            slow_select(4)
        ),
    );
    sb.write_migration("0003_after.sql", "INSERT INTO log VALUES ('3');");
    let holder = sb.spawn(&["migrate"]);
    wait_for(
        sb,
        "SELECT count(*) FROM dbwarden_migrations WHERE version = 2 AND statements_done = 2",
    );
    std::thread::sleep(Duration::from_millis(300)); // statement 3 is in flight
    kill9(holder);
    let (code, status) = sb.status(&[]);
    assert_eq!(
        (code, status["verdict"].as_str()),
        (11, Some("DEAD")),
        "{status}"
    );
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM sqlite_master WHERE name = 'slow'"
        ),
        0,
        "statement 3 rolled back"
    );
}

#[test]
fn a_killed_journaled_statement_rolled_back_with_its_entry_resumes_there() {
    let sb = Sandbox::new();
    journaled(&sb);
    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("resuming at statement 3"), "{r:?}");
    let db = sb.db();
    // Statements 1 and 2 (INSERTs with a primary key) ran once: a second run would have failed.
    assert_eq!(
        sqlite_query(
            &db,
            "SELECT group_concat(stmt) FROM (SELECT stmt FROM log ORDER BY stmt)"
        ),
        ["2.1,2.2,3"]
    );
    assert_eq!(
        sqlite_query(
            &db,
            "SELECT state || ':' || statements_done FROM dbwarden_migrations WHERE version = 2"
        ),
        ["APPLIED:5"]
    );
    assert_eq!(
        sqlite_count(
            &db,
            "SELECT count(*) FROM sqlite_master WHERE name IN ('slow','d','e')"
        ),
        3
    );
}

#[test]
fn under_recovery_policy_halt_a_killed_journaled_migration_waits_for_resolve() {
    let sb = Sandbox::new();
    journaled(&sb);
    for _ in 0..2 {
        let r = sb.run(&["migrate", "--recovery-policy", "halt"]);
        assert_eq!(r.code, 78, "{r:?}");
        assert!(r.stderr.contains("NEEDS_REVIEW: migration 2"), "{r:?}");
        assert!(r.stderr.contains("dbwarden resolve 2"), "{r:?}");
        let (code, status) = sb.status(&[]);
        assert_eq!(
            (code, status["verdict"].as_str()),
            (12, Some("NEEDS_REVIEW")),
            "{status}"
        );
        assert_eq!(status["status"]["migration_version"], 2);
    }
    let db = sb.db();
    assert_eq!(
        sqlite_count(&db, "SELECT count(*) FROM log"),
        2,
        "nothing ran while halted"
    );

    // resolve needs a terminal or --yes
    let r = sb.run(&["resolve", "2", "--retry"]);
    assert_eq!(r.code, 2, "{r:?}");
    let r = sb.run(&["resolve", "2", "--retry", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("re-run from statement 3"), "{r:?}");
    assert_eq!(
        sqlite_count(
            &db,
            "SELECT count(*) FROM dbwarden_lock_audit WHERE action = 'resolve_retry'"
        ),
        1
    );
    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        sqlite_query(
            &db,
            "SELECT group_concat(stmt) FROM (SELECT stmt FROM log ORDER BY stmt)"
        ),
        ["2.1,2.2,3"]
    );
    assert_eq!(
        sqlite_count(
            &db,
            "SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"
        ),
        3
    );
    let (code, status) = sb.status(&[]);
    assert_eq!(
        (code, status["verdict"].as_str()),
        (0, Some("AVAILABLE")),
        "{status}"
    );
}

#[test]
fn abandon_and_mark_applied_are_audited_decisions() {
    let sb = Sandbox::new();
    journaled(&sb);
    assert_eq!(sb.run(&["migrate", "--recovery-policy", "halt"]).code, 78);
    let r = sb.run(&["resolve", "2", "--mark-applied", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    let db = sb.db();
    // Marked applied: statements 3-5 never ran; migration 3 did.
    assert_eq!(
        sqlite_count(
            &db,
            "SELECT count(*) FROM sqlite_master WHERE name IN ('slow','d','e')"
        ),
        0
    );
    assert_eq!(
        sqlite_count(&db, "SELECT count(*) FROM log WHERE stmt = '3'"),
        1
    );
    assert_eq!(
        sqlite_count(
            &db,
            "SELECT count(*) FROM dbwarden_lock_audit WHERE action IN ('resolve_mark_applied', 'needs_review')"
        ),
        2
    );
    // resolving something that is not halted is a usage error
    let r = sb.run(&["resolve", "2", "--abandon", "--yes"]);
    assert_eq!(r.code, 2, "{r:?}");
}

#[test]
fn recovery_policy_halt_sends_every_dead_predecessor_to_review_and_the_halt_survives_other_commands()
 {
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_ran.sql",
        "CREATE TABLE ran (version INTEGER PRIMARY KEY);",
    );
    sb.write_migration(
        "0002_slow.sql",
        &format!(
            "INSERT INTO ran VALUES (2);\nCREATE TABLE slow AS {};",
            slow_select(4)
        ),
    );
    let holder = sb.spawn(&["migrate"]);
    wait_for(
        &sb,
        "SELECT count(*) FROM dbwarden_migrations WHERE version = 1",
    );
    std::thread::sleep(Duration::from_millis(300));
    kill9(holder);
    // Nothing was left half-done (the transaction rolled back), but halt means a human looks.
    let r = sb.run(&["migrate", "--recovery-policy", "halt"]);
    assert_eq!(r.code, 78, "{r:?}");
    assert!(r.stderr.contains("NEEDS_REVIEW: migration 2"), "{r:?}");
    let (code, v) = sb.status(&[]);
    assert_eq!(
        (code, v["status"]["migration_version"].as_i64()),
        (12, Some(2)),
        "{v}"
    );
    // Neither an unrelated `run` nor a mistaken `resolve` clears the halt.
    assert_eq!(sb.run(&["run", "--", "true"]).code, 0);
    let r = sb.run(&["resolve", "3", "--retry", "--yes"]);
    assert_eq!(r.code, 2, "{r:?}");
    let (code, v) = sb.status(&[]);
    assert_eq!(
        (code, v["status"]["migration_version"].as_i64()),
        (12, Some(2)),
        "{v}"
    );
    assert_eq!(sb.run(&["migrate"]).code, 78);
    // The human's decision does.
    let r = sb.run(&["resolve", "2", "--retry", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        sqlite_query(&sb.db(), "SELECT group_concat(version) FROM ran"),
        ["2"]
    );
}

#[test]
fn sigterm_stops_between_statements_releases_and_exits_75() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration(
        "0002_journaled.sql",
        &format!(
            "-- dbwarden:no-transaction\nCREATE TABLE s1 AS {slow};\nCREATE TABLE s2 AS {slow};",
            slow = slow_select(2)
        ),
    );
    let holder = sb.spawn(&["migrate"]);
    wait_for(
        &sb,
        "SELECT count(*) FROM dbwarden_migrations WHERE version = 2 AND state = 'RUNNING'",
    );
    // The RUNNING row lands just before statement 1 starts; a TERM in between stops before it
    // (also clean, but not what this test is about). Statement 1 runs in a write transaction,
    // and nothing else writes the database after the RUNNING row: the write lock says it began.
    let t0 = std::time::Instant::now();
    while !sqlite_write_locked(&sb.db()) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "statement 1 never began"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(holder.id(), Signal::TERM);
    let r = Run::wait(holder, Duration::from_secs(60));
    assert_eq!(r.code, 75, "{r:?}");
    assert!(r.stderr.contains("interrupted"), "{r:?}");
    // Released cleanly: no lock file, AVAILABLE, and statement 1 finished (it was running).
    assert!(!sb.path().join("dbwarden.db.dbwarden-lock").exists());
    let (code, v) = sb.status(&[]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
    assert_eq!(
        sqlite_query(
            &sb.db(),
            "SELECT state || ':' || statements_done FROM dbwarden_migrations WHERE version = 2"
        ),
        ["FAILED:1"]
    );
    // FAILED after a clean stop: the next run resumes at statement 2 without review.
    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("resuming at statement 2"), "{r:?}");
}

/// The same crashes on every engine, with short heartbeats (`--lock-ttl 2s`).
mod every_engine {
    use dbwarden_tests::chaos::{ClickHouse, MySql, Postgres, Redis, Sqlite, Target};
    use dbwarden_tests::modes::Case;
    use std::time::Duration;

    /// The statement the runner is killed in (ClickHouse's `sleep` stops at 3 s).
    const SLOW_MS: u32 = 3000;

    /// lock-status after a `kill -9`: DEAD (exit 11) once the server has let go of the dead
    /// runner's lock or its lease ran out; until then it may still show the lock held.
    fn reported_dead(case: &Case) {
        case.wait_status(Duration::from_secs(30), |code, v| {
            match v["verdict"].as_str() {
                Some("DEAD") => {
                    assert_eq!(code, 11, "{v}");
                    true
                }
                Some("HEALTHY" | "STUCK") => false,
                _ => panic!("[{}] lock-status after the kill: {v}", case.target.name()),
            }
        });
    }

    /// Killed inside an idempotent statement: the next run resumes there, so every
    /// non-idempotent statement ran exactly once, and the lock ends AVAILABLE.
    fn resumes_after_an_idempotent_statement(target: &dyn Target) {
        let case = Case::new(target);
        case.log_table();
        case.slow_idempotent(2, SLOW_MS);
        case.inserts(3, 1);
        let holder = case.spawn_guarded(&[]);
        case.wait_inside(2, 1);
        holder.kill9();
        reported_dead(&case);

        let r = case.migrate(&[]);
        assert_eq!(r.code, 0, "[{}] {r:?}", target.name());
        assert!(r.stderr.contains("previous holder died"), "{r:?}");
        case.assert_each_ran_once(&["m2.s1", "m2.s3", "m3.s1"]);
        assert_eq!(case.applied(), [1, 2, 3]);
        let tokens = case.tokens();
        assert!(
            tokens[0] < tokens[1],
            "the successor's token is newer: {tokens:?}"
        );
        case.assert_available();
    }

    /// Killed inside a non-idempotent statement. Where it ran in a transaction together with
    /// its journal entry (PostgreSQL, SQLite), the kill rolled both back: the next run resumes
    /// there and every statement runs once. Elsewhere (MySQL, where the statement may have
    /// committed before its entry; ClickHouse) every later run halts with exit 78 and
    /// lock-status says NEEDS_REVIEW at that migration; nothing after it runs. The operator
    /// looks (did the insert land?), resolves, and the next run finishes.
    fn halts_for_review_inside_a_non_idempotent_statement(target: &dyn Target) {
        let case = Case::new(target);
        case.log_table();
        case.slow_insert(2, SLOW_MS);
        case.inserts(3, 1);
        let holder = case.spawn_guarded(&[]);
        // MySQL sends the two INSERTs in one batch, so wait for the migration to start and
        // for the slow statement to be under way.
        case.wait_running(2);
        std::thread::sleep(Duration::from_millis(300));
        holder.kill9();
        reported_dead(&case);
        // The server may still be running the dead client's INSERT (ClickHouse does, over
        // HTTP): let it end before anyone counts what landed.
        std::thread::sleep(Duration::from_millis(u64::from(SLOW_MS) + 500));

        if target.transactional() {
            let r = case.migrate(&[]);
            assert_eq!(r.code, 0, "[{}] {r:?}", target.name());
            assert!(r.stderr.contains("previous holder died"), "{r:?}");
            case.assert_each_ran_once(&["m2.s1", "m2.s2", "m3.s1"]);
            assert_eq!(case.applied(), [1, 2, 3]);
            case.assert_available();
            return;
        }

        for _ in 0..2 {
            let r = case.migrate(&[]);
            assert_eq!(r.code, 78, "[{}] {r:?}", target.name());
        }
        let (code, v) = case.status();
        assert_eq!(
            (code, v["verdict"].as_str()),
            (12, Some("NEEDS_REVIEW")),
            "{v}"
        );
        assert_eq!(v["status"]["migration_version"], 2, "{v}");
        assert_eq!(
            case.ran("m3.s1"),
            0,
            "nothing after the halted migration ran"
        );
        let landed = case.ran("m2.s2");
        assert!(landed <= 1, "the statement in flight ran {landed} times");

        // The decision a human makes from what they see.
        let how = if landed == 1 {
            "--mark-applied"
        } else {
            "--retry"
        };
        let r = case.resolve(2, how);
        assert_eq!(r.code, 0, "[{}] resolve {how}: {r:?}", target.name());
        let r = case.migrate(&[]);
        assert_eq!(r.code, 0, "[{}] {r:?}", target.name());
        case.assert_each_ran_once(&["m2.s1", "m2.s2", "m3.s1"]);
        assert_eq!(case.applied(), [1, 2, 3]);
        case.assert_available();
    }

    macro_rules! engines {
        ($($name:ident => $target:expr),* $(,)?) => {
            $(mod $name {
                use super::*;

                #[test]
                fn resumes_after_an_idempotent_statement() {
                    super::resumes_after_an_idempotent_statement(&$target);
                }

                #[test]
                fn halts_for_review_inside_a_non_idempotent_statement() {
                    super::halts_for_review_inside_a_non_idempotent_statement(&$target);
                }
            })*
        };
    }

    engines! {
        sqlite => Sqlite,
        postgres => Postgres::default(),
        mysql => MySql::default(),
        clickhouse => ClickHouse::default(),
        redis => Redis::default(),
    }
}
