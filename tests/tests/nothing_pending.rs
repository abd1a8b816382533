//! `migrate` first looks whether anything is pending -- under the shared lock where the engine has
//! one (SQLite, PostgreSQL), in one consistent read where it has none (MySQL/MariaDB): replicas
//! that start together with nothing to do check side by side instead of taking the exclusive
//! lock one after another. A look changes nothing (no token bump, no status row), and a run with
//! something pending still needs the exclusive lock.

use std::time::Duration;

use dbwarden_tests::Sandbox;
use dbwarden_tests::pg::PgDb;

/// `dbwarden <head> <target> <tail>`: `target` is `-u URL` (or nothing for the sandbox's SQLite).
fn argv<'a>(head: &[&'a str], target: &[&'a str], tail: &[&'a str]) -> Vec<&'a str> {
    let mut v = head.to_vec();
    v.extend_from_slice(target);
    v.extend_from_slice(tail);
    v
}

/// Wait for two writers started together: both exit 0, one says `applied`, and the other,
/// which found the lock taken, looked again after the release and says `looked`.
fn one_applies_one_looks(writers: Vec<std::process::Child>, applied: &str, looked: &str) {
    let runs: Vec<_> = writers
        .into_iter()
        .map(|c| dbwarden_tests::Run::wait(c, Duration::from_secs(60)))
        .collect();
    for r in &runs {
        assert_eq!(r.code, 0, "{r:?}");
    }
    let count = |what: &str| runs.iter().filter(|r| r.stderr.contains(what)).count();
    assert_eq!(count(applied), 1, "{runs:?}");
    assert_eq!(
        count(looked),
        1,
        "the second writer took the lock alone instead of looking again: {runs:?}"
    );
}

fn token(sb: &Sandbox, target: &[&str]) -> u64 {
    let (_, v) = sb.status(target);
    v["status"]["fencing_token"]
        .as_u64()
        .unwrap_or_else(|| panic!("no token in {v}"))
}

fn case(sb: &Sandbox, target: &[&str], has_table: &dyn Fn(&str) -> bool) {
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INT);");
    let r = sb.run(&argv(&["migrate"], target, &[]));
    assert_eq!(r.code, 0, "{r:?}");
    let before = token(sb, target);

    // A reader holds the shared lock (an application replica under `run --shared`).
    let mut reader = sb.spawn(&argv(&["run", "--shared"], target, &["--", "sleep", "30"]));
    sb.wait_status(target, Duration::from_secs(20), |v| {
        v["shared_holders"].as_array().is_some_and(|a| a.len() == 1)
    });

    // Nothing pending: the run looks beside the reader and is done at once.
    let r = sb.run(&argv(&["migrate", "--wait", "0"], target, &[]));
    assert_eq!(
        r.code, 0,
        "a run with nothing to do must not need the lock alone: {r:?}"
    );
    assert!(
        r.stderr
            .contains("applied 0 migration(s), 1 already applied"),
        "{r:?}"
    );
    assert_eq!(token(sb, target), before, "a look must not bump the token");

    // Something pending: the writer needs the exclusive lock, which the reader still excludes.
    sb.write_migration("0002_b.sql", "CREATE TABLE b (x INT);");
    let r = sb.run(&argv(&["migrate", "--wait", "0"], target, &[]));
    assert_eq!(r.code, 3, "{r:?}");
    assert!(r.stderr.contains("shared by 1 holder(s)"), "{r:?}");
    assert!(!has_table("b"), "migration 2 ran beside a shared holder");

    let _ = reader.kill();
    let _ = reader.wait();
    let r = sb.run(&argv(&["migrate", "--wait", "30s"], target, &[]));
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr
            .contains("applied 1 migration(s), 1 already applied"),
        "{r:?}"
    );
    assert!(has_table("b"));
    assert_eq!(token(sb, target), before + 1);

    // A changed applied file is never settled by the look: the look refuses it (exit 2, naming
    // the file) before the lock, so not even the token moves.
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INT, y INT);");
    let r = sb.run(&argv(&["migrate", "--wait", "30s"], target, &[]));
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("0001_a.sql"), "{r:?}");
    assert_eq!(token(sb, target), before + 1, "refused before the lock");
}

/// Two runners see the same migration pending beside a reader, so neither can take the lock
/// alone; once the reader ends, one applies it and the other, finding the lock taken, looks again
/// after the release instead of queueing for it: it finds nothing to do and bumps no token.
/// The migration takes a second (`slow`), so the second runner's exclusive try surely meets the
/// first holding the lock (a fast one could be over before that try, which would then rightly
/// take the lock and find nothing to do).
fn the_second_writer_looks_again(sb: &Sandbox, target: &[&str], slow: &str) {
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INT);");
    assert_eq!(sb.run(&argv(&["migrate"], target, &[])).code, 0);
    let mut reader = sb.spawn(&argv(&["run", "--shared"], target, &["--", "sleep", "30"]));
    sb.wait_status(target, Duration::from_secs(20), |v| {
        v["shared_holders"].as_array().is_some_and(|a| a.len() == 1)
    });
    sb.write_migration("0002_b.sql", &format!("CREATE TABLE b (x INT);\n{slow};"));
    let writers: Vec<_> = (0..2)
        .map(|_| sb.spawn(&argv(&["migrate", "--wait", "60s"], target, &[])))
        .collect();
    // Both have looked (pending) and wait for the lock: let the reader go.
    std::thread::sleep(Duration::from_millis(1500));
    let _ = reader.kill();
    let _ = reader.wait();
    one_applies_one_looks(
        writers,
        "applied 1 migration(s)",
        "checked under the shared lock; fencing token 2 unchanged",
    );
    assert_eq!(token(sb, target), 2);
}

#[test]
fn sqlite_second_writer() {
    let sb = Sandbox::new();
    the_second_writer_looks_again(&sb, &[], &dbwarden_tests::slow_select(1));
}

#[test]
fn postgres_second_writer() {
    let sb = Sandbox::new();
    let db = PgDb::new();
    the_second_writer_looks_again(&sb, &["-u", &db.url], "SELECT pg_sleep(1)");
}

/// MySQL/MariaDB has no shared lock: the look is one consistent read, without any lock. It
/// settles only a clean state; a holder at work (status row RUNNING) leaves it to the exclusive
/// path, and a second writer that waited for the first looks again and bumps no token.
#[test]
fn mysql() {
    let sb = Sandbox::new();
    let db = dbwarden_tests::mysql::TestDb::new();
    let target = ["-u", db.url.as_str()];
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INT);");
    assert_eq!(sb.run(&argv(&["migrate"], &target, &[])).code, 0);
    let acquired = db.query("SELECT CAST(acquired_at AS CHAR) FROM dbwarden_lock");

    let r = sb.run(&argv(&["migrate", "--wait", "0"], &target, &[]));
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr
            .contains("applied 0 migration(s), 1 already applied, in")
            && r.stderr
                .contains("checked in one consistent read; fencing token 1 unchanged"),
        "{r:?}"
    );
    // Nothing written: the same token and claim time, no audit row.
    assert_eq!(token(&sb, &target), 1);
    assert_eq!(
        db.query("SELECT CAST(acquired_at AS CHAR) FROM dbwarden_lock"),
        acquired
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM dbwarden_lock_audit"), 0);

    // A holder at work: the look does not settle it, and the exclusive path says busy.
    let mut holder = sb.spawn(&argv(&["run"], &target, &["--", "sleep", "30"]));
    sb.wait_status(&target, Duration::from_secs(20), |v| {
        v["verdict"] == "HEALTHY"
    });
    let r = sb.run(&argv(&["migrate", "--wait", "0"], &target, &[]));
    assert_eq!(r.code, 3, "{r:?}");
    assert!(r.stderr.contains("lock busy"), "{r:?}");
    let _ = holder.kill();
    let _ = holder.wait();

    // Two writers, one migration pending behind a slow first one: one applies both, the other
    // waits for its release, looks again and bumps no token.
    sb.write_migration("0002_slow.sql", "SELECT SLEEP(1);");
    sb.write_migration("0003_b.sql", "CREATE TABLE b (x INT);");
    let writers: Vec<_> = (0..2)
        .map(|_| sb.spawn(&argv(&["migrate", "--wait", "60s"], &target, &[])))
        .collect();
    // Tokens: 1 the first migrate, 2 the `run` holder (killed: DEAD), 3 the writer that applied.
    one_applies_one_looks(
        writers,
        "applied 2 migration(s)",
        "checked in one consistent read; fencing token 3 unchanged",
    );
    assert_eq!(token(&sb, &target), 3);
    assert_eq!(db.count("SELECT COUNT(*) FROM b"), 0);

    // A changed applied file is never settled by the look: the look refuses it before the lock,
    // so not even the token moves.
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INT, y INT);");
    let r = sb.run(&argv(&["migrate", "--wait", "30s"], &target, &[]));
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("0001_a.sql"), "{r:?}");
    assert_eq!(token(&sb, &target), 3, "refused before the lock");
}

#[test]
fn sqlite() {
    let sb = Sandbox::new();
    let db = sb.path().join("dbwarden.db");
    case(&sb, &[], &|t| {
        dbwarden_tests::sqlite_count(
            &db,
            &format!("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '{t}'"),
        ) == 1
    });
}

#[test]
fn postgres() {
    let sb = Sandbox::new();
    let db = PgDb::new();
    case(&sb, &["-u", &db.url], &|t| {
        db.count(&format!(
            "SELECT COUNT(*) FROM pg_tables WHERE tablename = '{t}'"
        )) == 1
    });
}
