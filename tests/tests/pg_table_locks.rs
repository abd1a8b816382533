//! PostgreSQL: a migration never stalls the application behind a table lock. An application
//! transaction holds `ACCESS SHARE` on a table; `migrate` runs an `ALTER TABLE` on it. Without a
//! bound the `ALTER` waits in the lock queue and every later query on the table waits behind
//! it (the classic outage). With `lock_timeout` it gives up after that long, does nothing, and
//! is retried after a pause, each retry naming the session in the way; once the application
//! lets go, the migration applies, once (docs/operations.md, "Locks your migrations take").

use std::sync::mpsc;
use std::time::Duration;

use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Probe, Run, Sandbox};

/// An application session holding `ACCESS SHARE` on `s` in an open transaction until the
/// returned sender is used (or dropped); also its backend pid.
fn blocker(db: &PgDb) -> (std::thread::JoinHandle<()>, mpsc::Sender<()>, i64) {
    let (release, released) = mpsc::channel::<()>();
    let (pid_tx, pid_rx) = mpsc::channel();
    let url = db.url.clone();
    let h = std::thread::spawn(move || {
        let mut c = dbwarden_tests::pg::Client::connect(&url);
        c.exec("BEGIN; SELECT count(*) FROM s");
        pid_tx.send(c.backend_pid()).unwrap();
        let _ = released.recv();
        c.exec("COMMIT");
    });
    (h, release, pid_rx.recv().unwrap())
}

/// The application reading `s` every 100 ms on a connection of its own.
fn probe(db: &PgDb) -> Probe {
    let mut c = dbwarden_tests::pg::Client::connect(&db.url);
    Probe::start(move || {
        c.query("SELECT count(*) FROM s");
    })
}

/// How long the application keeps the table in the probe tests, once the migration has
/// reached it.
const HOLD: Duration = Duration::from_secs(30);

fn table(db: &PgDb) -> Sandbox {
    db.exec("CREATE TABLE s (id int); INSERT INTO s VALUES (1); CREATE TABLE ledger (what text)");
    Sandbox::new()
}

fn columns(db: &PgDb) -> Vec<String> {
    db.query(
        "SELECT string_agg(column_name, ',' ORDER BY ordinal_position) FROM information_schema.columns WHERE table_name = 's'",
    )
}

/// Run `migrate` with `extra` while the application blocks the table for `hold` (counted from
/// when the migration reached the table), with the probe reading all along; returns the run,
/// the probe's longest wait and the blocker's pid.
fn blocked_run(db: &PgDb, sb: &Sandbox, extra: &[&str], hold: Duration) -> (Run, Duration, i64) {
    let (app, release, pid) = blocker(db);
    let probe = probe(db);
    let mut args = vec!["migrate"];
    args.extend_from_slice(extra);
    let child = db.spawn(sb, &args);
    // The ALTER is waiting for its lock (or has waited and is pausing before a retry).
    db.wait_for(
        "SELECT count(*) FROM pg_locks WHERE relation = 's'::regclass AND NOT granted",
        Duration::from_secs(60),
    );
    std::thread::sleep(hold);
    release.send(()).unwrap();
    app.join().unwrap();
    let r = Run::wait(child, Duration::from_secs(120));
    (r, probe.stop(), pid)
}

#[test]
fn a_blocked_alter_never_queues_the_application_and_applies_once_the_table_is_free() {
    let db = PgDb::new();
    let sb = table(&db);
    sb.write_migration("0001_add.sql", "ALTER TABLE s ADD COLUMN c int;");
    let (r, longest, pid) = blocked_run(
        &db,
        &sb,
        &["--lock-timeout", "1s", "--lock-retries", "100"],
        HOLD,
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.contains(&format!("blocked by pid {pid} (")),
        "each retry names the session in the way: {r:?}"
    );
    assert!(
        r.stderr.contains("idle in transaction") && !r.stderr.contains("SELECT count"),
        "its state, never its query text: {r:?}"
    );
    // A read that arrives while the ALTER waits queues behind it, at most lock_timeout.
    eprintln!("the application's longest read while the migration was blocked: {longest:?}");
    assert!(
        longest < Duration::from_secs(1) + Duration::from_secs(2),
        "the application waited {longest:?} behind the migration"
    );
    assert_eq!(columns(&db), ["id,c"]);
    assert_eq!(
        db.query("SELECT state FROM dbwarden_migrations"),
        ["APPLIED"]
    );
}

/// The same without a bound (`--lock-timeout 0`): today's stall, which is what the feature
/// prevents -- the application's reads wait for the whole time the table is held.
#[test]
fn without_a_lock_timeout_the_application_waits_behind_the_migration() {
    let db = PgDb::new();
    let sb = table(&db);
    sb.write_migration("0001_add.sql", "ALTER TABLE s ADD COLUMN c int;");
    let (r, longest, _) = blocked_run(&db, &sb, &["--lock-timeout", "0"], HOLD);
    assert_eq!(r.code, 0, "{r:?}");
    eprintln!("the application's longest read behind the unbounded migration: {longest:?}");
    assert!(
        longest >= HOLD - Duration::from_secs(5),
        "the unbounded ALTER should have queued the reads ({longest:?})"
    );
    assert_eq!(columns(&db), ["id,c"]);
}

/// A transactional file whose second statement meets the blocker: the whole transaction rolls
/// back and is retried, so the statements before it take effect once (a ledger without a key).
#[test]
fn a_transaction_meeting_the_blocker_is_retried_whole() {
    let db = PgDb::new();
    let sb = table(&db);
    sb.write_migration(
        "0001_three.sql",
        "INSERT INTO ledger VALUES ('before');\nALTER TABLE s ADD COLUMN d int;\nINSERT INTO ledger VALUES ('after');",
    );
    let (r, _, _) = blocked_run(
        &db,
        &sb,
        &["--lock-timeout", "500ms", "--lock-retries", "30"],
        Duration::from_secs(3),
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("retry 1 of 30"), "{r:?}");
    assert_eq!(
        db.query("SELECT string_agg(what, ',' ORDER BY what) FROM ledger"),
        ["after,before"],
        "each statement's effect once"
    );
    assert_eq!(columns(&db), ["id,d"]);
}

/// Past `lock_retries` the run gives up: exit 3, naming the blocker, nothing of the migration
/// applied, its history row FAILED (so the next run applies it); once the table is free, it
/// does.
#[test]
fn giving_up_is_exit_3_naming_the_blocker_with_nothing_applied() {
    let db = PgDb::new();
    let sb = table(&db);
    sb.write_migration(
        "0001_add.sql",
        "INSERT INTO ledger VALUES ('x');\nALTER TABLE s ADD COLUMN c int;",
    );
    let (app, release, pid) = blocker(&db);
    let r = db.run(
        &sb,
        &["migrate", "--lock-timeout", "1s", "--lock-retries", "1"],
    );
    assert_eq!(r.code, 3, "{r:?}");
    assert!(
        r.stderr.contains("in 2 attempt(s)") && r.stderr.contains(&format!("blocked by pid {pid}")),
        "{r:?}"
    );
    assert!(r.stderr.contains("nothing of it was applied"), "{r:?}");
    assert_eq!(columns(&db), ["id"]);
    assert_eq!(db.query("SELECT count(*) FROM ledger"), ["0"]);
    assert_eq!(
        db.query("SELECT state FROM dbwarden_migrations"),
        ["FAILED"]
    );
    release.send(()).unwrap();
    app.join().unwrap();
    let r = db.run(&sb, &["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(columns(&db), ["id,c"]);
    assert_eq!(db.query("SELECT count(*) FROM ledger"), ["1"]);
}

/// A file's own directive comes before the setting: `-- dbwarden:lock-timeout 0` waits as
/// long as it takes, even with a short `--lock-timeout`.
#[test]
fn a_files_directive_overrides_the_setting() {
    let db = PgDb::new();
    let sb = table(&db);
    sb.write_migration(
        "0001_add.sql",
        "-- dbwarden:lock-timeout 0\nALTER TABLE s ADD COLUMN c int;",
    );
    let (r, _, _) = blocked_run(
        &db,
        &sb,
        &["--lock-timeout", "200ms", "--lock-retries", "0"],
        Duration::from_secs(2),
    );
    assert_eq!(r.code, 0, "waited for the lock instead of giving up: {r:?}");
    assert!(!r.stderr.contains("retry"), "{r:?}");
    assert_eq!(columns(&db), ["id,c"]);
}

/// A migration's own `SET lock_timeout = 0` (pg_dump headers have one) stays on the session
/// after its COMMIT; the next migration still runs with its own bound, not with that.
#[test]
fn a_migrations_own_set_does_not_unbound_the_next_one() {
    let db = PgDb::new();
    let sb = table(&db);
    sb.write_migration(
        "0001_dump.sql",
        "SET lock_timeout = 0;\nCREATE TABLE dumped (x int);",
    );
    sb.write_migration("0002_add.sql", "ALTER TABLE s ADD COLUMN c int;");
    let (app, release, _) = blocker(&db);
    let r = db.run(
        &sb,
        &["migrate", "--lock-timeout", "500ms", "--lock-retries", "0"],
    );
    release.send(()).unwrap();
    app.join().unwrap();
    assert_eq!(r.code, 3, "migration 2 was bounded again: {r:?}");
    assert_eq!(
        db.query("SELECT string_agg(version || ':' || state, ',' ORDER BY version) FROM dbwarden_migrations"),
        ["1:APPLIED,2:FAILED"]
    );
}

/// While the holder's `ALTER` waits for the application's lock, `lock-status` says so, naming
/// the session in the way (a lock timeout long enough that the wait is there to be seen).
#[test]
fn lock_status_names_the_session_a_waiting_holder_waits_for() {
    let db = PgDb::new();
    let sb = table(&db);
    sb.write_migration("0001_add.sql", "ALTER TABLE s ADD COLUMN c int;");
    let (app, release, pid) = blocker(&db);
    let child = db.spawn(&sb, &["migrate", "--lock-timeout", "60s"]);
    db.wait_for(
        "SELECT count(*) FROM pg_locks WHERE relation = 's'::regclass AND NOT granted",
        Duration::from_secs(60),
    );
    let (code, v) = db.status(&sb, &[]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["verdict"], "HEALTHY", "{v}");
    let notes = v["notes"].to_string();
    assert!(
        notes.contains(&format!(
            "the holder's migration waits for a lock held by pid {pid} ("
        )) && notes.contains("idle in transaction"),
        "{v}"
    );
    assert!(!notes.contains("SELECT count"), "never the query text: {v}");
    release.send(()).unwrap();
    app.join().unwrap();
    let r = Run::wait(child, Duration::from_secs(120));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(columns(&db), ["id,c"]);
    let (_, v) = db.status(&sb, &[]);
    assert!(
        !v["notes"].to_string().contains("waits for a lock"),
        "once done, nothing waits: {v}"
    );
}
