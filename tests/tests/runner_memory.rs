//! The runner against the in-memory engine: its order of work, recovery and refusals, proved
//! without a server or a process (the same scenarios on real engines live in contention.rs,
//! crash_recovery.rs and changed_checksum.rs). The engine logs every statement a store ran,
//! so "each statement exactly once" is counted, not inferred.

use std::time::Duration;

use dbwarden_core::adopt::SqlxCompatMode;
use dbwarden_core::config::Settings;
use dbwarden_core::migration::{Dialect, Migration};
use dbwarden_core::runner::{self, Interrupt, MigrateOptions, Outcome, Report, Silent};
use dbwarden_core::{
    Error, HeartbeatConfig, HistoryState, HolderInfo, MigrationLock, Namespace, RecoveryPolicy,
    Wait, wait::acquire,
};
use dbwarden_tests::{memory, unique_name};

fn migrations(n: i64) -> Vec<Migration> {
    (1..=n)
        .map(|v| {
            let sql = format!("INSERT INTO t VALUES ({v}, 1);\nINSERT INTO t VALUES ({v}, 2)");
            Migration::from_sql(v, format!("m{v}"), &sql, Dialect::Sqlite).unwrap()
        })
        .collect()
}

fn options(policy: RecoveryPolicy) -> MigrateOptions {
    MigrateOptions {
        wait: Wait::Up(Duration::from_secs(20)),
        skip_if_locked: false,
        to: None,
        allow_changed: false,
        allow_out_of_order: false,
        recovery_policy: policy,
        heartbeat: HeartbeatConfig {
            interval: Duration::from_millis(200),
            ttl: Duration::from_secs(1),
        },
        outer_lost: None,
        sqlx_compat: SqlxCompatMode::Auto,
        events: Default::default(),
        lock_retry: Default::default(),
    }
}

struct Db(String);

impl Db {
    fn new() -> Db {
        Db(unique_name("runner"))
    }
    fn lock(&self) -> Box<dyn MigrationLock> {
        memory::from_settings(&Settings {
            database_url: format!("memory://{}", self.0),
            namespace: Namespace::new("default").unwrap(),
            ..Settings::default()
        })
        .unwrap()
    }
    /// A holder that journals `m`, runs its first `done` statements and dies (its lease
    /// dropped without a final state).
    async fn die_inside(&self, m: &Migration, done: usize) {
        let lock = self.lock();
        let holder = HolderInfo::current(None, "dies");
        let hb = options(RecoveryPolicy::Halt).heartbeat;
        let mut lease = acquire(&*lock, &holder, Wait::No, hb).await.unwrap();
        let t = lease.fencing_token();
        let lost = lease.lost_signal();
        let store = lease.store().unwrap();
        store
            .journal_begin(t, holder.execution_id, m, 0)
            .await
            .unwrap();
        for i in 0..done {
            store.journal_statement(t, m, i, &lost).await.unwrap();
        }
        drop(lease);
    }
    fn executed(&self) -> Vec<(i64, usize)> {
        memory::executed(&self.0)
    }
    async fn migrate(&self, ms: &[Migration], policy: RecoveryPolicy) -> Result<Report, Error> {
        self.migrate_with(ms, options(policy)).await
    }
    async fn migrate_with(&self, ms: &[Migration], opts: MigrateOptions) -> Result<Report, Error> {
        let holder = HolderInfo::current(None, "runner test");
        let lock = self.lock();
        match runner::migrate(&*lock, ms, &holder, &opts, &Silent, &Interrupt::never()).await? {
            Outcome::Done(r) => Ok(r),
            Outcome::Skipped(i) => panic!("skipped: {i}"),
        }
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn each_once(db: &Db, ms: &[Migration]) {
    let mut ran = db.executed();
    ran.sort();
    let want: Vec<(i64, usize)> = ms
        .iter()
        .flat_map(|m| (0..m.statements.len()).map(move |i| (m.version, i)))
        .collect();
    assert_eq!(ran, want, "each statement exactly once");
}

#[test]
fn applies_each_migration_once_then_finds_nothing_to_do() {
    let db = Db::new();
    let ms = migrations(3);
    rt().block_on(async {
        let r = db
            .migrate(&ms, RecoveryPolicy::ResumeIdempotent)
            .await
            .unwrap();
        assert_eq!(
            r.applied.iter().map(|a| a.version).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        let again = db
            .migrate(&ms, RecoveryPolicy::ResumeIdempotent)
            .await
            .unwrap();
        assert!(again.applied.is_empty(), "{again:?}");
        assert_eq!(again.already_applied, 3);
        let o = db.lock().observe().await.unwrap();
        assert_eq!(o.status.unwrap().state, dbwarden_core::LockState::Complete);
    });
    each_once(&db, &ms);
}

#[test]
fn eight_runners_at_once_apply_each_statement_once() {
    for _ in 0..20 {
        eight_runners_at_once();
    }
}

fn eight_runners_at_once() {
    let db = Db::new();
    let ms = migrations(5);
    let runs = rt().block_on(async {
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (name, ms) = (db.0.clone(), ms.clone());
                tokio::spawn(async move {
                    Db(name)
                        .migrate(&ms, RecoveryPolicy::ResumeIdempotent)
                        .await
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap().expect("every runner succeeds"));
        }
        out
    });
    let applied: usize = runs.iter().map(|r| r.applied.len()).sum();
    assert_eq!(applied, 5, "{runs:?}");
    each_once(&db, &ms);
}

/// A predecessor died inside migration 2 (journal row RUNNING, a statement done). The memory
/// store is transactional, so that statement rolled back with it: migration 2 runs again in
/// full, recovery says so, and migration 3 follows.
#[test]
fn a_dead_predecessor_is_inspected_and_its_migration_rerun() {
    let db = Db::new();
    let ms = migrations(3);
    rt().block_on(async {
        db.migrate(&ms[..1], RecoveryPolicy::ResumeIdempotent)
            .await
            .unwrap();
        db.die_inside(&ms[1], 1).await;

        let r = db
            .migrate(&ms, RecoveryPolicy::ResumeIdempotent)
            .await
            .unwrap();
        assert!(
            r.recovered.iter().any(|s| s.contains('2')),
            "recovery names migration 2: {r:?}"
        );
        assert_eq!(
            r.applied.iter().map(|a| a.version).collect::<Vec<_>>(),
            [2, 3]
        );
        let history = db.lock().read_history().await.unwrap();
        assert!(
            history.iter().all(|h| h.state == HistoryState::Applied),
            "{history:?}"
        );
    });
    // Migration 2's first statement: once by the dead holder, once in the re-run.
    let twice = db.executed().iter().filter(|e| **e == (2, 0)).count();
    assert_eq!(twice, 2);
}

/// The order of work under the lock: recovery settles what a dead predecessor left before
/// anything pending runs. Migration 2 (no-transaction, so journaled) had run every statement
/// when its runner died: recovery marks it applied without running anything, and only then
/// do 3 and 4 run, in order, each once. Were recovery after the pending migrations, 2 would
/// be pending too and run again.
#[test]
fn recovery_comes_before_anything_pending_and_the_rest_runs_in_order() {
    let db = Db::new();
    let mut ms = migrations(4);
    ms[1] = Migration::from_sql(
        2,
        "m2",
        "-- no-transaction\nINSERT INTO t VALUES (2, 1);\nINSERT INTO t VALUES (2, 2)",
        Dialect::Sqlite,
    )
    .unwrap();
    let before = rt().block_on(async {
        db.migrate(&ms[..1], RecoveryPolicy::ResumeIdempotent)
            .await
            .unwrap();
        db.die_inside(&ms[1], 2).await;
        let before = db.executed().len();
        let r = db
            .migrate(&ms, RecoveryPolicy::ResumeIdempotent)
            .await
            .unwrap();
        assert!(
            r.recovered.len() == 1 && r.recovered[0].contains("marked applied"),
            "{:?}",
            r.recovered
        );
        assert_eq!(
            r.applied.iter().map(|a| a.version).collect::<Vec<_>>(),
            [3, 4]
        );
        assert_eq!(r.already_applied, 2, "{r:?}");
        before
    });
    assert_eq!(db.executed()[before..], [(3, 0), (3, 1), (4, 0), (4, 1)]);
}

/// A run that halted for review stays halted: the next run, whatever its policy, stops at that
/// migration before recovery or anything pending runs, and the status row still says so.
#[test]
fn a_halted_run_stops_the_next_one_before_recovery_and_anything_pending() {
    let db = Db::new();
    let ms = migrations(3);
    rt().block_on(async {
        db.die_inside(&ms[0], 1).await;
        let e = db.migrate(&ms, RecoveryPolicy::Halt).await.unwrap_err();
        assert_eq!(e.exit_code().code(), 78, "{e}");
        let ran = db.executed().len();

        let e = db
            .migrate(&ms, RecoveryPolicy::ResumeIdempotent)
            .await
            .unwrap_err();
        assert_eq!(e.exit_code().code(), 78, "{e}");
        assert!(e.to_string().contains("nobody has resolved it"), "{e}");
        assert_eq!(db.executed().len(), ran, "nothing ran: {:?}", db.executed());
        let status = db.lock().observe().await.unwrap().status.unwrap();
        assert_eq!(status.state, dbwarden_core::LockState::NeedsReview);
        assert_eq!(status.migration_version, Some(1));
    });
}

/// With `recovery_policy = halt` the same dead predecessor stops the run for a human: exit 78,
/// and nothing after it runs.
#[test]
fn halt_policy_stops_for_review() {
    let db = Db::new();
    let ms = migrations(2);
    rt().block_on(async {
        db.die_inside(&ms[0], 0).await;

        let e = db.migrate(&ms, RecoveryPolicy::Halt).await.unwrap_err();
        assert_eq!(e.exit_code().code(), 78, "{e}");
        let o = db.lock().observe().await.unwrap();
        assert_eq!(
            o.status.unwrap().state,
            dbwarden_core::LockState::NeedsReview
        );
    });
    assert!(db.executed().is_empty(), "{:?}", db.executed());
}

/// An applied migration whose file changed stops the run before anything else runs (exit 2).
#[test]
fn a_changed_file_stops_the_run() {
    let db = Db::new();
    let ms = migrations(1);
    rt().block_on(async {
        db.migrate(&ms, RecoveryPolicy::ResumeIdempotent)
            .await
            .unwrap();
        let mut changed = migrations(2);
        changed[0] =
            Migration::from_sql(1, "m1", "INSERT INTO t VALUES (1, 9)", Dialect::Sqlite).unwrap();
        let e = db
            .migrate(&changed, RecoveryPolicy::ResumeIdempotent)
            .await
            .unwrap_err();
        assert_eq!(e.exit_code().code(), 2, "{e}");
        assert!(
            e.to_string().contains("changed after it was applied"),
            "{e}"
        );
    });
    each_once(&db, &ms);
}

/// A pending migration below the highest applied one is refused (exit 2, nothing runs), and
/// applied in version order when allowed.
#[test]
fn out_of_order_is_refused_unless_allowed() {
    let db = Db::new();
    let all = migrations(3);
    rt().block_on(async {
        let first_and_third = [all[0].clone(), all[2].clone()];
        db.migrate(&first_and_third, RecoveryPolicy::ResumeIdempotent)
            .await
            .unwrap();
        let before = db.executed().len();
        let e = db
            .migrate(&all, RecoveryPolicy::ResumeIdempotent)
            .await
            .unwrap_err();
        assert_eq!(e.exit_code().code(), 2, "{e}");
        assert!(
            e.to_string().contains("out of order")
                && e.to_string().contains("--allow-out-of-order"),
            "{e}"
        );
        assert_eq!(db.executed().len(), before, "nothing ran");
        let allowed = MigrateOptions {
            allow_out_of_order: true,
            ..options(RecoveryPolicy::ResumeIdempotent)
        };
        let r = db.migrate_with(&all, allowed).await.unwrap();
        assert_eq!(r.applied.iter().map(|a| a.version).collect::<Vec<_>>(), [2]);
    });
    each_once(&db, &all);
}

/// Migrations that are journaled statement by statement and whose statements are neither
/// idempotent nor rolled back with their journal entry (MySQL's DDL commits on its own): a
/// `RUNNING` row pointing at one of them is a statement that may have run.
fn ddl_migrations(n: i64) -> Vec<Migration> {
    (1..=n)
        .map(|v| {
            let sql = format!("CREATE TABLE a{v} (id int);\nCREATE TABLE b{v} (id int)");
            Migration::from_sql(v, format!("m{v}"), &sql, Dialect::MySql).unwrap()
        })
        .collect()
}

fn row(db: &Db, version: i64) -> dbwarden_core::HistoryRow {
    rt().block_on(db.lock().read_history())
        .unwrap()
        .into_iter()
        .find(|r| r.version == version)
        .expect("a history row")
}

/// The holder's lease runs out while it writes migration 2's `RUNNING` row, before any
/// statement of migration 2 was sent (a TTL lease whose server was away: the ClickHouse
/// restart of server_restart.rs). It stops, exit 4. It knows what its successor cannot --
/// statement 1 was never sent -- and its token still holds, so it records migration 2 `FAILED`
/// before statement 1: the next run resumes there without a review, each statement once.
/// Before the holder said so, the row stayed `RUNNING` and the next run halted (exit 78) over
/// a `CREATE TABLE` that never ran.
#[test]
fn a_lease_lost_before_a_statement_was_sent_leaves_the_migration_resumable() {
    let db = Db::new();
    let ms = ddl_migrations(2);
    memory::expire_lease_during_begin(&db.0, 2, false);
    let e = rt()
        .block_on(db.migrate(&ms, RecoveryPolicy::ResumeIdempotent))
        .unwrap_err();
    assert_eq!(e.exit_code().code(), 4, "{e}");
    assert_eq!(db.executed(), [(1, 0), (1, 1)], "nothing of 2 was sent");
    let r2 = row(&db, 2);
    assert_eq!(
        (r2.state, r2.statements_done),
        (HistoryState::Failed, 0),
        "{r2:?}"
    );

    let r = rt()
        .block_on(db.migrate(&ms, RecoveryPolicy::ResumeIdempotent))
        .unwrap();
    assert_eq!(r.applied.iter().map(|a| a.version).collect::<Vec<_>>(), [2]);
    assert_eq!(r.applied[0].resumed_from, Some(0), "{r:?}");
    each_once(&db, &ms);
}

/// The same, but a successor took the lock over before the holder could say so: the fence
/// refuses the holder's write, the row stays `RUNNING` at a statement that, for all the
/// successor knows, may have been in flight, and the next run halts for review
/// (docs/design.md §9, rule 7) instead of guessing.
#[test]
fn once_a_successor_holds_the_token_the_row_stays_for_review() {
    let db = Db::new();
    let ms = ddl_migrations(2);
    memory::expire_lease_during_begin(&db.0, 2, true);
    let e = rt()
        .block_on(db.migrate(&ms, RecoveryPolicy::ResumeIdempotent))
        .unwrap_err();
    assert_eq!(e.exit_code().code(), 4, "{e}");
    let r2 = row(&db, 2);
    assert_eq!(
        (r2.state, r2.statements_done),
        (HistoryState::Running, 0),
        "{r2:?}"
    );
    let e = rt()
        .block_on(db.migrate(&ms, RecoveryPolicy::ResumeIdempotent))
        .unwrap_err();
    assert_eq!(e.exit_code().code(), 78, "{e}");
    assert_eq!(db.executed(), [(1, 0), (1, 1)], "nothing of 2 ran");
}
