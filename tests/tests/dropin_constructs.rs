//! Ordinary SQL that sqlx-cli 0.9 applies, dbwarden applies too, to the same schema: one folder
//! per engine (`tests/fixtures/constructs/<engine>/common`) holding every construct the splitter
//! and the transaction mode must handle, applied by each tool to a fresh database and compared
//! with the server's own dump. What sqlx-cli cannot apply (`beyond_sqlx`: DELIMITER,
//! CONCURRENTLY without the directive, a file's own BEGIN after PRAGMA foreign_keys, VACUUM)
//! is checked directly. Also: which statement failed, and the MySQL data batches.

use dbwarden_tests::mysql::TestDb;
use dbwarden_tests::peers::{
    constructs, copy_folder, mariadb_schema, pg_schema, sqlite_schema, sqlx_migrate,
    sqlx_sqlite_url, versions_in,
};
use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox, sqlite_count, sqlite_query};

/// A sandbox whose `migrations/` holds the given fixture parts of `engine`.
fn folder(engine: &str, parts: &[&str]) -> Sandbox {
    let sb = Sandbox::new();
    for part in parts {
        copy_folder(&constructs(engine, part), &sb.migrations());
    }
    sb
}

fn ok(r: &Run, what: &str) {
    assert_eq!(r.code, 0, "{what}: {r:?}");
}

/// `dbwarden history --json` of `url`: (version, state, statements_total) per row.
fn history(sb: &Sandbox, url: &str) -> Vec<(i64, String, i64)> {
    let r = sb.run(&["history", "--json", "-u", url]);
    ok(&r, "history");
    let rows: Vec<serde_json::Value> = serde_json::from_str(r.stdout.trim()).expect("JSON");
    rows.iter()
        .map(|r| {
            (
                r["version"].as_i64().unwrap(),
                r["state"].as_str().unwrap().to_owned(),
                r["statements_total"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// Every file of the folder is recorded APPLIED, once.
fn all_applied(sb: &Sandbox, url: &str) {
    let h = history(sb, url);
    let versions: Vec<i64> = h.iter().map(|r| r.0).collect();
    assert_eq!(versions, versions_in(&sb.migrations()), "{h:?}");
    assert!(h.iter().all(|r| r.1 == "APPLIED"), "{h:?}");
}

/// `migrate --dry-run` names each file's mode and why.
fn dry_run_says(sb: &Sandbox, url: &str, expected: &[&str]) {
    let r = sb.run(&["migrate", "--dry-run", "-u", url]);
    ok(&r, "dry run");
    for line in expected {
        assert!(
            r.stdout.contains(line),
            "dry run lacks {line:?}:\n{}",
            r.stdout
        );
    }
}

/// A goose block holding two statements fails at its second: the error names the block (the
/// file's last statement), never one past the end of the file.
fn a_failing_goose_block_is_named(run: impl Fn(&Sandbox) -> Run) {
    let sb = Sandbox::new();
    sb.write_migration(
        "1_goose.sql",
        "-- +goose Up\nCREATE TABLE g (id INT PRIMARY KEY);\n-- +goose StatementBegin\nINSERT INTO g VALUES (1);\nINSERT INTO g VALUES (1);\n-- +goose StatementEnd\n\n-- +goose Down\nDROP TABLE g;\n",
    );
    let r = run(&sb);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr
            .contains("migration 1 (migrations/1_goose.sql:4) failed at statement 2 of 2"),
        "{r:?}"
    );
}

mod postgres {
    use super::*;

    #[test]
    fn the_construct_folder_gives_the_schema_sqlx_cli_gives() {
        let sb = folder("postgres", &["common"]);
        let (ours, theirs) = (PgDb::new(), PgDb::new());
        dry_run_says(
            &sb,
            &ours.url,
            &[
                "0  setup  (1 statement(s), transaction",
                "2  sql_standard_bodies  (3 statement(s), transaction",
                "3  rule  (2 statement(s), transaction",
                "4  only_comments  (0 statement(s), transaction",
                "6  index_concurrently  (1 statement(s), no-transaction: its first line is `-- no-transaction`",
                "9  own_transaction  (4 statement(s), no-transaction: statement 1 opens the file's own transaction",
            ],
        );
        ok(&ours.run(&sb, &["migrate"]), "dbwarden migrate");
        all_applied(&sb, &ours.url);
        ok(
            &sqlx_migrate(&theirs.url, &sb.migrations()),
            "sqlx migrate run",
        );
        assert_eq!(pg_schema(&ours.url), pg_schema(&theirs.url));
        // The seeds and the rule's actions ran once each.
        for db in [&ours, &theirs] {
            assert_eq!(db.count("SELECT count(*) FROM accounts"), 2);
            assert_eq!(db.count("SELECT count(*) FROM teams"), 2);
        }
        // A second run finds nothing to do.
        let r = ours.run(&sb, &["migrate"]);
        ok(&r, "second run");
        assert!(r.stderr.contains("applied 0 migration(s)"), "{r:?}");
    }

    #[test]
    fn what_sqlx_cli_refuses_dbwarden_applies() {
        let sb = folder("postgres", &["common", "beyond_sqlx"]);
        let ours = PgDb::new();
        dry_run_says(
            &sb,
            &ours.url,
            &[
                "11  concurrently_without_directive  (3 statement(s), no-transaction: statement 2 (CREATE INDEX CONCURRENTLY) cannot run inside a transaction block",
                "12  vacuum  (1 statement(s), no-transaction: statement 1 (VACUUM) cannot run inside a transaction block",
            ],
        );
        ok(&ours.run(&sb, &["migrate"]), "dbwarden migrate");
        all_applied(&sb, &ours.url);
        assert_eq!(
            ours.count(
                "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
                 WHERE c.relname IN ('events_account_idx', 'events_at_idx') AND i.indisvalid"
            ),
            2,
            "both concurrent indexes built and valid"
        );
        // sqlx-cli stops at the first of them.
        let theirs = PgDb::new();
        let r = sqlx_migrate(&theirs.url, &sb.migrations());
        assert_ne!(r.code, 0, "{r:?}");
        assert!(
            format!("{r:?}").contains("cannot run inside a transaction block"),
            "{r:?}"
        );
    }

    #[test]
    fn a_failing_goose_block_is_named_by_its_place_in_the_file() {
        let db = PgDb::new();
        a_failing_goose_block_is_named(|sb| db.run(sb, &["migrate"]));
    }

    #[test]
    fn a_failing_statement_is_named_with_its_file_and_line_and_nothing_of_the_file_stays() {
        let sb = Sandbox::new();
        let db = PgDb::new();
        sb.write_migration(
            "1_bad.sql",
            "CREATE TABLE a (id int);\nINSERT INTO a VALUES (1);\n\nINSERT INTO a VALUES ('not a number');\nCREATE TABLE b (id int);\n",
        );
        let r = db.run(&sb, &["migrate"]);
        assert_eq!(r.code, 1, "{r:?}");
        assert!(
            r.stderr
                .contains("migration 1 (migrations/1_bad.sql:4) failed at statement 3 of 4"),
            "{r:?}"
        );
        assert_eq!(
            db.count("SELECT count(*) FROM pg_tables WHERE tablename IN ('a', 'b')"),
            0,
            "the transaction rolled back whole"
        );
    }
}

mod mariadb {
    use super::*;

    #[test]
    fn the_construct_folder_gives_the_schema_sqlx_cli_gives() {
        let sb = folder("mariadb", &["common"]);
        let (ours, theirs) = (TestDb::new(), TestDb::new());
        dry_run_says(
            &sb,
            &ours.url,
            &[
                "1  trigger  (1 statement(s), no-transaction: MySQL commits DDL on its own",
                "2  procedure  (1 statement(s)",
                "3  function_and_event  (2 statement(s)",
                "4  only_comments  (0 statement(s)",
                "6  executable_comments  (3 statement(s)",
            ],
        );
        ok(&sb.run(&["migrate", "-u", &ours.url]), "dbwarden migrate");
        all_applied(&sb, &ours.url);
        ok(
            &sqlx_migrate(&theirs.url, &sb.migrations()),
            "sqlx migrate run",
        );
        assert_eq!(mariadb_schema(&ours.url), mariadb_schema(&theirs.url));
        for db in [&ours, &theirs] {
            assert_eq!(db.count("SELECT COUNT(*) FROM orders"), 2);
            // The trigger fired on the seed's UPDATE: total 11.00 -> status unchanged.
            assert_eq!(
                db.query("SELECT note FROM orders WHERE id = 1"),
                ["it's; escaped"]
            );
        }
    }

    #[test]
    fn delimiter_files_anonymous_blocks_and_empty_files_apply() {
        let sb = folder("mariadb", &["common", "beyond_sqlx"]);
        let ours = TestDb::new();
        dry_run_says(
            &sb,
            &ours.url,
            &[
                "8  delimiter  (4 statement(s)",
                "9  anonymous_block  (1 statement(s)",
                "10  empty  (0 statement(s)",
            ],
        );
        ok(&sb.run(&["migrate", "-u", &ours.url]), "dbwarden migrate");
        all_applied(&sb, &ours.url);
        assert_eq!(
            ours.count(
                "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = 'count_orders'"
            ),
            1
        );
        assert_eq!(
            ours.count(
                "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME = 'order_log_guard'"
            ),
            1
        );
        assert!(ours.has_table("after_delimiter"));
        assert_eq!(
            ours.query("SELECT what FROM order_log WHERE order_id = 0"),
            ["orders: 2"],
            "the anonymous block ran once"
        );
        // sqlx-cli sends the DELIMITER line to the server, which refuses it.
        let theirs = TestDb::new();
        assert_ne!(sqlx_migrate(&theirs.url, &sb.migrations()).code, 0);
    }

    #[test]
    fn a_failing_goose_block_is_named_by_its_place_in_the_file() {
        let db = TestDb::new();
        a_failing_goose_block_is_named(|sb| sb.run(&["migrate", "-u", &db.url]));
    }

    #[test]
    fn data_changes_go_in_batches_that_commit_with_their_journal_entry() {
        let sb = Sandbox::new();
        let db = TestDb::new();
        sb.write_migration(
            "1_t.sql",
            "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB;",
        );
        let rows: String = (1..=2500)
            .map(|i| format!("INSERT INTO t VALUES ({i}, 'row; {i}');\n"))
            .collect();
        sb.write_migration("2_rows.sql", &rows);
        ok(&sb.run(&["migrate", "-u", &db.url]), "migrate");
        assert_eq!(db.count("SELECT COUNT(*) FROM t"), 2500);
        assert_eq!(
            db.query("SELECT CONCAT(state, ':', statements_done, '/', statements_total) FROM dbwarden_migrations WHERE version = 2"),
            ["APPLIED:2500/2500"]
        );

        // A failure inside the second batch: the error names the statement, the first batch
        // stays (recorded), nothing of the second does, and the row says where to resume.
        let sb = Sandbox::new();
        let db = TestDb::new();
        sb.write_migration(
            "1_t.sql",
            "CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB;",
        );
        let rows: String = (1..=1500)
            .map(|i| {
                let id = if i == 1200 { 7 } else { i };
                format!("INSERT INTO t VALUES ({id});\n")
            })
            .collect();
        sb.write_migration("2_rows.sql", &rows);
        let r = sb.run(&["migrate", "-u", &db.url]);
        assert_eq!(r.code, 1, "{r:?}");
        assert!(
            r.stderr.contains(
                "migration 2 (migrations/2_rows.sql:1200) failed at statement 1200 of 1500"
            ),
            "{r:?}"
        );
        assert!(r.stderr.contains("Duplicate entry '7'"), "{r:?}");
        assert_eq!(db.count("SELECT COUNT(*) FROM t"), 1000);
        assert_eq!(
            db.query("SELECT CONCAT(state, ':', statements_done) FROM dbwarden_migrations WHERE version = 2"),
            ["FAILED:1000"]
        );
    }

    #[test]
    fn a_long_transaction_of_the_files_own_does_not_stall_the_heartbeat() {
        // The journal entries inside the file's transaction hold no lock on the status row,
        // so the heartbeat (every 2 s, lost after 4 s without one) goes on through 7 s of it.
        let sb = Sandbox::new();
        let db = TestDb::new();
        sb.write_migration(
            "1_t.sql",
            "CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB;",
        );
        sb.write_migration(
            "2_block.sql",
            "START TRANSACTION;\nINSERT INTO t VALUES (1);\nSELECT SLEEP(7);\nINSERT INTO t VALUES (2);\nCOMMIT;\n",
        );
        let r = sb.run(&[
            "migrate",
            "-u",
            &db.url,
            "--lock-ttl",
            "6s",
            "--heartbeat-interval",
            "2s",
        ]);
        assert_eq!(r.code, 0, "{r:?}");
        assert_eq!(db.count("SELECT COUNT(*) FROM t"), 2);
        assert_eq!(
            db.query("SELECT CONCAT(state, ':', statements_done) FROM dbwarden_migrations WHERE version = 2"),
            ["APPLIED:5"]
        );
    }

    #[test]
    fn mysqldump_table_locks_are_skipped_not_fatal() {
        let sb = Sandbox::new();
        let db = TestDb::new();
        sb.write_migration(
            "1_dump.sql",
            "CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB;\nLOCK TABLES `t` WRITE;\n/*!40000 ALTER TABLE `t` DISABLE KEYS */;\nINSERT INTO `t` VALUES (1),(2);\n/*!40000 ALTER TABLE `t` ENABLE KEYS */;\nUNLOCK TABLES;\n",
        );
        let r = sb.run(&["migrate", "-u", &db.url]);
        assert_eq!(r.code, 0, "{r:?}");
        assert!(r.stderr.contains("`LOCK TABLES` skipped"), "{r:?}");
        assert_eq!(db.count("SELECT COUNT(*) FROM t"), 2);
    }

    #[test]
    fn tables_that_are_not_innodb_turn_batches_off() {
        let sb = Sandbox::new();
        let db = TestDb::new();
        sb.write_migration(
            "1_t.sql",
            "CREATE TABLE t (id INT PRIMARY KEY) ENGINE=MyISAM;",
        );
        sb.write_migration(
            "2_rows.sql",
            "INSERT INTO t VALUES (1);\nINSERT INTO t VALUES (1);\nINSERT INTO t VALUES (3);\n",
        );
        let r = sb.run(&["migrate", "-u", &db.url]);
        assert_eq!(r.code, 1, "{r:?}");
        // One by one: the first insert is recorded done, since MyISAM kept it.
        assert_eq!(db.count("SELECT COUNT(*) FROM t"), 1);
        assert_eq!(
            db.query("SELECT CONCAT(state, ':', statements_done) FROM dbwarden_migrations WHERE version = 2"),
            ["FAILED:1"]
        );
    }
}

mod sqlite {
    use super::*;

    #[test]
    fn the_construct_folder_gives_the_schema_sqlx_cli_gives() {
        let sb = folder("sqlite", &["common"]);
        dry_run_says(
            &sb,
            "sqlite://dbwarden.db",
            &[
                "1  touch_trigger  (2 statement(s), transaction",
                "2  only_comments  (0 statement(s), transaction",
                "5  no_transaction  (2 statement(s), no-transaction: its first line is `-- no-transaction`",
            ],
        );
        ok(&sb.run(&["migrate"]), "dbwarden migrate");
        all_applied(&sb, "sqlite://dbwarden.db");
        let theirs = sb.path().join("sqlx.db");
        ok(
            &sqlx_migrate(&sqlx_sqlite_url(&theirs), &sb.migrations()),
            "sqlx migrate run",
        );
        assert_eq!(sqlite_schema(&sb.db()), sqlite_schema(&theirs));
        for db in [sb.db(), theirs] {
            // The seed's UPDATE fired the trigger once.
            assert_eq!(
                sqlite_query(&db, "SELECT status || ':' || edits FROM notes WHERE id = 1"),
                ["edited:1"]
            );
        }
    }

    #[test]
    fn a_failing_goose_block_is_named_by_its_place_in_the_file() {
        a_failing_goose_block_is_named(|sb| sb.run(&["migrate"]));
    }

    #[test]
    fn the_foreign_keys_off_rebuild_and_vacuum_apply() {
        let sb = folder("sqlite", &["common", "beyond_sqlx"]);
        dry_run_says(
            &sb,
            "sqlite://dbwarden.db",
            &[
                "7  rebuild_table  (10 statement(s), no-transaction: statement 1 (PRAGMA foreign_keys) cannot run inside a transaction block",
                "8  vacuum  (1 statement(s), no-transaction: statement 1 (VACUUM)",
            ],
        );
        ok(&sb.run(&["migrate"]), "dbwarden migrate");
        all_applied(&sb, "sqlite://dbwarden.db");
        let db = sb.db();
        assert_eq!(
            sqlite_count(
                &db,
                "SELECT count(*) FROM sqlite_master WHERE name = 'notes' AND sql LIKE '%CHECK (status IN%'"
            ),
            1,
            "the rebuilt table has its new constraint"
        );
        assert_eq!(sqlite_count(&db, "SELECT count(*) FROM notes"), 2);
        // sqlx-cli opens its own transaction, so the file's BEGIN fails.
        let theirs = sb.path().join("sqlx.db");
        assert_ne!(
            sqlx_migrate(&sqlx_sqlite_url(&theirs), &sb.migrations()).code,
            0
        );
    }
}
