//! MySQL/MariaDB: a migration never stalls the application behind a metadata lock. An
//! application transaction has read table `s`; `migrate` runs an `ALTER TABLE` on it. Unbounded,
//! the `ALTER` waits for the metadata lock and every later query on `s` waits behind it. With
//! `lock_wait_timeout` (the `lock_timeout` setting) it gives up after that long having done
//! nothing, and is retried after a pause, each retry naming the sessions in the way; once the
//! application lets go, it applies, once (docs/operations.md, "Locks your migrations take").

use std::time::Duration;

use dbwarden_tests::mysql::{Session, TestDb};
use dbwarden_tests::{Probe, Sandbox, StderrWatch};

fn table(db: &TestDb) -> Sandbox {
    db.exec(
        "CREATE TABLE s (id int) ENGINE=InnoDB; INSERT INTO s VALUES (1); \
         CREATE TABLE ledger (what varchar(20)) ENGINE=InnoDB",
    );
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_add.sql",
        "INSERT INTO ledger VALUES ('x');\nALTER TABLE s ADD COLUMN c int;",
    );
    sb
}

/// An application session that has read `s` in a transaction it keeps open (holding the
/// table's metadata lock until it ends), and its connection id.
fn blocker(db: &TestDb) -> (Session, String) {
    let mut app = db.session();
    let id = app.id().to_string();
    app.exec("START TRANSACTION; SELECT count(*) FROM s");
    // The server lists the transaction once it has read a row; wait until it does, so the
    // runner's "blocked by" query can see it.
    db.wait_for_transaction(&id, Duration::from_secs(30));
    (app, id)
}

/// How long the application keeps the table once the migration has reached it.
const HOLD: Duration = Duration::from_secs(30);

/// The application reading `s` every 100 ms on a session of its own.
fn probe(db: &TestDb) -> Probe {
    let mut reader = db.session();
    Probe::start(move || reader.exec("SELECT count(*) FROM s"))
}

fn columns(db: &TestDb) -> Vec<String> {
    db.query(&format!(
        "SELECT GROUP_CONCAT(COLUMN_NAME ORDER BY ORDINAL_POSITION) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = '{}' AND TABLE_NAME = 's'",
        db.name
    ))
}

/// The blocker holds the table for 30 s while the application reads it every 100 ms: no read
/// waits much over `lock_timeout` (1 s), the retries name the blocker, and the migration applies
/// once when the table is free.
#[test]
fn a_blocked_alter_is_retried_naming_the_blocker_and_never_queues_the_application() {
    let db = TestDb::new();
    let sb = table(&db);
    let (mut app, id) = blocker(&db);
    let probe = probe(&db);
    let child = sb.spawn(&[
        "migrate",
        "-u",
        &db.url,
        "--lock-timeout",
        "1s",
        "--lock-retries",
        "100",
    ]);
    let mut run = StderrWatch::new(child);
    // The ALTER waited out its bound once, did nothing, and is paused before its next try.
    run.wait_for("retry 1 of 100", Duration::from_secs(60));
    assert_eq!(
        columns(&db),
        ["id"],
        "a timed-out ALTER leaves the table as it was"
    );
    std::thread::sleep(HOLD);
    app.exec("COMMIT");
    let r = run.finish(Duration::from_secs(120));
    let longest = probe.stop();
    assert_eq!(r.code, 0, "{r:?}");
    // Every session with a transaction open is named (other tests' too): ours among them.
    assert!(
        r.stderr.contains("blocked by connection ")
            && r.stderr.contains(&format!("connection {id} (user ")),
        "each retry names the session in the way: {r:?}"
    );
    assert!(
        !r.stderr.contains("SELECT count"),
        "never its query text: {r:?}"
    );
    // A read that arrives while the ALTER waits queues behind it, at most lock_timeout (the
    // margin is for a loaded machine; docs/BENCHMARKS.md row 11 has the measured numbers).
    eprintln!("the application's longest read while the migration was blocked: {longest:?}");
    assert!(
        longest < Duration::from_secs(1) + Duration::from_secs(2),
        "the application waited {longest:?} behind the migration"
    );
    assert_eq!(columns(&db), ["id,c"]);
    assert_eq!(
        db.query("SELECT count(*) FROM ledger"),
        ["1"],
        "the statement before the ALTER ran once"
    );
    assert_eq!(
        db.query("SELECT state FROM dbwarden_migrations"),
        ["APPLIED"]
    );
}

/// Past `lock_retries` the run gives up: exit 3, naming the blocker, the ALTER not applied,
/// the history row FAILED at it (so the next run resumes there); once the table is free, the
/// next run applies it, and the statement before it is not run again.
#[test]
fn giving_up_is_exit_3_and_the_next_run_resumes_at_the_alter() {
    let db = TestDb::new();
    let sb = table(&db);
    let (mut app, id) = blocker(&db);
    let r = sb.run(&[
        "migrate",
        "-u",
        &db.url,
        "--lock-timeout",
        "1s",
        "--lock-retries",
        "1",
    ]);
    assert_eq!(r.code, 3, "{r:?}");
    assert!(
        r.stderr.contains("in 2 attempt(s)")
            && r.stderr.contains("blocked by connection ")
            && r.stderr.contains(&format!("connection {id} (user ")),
        "{r:?}"
    );
    assert_eq!(columns(&db), ["id"]);
    assert_eq!(
        db.query("SELECT CONCAT(state, ' ', statements_done) FROM dbwarden_migrations"),
        ["FAILED 1"]
    );
    app.exec("COMMIT");
    let r = sb.run(&["migrate", "-u", &db.url]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(columns(&db), ["id,c"]);
    assert_eq!(db.query("SELECT count(*) FROM ledger"), ["1"]);
    assert_eq!(
        db.query("SELECT state FROM dbwarden_migrations"),
        ["APPLIED"]
    );
}

/// `--lock-timeout 0` leaves the wait to the server, as before (and as sqlx-cli does): the
/// ALTER waits for the application, and every read of the table waits behind it for the whole
/// 30 s -- the stall the bound prevents. It applies when the application lets go, with no retry.
#[test]
fn without_a_bound_the_application_waits_behind_the_alter() {
    let db = TestDb::new();
    let sb = table(&db);
    let (mut app, _) = blocker(&db);
    let probe = probe(&db);
    let child = sb.spawn(&["migrate", "-u", &db.url, "--lock-timeout", "0"]);
    db.wait_count(
        &format!(
            "SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = '{}' \
             AND STATE = 'Waiting for table metadata lock' AND INFO LIKE 'ALTER%'",
            db.name
        ),
        1,
        Duration::from_secs(60),
    );
    std::thread::sleep(HOLD);
    app.exec("COMMIT");
    let r = StderrWatch::new(child).finish(Duration::from_secs(120));
    let longest = probe.stop();
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!r.stderr.contains("retry"), "{r:?}");
    eprintln!("the application's longest read behind the unbounded migration: {longest:?}");
    assert!(
        longest >= HOLD - Duration::from_secs(5),
        "the unbounded ALTER should have queued the reads ({longest:?})"
    );
    assert_eq!(columns(&db), ["id,c"]);
}
