//! Galera nodes that die or are cut off under a holder of the lease (docs/engines.md,
//! "Clusters"): the holder stops (exit 4), a runner on another node takes the lease after its
//! ttl and finishes, and no statement runs twice. The cluster is `scripts/services.sh galera`;
//! `galera-kill-n2` kills a node with -9 and `galera` brings it back. These tests stop nodes,
//! so they run in the chaos step, after every other test.

use std::time::{Duration, Instant};

use dbwarden_tests::mysql::{TestDb, galera_nodes, galera_server, try_query_at, with_database};
use dbwarden_tests::{Run, Sandbox, services};

/// While the cluster decides a node is gone (`evs.suspect_timeout`, 5 s by default) no node
/// commits, renewals included: `ttl − interval` must outlast that, or the new holder's own
/// lease runs out in the stall after a fault (docs/engines.md, Galera).
const TIMING: [&str; 4] = ["--lock-ttl", "15s", "--heartbeat-interval", "3s"];

fn synced(url: &str, sql: &str) -> Vec<String> {
    try_query_at(url, &format!("SET SESSION wsrep_sync_wait = 1; {sql}"))
        .unwrap_or_else(|e| panic!("{sql} at {url}: {e}"))
}

/// A ledger, then a file whose middle statement takes `secs` (the fault lands there).
fn folder(secs: u32) -> Sandbox {
    let sb = Sandbox::new();
    sb.write_migration("0001_ledger.sql", "CREATE TABLE ledger (who VARCHAR(16));");
    sb.write_migration(
        "0002_slow.sql",
        &format!("INSERT INTO ledger VALUES ('a');\nSELECT SLEEP({secs});\nINSERT INTO ledger VALUES ('b');"),
    );
    sb.write_migration("0003_after.sql", "INSERT INTO ledger VALUES ('c');");
    sb
}

fn migrate(sb: &Sandbox, url: &str, wait: &str) -> std::process::Child {
    let mut args = vec!["migrate", "-u", url, "--wait", wait];
    args.extend_from_slice(&TIMING);
    sb.spawn(&args)
}

/// Wait until node `url` runs a statement of this database that starts with `prefix`.
fn wait_running(url: &str, db: &str, prefix: &str) {
    let sql = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = '{db}' AND INFO LIKE '{prefix}%'"
    );
    let t0 = Instant::now();
    while try_query_at(url, &sql).ok().as_deref() != Some(&["1".to_owned()][..]) {
        assert!(t0.elapsed() < Duration::from_secs(60), "{prefix} never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the fault left, after the other node's run finished: each statement once, the
/// history the same on the two live nodes, a taken-over lease with a newer token.
fn each_once(live: &[&String], holder: &Run, taker: &Run) {
    assert_eq!(holder.code, 4, "the holder on the failed node: {holder:?}");
    assert_eq!(taker.code, 0, "the runner on a live node: {taker:?}");
    let ledger = synced(live[0], "SELECT who FROM ledger ORDER BY who");
    assert_eq!(ledger, ["a", "b", "c"], "each statement once");
    let history = "SELECT CONCAT(version, ':', state) FROM dbwarden_migrations ORDER BY version";
    let first = synced(live[0], history);
    assert_eq!(first, ["1:APPLIED", "2:APPLIED", "3:APPLIED"]);
    assert_eq!(synced(live[1], history), first);
    let tokens = synced(live[1], "SELECT fencing_token FROM dbwarden_lock");
    assert_eq!(tokens, ["2"], "the taker's token is the holder's plus one");
}

/// The holder's node is killed with -9 mid-statement: the holder exits 4; a runner on another
/// node takes the lease after its ttl and finishes.
#[test]
fn the_holders_node_killed_the_holder_exits_4_and_another_node_finishes() {
    let db = TestDb::on(&galera_server());
    let urls: Vec<String> = galera_nodes()
        .iter()
        .map(|n| with_database(n, &db.name))
        .collect();
    let sb = folder(5);
    let holder = migrate(&sb, &urls[1], "30s");
    wait_running(&urls[1], &db.name, "SELECT SLEEP");
    services("galera-kill-n2");
    let killed = Instant::now();
    let taker = migrate(&sb, &urls[2], "120s");
    let h = Run::wait(holder, Duration::from_secs(90));
    let t = Run::wait(taker, Duration::from_secs(120));
    eprintln!(
        "holder exit {} at {:?}; taker exit {} at {:?} after the kill",
        h.code,
        h.elapsed,
        t.code,
        killed.elapsed()
    );
    services("galera");
    each_once(&[&urls[0], &urls[2]], &h, &t);
}

/// The holder's node is cut off from the other two (`gmcast.isolate=1`: it leaves the primary
/// component): its renewals stall, so the holder exits 4 within `ttl − interval` of its last
/// one, before anyone may take over (`ttl` after it), and a runner on a node of the primary
/// component takes over and finishes.
#[test]
fn a_node_cut_off_from_the_cluster_stops_its_holder_within_the_ttl() {
    let db = TestDb::on(&galera_server());
    let urls: Vec<String> = galera_nodes()
        .iter()
        .map(|n| with_database(n, &db.name))
        .collect();
    let sb = folder(3);
    let holder = migrate(&sb, &urls[2], "30s");
    wait_running(&urls[2], &db.name, "SELECT SLEEP");
    let node3 = &galera_nodes()[2];
    try_query_at(
        node3,
        "SET GLOBAL wsrep_provider_options = 'gmcast.isolate=1'",
    )
    .expect("isolating node 3");
    let cut = Instant::now();
    let taker = migrate(&sb, &urls[0], "120s");
    let h = Run::wait(holder, Duration::from_secs(90));
    let stopped = cut.elapsed();
    let t = Run::wait(taker, Duration::from_secs(120));
    let _ = try_query_at(
        node3,
        "SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'",
    );
    eprintln!(
        "holder exit {} {stopped:?} after the cut; taker exit {}",
        h.code, t.code
    );
    services("galera");
    assert!(
        stopped < Duration::from_secs(15),
        "the cut-off holder ran on for {stopped:?}, past its 15 s ttl: {h:?}"
    );
    each_once(&[&urls[0], &urls[1]], &h, &t);
}
