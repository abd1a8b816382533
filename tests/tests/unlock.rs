//! `dbwarden unlock`: shows the holder, needs --yes without a terminal, honours --holder,
//! fences the holder out and is audited. A live holder, on every engine: `every_engine`; a
//! dead one on SQLite here. What one engine alone does to the holder's session (PostgreSQL
//! terminates its backend, MySQL kills it) is in `pg_unlock.rs` and `mysql_unlock.rs`; the
//! Redis lease held by a library user, in `redis_unlock.rs`.

use std::time::Duration;

use dbwarden_tests::{Run, Sandbox, signal, slow_select, sqlite_count};
use rustix::process::Signal;

#[test]
fn unlocking_a_dead_holder_is_audited_and_fences_it_out() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration(
        "0002_slow.sql",
        &format!("CREATE TABLE slow AS {};", slow_select(6)),
    );
    let holder = sb.spawn(&["migrate"]);
    // Held, and the status row written: the holder is past its acquisition.
    let held = sb.wait_status(&[], Duration::from_secs(30), |v| {
        v["held"] == true && v["status"]["state"] == "RUNNING"
    });
    let execution = held["holder"]["execution_id"].as_str().unwrap().to_owned();
    signal(holder.id(), Signal::KILL);
    let _ = Run::wait(holder, Duration::from_secs(10));
    let (code, v) = sb.status(&[]);
    assert_eq!(code, 11, "{v}\nheld was: {held}\nfiles: {:?}", sb.listing());

    // --holder with someone else's id changes nothing.
    let other = uuid::Uuid::new_v4().to_string();
    let r = sb.run(&["unlock", "--yes", "--holder", &other]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains(&execution), "{r:?}");
    assert_eq!(sb.status(&[]).0, 11);

    let r = sb.run(&["unlock", "--yes", "--holder", &execution]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.starts_with("DEAD"),
        "the holder is shown first: {r:?}"
    );
    assert!(r.stderr.contains(&execution), "{r:?}");
    let (code, v) = sb.status(&[]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
    assert_eq!(
        v["fencing_token"], 2,
        "unlock bumps the token so the old holder is fenced out"
    );
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM dbwarden_lock_audit WHERE action = 'forced_unlock'"
        ),
        1
    );
    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"
        ),
        2
    );
}

/// A live holder inside a slow statement, unlocked by an operator, the same on every engine.
mod every_engine {
    use dbwarden_tests::chaos::Target;
    use dbwarden_tests::modes::Case;
    use std::time::Duration;

    /// Refused without `--yes` (no terminal) and for a `--holder` that is someone else, with
    /// nothing changed; then shown and broken: the holder stops with exit 4 before its next
    /// statement, the lock is AVAILABLE, the unlock is audited once, the next run finishes
    /// every statement exactly once with a newer token, and there is nothing left to unlock.
    fn a_live_holder_is_fenced_out_before_its_next_statement(target: &dyn Target) {
        // Heartbeats every 500 ms, so a holder told through its lease (the Redis lease, a
        // SQLite lock file removed) learns of the unlock quickly; a 6 s ttl, so nothing paused
        // looks STUCK on a loaded machine.
        let case = Case::with_ttl(
            target,
            &["--lock-ttl", "6s", "--heartbeat-interval", "500ms"],
        );
        let name = target.name();
        // The holder sits in 12 s of slow statements. PostgreSQL and MySQL end it at the
        // unlock; ClickHouse (3 s per statement) stops at the next statement's fence check.
        // The others learn at a heartbeat, after the unlock has waited up to 2 s for SQLite's
        // write lock: all of that, and the five commands before it, well inside 12 s.
        let (steps, ms) = if name == "clickhouse" {
            (4, 3000)
        } else {
            (1, 12_000)
        };
        let last = format!("m2.s{}", steps + 2);
        case.log_table();
        case.slow_between(2, steps, ms);
        case.inserts(3, 1);
        let holder = case.spawn_guarded(&[]);
        case.wait_inside(2, 1);
        let (_, held) = case.lock_status();
        assert_eq!(held["verdict"], "HEALTHY", "[{name}] {held}");
        let exec = held["holder"]["execution_id"].as_str().unwrap().to_owned();

        let r = case.on_lock(&["unlock"]);
        assert_eq!(r.code, 2, "[{name}] no terminal and no --yes: {r:?}");
        assert!(r.stderr.contains("without --yes"), "[{name}] {r:?}");
        let other = uuid::Uuid::new_v4().to_string();
        let r = case.on_lock(&["unlock", "--yes", "--holder", &other]);
        assert_eq!(r.code, 2, "[{name}] {r:?}");
        assert!(
            r.stderr.contains(&exec),
            "[{name}] names the real holder: {r:?}"
        );
        let (_, still) = case.lock_status();
        assert_eq!(still["held"], true, "[{name}] nothing changed: {still}");
        assert_eq!(case.audits("forced_unlock"), 0, "[{name}]");

        let r = case.on_lock(&["unlock", "--yes", "--holder", &exec]);
        assert_eq!(r.code, 0, "[{name}] {r:?}");
        assert!(
            r.stderr.starts_with("HEALTHY"),
            "[{name}] the holder is shown first: {r:?}"
        );
        assert!(r.stderr.contains(&exec), "[{name}] {r:?}");
        let h = holder.wait(Duration::from_secs(60));
        assert_eq!(h.code, 4, "[{name}] the unlocked holder stops: {h:?}");
        assert!(h.stderr.contains("lock lost"), "[{name}] {h:?}");
        assert_eq!(
            (case.ran(&last), case.ran("m3.s1")),
            (0, 0),
            "[{name}] nothing after the statement in flight ran"
        );
        // Free. Where the unlock could not write the status row (a SQLite file the holder's
        // statement write-locked), it says DEAD -- a run died mid-migration -- until the next
        // holder writes it; everywhere else AVAILABLE.
        let (code, v) = case.lock_status();
        assert_eq!(v["held"], false, "[{name}] {v}");
        let verdict = (code, v["verdict"].as_str());
        assert!(
            verdict == (0, Some("AVAILABLE"))
                || (name == "sqlite" && verdict == (11, Some("DEAD"))),
            "[{name}] {v}"
        );

        let r = case.migrate(&[]);
        assert_eq!(r.code, 0, "[{name}] {r:?}");
        case.assert_each_ran_once(&["m2.s1", &last, "m3.s1"]);
        assert_eq!(case.applied(), [1, 2, 3], "[{name}]");
        let tokens = case.tokens();
        assert!(
            tokens[0] < tokens[1],
            "[{name}] the next run holds a newer token: {tokens:?}"
        );
        // A SQLite file write-locked by the holder's statement gets the row from the next
        // holder (the spool); by now every engine has it.
        assert_eq!(case.audits("forced_unlock"), 1, "[{name}]");
        let r = case.on_lock(&["unlock", "--yes"]);
        assert_eq!(r.code, 0, "[{name}] {r:?}");
        assert!(r.stderr.contains("nothing to unlock"), "[{name}] {r:?}");
    }

    mod a_live_holder {
        dbwarden_tests::every_engine!(
            super::a_live_holder_is_fenced_out_before_its_next_statement,
            [sqlite, postgres, mysql, clickhouse, redis]
        );
    }
}
