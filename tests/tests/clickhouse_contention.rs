//! ClickHouse under contention: many contenders, never two holders, fencing tokens strictly
//! increasing, and every migration statement executed exactly once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dbwarden_core::config::Settings;
use dbwarden_core::{HeartbeatConfig, HolderInfo, Namespace, Wait, wait};
use dbwarden_tests::Sandbox;
use dbwarden_tests::clickhouse::TestDb;

#[test]
fn sixteen_contenders_times_100_cycles_never_hold_at_once_and_tokens_strictly_increase() {
    const CONTENDERS: usize = 16;
    const CYCLES: usize = 100;
    let db = TestDb::new();
    let settings = Settings {
        database_url: db.url(),
        namespace: Namespace::new("contention.16x100").unwrap(),
        ..Settings::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let t0 = Instant::now();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..CONTENDERS {
            let settings = settings.clone();
            let inside = inside.clone();
            let tokens = tokens.clone();
            tasks.push(tokio::spawn(async move {
                let lock = dbwarden_clickhouse::from_settings(&settings).unwrap();
                for i in 0..CYCLES {
                    let holder = HolderInfo::current(Some(format!("c{c}")), format!("cycle {i}"));
                    let lease = wait::acquire(
                        lock.as_ref(),
                        &holder,
                        Wait::Up(Duration::from_secs(600)),
                        HeartbeatConfig {
                            interval: Duration::from_secs(15),
                            ttl: Duration::from_secs(120),
                        },
                    )
                    .await
                    .unwrap_or_else(|e| panic!("contender {c} cycle {i}: {e}"));
                    let before = inside.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(before, 0, "two holders at once (contender {c}, cycle {i})");
                    tokens.lock().unwrap().push(lease.fencing_token().0);
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    lease.release().await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let elapsed = t0.elapsed();
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), CONTENDERS * CYCLES);
    for w in tokens.windows(2) {
        assert!(w[0] < w[1], "fencing tokens must strictly increase: {w:?}");
    }
    assert_eq!(tokens[0], 1);
    // The fence table agrees: one token per acquire, never reused.
    let stored = db.fence_tokens();
    assert_eq!(stored, tokens, "the stored fence is the acquire order");
    assert!(db.tables_like("dbwarden_lock_contention").is_empty());
    eprintln!(
        "{} acquisitions by {CONTENDERS} contenders in {elapsed:?}",
        tokens.len()
    );
}

#[test]
fn sixteen_migrate_processes_with_50_migrations_all_exit_0_and_run_each_statement_once() {
    let db = TestDb::new();
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_side.sql",
        "CREATE TABLE side (k String) ENGINE = Log;\nCREATE TABLE once (k String) ENGINE = Log;",
    );
    for v in 2..=50 {
        sb.write_migration(
            &format!("{v:04}_m{v}.sql"),
            &format!("INSERT INTO side VALUES ('{v}.1');\nINSERT INTO side VALUES ('{v}.2');"),
        );
    }
    let url = db.url();
    let t0 = Instant::now();
    let children: Vec<_> = (0..16)
        .map(|_| sb.spawn(&["migrate", "-u", &url, "--wait", "5m", "--json"]))
        .collect();
    let runs: Vec<_> = children
        .into_iter()
        .map(|c| dbwarden_tests::Run::wait(c, Duration::from_secs(170)))
        .collect();
    let elapsed = t0.elapsed();
    for r in &runs {
        assert_eq!(r.code, 0, "{r:?}");
    }
    let appliers: Vec<_> = runs
        .iter()
        .filter(|r| r.stdout.contains("\"version\":50"))
        .collect();
    assert_eq!(appliers.len(), 1, "exactly one process applied them");
    assert_eq!(db.count("SELECT count() FROM side"), 98);
    assert_eq!(
        db.count("SELECT uniqExact(k) FROM side"),
        98,
        "no statement ran twice"
    );
    assert_eq!(
        db.count("SELECT count() FROM (SELECT version FROM dbwarden_migrations GROUP BY version HAVING argMax(state, (fencing_token, seq)) = 'APPLIED')"),
        50
    );
    let tokens = db.fence_tokens();
    assert_eq!(
        tokens,
        (1..=16).collect::<Vec<u64>>(),
        "16 acquisitions, in order"
    );
    let (code, status) = sb.status(&["-u", &url]);
    assert_eq!(
        (code, status["verdict"].as_str()),
        (0, Some("AVAILABLE")),
        "{status}"
    );
    eprintln!("16 processes, 50 migrations: {elapsed:?}");
}
