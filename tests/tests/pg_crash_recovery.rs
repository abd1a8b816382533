//! PostgreSQL: a holder killed with `kill -9` mid-migration. The server ends its session, which
//! frees the advisory lock and rolls back the migration's transaction; a waiting runner takes
//! over long before the killed statement would have ended, re-runs the rolled-back migration,
//! and nothing is applied twice. (How fast -- the ≤ 1 s failover goal -- is measured by the
//! benchmark, `dbwarden-bench` row 6, not asserted here.)
//! Because migrations run on the lock session, a killed runner's statement that the server is
//! still executing keeps the lock until it ends or is cancelled: no two runners overlap.

use std::time::{Duration, Instant};

use dbwarden_tests::pg::{PgDb, local_epoch};
use dbwarden_tests::{Run, Sandbox, kill9, signal};
use rustix::process::Signal;

/// 1: the side table and a knob; 2: records itself, then sleeps as long as the knob says
/// (`secs` at first) in the same transaction; 3: records. Turning the knob to 0 (before a kill)
/// makes the re-run fast while the killed statement still sleeps.
fn slow_second(sb: &Sandbox, secs: u32) {
    sb.write_migration(
        "0001_ran.sql",
        &format!("CREATE TABLE ran (version INTEGER PRIMARY KEY, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp());\nINSERT INTO ran (version) VALUES (1);\nCREATE TABLE knob (secs FLOAT8 NOT NULL);\nINSERT INTO knob VALUES ({secs});"),
    );
    sb.write_migration(
        "0002_slow.sql",
        "INSERT INTO ran (version) VALUES (2);\nSELECT pg_sleep((SELECT secs FROM knob));",
    );
    sb.write_migration("0003_after.sql", "INSERT INTO ran (version) VALUES (3);");
}

/// Wait until the holder is inside migration 2; returns its execution id and lock-session pid.
fn holder_in_second(db: &PgDb) -> (String, i64) {
    db.wait_for(
        "SELECT count(*) FROM dbwarden_lock WHERE state = 'RUNNING' AND migration_version = 2",
        Duration::from_secs(60),
    );
    let row = db
        .client()
        .rows("SELECT execution_id, db_connection_id FROM dbwarden_lock");
    (row[0][0].clone(), row[0][1].parse().expect("backend pid"))
}

/// Wait until `n` dbwarden sessions are connected to the database.
fn sessions(db: &PgDb, n: usize) {
    db.wait_for(
        &format!(
            "SELECT (count(*) >= {n})::int FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'dbwarden'"
        ),
        Duration::from_secs(30),
    );
}

#[test]
fn a_killed_holder_is_replaced_before_its_statement_ends_and_its_migration_rerun_once() {
    let sb = Sandbox::new();
    slow_second(&sb, 30);
    let db = PgDb::new();
    let holder = db.spawn(&sb, &["migrate"]);
    let (dead_exec, _) = holder_in_second(&db);
    let waiters: Vec<_> = (0..2).map(|_| db.spawn(&sb, &["migrate"])).collect();
    // holder: lock session + heartbeat; each waiter: the connection it listens and tries on
    sessions(&db, 4);
    db.wait_knob_sleep();

    db.exec("UPDATE knob SET secs = 0");
    let killed_at = local_epoch();
    kill9(holder);
    // Until the server notices (client_connection_check_interval) the killed holder's backend
    // still holds the lock; from then on lock-status says DEAD (free, status row RUNNING) or
    // shows a waiter as the new holder -- never AVAILABLE.
    let t0 = Instant::now();
    loop {
        let (code, v) = db.status(&sb, &[]);
        let holder = v["holder"]["execution_id"].as_str().map(str::to_owned);
        match v["verdict"].as_str() {
            Some("HEALTHY") if holder.as_deref() == Some(dead_exec.as_str()) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "the server never noticed: {v}"
                );
                continue;
            }
            // A waiter has the lock: claimed (its status row), or for a moment not yet --
            // lock-status then says which runner that is rather than blaming another tool.
            Some("HEALTHY") if holder.is_some() => assert_eq!(code, 0, "{v}"),
            Some("HEALTHY") => {
                assert_eq!(code, 0, "{v}");
                assert!(
                    v["notes"].to_string().contains("dbwarden runner"),
                    "an unclaimed lock must be named as a dbwarden runner's: {v}"
                );
            }
            Some("DEAD") => assert_eq!(code, 11, "{v}"),
            // The successor claimed, recovered and finished before this look (the killed
            // holder's statement ended at once): free again, with the successor's token. Never
            // AVAILABLE with the dead holder's token 1, whose row said RUNNING.
            Some("AVAILABLE") if v["fencing_token"].as_u64() > Some(1) => {
                assert_eq!(code, 0, "{v}")
            }
            _ => panic!("lock-status after the kill: {v}"),
        }
        break;
    }

    let runs: Vec<Run> = waiters
        .into_iter()
        .map(|c| Run::wait(c, Duration::from_secs(120)))
        .collect();
    for r in &runs {
        assert_eq!(r.code, 0, "{r:?}");
    }
    // The first waiter to get the lock found the dead predecessor and re-ran migration 2.
    let recoverers: Vec<_> = runs
        .iter()
        .filter(|r| r.stderr.contains("previous holder died"))
        .collect();
    assert_eq!(recoverers.len(), 1, "{runs:?}");
    assert!(
        recoverers[0]
            .stderr
            .contains("applied 2 migration(s), 1 already applied"),
        "{runs:?}"
    );

    let mut c = db.client();
    assert_eq!(
        c.query("SELECT string_agg(version::text, ',' ORDER BY version) FROM ran"),
        ["1,2,3"]
    );
    assert_eq!(
        c.count("SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"),
        3
    );
    // v1 by the killed holder (token 1), v2 and v3 by its successor (token 2).
    assert_eq!(
        c.query(
            "SELECT string_agg(fencing_token::text, ',' ORDER BY version) FROM dbwarden_migrations"
        ),
        ["1,2,2"]
    );
    assert_eq!(
        c.count(&format!(
            "SELECT count(*) FROM dbwarden_migrations WHERE execution_id = '{dead_exec}'"
        )),
        1
    );
    // The successor took over (its claim, audited by core right after it) while the killed
    // holder's pg_sleep(30) still had most of its time to run: the server cancelled the dead
    // client's statement (client_connection_check_interval) instead of waiting it out.
    let took_over: f64 = c.query(
        "SELECT extract(epoch FROM at)::float8 FROM dbwarden_lock_audit WHERE action = 'broken_stale_lock'",
    )[0]
        .parse()
        .unwrap();
    let delay = took_over - killed_at;
    eprintln!("kill -9 to take-over: {:.0} ms", delay * 1000.0);
    assert!(
        (0.0..10.0).contains(&delay),
        "a waiter acquired {delay:.3}s after the kill: the killed pg_sleep(30) was waited out"
    );
    assert_eq!(c.count("SELECT count(*) FROM dbwarden_lock_audit"), 1);
    let (code, v) = db.status(&sb, &[]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
}

#[test]
fn a_killed_runner_keeps_the_lock_until_its_statement_is_cancelled() {
    let sb = Sandbox::new();
    slow_second(&sb, 20);
    let db = PgDb::new();
    let holder = db.spawn(&sb, &["migrate"]);
    let (dead_exec, backend) = holder_in_second(&db);
    let waiter = db.spawn(&sb, &["migrate"]);
    sessions(&db, 3);
    db.wait_knob_sleep();
    db.exec("UPDATE knob SET secs = 0");
    // Watch the server from a connection opened before the kill: while the killed runner's
    // backend exists, nobody else may have the lock.
    let mut c = db.client();
    let probe = format!(
        "SELECT extract(epoch FROM clock_timestamp())::float8, \
                (SELECT count(*) FROM pg_stat_activity WHERE pid = {backend}), \
                (SELECT execution_id FROM dbwarden_lock)"
    );
    // The statement is still running on the server when its client dies.
    let killed_at = local_epoch();
    signal(holder.id(), Signal::KILL);
    let t0 = Instant::now();
    let mut alive_after_kill = 0;
    let mut last_alive = 0.0f64;
    loop {
        let row = c.rows(&probe).remove(0);
        let (at, alive, owner): (f64, i64, &str) =
            (row[0].parse().unwrap(), row[1].parse().unwrap(), &row[2]);
        if alive > 0 {
            if at > killed_at {
                alive_after_kill += 1;
            }
            last_alive = at;
            assert_eq!(
                owner, dead_exec,
                "another runner claimed the lock while the killed runner's backend {backend} still existed"
            );
        } else if owner != dead_exec {
            break; // the successor claimed it, after the backend was gone
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no successor");
    }
    let h = Run::wait(holder, Duration::from_secs(10));
    assert_eq!(h.code, -1, "the holder must die by SIGKILL: {h:?}");
    let r = Run::wait(waiter, Duration::from_secs(60));
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        alive_after_kill > 0,
        "the scenario needs the statement still executing after the kill"
    );
    let claimed: f64 = c.query(
        "SELECT extract(epoch FROM at)::float8 FROM dbwarden_lock_audit WHERE action = 'broken_stale_lock'",
    )[0]
        .parse()
        .unwrap();
    assert!(
        claimed >= last_alive,
        "claimed at {claimed}, but the old backend was alive at {last_alive}"
    );
    // client_connection_check_interval: the orphaned pg_sleep(20) was cancelled, not waited
    // out (the claim is well under a second after the kill; 20 s leaves a loaded machine room).
    let started: f64 = c.query("SELECT extract(epoch FROM at)::float8 FROM ran WHERE version = 1")
        [0]
    .parse()
    .unwrap();
    eprintln!(
        "{alive_after_kill} probes saw the old backend alive after the kill; last seen {:.0} ms before the successor's claim; claim {:.2}s after migration 1",
        (claimed - last_alive) * 1000.0,
        claimed - started
    );
    assert!(
        claimed - started < 20.0,
        "the orphaned pg_sleep(20) ran to its end instead of being cancelled"
    );
    assert_eq!(
        c.query("SELECT string_agg(version::text, ',' ORDER BY version) FROM ran"),
        ["1,2,3"]
    );
}

#[test]
fn a_killed_holder_without_waiters_is_reported_dead_then_recovered() {
    let sb = Sandbox::new();
    slow_second(&sb, 30);
    let db = PgDb::new();
    let holder = db.spawn(&sb, &["migrate"]);
    let (dead_exec, _) = holder_in_second(&db);
    kill9(holder);
    let v = db.wait_status(&sb, Duration::from_secs(10), |v| v["held"] == false);
    assert_eq!(v["verdict"], "DEAD", "{v}");
    assert_eq!(v["status"]["execution_id"], dead_exec.as_str());
    assert_eq!(v["status"]["migration_version"], 2);
    assert_eq!(db.status(&sb, &[]).0, 11);
    // Recovery: the rolled-back migration runs again (quickly now); nothing twice.
    db.exec("UPDATE knob SET secs = 0");
    let r = db.run(&sb, &["migrate", "--wait", "0"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("previous holder died"), "{r:?}");
    assert_eq!(
        db.query("SELECT string_agg(version::text, ',' ORDER BY version) FROM ran"),
        ["1,2,3"]
    );
    let (code, v) = db.status(&sb, &[]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
    assert_eq!(v["fencing_token"], 2);
}
