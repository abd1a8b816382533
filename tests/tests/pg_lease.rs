//! PostgreSQL's pooler-safe lock (`lock = "lease"`) through a real PgBouncer in transaction
//! mode (started by `scripts/services.sh pg-extras`): a fenced lease row instead of the session
//! advisory lock. Runners through the pooler apply each migration once; a holder paused past its
//! lease is fenced out and exits 4 while its late work is rolled back; a killed holder's lease is
//! broken after its ttl, audited; runners on the advisory lock (a direct URL) and on the lease
//! exclude each other on one database; lock-status names the lease.

use std::path::Path;
use std::time::{Duration, Instant};

use dbwarden_tests::pg::{PgDb, numbered_migrations, pgbouncer_port};
use dbwarden_tests::{Run, Sandbox, assert_exclusive_tokens, kill9, signal, spans};
use rustix::process::Signal;

/// PgBouncer's transaction-pooling port.
fn tx_port() -> u16 {
    pgbouncer_port(false)
}

fn lease_args<'a>(url: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![rest[0], "-u", url, "--lock", "lease"];
    v.extend_from_slice(&rest[1..]);
    v
}

fn wait_all(children: Vec<std::process::Child>, limit: Duration) -> Vec<Run> {
    children.into_iter().map(|c| Run::wait(c, limit)).collect()
}

fn applied(db: &PgDb) -> i64 {
    db.count("SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'")
}

#[test]
fn sixteen_lease_runners_through_a_transaction_pooler_apply_each_migration_once() {
    let port = tx_port();
    let sb = Sandbox::new();
    numbered_migrations(&sb, 300);
    for round in 1..=2 {
        let db = PgDb::new();
        let url = db.url_on_port(port);
        let t0 = Instant::now();
        let children: Vec<_> = (0..16)
            .map(|_| sb.spawn(&lease_args(&url, &["migrate", "--wait", "120s"])))
            .collect();
        let runs = wait_all(children, Duration::from_secs(180));
        let wall = t0.elapsed();
        for (i, r) in runs.iter().enumerate() {
            assert_eq!(r.code, 0, "round {round} runner {i}: {r:?}");
            assert!(!r.stderr.contains("prepared statement"), "{r:?}");
        }
        // `ran` has a primary key on the version: a second run of any migration fails loudly.
        assert_eq!(db.count("SELECT count(*) FROM ran"), 300);
        assert_eq!(applied(&db), 300);
        assert_eq!(db.count("SELECT count(*) FROM dbwarden_migrations"), 300);
        assert_eq!(
            runs.iter()
                .filter(|r| r.stderr.contains("applied 300 migration(s)"))
                .count(),
            1,
            "round {round}: {runs:?}"
        );
        assert_exclusive_tokens(
            &runs,
            db.count("SELECT fencing_token FROM dbwarden_lock WHERE namespace = 'default'"),
        );
        assert_eq!(
            db.query("SELECT state || ' ' || (expires_at IS NULL) FROM dbwarden_lock"),
            ["COMPLETE true"],
            "the lease is given back"
        );
        assert_eq!(db.count("SELECT count(*) FROM dbwarden_lock_audit"), 0);
        eprintln!("round {round}: 16 lease runners through PgBouncer in {wall:?}");
    }
}

#[test]
fn the_advisory_lock_stays_the_default_and_its_refusal_names_the_lease() {
    let port = tx_port();
    let sb = Sandbox::new();
    numbered_migrations(&sb, 2);
    let db = PgDb::new();
    let r = sb.run(&["migrate", "-u", &db.url_on_port(port)]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("transaction pooler"), "{r:?}");
    assert!(r.stderr.contains("lock = \"lease\""), "{r:?}");
    assert_eq!(
        db.count("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"),
        0
    );
    // A lease on an engine that has its own lock is a usage error, before anything is opened.
    let r = sb.run(&["migrate", "-u", "sqlite://x.db", "--lock", "lease"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("lock = \"lease\" is for PostgreSQL"),
        "{r:?}"
    );
    assert!(!sb.path().join("x.db").exists());
}

/// Holder H takes the lease (ttl 3 s, heartbeat 1 s) and is SIGSTOPped inside migration 2,
/// whose row in `ran` is not committed yet. Its lease expires; runner T takes it over (token
/// bump, audited), re-applies migration 2 (waiting on H's uncommitted row) and finishes.
/// SIGCONT: H finds itself fenced out, rolls its work back and exits 4.
#[test]
fn a_holder_paused_past_its_lease_is_fenced_out_and_exits_4() {
    let port = tx_port();
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_ran.sql",
        "CREATE TABLE ran (version INTEGER PRIMARY KEY, note TEXT);\nINSERT INTO ran VALUES (1, 'one');",
    );
    sb.write_migration(
        "0002_slow.sql",
        "INSERT INTO ran VALUES (2, 'two');\nSELECT pg_sleep(1.5);",
    );
    sb.write_migration("0003_after.sql", "INSERT INTO ran VALUES (3, 'three');");
    let db = PgDb::new();
    let url = db.url_on_port(port);
    let timing = ["--lock-ttl", "3s", "--heartbeat-interval", "1s"];
    let mut args = lease_args(&url, &["migrate"]);
    args.extend_from_slice(&timing);
    let holder = sb.spawn(&args);
    let pid = holder.id();
    db.wait_for(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(1.5)%' AND pid <> pg_backend_pid()",
        Duration::from_secs(30),
    );
    signal(pid, Signal::STOP);
    let paused = Instant::now();
    let mut args = lease_args(&url, &["migrate", "--wait", "60s"]);
    args.extend_from_slice(&timing);
    let taker = sb.spawn(&args);
    // The taker gets the lease once the holder's has expired (3 s without a heartbeat).
    db.wait_for(
        "SELECT count(*) FROM dbwarden_lock_audit WHERE action = 'broken_stale_lock'",
        Duration::from_secs(30),
    );
    assert!(
        paused.elapsed() >= Duration::from_secs(2),
        "the lease was broken {:?} after the pause, before its ttl could pass",
        paused.elapsed()
    );
    let taker_token = db.count("SELECT fencing_token FROM dbwarden_lock");
    eprintln!("taken over {:?} after the pause", paused.elapsed());
    std::thread::sleep(Duration::from_secs(1));
    signal(pid, Signal::CONT);
    let h = Run::wait(holder, Duration::from_secs(60));
    let t = Run::wait(taker, Duration::from_secs(60));
    assert_eq!(h.code, 4, "the paused holder: {h:?}");
    assert!(
        h.stderr.contains("lost") || h.stderr.contains("fenced"),
        "{h:?}"
    );
    assert_eq!(t.code, 0, "the taker: {t:?}");
    // Every migration exactly once, each recorded by the taker's token (1 and 2 recorded
    // again after the recovery check, or kept from the holder for 1).
    assert_eq!(
        db.query("SELECT string_agg(version::text, ',' ORDER BY version) FROM ran"),
        ["1,2,3"]
    );
    assert_eq!(applied(&db), 3);
    assert_eq!(
        db.count("SELECT count(*) FROM dbwarden_migrations WHERE version >= 2 AND fencing_token <> (SELECT fencing_token FROM dbwarden_lock)"),
        0,
        "migrations 2 and 3 were recorded by the taker alone"
    );
    assert_eq!(
        db.count("SELECT fencing_token FROM dbwarden_lock"),
        taker_token
    );
    let reason =
        db.query("SELECT reason FROM dbwarden_lock_audit WHERE action = 'broken_stale_lock'");
    assert_eq!(reason.len(), 1, "{reason:?}");
    assert!(reason[0].contains("lease"), "{reason:?}");
    let (code, status) = {
        let r = sb.run(&["lock-status", "-u", &url, "--lock", "lease", "--json"]);
        (
            r.code,
            serde_json::from_str::<serde_json::Value>(&r.stdout).unwrap_or_default(),
        )
    };
    assert_eq!(code, 0, "{status}");
    assert_eq!(status["verdict"], "AVAILABLE", "{status}");
}

/// A holder killed with -9 leaves its lease: lock-status (through the pooler and on a direct
/// URL) names the lease holder HEALTHY while its lease runs, DEAD once it expired; the next
/// runner takes over, audits the broken lease and finishes the work.
#[test]
fn a_killed_lease_holder_is_taken_over_after_its_ttl_and_lock_status_names_the_lease() {
    let port = tx_port();
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_ran.sql",
        "CREATE TABLE ran (version INTEGER PRIMARY KEY);\nCREATE TABLE go (x INTEGER);\nINSERT INTO ran VALUES (1);",
    );
    // Sleeps until the test says go (the run after the kill re-applies it without sleeping).
    sb.write_migration(
        "0002_slow.sql",
        "INSERT INTO ran VALUES (2);\nSELECT pg_sleep(30) WHERE NOT EXISTS (SELECT 1 FROM go);",
    );
    let db = PgDb::new();
    let url = db.url_on_port(port);
    let timing = ["--lock-ttl", "3s", "--heartbeat-interval", "1s"];
    let mut args = lease_args(&url, &["migrate"]);
    args.extend_from_slice(&timing);
    let holder = sb.spawn(&args);
    let sleeping = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(30)%' AND state = 'active' AND pid <> pg_backend_pid()";
    db.wait_for(sleeping, Duration::from_secs(30));
    for direct in [false, true] {
        let mut a = vec!["lock-status", "-u"];
        if direct {
            a.push(&db.url);
        } else {
            a.extend([url.as_str(), "--lock", "lease"]);
        }
        let r = sb.run(&a);
        assert_eq!(r.code, 0, "{r:?}");
        assert!(r.stdout.starts_with("HEALTHY"), "{r:?}");
        assert!(r.stdout.contains("grade C"), "{r:?}");
        assert!(r.stdout.contains("lock = \"lease\""), "{r:?}");
    }
    kill9(holder);
    let st = sb.wait_status(
        &["-u", &url, "--lock", "lease"],
        Duration::from_secs(15),
        |s| s["verdict"] == "DEAD",
    );
    assert_eq!(
        db.count("SELECT count(*) FROM dbwarden_lock WHERE expires_at < now()"),
        1,
        "DEAD only once the lease expired: {st}"
    );
    // Through the pooler nobody cancels the dead holder's statement: the server runs it to its
    // end. Let it go, so the new runner's re-run does not wait for it.
    db.exec("INSERT INTO go VALUES (1)");
    db.exec(
        "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(30)%' AND pid <> pg_backend_pid()",
    );
    let events = sb.path().join("events.jsonl");
    let hook = format!("cat >> {}", events.display());
    let r = sb.run(&lease_args(
        &url,
        &["migrate", "--wait", "30s", "--hook", &hook],
    ));
    assert_eq!(r.code, 0, "{r:?}");
    // The hook heard the broken lease once, naming the dead holder.
    let heard = std::fs::read_to_string(&events).unwrap_or_default();
    let heard: Vec<serde_json::Value> = heard
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per event"))
        .collect();
    assert_eq!(heard.len(), 1, "{heard:?}");
    assert_eq!(heard[0]["event"], "lock_broken", "{heard:?}");
    assert_eq!(
        db.query("SELECT string_agg(version::text, ',' ORDER BY version) FROM ran"),
        ["1,2"]
    );
    assert_eq!(applied(&db), 2);
    let audit =
        db.query("SELECT reason FROM dbwarden_lock_audit WHERE action = 'broken_stale_lock'");
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert!(audit[0].contains("lease"), "{audit:?}");
}

/// Runners on the advisory lock (direct URL) and on the lease (through the pooler), started
/// together, each holding the lock for 150 ms through `dbwarden run`: no two holds overlap,
/// every run exits 0, and every token is new.
#[test]
fn advisory_and_lease_runners_on_one_database_never_overlap() {
    let port = tx_port();
    let sb = Sandbox::new();
    let db = PgDb::new();
    let lease_url = db.url_on_port(port);
    let log = sb.path().join("spans.log");
    let mut children = Vec::new();
    for i in 0..12 {
        let name = if i % 2 == 0 {
            format!("lease{i}")
        } else {
            format!("advisory{i}")
        };
        let script = dbwarden_tests::timed_script(&log, &name, 0.15);
        let script = format!(
            "echo \"$DBWARDEN_FENCING_TOKEN\" >> {}; {script}",
            tokens(sb.path()).display()
        );
        let args: Vec<&str> = if i % 2 == 0 {
            vec![
                "run", "-u", &lease_url, "--lock", "lease", "--wait", "60s", "--", "sh", "-c",
                &script,
            ]
        } else {
            vec![
                "run", "-u", &db.url, "--wait", "60s", "--", "sh", "-c", &script,
            ]
        };
        children.push(sb.spawn(&args));
    }
    let runs = wait_all(children, Duration::from_secs(120));
    for r in &runs {
        assert_eq!(r.code, 0, "{r:?}");
    }
    let mut s = spans(&log);
    assert_eq!(s.len(), 12, "{s:?}");
    s.sort_by(|a, b| a.1.partial_cmp(&b.1).unwrap());
    for w in s.windows(2) {
        assert!(
            w[0].2 <= w[1].1,
            "{} (until {}) overlapped {} (from {})",
            w[0].0,
            w[0].2,
            w[1].0,
            w[1].1
        );
    }
    let mut t: Vec<u64> = std::fs::read_to_string(tokens(sb.path()))
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    t.sort_unstable();
    assert_eq!(t, (1..=12).collect::<Vec<u64>>());
}

fn tokens(dir: &Path) -> std::path::PathBuf {
    dir.join("tokens.log")
}

/// A claim -- on the lease, or on the advisory lock -- that meets the status row locked by
/// another transaction (a lease holder paused inside a fenced write, an unlock in flight) for
/// longer than its `lock_timeout` says busy: exit 3 with `--wait 0`, not "cannot reach",
/// nothing applied. A waiting runner takes the lease once the row is free.
#[test]
fn a_status_row_locked_elsewhere_is_busy_then_taken() {
    let port = tx_port();
    let sb = Sandbox::new();
    // lock_timeout follows statement_timeout: 2 s instead of 30.
    std::fs::write(
        sb.path().join("dbwarden.toml"),
        "statement_timeout = \"2s\"\n",
    )
    .unwrap();
    numbered_migrations(&sb, 2);
    let db = PgDb::new();
    let url = db.url_on_port(port);
    let r = sb.run(&lease_args(&url, &["migrate"]));
    assert_eq!(r.code, 0, "{r:?}");
    numbered_migrations(&sb, 3);
    let token = || db.count("SELECT fencing_token FROM dbwarden_lock");
    let before = token();

    let mut other = db.client();
    other.exec("BEGIN");
    other.exec("SELECT 1 FROM dbwarden_lock FOR UPDATE");
    let t0 = Instant::now();
    let r = sb.run(&lease_args(&url, &["migrate", "--wait", "0"]));
    assert_eq!(r.code, 3, "busy, not an error: {r:?}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    // The same for a runner on the advisory lock (a direct URL): its claim waits for the row.
    let t0 = Instant::now();
    let r = sb.run(&["migrate", "-u", &db.url, "--wait", "0"]);
    assert_eq!(r.code, 3, "busy, not an error: {r:?}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(db.count("SELECT count(*) FROM ran"), 2);

    let waiter = sb.spawn(&lease_args(&url, &["migrate", "--wait", "30s"]));
    std::thread::sleep(Duration::from_secs(3));
    other.exec("COMMIT");
    let r = Run::wait(waiter, Duration::from_secs(60));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(db.count("SELECT count(*) FROM ran"), 3);
    assert!(token() > before);
}

/// Lease runner `l1` (`run --lock lease -- sleep 60` with `ttl` and `interval`), once
/// `lock-status` shows it holding; with that status.
fn lease_holder_l1(
    sb: &Sandbox,
    url: &str,
    ttl: &str,
    interval: &str,
) -> (std::process::Child, serde_json::Value) {
    let l1 = sb.spawn(&[
        "run",
        "-u",
        url,
        "--lock",
        "lease",
        "--owner",
        "l1",
        "--lock-ttl",
        ttl,
        "--heartbeat-interval",
        interval,
        "--",
        "sleep",
        "60",
    ]);
    let st = sb.wait_status(
        &["-u", url, "--lock", "lease"],
        Duration::from_secs(30),
        |s| s["holder"]["owner"] == "l1",
    );
    (l1, st)
}

/// `unlock --holder L1` on a direct URL (the advisory lock) while lease runner L1 holds the
/// namespace, and another runner's claim commits between the unlock's look and its token bump
/// (a second session keeps the row locked, so the bump waits, then "claims" it for `l2`): the
/// bump does not fence the newcomer out. "--holder does not match", exit 2, nothing audited,
/// the token the newcomer's.
#[test]
fn unlock_with_holder_fences_out_only_the_holder_it_checked() {
    let sb = Sandbox::new();
    let db = PgDb::new();
    let url = db.url.clone();
    let (l1, st) = lease_holder_l1(&sb, &url, "6s", "2s");
    let l1_id = st["holder"]["execution_id"].as_str().unwrap().to_owned();
    let token = || db.count("SELECT fencing_token FROM dbwarden_lock");
    let audits = || db.count("SELECT count(*) FROM dbwarden_lock_audit");
    let (t0, a0) = (token(), audits());

    let mut other = db.client();
    other.exec("BEGIN");
    other.exec("SELECT 1 FROM dbwarden_lock FOR UPDATE");
    let unlock = sb.spawn(&["unlock", "-u", &url, "--holder", &l1_id, "--yes"]);
    db.wait_for(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE%fencing_token = fencing_token + 1%'",
        Duration::from_secs(30),
    );
    let l2 = uuid::Uuid::new_v4();
    other.exec(&format!(
        "UPDATE dbwarden_lock SET fencing_token = fencing_token + 1, execution_id = '{l2}', owner_id = 'l2', last_heartbeat_at = now()"
    ));
    other.exec("COMMIT");
    let r = Run::wait(unlock, Duration::from_secs(30));
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("--holder does not match"), "{r:?}");
    assert!(
        r.stderr.contains(&l2.to_string()),
        "names the new holder: {r:?}"
    );
    assert_eq!(
        token(),
        t0 + 1,
        "only the newcomer's claim bumped the token"
    );
    assert_eq!(audits(), a0, "nothing audited");
    // L1 itself was fenced out by the newcomer's claim, not by the unlock: its next beat says so.
    let r = Run::wait(l1, Duration::from_secs(30));
    assert_eq!(r.code, 4, "{r:?}");
}

/// `unlock` on the advisory lock while a lease holder's transaction keeps the status row locked
/// (paused inside a fenced write: no backend to terminate frees it) ends as busy within its
/// bound -- exit 3, nothing bumped or audited -- instead of waiting for that holder for ever.
/// Once the row is free, the same unlock fences the holder out.
#[test]
fn unlock_meeting_a_locked_row_is_busy_within_its_bound() {
    let sb = Sandbox::new();
    std::fs::write(
        sb.path().join("dbwarden.toml"),
        "statement_timeout = \"2s\"\n",
    )
    .unwrap();
    let db = PgDb::new();
    let url = db.url.clone();
    let (l1, _) = lease_holder_l1(&sb, &url, "9s", "3s");
    let token = || db.count("SELECT fencing_token FROM dbwarden_lock");
    let audits = || db.count("SELECT count(*) FROM dbwarden_lock_audit");
    let (t0, a0) = (token(), audits());

    let mut other = db.client();
    other.exec("BEGIN");
    other.exec("SELECT 1 FROM dbwarden_lock FOR UPDATE");
    let started = Instant::now();
    let r = sb.run(&["unlock", "-u", &url, "--yes"]);
    let took = started.elapsed();
    other.exec("COMMIT");
    assert_eq!(r.code, 3, "{r:?}");
    assert!(r.stderr.contains("status row locked"), "{r:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert_eq!(token(), t0, "nothing bumped");
    assert_eq!(audits(), a0, "nothing audited");

    let r = sb.run(&["unlock", "-u", &url, "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(token(), t0 + 1);
    let r = Run::wait(l1, Duration::from_secs(30));
    assert_eq!(r.code, 4, "the unlocked holder stops: {r:?}");
}
