//! The etcd lease from the command line, on the 3-member cluster of scripts/services.sh: the
//! outer lock of `run` and `migrate --lock-url etcd://…` over SQL databases of any engine,
//! `lock-status` and `unlock` of it, a holder cut off from the cluster, and bad input. Each
//! test uses a key prefix of its own. (The leader killed under a holder: etcd_failover.rs,
//! which runs with the tests that stop servers.)

use std::time::{Duration, Instant};

use dbwarden_tests::etcd_util::{alternates, history, intervals, ledgered, revision};
use dbwarden_tests::pg::PgDb;
use dbwarden_tests::proxy::{Fault, FaultProxy};
use dbwarden_tests::{Run, Sandbox, etcd_url, sqlite_count, unique_name};

fn lock_url(prefix: &str) -> String {
    format!("{}/{prefix}", etcd_url())
}

#[test]
fn runs_and_migrates_on_two_databases_take_the_etcd_lock_in_turn() {
    let prefix = unique_name("etcd");
    let url = lock_url(&prefix);
    let from = revision();
    let sb = Sandbox::new();
    let pg = PgDb::new();
    sb.write_migration("0001_t.sql", "CREATE TABLE t (x INTEGER);");
    sb.write_migration(
        "0002_ledger.sql",
        "CREATE TABLE ledger (who TEXT);\nINSERT INTO ledger VALUES ('m2');",
    );
    sb.write_migration("0003_more.sql", "INSERT INTO ledger VALUES ('m3');");
    let ledger = sb.path().join("ledger");
    let sqlite = format!("sqlite://{}", sb.db().display());
    let mut children = Vec::new();
    for i in 0..24 {
        let db = if i % 2 == 0 { &sqlite } else { &pg.url };
        let script = ledgered(&ledger, &format!("run{i}"), "sleep 0.2");
        let mut args = vec![
            "-u",
            db,
            "--lock-url",
            &url,
            "--wait",
            "120s",
            "--lock-ttl",
            "5s",
            "--heartbeat-interval",
            "1s",
        ];
        match i < 8 {
            true => {
                args.insert(0, "run");
                args.extend(["--", "sh", "-c", &script]);
                children.push(sb.spawn(&args));
            }
            false => {
                args.insert(0, "migrate");
                children.push(sb.spawn(&args));
            }
        }
    }
    for c in children {
        let r = Run::wait(c, Duration::from_secs(180));
        assert_eq!(r.code, 0, "{r:?}");
    }
    let held = intervals(&ledger);
    assert_eq!(held.len(), 8, "{held:?}");
    for w in held.windows(2) {
        assert!(w[0].2 <= w[1].1, "{} overlapped {}", w[0].0, w[1].0);
    }
    // Each migration once on each database.
    for (db, count) in [
        (
            "sqlite",
            sqlite_count(
                &sb.db(),
                "SELECT count(*) FROM ledger WHERE who IN ('m2', 'm3')",
            ),
        ),
        ("postgres", pg.count("SELECT count(*) FROM ledger")),
    ] {
        assert_eq!(count, 2, "{db}: each of the two ledger rows once");
    }
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"
        ),
        3
    );
    assert_eq!(
        pg.count("SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"),
        3
    );
    // etcd's own history of the lock key: every holder in turn, every run among them.
    let changes = history(&format!("{prefix}/default/lock"), from);
    alternates(&changes);
    let taken = changes.iter().filter(|c| c.created).count();
    assert!(taken >= 8, "{taken} acquisitions: {changes:?}");
    eprintln!("{taken} holders of one etcd lock, each in turn");
}

#[test]
fn lock_status_names_the_holder_and_unlock_stops_it() {
    let prefix = unique_name("etcd");
    let url = lock_url(&prefix);
    let from = revision();
    let sb = Sandbox::new();
    let sqlite = format!("sqlite://{}", sb.db().display());
    let (code, status) = sb.status(&["-u", &url]);
    assert_eq!(code, 0, "{status}");
    assert_eq!(status["verdict"], "AVAILABLE", "{status}");
    let holder = sb.spawn(&[
        "run",
        "-u",
        &sqlite,
        "--lock-url",
        &url,
        "--lock-ttl",
        "6s",
        "--heartbeat-interval",
        "1s",
        "--",
        "sleep",
        "60",
    ]);
    let status = sb.wait_status(&["-u", &url], Duration::from_secs(30), |s| {
        s["held"] == true
    });
    assert_eq!(status["verdict"], "HEALTHY", "{status}");
    assert_eq!(status["holder"]["pid"], holder.id(), "{status}");
    assert_eq!(status["engine"], "etcd", "{status}");
    let token = status["fencing_token"].as_u64().expect("a token");
    let u = sb.run(&["unlock", "-u", &url, "--yes"]);
    assert_eq!(u.code, 0, "{u:?}");
    let r = Run::wait(holder, Duration::from_secs(30));
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("lock lost"), "{r:?}");
    // The next holder's token is larger.
    let again = sb.run(&["run", "-u", &sqlite, "--lock-url", &url, "--", "true"]);
    assert_eq!(again.code, 0, "{again:?}");
    let (_, status) = sb.status(&["-u", &url]);
    assert_eq!(status["verdict"], "AVAILABLE", "{status}");
    let u = sb.run(&["unlock", "-u", &url, "--yes"]);
    assert_eq!(u.code, 0, "{u:?}");
    assert!(
        u.stdout.contains("nothing to unlock") || u.stderr.contains("nothing to unlock"),
        "{u:?}"
    );
    let changes = history(&format!("{prefix}/default/lock"), from);
    alternates(&changes);
    let last = changes.iter().rfind(|c| c.created).expect("a create");
    assert!(last.revision as u64 > token, "{changes:?} after {token}");
}

/// A holder whose link to etcd holds every byte: its renewals go unanswered, so it stops its
/// command and exits 4 before its lease can run out on the cluster; a runner on a working link
/// takes the lock only after that, and never while the first command still runs.
#[test]
fn a_holder_cut_off_from_etcd_exits_4_and_the_next_takes_over_after_its_lease() {
    let prefix = unique_name("etcd");
    let first_member = etcd_url()
        .trim_start_matches("etcd://")
        .split(',')
        .next()
        .unwrap()
        .to_owned();
    let proxy = FaultProxy::start(&first_member);
    let cut_url = format!("etcd://{}/{prefix}", proxy.addr());
    let url = lock_url(&prefix);
    let sb = Sandbox::new();
    let sqlite = format!("sqlite://{}", sb.db().display());
    let ledger = sb.path().join("ledger");
    // The holder stops its command `interval` before etcd can expire its lease: 2 s of margin.
    let (ttl, interval) = (Duration::from_secs(6), Duration::from_secs(2));
    let lease = ["--lock-ttl", "6s", "--heartbeat-interval", "2s"];
    let holder_cmd = ledgered(&ledger, "holder", "sleep 60 & wait");
    let mut args = vec!["run", "-u", &sqlite, "--lock-url", &cut_url];
    args.extend(lease);
    args.extend(["--", "sh", "-c", &holder_cmd]);
    let holder = sb.spawn(&args);
    let t0 = Instant::now();
    while !std::fs::read_to_string(&ledger).is_ok_and(|t| t.contains("enter holder")) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the holder never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    proxy.set(Fault::Hold);
    let cut_at = Instant::now();
    let next_cmd = ledgered(&ledger, "next", "true");
    let mut args = vec!["run", "-u", &sqlite, "--lock-url", &url, "--wait", "60s"];
    args.extend(lease);
    args.extend(["--", "sh", "-c", &next_cmd]);
    let next = sb.spawn(&args);
    let r = Run::wait(holder, Duration::from_secs(60));
    let stopped_after = cut_at.elapsed();
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("lock lost"), "{r:?}");
    eprintln!(
        "cut off: the holder stopped {stopped_after:?} after the cut (ttl {ttl:?}, interval {interval:?})"
    );
    // Lost at ttl − interval after its last renewal, which was at most one interval before
    // the cut; the bound leaves room for a loaded machine. The order below is what matters.
    assert!(stopped_after < ttl * 2, "{stopped_after:?}: {r:?}");
    let n = Run::wait(next, Duration::from_secs(60));
    assert_eq!(n.code, 0, "{n:?}");
    let held = intervals(&ledger);
    assert_eq!(
        held.iter().map(|h| h.0.as_str()).collect::<Vec<_>>(),
        ["holder", "next"]
    );
    assert!(
        held[0].2 < held[1].1,
        "the next entered before the holder stopped: {held:?}"
    );
    proxy.set(Fault::Pass);
}

#[test]
fn bad_etcd_input_is_one_line_exit_2_without_the_password() {
    let sb = Sandbox::new();
    let sqlite = format!("sqlite://{}", sb.db().display());
    let url = lock_url(&unique_name("etcd"));
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["lock-status", "-u", "etcd://app:hunter2@h:notaport/p"],
            "invalid etcd URL",
        ),
        (
            vec!["lock-status", "-u", "etcd://app:hunter2@h:2379/p?tls=1"],
            "takes no options",
        ),
        (
            vec!["lock-status", "-u", "etcd://h:2379/bad prefix"],
            "the prefix takes",
        ),
        (vec!["migrate", "-u", &url], "keeps no migration tables"),
        (vec!["history", "-u", &url], "no migration history"),
        (
            vec![
                "lock-status",
                "-u",
                &url,
                "--lock-ttl",
                "1s",
                "--heartbeat-interval",
                "300ms",
            ],
            "too short",
        ),
        (
            vec![
                "run",
                "-u",
                &sqlite,
                "--lock-url",
                "etcd://app:hunter2@127.0.0.1:1/p",
                "--",
                "true",
            ],
            "cannot reach",
        ),
    ];
    for (args, expect) in cases {
        let r = sb.run(&args);
        assert_eq!(r.code, 2, "{args:?}: {r:?}");
        assert!(r.stderr.contains(expect), "{args:?}: {r:?}");
        assert_eq!(r.stderr_lines().len(), 1, "{args:?}: {r:?}");
        assert!(!r.stderr.contains("hunter2"), "{args:?}: {r:?}");
    }
    assert!(!sb.db().exists(), "nothing was written");
}
