//! Many runners start at once against one MariaDB/MySQL database: exactly one applies, the
//! others wait in `GET_LOCK` and then find nothing to do in one consistent read, all exit 0,
//! and nothing runs twice.

use std::time::{Duration, Instant};

use dbwarden_tests::mysql::TestDb;
use dbwarden_tests::{Run, Sandbox, assert_exclusive_tokens};

/// 300 migrations, each inserting its version into `ran`, whose primary key makes a second run
/// of any migration fail loudly; every fifth one also creates a table (DDL, which autocommits:
/// the journal path). Only every fifth, because MariaDB's DDL costs tens of milliseconds on a
/// loaded machine and the suite has a time budget. The strings use MySQL's backslash escapes
/// and the files `#` comments, both holding `;`, so a wrong split fails the run.
fn three_hundred(sb: &Sandbox) {
    sb.write_migration(
        "0001_ran.sql",
        "# the ledger; one row per migration that ran\nCREATE TABLE ran (version INT NOT NULL PRIMARY KEY, note TEXT NOT NULL);\nINSERT INTO ran VALUES (1, 'first');",
    );
    for v in 2..=300 {
        let ddl = if v % 5 == 0 {
            format!(
                "CREATE TABLE t_{v} (id INT NOT NULL AUTO_INCREMENT PRIMARY KEY, note TEXT NOT NULL);\n"
            )
        } else {
            String::new()
        };
        sb.write_migration(
            &format!("{v:04}_migration_{v}.sql"),
            &format!(
                "{ddl}# a comment; with a semicolon\n\
                 INSERT INTO ran VALUES ({v}, 'v{v}: it\\'s got a semicolon; and a quote');"
            ),
        );
    }
}

fn stampede(sb: &Sandbox, url: &str, n: usize) -> Vec<Run> {
    let children: Vec<_> = (0..n).map(|_| sb.spawn(&["migrate", "-u", url])).collect();
    children
        .into_iter()
        .map(|c| Run::wait(c, Duration::from_secs(180)))
        .collect()
}

#[test]
fn thirty_two_runners_on_a_fresh_database_all_exit_0_and_apply_each_migration_once() {
    let sb = Sandbox::new();
    three_hundred(&sb);
    for round in 1..=5 {
        let db = TestDb::new();
        let t0 = Instant::now();
        let runs = stampede(&sb, &db.url, 32);
        eprintln!(
            "round {round}: 32 runners, 300 migrations, {:?}",
            t0.elapsed()
        );
        for (i, r) in runs.iter().enumerate() {
            assert_eq!(r.code, 0, "round {round} runner {i}: {r:?}");
        }
        assert_eq!(
            db.count("SELECT COUNT(*) FROM dbwarden_migrations WHERE state = 'APPLIED' AND statements_done = statements_total"),
            300
        );
        assert_eq!(db.count("SELECT COUNT(*) FROM dbwarden_migrations"), 300);
        assert_eq!(db.count("SELECT COUNT(*) FROM ran"), 300);
        assert_eq!(
            db.count("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 't\\_%'"),
            60
        );
        assert_eq!(
            db.query("SELECT note FROM ran WHERE version = 42"),
            ["v42: it's got a semicolon; and a quote"]
        );
        // Exactly one runner applied everything; the others found nothing pending.
        let appliers = runs
            .iter()
            .filter(|r| r.stderr.contains("applied 300 migration(s)"))
            .count();
        assert_eq!(appliers, 1, "round {round}: {runs:?}");
        let idle = runs
            .iter()
            .filter(|r| {
                r.stderr
                    .contains("applied 0 migration(s), 300 already applied")
            })
            .count();
        assert_eq!(idle, 31, "round {round}: {runs:?}");
        // Every run that held the lock alone got its own token; the others found nothing to do
        // in one consistent read after the apply (at least one did: the look is not skipped).
        let alone = assert_exclusive_tokens(
            &runs,
            db.count("SELECT fencing_token FROM dbwarden_lock WHERE namespace = 'default'"),
        );
        assert!(alone < 32, "every runner took the lock alone: {runs:?}");
        let (code, v) = sb.status(&["-u", &db.url]);
        assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")), "{v}");
        assert_eq!(v["status"]["state"], "COMPLETE");
    }
}

#[test]
fn sixteen_runners_with_nothing_pending_all_exit_0_and_change_nothing() {
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_a.sql",
        "CREATE TABLE a (x INT);\nINSERT INTO a VALUES (1);",
    );
    sb.write_migration("0002_b.sql", "INSERT INTO a VALUES (2);");
    let db = TestDb::new();
    assert_eq!(sb.run(&["migrate", "-u", &db.url]).code, 0);
    let history =
        "SELECT GROUP_CONCAT(version, ':', execution_id ORDER BY version) FROM dbwarden_migrations";
    let before = db.query(history);
    for (i, r) in stampede(&sb, &db.url, 16).iter().enumerate() {
        assert_eq!(r.code, 0, "runner {i}: {r:?}");
        assert!(
            r.stderr
                .contains("applied 0 migration(s), 2 already applied")
                && r.stderr
                    .contains("checked in one consistent read; fencing token 1 unchanged"),
            "{r:?}"
        );
    }
    assert_eq!(db.query(history), before);
    assert_eq!(db.count("SELECT COUNT(*) FROM a"), 2);
    // Nothing pending and nobody at work: every runner settled it with a look, none took the
    // lock, and no audit row was written.
    assert_eq!(
        db.count("SELECT fencing_token FROM dbwarden_lock WHERE namespace = 'default'"),
        1
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM dbwarden_lock_audit"), 0);
}
