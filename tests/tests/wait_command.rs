//! `dbwarden wait`, the readiness gate: replicas started before a slow `migrate` block until it
//! has applied everything, then exit 0, never taking the lock; it exits 3 on timeout, 78 when
//! the migration it waits for is halted for review, 2 when a file it waits for changed.

use std::time::{Duration, Instant};

use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox, kill9, slow_select, sqlite_count};

/// `waiters` `wait` processes, then a `migrate` that takes about `slow` seconds: every waiter
/// exits 0, none before the migration could have finished, and the lock was taken once (by
/// the migrate: the fencing token is 1).
fn waiters_exit_after_the_migrate(sb: &Sandbox, url: &str, waiters: usize, slow: f64) {
    waiters_exit_after(sb, url, waiters, slow, &[]);
}

/// The same, with `extra` arguments for the gates and the migrate alike.
fn waiters_exit_after(sb: &Sandbox, url: &str, waiters: usize, slow: f64, extra: &[&str]) {
    let args = |cmd: &'static str| -> Vec<String> {
        let mut v: Vec<String> = vec![cmd.into(), "-u".into(), url.into()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let mut wait_args = args("wait");
    wait_args.extend(["--timeout".into(), "90s".into()]);
    let wait_args: Vec<&str> = wait_args.iter().map(String::as_str).collect();
    let started = Instant::now();
    let gates: Vec<_> = (0..waiters).map(|_| sb.spawn(&wait_args)).collect();
    // The gates are up and polling before anything is applied.
    std::thread::sleep(Duration::from_millis(500));
    let migrate_args = args("migrate");
    let migrate_args: Vec<&str> = migrate_args.iter().map(String::as_str).collect();
    let mut migrate = Some(sb.spawn(&migrate_args));
    let mut migrate_run = None;
    let mut migrate_done = Duration::ZERO;
    // Watch every process: a gate may open only once everything is applied. When a gate is
    // seen gone while the migrate still runs, the history must already say so -- a gate that
    // opened early is caught while the slow migration is still in its statement (no bet on
    // how long that statement takes on a loaded machine).
    let mut gates: Vec<Option<std::process::Child>> = gates.into_iter().map(Some).collect();
    let mut opened: Vec<(Run, Duration)> = Vec::new();
    while gates.iter().any(Option::is_some) || migrate.is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "gates or migrate hang"
        );
        if let Some(m) = migrate.as_mut()
            && m.try_wait().unwrap().is_some()
        {
            migrate_done = started.elapsed();
            migrate_run = Some(Run::wait(migrate.take().unwrap(), Duration::from_secs(10)));
        }
        for slot in gates.iter_mut() {
            if let Some(g) = slot.as_mut()
                && g.try_wait().unwrap().is_some()
            {
                let at = started.elapsed();
                if migrate.is_some() {
                    let st = survey(sb, url, extra);
                    assert_eq!(
                        (&st["counts"]["pending"], &st["counts"]["running"]),
                        (&0.into(), &0.into()),
                        "a gate opened at {at:?} while migrations were still pending: {st}"
                    );
                }
                opened.push((Run::wait(slot.take().unwrap(), Duration::from_secs(10)), at));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let m = migrate_run.expect("the migrate ended");
    assert_eq!(m.code, 0, "{m:?}");
    assert!(
        migrate_done.as_secs_f64() >= slow * 0.25,
        "the slow migration was not slow ({migrate_done:?}): the gates were not tested"
    );
    for (r, at) in &opened {
        assert_eq!(r.code, 0, "{r:?}");
        assert!(r.stderr.contains("ready:"), "{r:?}");
        assert!(
            *at <= migrate_done + Duration::from_secs(10),
            "a gate opened at {at:?}, long after the migrate ended at {migrate_done:?}: {r:?}"
        );
    }
    let mut status_args = vec!["-u", url];
    status_args.extend(
        extra
            .iter()
            .filter(|a| **a != "--redis-url" && !a.starts_with("redis://")),
    );
    let (_, status) = sb.status(&status_args);
    assert_eq!(
        status["fencing_token"], 1,
        "only the migrate took the lock: {status}"
    );
}

/// `dbwarden status --json` of the migrations (the Redis lease's flags left out).
fn survey(sb: &Sandbox, url: &str, extra: &[&str]) -> serde_json::Value {
    let mut a = vec!["status", "-u", url, "--json"];
    a.extend(
        extra
            .iter()
            .filter(|a| **a != "--redis-url" && !a.starts_with("redis://")),
    );
    let r = sb.run(&a);
    assert_eq!(r.code, 0, "{r:?}");
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {r:?}"))
}

#[test]
fn sqlite_gates_open_when_the_migrate_is_done() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration(
        "0002_slow.sql",
        &format!("CREATE TABLE slow AS {};", slow_select(3)),
    );
    sb.write_migration("0003_c.sql", "CREATE TABLE c (x INTEGER);");
    waiters_exit_after_the_migrate(&sb, "sqlite://dbwarden.db", 6, 2.0);
}

#[test]
fn postgres_gates_open_when_the_migrate_is_done() {
    let db = PgDb::new();
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration("0002_slow.sql", "SELECT pg_sleep(3);");
    sb.write_migration("0003_c.sql", "CREATE TABLE c (x INTEGER);");
    waiters_exit_after_the_migrate(&sb, &db.url, 8, 3.0);
}

/// A Redis-guarded migrate on SQLite: the gates listen on the lease's release channel too
/// (never taking the lease), and open once everything is applied.
#[test]
fn redis_guarded_gates_open_when_the_migrate_is_done() {
    let sb = Sandbox::new();
    let ns = dbwarden_tests::unique_name("gate");
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration(
        "0002_slow.sql",
        &format!("CREATE TABLE slow AS {};", slow_select(3)),
    );
    let redis = dbwarden_tests::server_url("DBWARDEN_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    waiters_exit_after(
        &sb,
        "sqlite://dbwarden.db",
        4,
        2.0,
        &["--namespace", &ns, "--redis-url", &redis],
    );
}

#[test]
fn timeout_is_exit_3_and_until_bounds_the_wait() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration("0002_b.sql", "CREATE TABLE b (x INTEGER);");
    let r = sb.run(&["wait", "--timeout", "1s"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert!(
        r.stderr.contains("timed out") && r.stderr.contains("1, 2"),
        "{r:?}"
    );
    assert!(!sb.db().exists(), "wait creates nothing");

    assert_eq!(sb.run(&["migrate", "--to", "1"]).code, 0);
    let r = sb.run(&["wait", "--until", "1", "--timeout", "1s"]);
    assert_eq!(r.code, 0, "{r:?}");
    let r = sb.run(&["wait", "--until", "2", "--timeout", "1s"]);
    assert_eq!(r.code, 3, "{r:?}");
    for bad in [["--until", "7"], ["--until", "x"], ["--timeout", "soon"]] {
        let r = sb.run(&["wait", bad[0], bad[1]]);
        assert_eq!(r.code, 2, "{bad:?}: {r:?}");
        assert_eq!(r.stderr_lines().len(), 1, "{r:?}");
    }
    assert_eq!(
        sqlite_count(&sb.db(), "SELECT max(fencing_token) FROM dbwarden_lock"),
        1,
        "no wait took the lock"
    );
}

#[test]
fn a_changed_file_is_exit_2_and_a_halted_migration_is_exit_78() {
    let sb = Sandbox::new();
    sb.write_migration("0001_log.sql", "CREATE TABLE log (stmt TEXT PRIMARY KEY);");
    assert_eq!(sb.run(&["migrate"]).code, 0);
    sb.write_migration(
        "0001_log.sql",
        "CREATE TABLE log (stmt TEXT PRIMARY KEY, x INTEGER);",
    );
    let r = sb.run(&["wait", "--timeout", "5s"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("changed after it was applied"), "{r:?}");
    sb.write_migration("0001_log.sql", "CREATE TABLE log (stmt TEXT PRIMARY KEY);");

    // A journaled migration killed in flight, then recovery with `halt`: NEEDS_REVIEW.
    sb.write_migration(
        "0002_journaled.sql",
        &format!(
            "-- dbwarden:no-transaction\nINSERT INTO log VALUES ('2.1');\nCREATE TABLE slow AS {};\n",
            slow_select(6)
        ),
    );
    let holder = sb.spawn(&["migrate"]);
    let t0 = Instant::now();
    while sqlite_count(
        &sb.db(),
        "SELECT count(*) FROM dbwarden_migrations WHERE version = 2 AND statements_done = 1",
    ) == 0
    {
        assert!(t0.elapsed() < Duration::from_secs(30), "never reached 2.1");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    kill9(holder);
    let r = sb.run(&["migrate", "--recovery-policy", "halt"]);
    assert_eq!(r.code, 78, "{r:?}");
    let gate = sb.spawn(&["wait", "--timeout", "30s"]);
    let r = Run::wait(gate, Duration::from_secs(60));
    assert_eq!(r.code, 78, "{r:?}");
    assert!(r.stderr.contains("dbwarden resolve 2"), "{r:?}");
    // Waiting only up to version 1 is not held up by it.
    let r = sb.run(&["wait", "--until", "1", "--timeout", "5s"]);
    assert_eq!(r.code, 0, "{r:?}");
}

/// A PostgreSQL gate after a release that did not finish the folder (the migrate failed): it
/// keeps waiting at the poll pace, not in a loop around a wake-up it has already heard. Counted
/// on the server: the transactions the database committed while only the gate was looking.
#[test]
fn a_postgres_gate_does_not_spin_after_a_release() {
    let db = PgDb::new();
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration("0002_broken.sql", "SELECT 1/0;");
    let gate = db.spawn(&sb, &["wait", "--timeout", "5s"]);
    std::thread::sleep(Duration::from_millis(500));
    let r = db.run(&sb, &["migrate"]);
    assert_eq!(r.code, 1, "the second migration fails: {r:?}");
    // The migrate's backend has ended, so its own transactions are counted already.
    std::thread::sleep(Duration::from_millis(1500));
    let commits = |db: &PgDb| {
        db.count(&format!(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = '{}'",
            db.name
        ))
    };
    let before = commits(&db);
    let r = Run::wait(gate, Duration::from_secs(60));
    assert_eq!(r.code, 3, "it waits out its timeout for 0002: {r:?}");
    std::thread::sleep(Duration::from_millis(1500)); // the gate's backends report at exit
    let looked = commits(&db) - before;
    // Polling (at least every 200 ms, a status read at most every second... or at every look
    // while a row is half-done) commits some dozens in these ~3 s; a spin, thousands.
    assert!(
        looked < 600,
        "{looked} transactions in ~3 s of waiting: the gate is spinning"
    );
}
