//! The database server (or Redis) restarts while a holder is inside a migration, on every
//! engine with a server. The holder's lock dies with the server: it stops before its next
//! statement and exits 4 (lock lost), never 1, and writes nothing more (but, where its token
//! still holds, that the statement it stopped before was never sent); once the server is back,
//! the next run recovers the interrupted migration and finishes, each statement once -- or, in
//! the one window the recovery rules leave to a human, halts and is resolved as an operator
//! would.
//!
//! These restart shared servers, so scripts/test.sh runs this file with the chaos campaigns:
//! after every other test, one test at a time.

use std::time::Duration;

use dbwarden_tests::chaos::{ClickHouse, MySql, Postgres, Redis, Target};
use dbwarden_tests::modes::Case;

/// From a NEEDS_REVIEW halt, "migration V: its runner died during statement K of N": (V, K).
fn in_doubt(stderr: &str) -> Option<(u32, usize)> {
    let rest = stderr.split("NEEDS_REVIEW: migration ").nth(1)?;
    let (version, rest) = rest.split_once(':')?;
    let rest = rest.split("during statement ").nth(1)?;
    let (statement, _) = rest.split_once(" of ")?;
    Some((version.trim().parse().ok()?, statement.trim().parse().ok()?))
}

#[test]
fn the_statement_in_doubt_is_read_from_the_halt() {
    let halt = "dbwarden: error: NEEDS_REVIEW: migration 2: its runner died during statement 3 of 3, which is not idempotent (INSERT …)";
    assert_eq!(in_doubt(halt), Some((2, 3)));
    assert_eq!(in_doubt("dbwarden: error: something else"), None);
}

fn restart_mid_migration(target: &dyn Target) {
    let case = Case::new(target);
    case.log_table();
    case.slow_idempotent(2, 3000);
    case.inserts(3, 1);
    let holder = case.spawn_guarded(&[]);
    case.wait_inside(2, 1);
    assert!(
        target.restart_server(),
        "[{}] restart failed",
        target.name()
    );
    let r = holder.wait(Duration::from_secs(90));
    // ClickHouse drains running queries before it stops and keeps the lease row on disk: a
    // holder that kept heartbeating through the restart may finish (exit 0). Anywhere else
    // the lock died with the server.
    let finished = r.code == 0 && target.lock_outlives_restart();
    assert!(
        r.code == 4 || finished,
        "[{}] a holder whose server restarted has lost its lock (exit 4): {r:?}",
        target.name()
    );
    // The server is back (services.sh waits until it answers); the next run recovers.
    let services = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/services.sh");
    let svc = target.service().expect("a target with a server");
    let up = std::process::Command::new("bash")
        .args([services, svc])
        .output()
        .expect("run services.sh");
    assert!(up.status.success(), "{svc} did not come back: {up:?}");
    if !finished {
        assert_eq!(case.ran("m3.s1"), 0, "nothing ran past the lost lock");
    }

    let mut r = case.migrate(&[]);
    if r.code == 78 && !finished {
        // The one halt the recovery rules allow here (docs/design.md §9, rule 7): the holder
        // lost its lease after the journal last recorded progress and before it could record
        // that the next statement was never sent (its server was still away when the loss was
        // seen, so its fenced "stopped before statement K" write failed; see §10.3). That is
        // migration 3's first statement, or migration 2's last (whose count ClickHouse and
        // MySQL carry with the migration's end). For the successor that INSERT may have been
        // in flight, and it is not idempotent. The operator does what the advice says: looks
        // (the ledger shows it never ran) and retries.
        let (version, statement) = in_doubt(&r.stderr).unwrap_or_else(|| {
            panic!(
                "[{}] a halt must name the statement in doubt: {r:?}",
                target.name()
            )
        });
        let id = format!("m{version}.s{statement}");
        assert!(
            ["m2.s3", "m3.s1"].contains(&id.as_str()),
            "[{}] only the statement after the last recorded one can be in doubt, not {id}: {r:?}",
            target.name()
        );
        assert_eq!(case.ran(&id), 0, "nothing ran past the lost lock ({id})");
        let resolved = case.resolve(version, "--retry");
        assert_eq!(resolved.code, 0, "[{}] {resolved:?}", target.name());
        r = case.migrate(&[]);
    }
    assert_eq!(r.code, 0, "[{}] {r:?}", target.name());
    if finished {
        assert!(r.stderr.contains("applied 0 migration(s)"), "{r:?}");
    }
    case.assert_each_ran_once(&["m2.s1", "m2.s3", "m3.s1"]);
    assert_eq!(case.applied(), [1, 2, 3]);
    let tokens = case.tokens();
    assert!(
        finished || tokens[0] < tokens[2],
        "the recovering run's token is newer: {tokens:?}"
    );
    case.assert_available();
}

#[test]
fn restart_postgres() {
    restart_mid_migration(&Postgres::default());
}

#[test]
fn restart_mysql() {
    restart_mid_migration(&MySql::default());
}

#[test]
fn restart_clickhouse() {
    restart_mid_migration(&ClickHouse::default());
}

#[test]
fn restart_redis() {
    restart_mid_migration(&Redis::default());
}
