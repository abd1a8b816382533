//! The etcd leader killed (`kill -9`) while a `dbwarden run` holds the etcd lock and another
//! waits for it, 10 rounds: the holder keeps its lease through the election (etcd extends
//! leases across a leader change) and finishes, or loses it cleanly (exit 4, its command
//! stopped); the waiter gets the lock after it, never while its command still runs; etcd's own
//! history of the key shows one holder at a time.
//!
//! This stops a member of the shared cluster, so scripts/test.sh runs it with the tests that
//! restart servers, after every other test.

use std::time::{Duration, Instant};

use dbwarden_tests::etcd_util::{alternates, history, intervals, ledgered, revision};
use dbwarden_tests::{Run, Sandbox, etcd_url, services, unique_name};

#[test]
fn etcd_leader_killed_under_a_holder() {
    let mut outcomes = Vec::new();
    for round in 1..=10 {
        let prefix = unique_name("failover");
        let url = format!("{}/{prefix}", etcd_url());
        let from = revision();
        let sb = Sandbox::new();
        let sqlite = format!("sqlite://{}", sb.db().display());
        let ledger = sb.path().join("ledger");
        let lease = [
            "--lock-ttl",
            "6s",
            "--heartbeat-interval",
            "2s",
            "--wait",
            "90s",
        ];
        let spawn = |who: &str, body: &str| {
            let script = ledgered(&ledger, who, body);
            let mut args = vec!["run", "-u", &sqlite, "--lock-url", &url];
            args.extend(lease);
            args.extend(["--", "sh", "-c", &script]);
            sb.spawn(&args)
        };
        let holder = spawn("holder", "sleep 3 & wait");
        let t0 = Instant::now();
        while !std::fs::read_to_string(&ledger).is_ok_and(|t| t.contains("enter holder")) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "round {round}: no holder"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let waiter = spawn("waiter", "true");
        std::thread::sleep(Duration::from_millis(300));
        services("etcd-kill-leader");
        let h = Run::wait(holder, Duration::from_secs(90));
        let w = Run::wait(waiter, Duration::from_secs(90));
        services("etcd");
        assert!([0, 4].contains(&h.code), "round {round}: holder {h:?}");
        assert_eq!(w.code, 0, "round {round}: waiter {w:?}");
        let held = intervals(&ledger);
        let who: Vec<&str> = held.iter().map(|h| h.0.as_str()).collect();
        assert_eq!(who, ["holder", "waiter"], "round {round}: {held:?}");
        assert!(held[0].2 <= held[1].1, "round {round}: overlap {held:?}");
        let changes = history(&format!("{prefix}/default/lock"), from);
        alternates(&changes);
        outcomes.push(h.code);
    }
    let kept = outcomes.iter().filter(|c| **c == 0).count();
    eprintln!(
        "etcd leader killed under a holder, 10 rounds: {kept} kept the lease and finished, {} lost it cleanly (exit 4); never two holders",
        10 - kept
    );
}
