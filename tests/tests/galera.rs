//! MariaDB Galera (three nodes, `scripts/services.sh galera`): `GET_LOCK` holds on one node
//! only (MDEV-31325), so on a `wsrep_on` node the lock is the lease in the status row, whose
//! claims certification orders across the cluster (docs/engines.md, "Clusters"). Runners on
//! every node exclude each other; a killed holder is taken over after its ttl; lock-status,
//! unlock and wait answer from any node. Node kills and a node cut off: `galera_failover.rs`.

use std::time::{Duration, Instant};

use dbwarden_tests::mysql::{TestDb, galera_nodes, galera_server, try_query_at, with_database};
use dbwarden_tests::{Run, Sandbox, assert_exclusive_tokens, server_url, unique_name};

/// `sql` on node `url`, after the node applied everything the cluster committed before it.
fn synced(url: &str, sql: &str) -> Vec<String> {
    try_query_at(url, &format!("SET SESSION wsrep_sync_wait = 1; {sql}"))
        .unwrap_or_else(|e| panic!("{sql} at {url}: {e}"))
}

/// This test's database on each of the three nodes.
fn urls(db: &TestDb) -> Vec<String> {
    galera_nodes()
        .iter()
        .map(|n| with_database(n, &db.name))
        .collect()
}

const HISTORY: &str = "SELECT CONCAT(version, ':', state, ':', statements_done, ':', checksum) FROM dbwarden_migrations ORDER BY version";

/// Every ledger entry once, and the same history on the three nodes; the history.
fn once_everywhere(urls: &[String], entries: &[&str]) -> Vec<String> {
    let ledger = synced(
        &urls[0],
        "SELECT CONCAT(who, '=', COUNT(*)) FROM ledger GROUP BY who ORDER BY who",
    );
    let want: Vec<String> = entries.iter().map(|e| format!("{e}=1")).collect();
    assert_eq!(ledger, want, "each statement's effect once");
    let first = synced(&urls[0], HISTORY);
    for u in &urls[1..] {
        assert_eq!(synced(u, HISTORY), first, "the history on {u}");
    }
    first
}

#[test]
fn twenty_four_runners_on_three_nodes_apply_each_migration_once() {
    let db = TestDb::on(&galera_server());
    assert_eq!(
        db.query("SELECT @@wsrep_on"),
        ["1"],
        "the test node runs wsrep"
    );
    let urls = urls(&db);
    let sb = Sandbox::new();
    // A ledger without a key: a statement run twice shows as a second row.
    sb.write_migration("0001_ledger.sql", "CREATE TABLE ledger (who VARCHAR(16));");
    sb.write_migration(
        "0002_slow.sql",
        "INSERT INTO ledger VALUES ('m2a');\nSELECT SLEEP(1);\nINSERT INTO ledger VALUES ('m2b');",
    );
    sb.write_migration(
        "0003_ddl.sql",
        "ALTER TABLE ledger ADD COLUMN note VARCHAR(8);\nINSERT INTO ledger (who) VALUES ('m3');",
    );
    sb.write_migration("0004_data.sql", "INSERT INTO ledger (who) VALUES ('m4');");
    // Readiness gates on each node, started first: they exit 0 once everything is applied.
    let gates: Vec<_> = urls
        .iter()
        .map(|u| sb.spawn(&["wait", "-u", u, "--timeout", "120s"]))
        .collect();
    let children: Vec<_> = (0..24)
        .map(|i| sb.spawn(&["migrate", "-u", &urls[i % 3], "--wait", "120s"]))
        .collect();
    let runs: Vec<Run> = children
        .into_iter()
        .map(|c| Run::wait(c, Duration::from_secs(180)))
        .collect();
    let failed: Vec<&Run> = runs.iter().filter(|r| r.code != 0).collect();
    assert!(
        failed.is_empty(),
        "{} of 24 failed: {failed:#?}",
        failed.len()
    );
    for g in gates {
        let g = Run::wait(g, Duration::from_secs(60));
        assert_eq!(g.code, 0, "a wait gate: {g:?}");
    }
    let history = once_everywhere(&urls, &["m2a", "m2b", "m3", "m4"]);
    assert_eq!(history.len(), 4, "{history:?}");
    assert!(
        history.iter().all(|h| h.contains(":APPLIED:")),
        "{history:?}"
    );
    let stored = db.count("SELECT fencing_token FROM dbwarden_lock");
    let holders = assert_exclusive_tokens(&runs, stored);
    eprintln!("{holders} runner(s) held the lease in turn; 24 exited 0");
    let lease = db.query("SELECT db_connection_id FROM dbwarden_lock");
    assert_eq!(lease, ["lease"], "the lock was the lease in the row");
}

/// Holder H on node 1 is killed with -9 inside migration 2. Its lease stays until its ttl:
/// lock-status from node 3 names H; a runner on node 2 waits, takes the lease over (audited),
/// re-runs the statement that was in flight and finishes; each ledger entry once.
#[test]
fn a_killed_holder_is_taken_over_after_its_ttl_from_another_node() {
    let db = TestDb::on(&galera_server());
    let urls = urls(&db);
    let sb = Sandbox::new();
    sb.write_migration("0001_ledger.sql", "CREATE TABLE ledger (who VARCHAR(16));");
    sb.write_migration(
        "0002_slow.sql",
        "INSERT INTO ledger VALUES ('a');\nSELECT SLEEP(3);\nINSERT INTO ledger VALUES ('b');",
    );
    let timing = ["--lock-ttl", "4s", "--heartbeat-interval", "1s"];
    let mut args = vec!["migrate", "-u", &urls[0]];
    args.extend_from_slice(&timing);
    let holder = sb.spawn(&args);
    let pid = holder.id();
    db.wait_running("SELECT SLEEP", Duration::from_secs(60));
    dbwarden_tests::kill9(holder);
    let killed = Instant::now();
    // From another node, while its lease runs: held, by the killed runner.
    let (_, status) = sb.status(&["-u", &urls[2]]);
    assert_eq!(status["holder"]["pid"], pid, "{status}");
    assert!(status["verdict"] != "AVAILABLE", "{status}");
    let mut args = vec!["migrate", "-u", &urls[1], "--wait", "60s"];
    args.extend_from_slice(&timing);
    let r = sb.run(&args);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        killed.elapsed() >= Duration::from_secs(3),
        "taken over {:?} after the kill, before the ttl could pass: {r:?}",
        killed.elapsed()
    );
    once_everywhere(&urls, &["a", "b"]);
    let audit = synced(
        &urls[2],
        "SELECT reason FROM dbwarden_lock_audit WHERE action = 'broken_stale_lock'",
    );
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert!(audit[0].contains("lease"), "{audit:?}");
    let (code, status) = sb.status(&["-u", &urls[2]]);
    assert_eq!(
        (code, &status["verdict"]),
        (0, &"AVAILABLE".into()),
        "{status}"
    );
}

/// `unlock` from node 3 fences out a live holder on node 1 (it exits 4 at its next write);
/// the next run on node 2 finishes the work once.
#[test]
fn unlock_from_another_node_fences_the_holder_out() {
    let db = TestDb::on(&galera_server());
    let urls = urls(&db);
    let sb = Sandbox::new();
    sb.write_migration("0001_ledger.sql", "CREATE TABLE ledger (who VARCHAR(16));");
    sb.write_migration(
        "0002_slow.sql",
        "INSERT INTO ledger VALUES ('a');\nSELECT SLEEP(2);\nINSERT INTO ledger VALUES ('b');",
    );
    let holder = sb.spawn(&["migrate", "-u", &urls[0]]);
    db.wait_running("SELECT SLEEP", Duration::from_secs(60));
    let u = sb.run(&["unlock", "-u", &urls[2], "--yes"]);
    assert_eq!(u.code, 0, "{u:?}");
    let h = Run::wait(holder, Duration::from_secs(60));
    assert_eq!(h.code, 4, "the fenced-out holder: {h:?}");
    assert_eq!(
        synced(&urls[1], "SELECT who FROM ledger"),
        ["a"],
        "nothing after the unlock"
    );
    let r = sb.run(&["migrate", "-u", &urls[1]]);
    assert_eq!(r.code, 0, "{r:?}");
    once_everywhere(&urls, &["a", "b"]);
    let audit = synced(
        &urls[0],
        "SELECT action FROM dbwarden_lock_audit ORDER BY id",
    );
    assert!(audit.iter().any(|a| a.contains("unlock")), "{audit:?}");
}

/// Inside an outer lease every runner shares, the node's own `GET_LOCK` is the inner lock.
#[test]
fn inside_the_redis_lease_a_galera_node_is_migrated() {
    let db = TestDb::on(&galera_server());
    let sb = Sandbox::new();
    sb.write_migration("0001_t.sql", "CREATE TABLE t (x INT);");
    sb.write_migration("0002_ledger.sql", "INSERT INTO t VALUES (1);");
    let redis = server_url("DBWARDEN_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let ns = unique_name("galera");
    let r = sb.run(&[
        "migrate",
        "-u",
        &db.url,
        "--redis-url",
        &redis,
        "--namespace",
        &ns,
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(db.query("SELECT count(*) FROM t"), ["1"]);
    let session = db.query(&format!(
        "SELECT db_connection_id FROM dbwarden_lock WHERE namespace = '{ns}'"
    ));
    assert_ne!(session, ["lease"], "the named lock, not the lease");
}

/// On the lease a file's own `START TRANSACTION … COMMIT` commits whole or not at all (the
/// journal's entries join it, and its COMMIT carries the lease's proof), and a lone data change
/// commits in a transaction of its own that proves the lease: a failing statement inside the
/// file's transaction leaves nothing of it.
#[test]
fn a_files_own_transaction_commits_whole_on_the_lease() {
    let db = TestDb::on(&galera_server());
    let urls = urls(&db);
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_ledger.sql",
        "CREATE TABLE ledger (who VARCHAR(16)) ENGINE=InnoDB;",
    );
    sb.write_migration(
        "0002_tx.sql",
        "START TRANSACTION;\nINSERT INTO ledger VALUES ('t1');\nINSERT INTO ledger VALUES ('t2');\nCOMMIT;",
    );
    sb.write_migration(
        "0003_update.sql",
        "UPDATE ledger SET who = CONCAT(who, 'x') WHERE who = 't1';",
    );
    sb.write_migration(
        "0004_fails.sql",
        "START TRANSACTION;\nINSERT INTO ledger VALUES ('r1');\nINSERT INTO nosuch VALUES (1);\nCOMMIT;",
    );
    let r = sb.run(&["migrate", "-u", &urls[1]]);
    assert_eq!(r.code, 1, "the fourth file fails: {r:?}");
    assert_eq!(
        synced(&urls[2], "SELECT who FROM ledger ORDER BY who"),
        ["t1x", "t2"],
        "nothing of the failed file's transaction, the others whole"
    );
    assert_eq!(
        synced(
            &urls[0],
            "SELECT CONCAT(version, ':', state) FROM dbwarden_migrations ORDER BY version"
        ),
        ["1:APPLIED", "2:APPLIED", "3:APPLIED", "4:FAILED"]
    );
}

/// An application on another node writes the row a data migration is changing: the cluster
/// lets the first commit win and aborts the migration's transaction (1213). That change rolled
/// back whole, so the run fails (exit 1) recording the migration FAILED, not in doubt, and the
/// next run applies it once.
#[test]
fn a_data_change_the_cluster_refuses_rolls_back_whole_and_runs_again_once() {
    let db = TestDb::on(&galera_server());
    let urls = urls(&db);
    db.exec("CREATE TABLE account (id INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB; INSERT INTO account VALUES (1, 0)");
    let sb = Sandbox::new();
    // Holds the row for 3 s before its commit: the application's write lands meanwhile.
    sb.write_migration(
        "0001_bump.sql",
        "UPDATE account SET v = v + 1 WHERE id = 1 AND SLEEP(3) = 0;",
    );
    let holder = sb.spawn(&["migrate", "-u", &urls[0]]);
    db.wait_running("UPDATE account", Duration::from_secs(60));
    try_query_at(&urls[1], "UPDATE account SET v = 100 WHERE id = 1")
        .expect("the application's write on node 2");
    let h = Run::wait(holder, Duration::from_secs(60));
    assert_eq!(h.code, 1, "the refused migration fails: {h:?}");
    assert_eq!(
        synced(
            &urls[2],
            "SELECT CONCAT(state, ':', statements_done) FROM dbwarden_migrations"
        ),
        ["FAILED:0"],
        "recorded as not applied, not in doubt"
    );
    assert_eq!(synced(&urls[2], "SELECT v FROM account"), ["100"]);
    let r = sb.run(&["migrate", "-u", &urls[2]]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(synced(&urls[0], "SELECT v FROM account"), ["101"], "once");
}
