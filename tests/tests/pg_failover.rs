//! PostgreSQL failover (docs/engines.md, "Clusters"): runners on a URL with both hosts of a
//! primary/standby pair (`postgres://…@a,b/db?target_session_attrs=read-write`) while the
//! primary is killed (`kill -9` of the postmaster and its backends, as a host that dies) and the
//! standby promoted, in the middle of a slow multi-file run. The pair is
//! `scripts/services.sh pg-standby` (127.0.0.1:5433 and :5434); `pg-failover` kills and
//! promotes; `pg-standby` rebuilds the old primary as the new one's standby for the next round.
//! This binary is the pair's only user.

use std::time::{Duration, Instant};

use dbwarden_tests::pg::Client;
use dbwarden_tests::{Sandbox, services};

const PORTS: [u16; 2] = [5433, 5434];
const FILES: i64 = 5;

fn admin(port: u16, db: &str) -> Client {
    Client::connect(&format!("postgres://root@127.0.0.1:{port}/{db}"))
}

/// The port that answers as the primary now.
fn primary() -> u16 {
    for port in PORTS {
        if let Ok(mut c) = Client::try_connect(&format!("postgres://root@127.0.0.1:{port}/test"))
            && c.query("SELECT pg_is_in_recovery()::text") == ["false"]
        {
            return port;
        }
    }
    panic!("no primary on 127.0.0.1:{PORTS:?}");
}

fn both_hosts(db: &str) -> String {
    format!(
        "postgres://root@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs=read-write",
        PORTS[0], PORTS[1]
    )
}

/// A ledger table, then `FILES` files that each add their row and take a while, each in its
/// own transaction with its history row: a file cut off by the failover left nothing.
fn folder(sb: &Sandbox) {
    sb.write_migration("0001_ledger.sql", "CREATE TABLE ledger (n int NOT NULL);");
    for n in 1..=FILES {
        sb.write_migration(
            &format!("{:04}_step.sql", n + 1),
            &format!("INSERT INTO ledger VALUES ({n});\nSELECT pg_sleep(0.4);"),
        );
    }
}

fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Ten failovers, each in the middle of a run of three runners on the two-host URL: every
/// runner ends applied (0) or with a clear lost lock (4) or halt (78); a run afterwards on the
/// same URL finds the promoted standby by itself and finishes; on the new primary each file's
/// ledger row is there once and the history says every file applied once.
#[test]
fn ten_failovers_mid_run_each_migration_once_on_the_new_primary() {
    services("pg-standby");
    let sb = Sandbox::new();
    folder(&sb);
    let mut codes = std::collections::BTreeMap::<i32, usize>::new();
    for round in 0..10 {
        let old = primary();
        let db = format!("failover_{}_{round}", std::process::id());
        admin(old, "test").exec(&format!("CREATE DATABASE {db}"));
        let url = both_hosts(&db);
        let runners: Vec<_> = (0..3)
            .map(|_| sb.spawn(&["migrate", "--database-url", &url, "--wait", "90s"]))
            .collect();
        // Mid-run: a file's row committed, the rest to come.
        let mut watch = admin(old, &db);
        wait_until(Duration::from_secs(60), "a first file applied", || {
            watch
                .try_rows("SELECT count(*) FROM ledger")
                .ok()
                .and_then(|r| r.first().map(|r| r[0].clone()))
                .is_some_and(|n| n != "0")
        });
        drop(watch);
        services("pg-failover");
        let new = primary();
        assert_ne!(new, old, "round {round}: the standby was promoted");
        for child in runners {
            let r = dbwarden_tests::Run::wait(child, Duration::from_secs(120));
            *codes.entry(r.code).or_default() += 1;
            assert!(
                [0, 4, 78].contains(&r.code),
                "round {round}: a runner ended neither applied nor with a clear 4/78: {r:?}"
            );
        }
        let last = sb.run(&["migrate", "--database-url", &url, "--wait", "30s"]);
        assert_eq!(
            last.code, 0,
            "round {round}: the run after the failover finishes on the promoted standby: {last:?}"
        );
        let mut c = admin(new, &db);
        let ledger = c.rows("SELECT n::text, count(*)::text FROM ledger GROUP BY n ORDER BY n");
        let want: Vec<Vec<String>> = (1..=FILES)
            .map(|n| vec![n.to_string(), "1".to_owned()])
            .collect();
        assert_eq!(
            ledger, want,
            "round {round}: each file's row once on the new primary"
        );
        assert_eq!(
            c.count("SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"),
            FILES + 1,
            "round {round}"
        );
        drop(c);
        admin(new, "test").exec(&format!("DROP DATABASE {db}"));
        services("pg-standby");
    }
    eprintln!("runner exit codes over 10 failovers: {codes:?}");
}

/// A host list with a standby-only choice is refused before anything is written.
#[test]
fn a_standby_only_host_list_is_refused_with_exit_2() {
    let sb = Sandbox::new();
    folder(&sb);
    let url = format!(
        "postgres://root@127.0.0.1:{},127.0.0.1:{}/test?target_session_attrs=read-only",
        PORTS[0], PORTS[1]
    );
    let r = sb.run(&["migrate", "--database-url", &url]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("target_session_attrs=read-only"), "{r:?}");
}
