//! A ClickHouse cluster (`scripts/services.sh clickhouse-cluster`: two 18.16 replicas of
//! cluster `dbw` behind ZooKeeper) with `cluster = "dbw"`: dbwarden's tables are replicated to
//! both nodes and every write to them is a quorum insert, the lock table is created through
//! the cluster's DDL queue (one order for every node), so runners on both nodes exclude each
//! other, each migration runs once per cluster, and both nodes show the same history
//! (docs/engines.md, "On a cluster").

use std::time::{Duration, Instant};

use dbwarden_tests::clickhouse::{CLUSTER, ClusterDb, cluster_query};
use dbwarden_tests::{Run, Sandbox, assert_exclusive_tokens, services};
use rustix::process::Signal;

/// A sandbox whose `dbwarden.toml` names the cluster.
fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    std::fs::write(
        sb.path().join("dbwarden.toml"),
        format!("cluster = \"{CLUSTER}\"\n"),
    )
    .unwrap();
    sb
}

/// A ledger replicated on both nodes. Every row carries a random number, so that a statement
/// run twice is two rows (a replicated table drops a second insert of an identical block).
fn ledger_migration(sb: &Sandbox, db: &ClusterDb) {
    sb.write_migration(
        "0001_ledger.sql",
        &format!(
            "CREATE TABLE ledger {{on_cluster}} (who String, r UInt64) \
             ENGINE = ReplicatedMergeTree('/clickhouse/tables/{{shard}}/{}/ledger', '{{replica}}') ORDER BY who;",
            db.name
        ),
    );
}

fn entry(who: &str) -> String {
    format!("INSERT INTO ledger (who, r) SELECT '{who}', rand64();")
}

const HISTORY: &str = "SELECT version, argMax(state, (fencing_token, seq)) AS s, \
     argMax(statements_done, (fencing_token, seq)) AS d, argMax(checksum, (fencing_token, seq)) \
     FROM dbwarden_migrations GROUP BY version ORDER BY version";

/// Every ledger entry once on both nodes, the same history on both; the history.
fn once_on_both(db: &ClusterDb, entries: &[&str]) -> Vec<String> {
    let want: Vec<String> = entries.iter().map(|e| format!("{e}\t1")).collect();
    for node in 0..2 {
        // The node first fetches every part the other one has (a second insert that has not
        // replicated yet would otherwise hide).
        db.lines_at(node, "SYSTEM SYNC REPLICA ledger");
        let got = db.lines_at(
            node,
            "SELECT who, count() FROM ledger GROUP BY who ORDER BY who",
        );
        assert_eq!(
            got,
            want,
            "each statement's effect once, on node {}",
            node + 1
        );
    }
    let first = db.lines_at(0, HISTORY);
    assert_eq!(db.lines_at(1, HISTORY), first, "the history on both nodes");
    first
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A three-second statement that names the test's database, so [`running`] finds this test's
/// statement (not another test's, nor dbwarden's own queries on the database).
fn slow(db: &ClusterDb) -> String {
    format!("SELECT sleep(3), '{}'", db.name)
}

/// The lease of the holders the kill and node-stop tests start.
const TIMING: [&str; 4] = ["--lock-ttl", "4s", "--heartbeat-interval", "1s"];

/// Migrations 1 (the ledger) and 2 (`a`, a slow statement, `b`), and a holder on node 1 with a
/// 4 s lease, returned once it runs the slow statement.
fn holder_inside_migration_two(sb: &Sandbox, db: &ClusterDb) -> std::process::Child {
    ledger_migration(sb, db);
    sb.write_migration(
        "0002_slow.sql",
        &format!("{}\n{};\n{}", entry("a"), slow(db), entry("b")),
    );
    let url1 = db.url(0);
    let mut args = vec!["migrate", "-u", url1.as_str()];
    args.extend_from_slice(&TIMING);
    let holder = sb.spawn(&args);
    wait_until(
        "the slow statement on node 1",
        Duration::from_secs(60),
        || running(0, &slow(db)),
    );
    holder
}

/// A query whose text contains `needle` runs on `node`.
fn running(node: usize, needle: &str) -> bool {
    let sql = format!(
        "SELECT count() FROM system.processes WHERE position(query, '{}') > 0 \
         AND position(query, 'system.processes') = 0",
        needle.replace('\'', "\\'")
    );
    cluster_query(node, None, &sql).is_ok_and(|o| o.trim() != "0")
}

#[test]
fn sixteen_runners_on_two_nodes_apply_each_migration_once() {
    let db = ClusterDb::new();
    let sb = sandbox();
    ledger_migration(&sb, &db);
    sb.write_migration(
        "0002_slow.sql",
        &format!("{}\nSELECT sleep(1);\n{}", entry("m2a"), entry("m2b")),
    );
    sb.write_migration(
        "0003_ddl.sql",
        &format!(
            "ALTER TABLE ledger {{on_cluster}} ADD COLUMN note String;\n{}",
            entry("m3")
        ),
    );
    sb.write_migration("0004_data.sql", &entry("m4"));
    let urls = [db.url(0), db.url(1)];
    let children: Vec<_> = (0..16)
        .map(|i| sb.spawn(&["migrate", "-u", &urls[i % 2], "--wait", "180s"]))
        .collect();
    let runs: Vec<Run> = children
        .into_iter()
        .map(|c| Run::wait(c, Duration::from_secs(240)))
        .collect();
    let failed: Vec<&Run> = runs.iter().filter(|r| r.code != 0).collect();
    assert!(
        failed.is_empty(),
        "{} of 16 failed: {failed:#?}",
        failed.len()
    );
    let history = once_on_both(&db, &["m2a", "m2b", "m3", "m4"]);
    assert_eq!(history.len(), 4, "{history:?}");
    assert!(
        history.iter().all(|h| h.contains("\tAPPLIED\t")),
        "{history:?}"
    );
    let applied: usize = runs
        .iter()
        .filter(|r| r.stderr.contains("applied 4 migration(s)"))
        .count();
    assert_eq!(applied, 1, "one runner applied the four: {runs:#?}");
    let stored: Vec<String> = db.lines_at(1, "SELECT max(token) FROM dbwarden_fence");
    let holders = assert_exclusive_tokens(&runs, stored[0].parse().unwrap());
    eprintln!("{holders} runner(s) held the lock in turn; 16 exited 0");
    for node in 0..2 {
        let engines = db.lines_at(
            node,
            "SELECT DISTINCT engine FROM system.tables WHERE database = currentDatabase() \
             AND startsWith(name, 'dbwarden_')",
        );
        assert_eq!(engines, ["ReplicatedMergeTree"], "node {}", node + 1);
    }
    // Either node tells the same: nothing held.
    for url in &urls {
        let (code, status) = sb.status(&["-u", url]);
        assert_eq!(status["verdict"], "AVAILABLE", "{status}");
        assert_eq!(code, 0, "{status}");
    }
}

/// A holder on node 1 `kill -9`ed inside migration 2: lock-status on node 2 names it; a
/// runner on node 2 takes over once its ttl has passed (audited, on both nodes), re-runs the
/// statement that was in flight and finishes; each ledger entry once.
#[test]
fn a_holder_killed_on_node_one_is_taken_over_from_node_two_after_its_ttl() {
    let db = ClusterDb::new();
    let sb = sandbox();
    let holder = holder_inside_migration_two(&sb, &db);
    let (url1, url2) = (db.url(0), db.url(1));
    let pid = holder.id();
    dbwarden_tests::kill9(holder);
    let killed = Instant::now();
    let (_, status) = sb.status(&["-u", &url2]);
    assert_eq!(status["holder"]["pid"], pid, "{status}");
    assert!(status["verdict"] != "AVAILABLE", "{status}");
    let mut args = vec!["migrate", "-u", url2.as_str(), "--wait", "60s"];
    args.extend_from_slice(&TIMING);
    let taker = sb.spawn(&args);
    // The moment the killed holder's lock is broken: its table renamed to a tombstone.
    wait_until("the stale lock broken", Duration::from_secs(60), || {
        !db.lines_at(
            1,
            "SELECT name FROM system.tables WHERE database = currentDatabase() \
             AND startsWith(name, 'dbwarden_lock_default_stale_')",
        )
        .is_empty()
    });
    let broken = killed.elapsed();
    // The lease is 4 s, judged in whole seconds: never broken in under 3 s.
    assert!(
        broken >= Duration::from_secs(3),
        "broken {broken:?} after the kill, before its ttl could pass"
    );
    let r = Run::wait(taker, Duration::from_secs(90));
    assert_eq!(r.code, 0, "{r:?}");
    once_on_both(&db, &["a", "b"]);
    for node in 0..2 {
        let audit = db.lines_at(
            node,
            "SELECT reason FROM dbwarden_lock_audit WHERE action = 'broken_stale_lock'",
        );
        assert_eq!(audit.len(), 1, "node {}: {audit:?}", node + 1);
    }
    let (code, status) = sb.status(&["-u", &url1]);
    assert_eq!(status["verdict"], "AVAILABLE", "{status}");
    assert_eq!(code, 0, "{status}");
}

/// Starts node 2 again however the test ends (the other cluster tests need it).
struct NodeTwoBack;

impl Drop for NodeTwoBack {
    fn drop(&mut self) {
        services("clickhouse-cluster");
    }
}

/// Node 2 stopped while a runner on node 1 is inside migration 2: dbwarden writes its state to
/// every node, so the runner stops before its next statement (exit 4, naming the cluster) and
/// records nothing more. Node 2 back, a runner on node 2 takes over once the
/// stopped runner's lease has run out and finishes the work; each ledger entry once on both
/// nodes.
#[test]
fn a_node_stopped_mid_run_stops_the_holder_and_nothing_is_applied_twice_when_it_returns() {
    let db = ClusterDb::new();
    let sb = sandbox();
    sb.write_migration("0003_after.sql", &entry("c"));
    let holder = holder_inside_migration_two(&sb, &db);
    // The holder is paused while node 2 stops, so node 2 is down before the slow statement
    // returns, however long the stop takes.
    let _back = NodeTwoBack;
    dbwarden_tests::signal(holder.id(), Signal::STOP);
    services("clickhouse-cluster-stop-n2");
    dbwarden_tests::signal(holder.id(), Signal::CONT);
    let r = Run::wait(holder, Duration::from_secs(180));
    assert_eq!(r.code, 4, "{r:?}");
    assert!(
        r.stderr.contains(&format!("cluster `{CLUSTER}`")),
        "the error names the cluster: {r:?}"
    );
    // Nothing of migration 3 ran on node 1 while node 2 was away.
    assert_eq!(
        db.lines_at(0, "SELECT count() FROM ledger WHERE who = 'c'"),
        ["0"]
    );
    // Its lease stays until its ttl (it could not write its release to every node); then a
    // runner on node 2 breaks it and resumes at the statement that was in flight.
    services("clickhouse-cluster");
    let r = sb.run(&["migrate", "-u", &db.url(1), "--wait", "90s"]);
    assert_eq!(r.code, 0, "{r:?}");
    let history = once_on_both(&db, &["a", "b", "c"]);
    assert_eq!(history.len(), 3, "{history:?}");
    assert!(
        history.iter().all(|h| h.contains("\tAPPLIED\t")),
        "{history:?}"
    );
}
