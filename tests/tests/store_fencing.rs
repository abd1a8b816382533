//! The stores' fences, driven through the library as the runner drives them. Journal and history
//! writes are conditional writes whose matched rows are the fence (PostgreSQL: the history row is
//! inserted from the status row `FOR UPDATE` in the migration's own transaction; MariaDB: a
//! migration statement follows such a write without a separate token re-read). These pin down
//! that a holder whose token moved, or whose lock session was killed (what `dbwarden unlock`
//! does first), writes nothing and runs nothing more.

use std::time::Duration;

use dbwarden_core::migration::{Dialect, Migration};
use dbwarden_core::{
    Error, HeartbeatConfig, HolderInfo, Lease, MigrationLock, Namespace, Wait, wait::acquire,
};
use dbwarden_mysql::MySqlLock;
use dbwarden_postgres::PgLock;
use dbwarden_tests::mysql::TestDb;
use dbwarden_tests::pg::PgDb;

fn migration(version: i64, statements: &[&str]) -> Migration {
    let sql = statements.join(";\n");
    Migration::from_sql(version, format!("m{version}"), sql, Dialect::Postgres).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn take(lock: &dyn MigrationLock) -> Lease {
    let holder = HolderInfo::current(None, "mysql_fencing test");
    let hb = HeartbeatConfig {
        interval: Duration::from_secs(1),
        ttl: Duration::from_secs(10),
    };
    acquire(lock, &holder, Wait::No, hb).await.unwrap()
}

fn ns() -> Namespace {
    Namespace::new("default").unwrap()
}

/// `TestDb` runs its own runtime: call it off this one's thread.
fn outside<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().unwrap())
}

fn expect_lost(r: Result<(), Error>, what: &str) {
    match r {
        Err(e) if e.is_lost() => {}
        other => panic!("{what}: expected the lock reported lost, got {other:?}"),
    }
}

/// The token moves under a holder (by hand here; in real life only after its session ended):
/// its journal start writes nothing and its next statement does not run.
fn moved_token_before_the_journal_start(
    lock: &dyn MigrationLock,
    sql: &(dyn Fn(&str) + Sync),
    query: &(dyn Fn(&str) -> Vec<String> + Sync),
    has_table: &(dyn Fn(&str) -> bool + Sync),
) {
    runtime().block_on(async {
        let mut lease = take(lock).await;
        let token = lease.fencing_token();
        let exec = lease.holder().execution_id;
        let m = migration(1, &["CREATE TABLE fenced_a (x INT)"]);
        outside(|| sql("UPDATE dbwarden_lock SET fencing_token = fencing_token + 1"));
        let store = lease.store().unwrap();
        expect_lost(
            store.journal_begin(token, exec, &m, 0).await,
            "journal_begin",
        );
        let lost = lease.lost_signal();
        let store = lease.store().unwrap();
        expect_lost(
            store.journal_statement(token, &m, 0, &lost).await,
            "journal_statement after a failed journal_begin",
        );
    });
    assert_eq!(query("SELECT COUNT(*) FROM dbwarden_migrations"), ["0"]);
    assert_eq!(
        query("SELECT COALESCE(CAST(migration_version AS CHAR(20)), '-') FROM dbwarden_lock"),
        ["-"],
        "the status row must not name a migration the fenced-out holder never started"
    );
    assert!(
        !has_table("fenced_a"),
        "a fenced-out holder ran a statement"
    );
}

#[test]
fn mysql_a_journal_start_with_a_moved_token_writes_nothing() {
    let db = TestDb::new();
    let lock = MySqlLock::from_url(&db.url, ns()).unwrap();
    moved_token_before_the_journal_start(&lock, &|sql| db.exec(sql), &|sql| db.query(sql), &|t| {
        db.has_table(t)
    });
}

#[test]
fn postgres_a_journal_start_with_a_moved_token_writes_nothing() {
    let db = PgDb::new();
    let lock = PgLock::from_url(&db.url, ns()).unwrap();
    moved_token_before_the_journal_start(&lock, &|sql| db.exec(sql), &|sql| db.query(sql), &|t| {
        db.count(&format!(
            "SELECT COUNT(*) FROM pg_tables WHERE tablename = '{t}'"
        )) == 1
    });
}

/// PostgreSQL commits a migration with its history row: a token that moved before that row is
/// written rolls the whole migration back.
#[test]
fn postgres_a_token_moved_during_a_migration_rolls_it_back() {
    let db = PgDb::new();
    let lock = PgLock::from_url(&db.url, ns()).unwrap();
    runtime().block_on(async {
        let mut lease = take(&lock).await;
        let token = lease.fencing_token();
        let exec = lease.holder().execution_id;
        let lost = lease.lost_signal();
        // The migration's second statement moves the token inside the migration's own
        // transaction, so the history insert that closes it sees a token that is not ours.
        let m = migration(
            1,
            &[
                "CREATE TABLE rolled_back (x INT)",
                "UPDATE dbwarden_lock SET fencing_token = fencing_token + 1",
            ],
        );
        let store = lease.store().unwrap();
        expect_lost(
            store.apply_in_transaction(token, exec, &m, &lost).await,
            "a migration whose token moved",
        );
    });
    assert_eq!(
        db.count("SELECT COUNT(*) FROM pg_tables WHERE tablename = 'rolled_back'"),
        0,
        "the migration must roll back with its fenced-out history row"
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM dbwarden_migrations"), 0);
}

#[test]
fn mysql_a_killed_lock_session_runs_no_further_statement_and_records_nothing() {
    let db = TestDb::new();
    let lock = MySqlLock::from_url(&db.url, ns()).unwrap();
    runtime().block_on(async {
        let mut lease = take(&lock).await;
        let token = lease.fencing_token();
        let exec = lease.holder().execution_id;
        let lost = lease.lost_signal();
        let m = migration(
            1,
            &[
                "CREATE TABLE before_kill (x INT)",
                "CREATE TABLE after_kill (x INT)",
            ],
        );
        let store = lease.store().unwrap();
        store.journal_begin(token, exec, &m, 0).await.unwrap();
        store.journal_statement(token, &m, 0, &lost).await.unwrap();
        // What `dbwarden unlock` does first: KILL the holder's session, then bump the token.
        outside(|| {
            let id = db.query("SELECT db_connection_id FROM dbwarden_lock")[0].clone();
            db.exec(&format!("KILL {id}"));
            db.exec("UPDATE dbwarden_lock SET fencing_token = fencing_token + 1");
        });
        let store = lease.store().unwrap();
        expect_lost(
            store.journal_statement(token, &m, 1, &lost).await,
            "the statement after the kill",
        );
    });
    assert!(db.has_table("before_kill"));
    assert!(
        !db.has_table("after_kill"),
        "a statement ran after its session was killed"
    );
    assert_eq!(
        db.query("SELECT CONCAT(state, ':', statements_done) FROM dbwarden_migrations"),
        ["RUNNING:1"],
        "the journal must still say statement 1 of 2 finished"
    );
}

/// The other sessions connected to `db`, as `pid:application_name`.
fn pg_sessions(db: &PgDb) -> Vec<String> {
    outside(|| {
        db.query(
            "SELECT pid || ':' || application_name FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid() ORDER BY pid",
        )
    })
}

fn lock_pid(db: &PgDb) -> String {
    outside(|| db.query("SELECT db_connection_id FROM dbwarden_lock")[0].clone())
}

/// A replica that takes the lock around its own work, again and again, reuses its two sessions:
/// the next acquire opens no connection (with TLS each costs milliseconds).
#[test]
fn postgres_a_clean_release_keeps_the_sessions_for_the_next_acquire() {
    let db = PgDb::new();
    let lock = PgLock::from_url(&db.url, ns()).unwrap();
    runtime().block_on(async {
        let first = take(&lock).await;
        let t1 = first.fencing_token().0;
        let pid = lock_pid(&db);
        let during = pg_sessions(&db);
        assert_eq!(during.len(), 2, "lock session and heartbeat: {during:?}");
        first.release().await.unwrap();
        assert_eq!(pg_sessions(&db), during, "kept, not closed");
        let second = take(&lock).await;
        assert_eq!(second.fencing_token().0, t1 + 1);
        assert_eq!(lock_pid(&db), pid, "the same lock session");
        assert_eq!(pg_sessions(&db), during);
        second.release().await.unwrap();
    });
}

/// A session that ran a migration is never reused: what the migration set on it (here its
/// application_name; as well a role or a statement_timeout) must not follow into the next run.
#[test]
fn postgres_a_session_that_ran_a_migration_is_closed_at_release() {
    let db = PgDb::new();
    let lock = PgLock::from_url(&db.url, ns()).unwrap();
    runtime().block_on(async {
        let mut lease = take(&lock).await;
        let token = lease.fencing_token();
        let exec = lease.holder().execution_id;
        let lost = lease.lost_signal();
        let pid = lock_pid(&db);
        let m = migration(
            1,
            &[
                "CREATE TABLE t1 (x INT)",
                "SET application_name = 'set_by_migration'",
            ],
        );
        let store = lease.store().unwrap();
        store
            .apply_in_transaction(token, exec, &m, &lost)
            .await
            .unwrap();
        assert!(
            pg_sessions(&db).contains(&format!("{pid}:set_by_migration")),
            "{:?}",
            pg_sessions(&db)
        );
        lease.release().await.unwrap();
        let next = take(&lock).await;
        assert_ne!(lock_pid(&db), pid, "a new lock session");
        let now = pg_sessions(&db);
        assert!(
            now.iter().all(|s| !s.ends_with(":set_by_migration")),
            "{now:?}"
        );
        next.release().await.unwrap();
    });
    assert_eq!(db.count("SELECT COUNT(*) FROM dbwarden_migrations"), 1);
}

/// MariaDB: the lock session's connection id and who holds its liveness lock.
fn mysql_sessions(db: &TestDb) -> (String, String) {
    outside(|| {
        let id = db.query("SELECT db_connection_id FROM dbwarden_lock")[0].clone();
        let alive = db.query(&format!(
            "SELECT COALESCE(IS_USED_LOCK('dbwarden.alive.{id}'), 0)"
        ))[0]
            .clone();
        (id, alive)
    })
}

#[test]
fn mysql_a_clean_release_keeps_the_sessions_for_the_next_acquire() {
    let db = TestDb::new();
    let lock = MySqlLock::from_url(&db.url, ns()).unwrap();
    runtime().block_on(async {
        let first = take(&lock).await;
        let t1 = first.fencing_token().0;
        let (id, alive) = mysql_sessions(&db);
        assert_ne!(alive, "0", "the liveness lock is held");
        first.release().await.unwrap();
        let second = take(&lock).await;
        assert_eq!(second.fencing_token().0, t1 + 1);
        assert_eq!(
            mysql_sessions(&db),
            (id, alive),
            "the same lock session, and the same liveness session holding its lock"
        );
        second.release().await.unwrap();
    });
}

#[test]
fn mysql_a_session_that_ran_a_migration_is_closed_at_release() {
    let db = TestDb::new();
    let lock = MySqlLock::from_url(&db.url, ns()).unwrap();
    runtime().block_on(async {
        let mut lease = take(&lock).await;
        let token = lease.fencing_token();
        let exec = lease.holder().execution_id;
        let lost = lease.lost_signal();
        let (id, _) = mysql_sessions(&db);
        let m = migration(1, &["SET SESSION sql_mode = 'ANSI_QUOTES'"]);
        let store = lease.store().unwrap();
        store.journal_begin(token, exec, &m, 0).await.unwrap();
        store.journal_statement(token, &m, 0, &lost).await.unwrap();
        lease.release().await.unwrap();
        let gone = outside(|| {
            db.count(&format!(
                "SELECT COUNT(*) FROM information_schema.processlist WHERE id = {id}"
            ))
        });
        assert_eq!(gone, 0, "the session that ran the migration was closed");
        let next = take(&lock).await;
        let (next_id, alive) = mysql_sessions(&db);
        assert_ne!(next_id, id, "a new lock session");
        assert_ne!(alive, "0");
        next.release().await.unwrap();
    });
}

/// A kept liveness session that was killed meanwhile is replaced, never reused: reused, its
/// liveness lock would be free while the run holds the lock, and any waiter would KILL the run.
#[test]
fn mysql_a_kept_liveness_session_that_died_is_replaced() {
    let db = TestDb::new();
    let lock = MySqlLock::from_url(&db.url, ns()).unwrap();
    runtime().block_on(async {
        take(&lock).await.release().await.unwrap();
        let (id, alive) = mysql_sessions(&db);
        outside(|| db.exec(&format!("KILL {alive}")));
        let second = take(&lock).await;
        let (id2, alive2) = mysql_sessions(&db);
        assert_eq!(id2, id, "the kept lock session is reused");
        assert_ne!(alive2, "0", "the liveness lock is held again");
        assert_ne!(alive2, alive, "by a new liveness session");
        second.release().await.unwrap();
    });
}

/// A kept heartbeat connection that was cut meanwhile is replaced at the next acquire.
#[test]
fn postgres_a_kept_heartbeat_connection_that_died_is_replaced() {
    let db = PgDb::new();
    let lock = PgLock::from_url(&db.url, ns()).unwrap();
    runtime().block_on(async {
        take(&lock).await.release().await.unwrap();
        let pid = lock_pid(&db);
        let kept = pg_sessions(&db);
        let aux: Vec<_> = kept
            .iter()
            .filter(|s| !s.starts_with(&format!("{pid}:")))
            .map(|s| s.split(':').next().unwrap().to_owned())
            .collect();
        assert_eq!(aux.len(), 1, "{kept:?}");
        outside(|| db.exec(&format!("SELECT pg_terminate_backend({})", aux[0])));
        let second = take(&lock).await;
        let now = pg_sessions(&db);
        assert_eq!(
            now.len(),
            2,
            "lock session and a new heartbeat connection: {now:?}"
        );
        assert!(
            now.iter().all(|s| !s.starts_with(&format!("{}:", aux[0]))),
            "{now:?}"
        );
        second.release().await.unwrap();
    });
}

/// A kept session that ended between two runs of a library user does not fail the next
/// run's consistent-read look: it reads on a fresh session.
#[test]
fn mysql_a_kept_session_that_ended_does_not_fail_the_next_look() {
    let db = TestDb::new();
    let lock = MySqlLock::from_url(&db.url, ns()).unwrap();
    runtime().block_on(async {
        take(&lock).await.release().await.unwrap();
        let (id, _) = mysql_sessions(&db);
        outside(|| db.exec(&format!("KILL {id}")));
        let snapshot = dbwarden_core::SnapshotRead::read_snapshot(&lock)
            .await
            .expect("a look after the kill");
        assert_eq!(
            snapshot.status.map(|s| s.fencing_token),
            Some(1),
            "the status row of the first run"
        );
    });
}

/// The pooler-safe lease (`lock = "lease"`, through PgBouncer in transaction mode): the same
/// fence on every write.
fn pg_lease_lock(db: &PgDb) -> dbwarden_postgres::lease::PgLeaseLock {
    let port = dbwarden_tests::pg::pgbouncer_port(false);
    dbwarden_postgres::lease::PgLeaseLock::new(
        PgLock::from_url(&db.url_on_port(port), ns()).unwrap(),
    )
}

#[test]
fn postgres_lease_a_journal_start_with_a_moved_token_writes_nothing() {
    let db = PgDb::new();
    let lock = pg_lease_lock(&db);
    moved_token_before_the_journal_start(&lock, &|sql| db.exec(sql), &|sql| db.query(sql), &|t| {
        db.count(&format!(
            "SELECT COUNT(*) FROM pg_tables WHERE tablename = '{t}'"
        )) == 1
    });
}

/// A lease holder that stopped heartbeating (no heartbeat task here: as if paused) and whose
/// lease another runner took once it expired: the database itself rejects its late writes --
/// its migration rolls back, its state change and journal write nothing -- and its next
/// heartbeat says it is gone. Core's lost-signal would have stopped it first; this is the
/// fence behind it.
#[test]
fn postgres_lease_a_holder_whose_expired_lease_was_taken_writes_nothing() {
    use dbwarden_core::{Attempt, Beat, LockState};
    let db = PgDb::new();
    let (a, b) = (pg_lease_lock(&db), pg_lease_lock(&db));
    runtime().block_on(async {
        let mut holder = HolderInfo::current(None, "lease fencing test");
        holder.lock_ttl_ms = Some(1000);
        let Attempt::Acquired(mut held) = a.try_acquire(&holder).await.unwrap() else {
            panic!("a fresh lease is free");
        };
        let (token, beat) = (held.token, held.heartbeat);
        assert_eq!(beat.beat().await.unwrap(), Beat::Alive);
        let other = HolderInfo::current(None, "lease fencing test (taker)");
        assert!(
            matches!(b.try_acquire(&other).await.unwrap(), Attempt::Busy(_)),
            "a live lease is not taken"
        );
        tokio::time::sleep(Duration::from_millis(1300)).await;
        let Attempt::Acquired(taken) = b.try_acquire(&other).await.unwrap() else {
            panic!("an expired lease is taken");
        };
        assert_eq!(taken.token.0, token.0 + 1);
        let lost = dbwarden_core::LostSignal::never();
        let m = migration(1, &["CREATE TABLE late (x INT)"]);
        let store = held.held.store().unwrap();
        expect_lost(
            store
                .apply_in_transaction(token, holder.execution_id, &m, &lost)
                .await,
            "a migration after the take-over",
        );
        expect_lost(
            store.set_state(token, LockState::Complete, None).await,
            "the final state after the take-over",
        );
        expect_lost(
            store.journal_begin(token, holder.execution_id, &m, 0).await,
            "a journal start after the take-over",
        );
        assert!(
            matches!(beat.beat().await.unwrap(), Beat::Gone(_)),
            "the old holder's heartbeat must find its lease gone"
        );
        held.held.release().await.unwrap();
        taken.held.release().await.unwrap();
    });
    assert_eq!(
        db.count("SELECT COUNT(*) FROM pg_tables WHERE tablename = 'late'"),
        0
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM dbwarden_migrations"), 0);
    assert_eq!(
        db.query("SELECT state || ' ' || fencing_token FROM dbwarden_lock"),
        ["RUNNING 2"],
        "the old holder's release must not touch the new holder's lease"
    );
}

/// A lease holder that stops inside a no-transaction file's own `BEGIN … COMMIT` (its lease
/// lost, as the runner stops before the next statement) and then releases: the release must not
/// commit that half-done transaction on the connection it shares with the store.
#[test]
fn postgres_lease_a_release_inside_a_files_own_transaction_commits_nothing_of_it() {
    use dbwarden_core::Attempt;
    let db = PgDb::new();
    db.exec("CREATE TABLE half (x INT)");
    let lock = pg_lease_lock(&db);
    let m = Migration::from_sql(
        1,
        "own_tx",
        "-- no-transaction\nBEGIN;\nINSERT INTO half VALUES (1);\nINSERT INTO half VALUES (2);\nCOMMIT;",
        Dialect::Postgres,
    )
    .unwrap();
    runtime().block_on(async {
        let holder = HolderInfo::current(None, "lease release test");
        let Attempt::Acquired(mut held) = lock.try_acquire(&holder).await.unwrap() else {
            panic!("a fresh lease is free");
        };
        let token = held.token;
        let lost = dbwarden_core::LostSignal::never();
        let store = held.held.store().unwrap();
        store
            .journal_begin(token, holder.execution_id, &m, 0)
            .await
            .unwrap();
        // BEGIN and the first INSERT run; the runner stops here (lease lost) and releases.
        for i in 0..2 {
            store.journal_statement(token, &m, i, &lost).await.unwrap();
        }
        held.held.release().await.unwrap();
    });
    assert_eq!(db.count("SELECT count(*) FROM half"), 0);
    assert_eq!(
        db.query("SELECT (expires_at IS NULL)::text FROM dbwarden_lock"),
        ["true"],
        "the lease is given back"
    );
}
