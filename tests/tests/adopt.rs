//! A database another tool migrated: `migrate` refuses it before writing anything (exit 2),
//! `adopt` imports the other tool's applied set (under the lock, audited, in one transaction),
//! and `migrate` then runs only what is new. sqlx-cli's tables come from the real sqlx-cli
//! 0.9.0; golang-migrate's and goose's are built here with their published shapes. Also
//! `baseline` for a database built by hand, and `migrate --adopt` from several replicas at once.

use std::time::Duration;

use dbwarden_tests::mysql::TestDb;
use dbwarden_tests::peers::{sqlx_migrate, sqlx_sqlite_url};
use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox, sqlite_count, sqlite_exec, sqlite_query};

/// A database of one engine, with what the tests need of it.
enum Db {
    Pg(PgDb),
    My(TestDb),
    Lite(std::path::PathBuf),
}

impl Db {
    fn new(engine: &str, sb: &Sandbox) -> Db {
        match engine {
            "postgres" => Db::Pg(PgDb::new()),
            "mariadb" => Db::My(TestDb::new()),
            _ => Db::Lite(sb.db()),
        }
    }

    /// The URL dbwarden takes.
    fn url(&self) -> String {
        match self {
            Db::Pg(d) => d.url.clone(),
            Db::My(d) => d.url.clone(),
            Db::Lite(p) => format!("sqlite://{}", p.display()),
        }
    }

    /// The URL sqlx-cli takes.
    fn sqlx_url(&self) -> String {
        match self {
            Db::Lite(p) => sqlx_sqlite_url(p),
            _ => self.url(),
        }
    }

    fn exec(&self, sql: &str) {
        match self {
            Db::Pg(d) => d.exec(sql),
            Db::My(d) => d.exec(sql),
            Db::Lite(p) => sqlite_exec(p, sql),
        }
    }

    fn query(&self, sql: &str) -> Vec<String> {
        match self {
            Db::Pg(d) => d.query(sql),
            Db::My(d) => d.query(sql),
            Db::Lite(p) => sqlite_query(p, sql),
        }
    }

    fn count(&self, sql: &str) -> i64 {
        match self {
            Db::Pg(d) => d.count(sql),
            Db::My(d) => d.count(sql),
            Db::Lite(p) => sqlite_count(p, sql),
        }
    }

    /// Whether dbwarden created any of its tables.
    fn has_dbwarden_tables(&self) -> bool {
        let sql = match self {
            Db::Pg(_) => "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'dbwarden%'",
            Db::My(_) => {
                "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'dbwarden%'"
            }
            Db::Lite(p) if !p.exists() => return false,
            Db::Lite(_) => "SELECT count(*) FROM sqlite_master WHERE name LIKE 'dbwarden%'",
        };
        self.count(sql) > 0
    }

    /// `version:STATE` of every dbwarden history row.
    fn history(&self) -> Vec<String> {
        let concat = match self {
            Db::My(_) => "CONCAT(version, ':', state)",
            _ => "version || ':' || state",
        };
        self.query(&format!(
            "SELECT {concat} FROM dbwarden_migrations ORDER BY version"
        ))
    }

    fn run(&self, sb: &Sandbox, args: &[&str]) -> Run {
        let url = self.url();
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["-u", url.as_str()]);
        sb.run(&a)
    }
}

/// Three migrations, the second a seed that must never run twice.
fn first_three(sb: &Sandbox) {
    sb.write_migration(
        "1_users.sql",
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name VARCHAR(40) NOT NULL);\n",
    );
    sb.write_migration(
        "2_seed_users.sql",
        "INSERT INTO users (id, name) VALUES (1, 'ada');\nINSERT INTO users (id, name) VALUES (2, 'bob');\n",
    );
    sb.write_migration(
        "3_teams.sql",
        "CREATE TABLE teams (id INTEGER PRIMARY KEY);\n",
    );
}

/// The file the other tool never saw.
fn fourth(sb: &Sandbox) {
    sb.write_migration(
        "4_more_users.sql",
        "INSERT INTO users (id, name) VALUES (3, 'cy');\nCREATE TABLE projects (id INTEGER PRIMARY KEY);\n",
    );
}

/// `migrate` refuses, writing nothing, naming the tool and the command.
fn refused(db: &Db, sb: &Sandbox, tool: &str, flag: &str) {
    let r = db.run(sb, &["migrate"]);
    assert_eq!(r.code, 2, "{r:?}");
    let lines = r.stderr_lines();
    assert_eq!(lines.len(), 1, "{r:?}");
    assert!(lines[0].contains(&format!("migrated by {tool}")), "{r:?}");
    assert!(lines[0].contains(&format!("adopt --from {flag}")), "{r:?}");
    assert!(!db.has_dbwarden_tables(), "the refusal wrote nothing");
}

/// After the adoption, only the new file runs and the seed is there once.
fn only_new_files_run(db: &Db, sb: &Sandbox, adopted: &[&str]) {
    assert_eq!(db.history(), adopted);
    fourth(sb);
    let r = db.run(sb, &["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("applied 1 migration(s)"), "{r:?}");
    assert_eq!(db.count("SELECT count(*) FROM users"), 3);
    assert_eq!(db.history().last().map(String::as_str), Some("4:APPLIED"));
}

mod sqlx_cli {
    use super::*;

    fn adopted_from_sqlx(engine: &str) {
        let sb = Sandbox::new();
        let db = Db::new(engine, &sb);
        first_three(&sb);
        let r = sqlx_migrate(&db.sqlx_url(), &sb.migrations());
        assert_eq!(r.code, 0, "sqlx-cli: {r:?}");
        refused(&db, &sb, "sqlx-cli", "sqlx");

        let r = db.run(&sb, &["adopt", "--dry-run"]);
        assert_eq!(r.code, 0, "{r:?}");
        assert!(
            r.stdout.contains("3 migration(s) sqlx-cli applied"),
            "{r:?}"
        );
        assert!(r.stdout.contains("2  seed_users  applied"), "{r:?}");
        assert!(!db.has_dbwarden_tables(), "a dry run writes nothing");
        let r = db.run(&sb, &["adopt"]);
        assert_eq!(r.code, 2, "no terminal and no --yes: {r:?}");
        assert!(!db.has_dbwarden_tables());

        let r = db.run(&sb, &["adopt", "--yes"]);
        assert_eq!(r.code, 0, "{r:?}");
        assert_eq!(
            db.count("SELECT count(*) FROM dbwarden_lock_audit WHERE action = 'adopt_sqlx'"),
            1
        );
        only_new_files_run(&db, &sb, &["1:APPLIED", "2:APPLIED", "3:APPLIED"]);
        // sqlx_compat is on for a database adopted from sqlx: migration 4 is in sqlx's table
        // too, with sqlx's checksum, so sqlx-cli has nothing left to do.
        assert_eq!(db.count("SELECT count(*) FROM _sqlx_migrations"), 4);
        let r = sqlx_migrate(&db.sqlx_url(), &sb.migrations());
        assert_eq!(r.code, 0, "sqlx-cli after dbwarden: {r:?}");
        assert_eq!(db.count("SELECT count(*) FROM users"), 3);
    }

    #[test]
    fn postgres() {
        adopted_from_sqlx("postgres");
    }

    #[test]
    fn mariadb() {
        adopted_from_sqlx("mariadb");
    }

    #[test]
    fn sqlite() {
        adopted_from_sqlx("sqlite");
    }

    #[test]
    fn a_file_changed_since_sqlx_ran_it_stops_the_adoption() {
        let sb = Sandbox::new();
        let db = Db::new("postgres", &sb);
        first_three(&sb);
        assert_eq!(sqlx_migrate(&db.sqlx_url(), &sb.migrations()).code, 0);
        sb.write_migration(
            "2_seed_users.sql",
            "INSERT INTO users (id, name) VALUES (1, 'ada');\n",
        );
        let r = db.run(&sb, &["adopt", "--yes"]);
        assert_eq!(r.code, 2, "{r:?}");
        assert!(
            r.stderr.contains("migration 2")
                && r.stderr.contains("changed since sqlx-cli applied it"),
            "{r:?}"
        );
        assert!(!db.has_dbwarden_tables());
        let r = db.run(&sb, &["adopt", "--yes", "--allow-changed"]);
        assert_eq!(r.code, 0, "{r:?}");
        assert_eq!(db.history(), ["1:APPLIED", "2:APPLIED", "3:APPLIED"]);
    }

    #[test]
    fn an_unsuccessful_sqlx_row_halts_for_review_never_applied_silently() {
        let sb = Sandbox::new();
        let db = Db::new("postgres", &sb);
        first_three(&sb);
        assert_eq!(sqlx_migrate(&db.sqlx_url(), &sb.migrations()).code, 0);
        // What sqlx leaves when a migration fails after its row went in (MySQL does this).
        db.exec("UPDATE _sqlx_migrations SET success = false WHERE version = 3");
        fourth(&sb);
        let r = db.run(&sb, &["adopt", "--yes"]);
        assert_eq!(r.code, 78, "{r:?}");
        assert!(r.stderr.contains("NEEDS_REVIEW: migration 3"), "{r:?}");
        let (code, v) = sb.status(&["-u", &db.url()]);
        assert_eq!(
            (code, v["verdict"].as_str()),
            (12, Some("NEEDS_REVIEW")),
            "{v}"
        );
        assert_eq!(v["status"]["migration_version"], 3, "{v}");
        let r = db.run(&sb, &["migrate"]);
        assert_eq!(r.code, 78, "{r:?}");
        assert_eq!(db.count("SELECT count(*) FROM users"), 2, "nothing ran");
        // The operator sees teams exists, so it did run.
        let r = db.run(&sb, &["resolve", "3", "--mark-applied", "--yes"]);
        assert_eq!(r.code, 0, "{r:?}");
        let r = db.run(&sb, &["migrate"]);
        assert_eq!(r.code, 0, "{r:?}");
        assert_eq!(db.count("SELECT count(*) FROM users"), 3);
    }

    #[test]
    fn a_journaled_migration_both_tools_ran_part_of_halts_for_review() {
        let sb = Sandbox::new();
        let db = Db::new("postgres", &sb);
        first_three(&sb);
        assert_eq!(sqlx_migrate(&db.sqlx_url(), &sb.migrations()).code, 0);
        assert_eq!(db.run(&sb, &["adopt", "--yes"]).code, 0);
        sb.write_migration(
            "4_more_users.sql",
            "-- no-transaction\nINSERT INTO users (id, name) VALUES (3, 'cy');\nINSERT INTO users (id, name) VALUES (4, 'di');\n",
        );
        // A dbwarden run got through statement 1 of 4 and died; then an old sqlx replica ran
        // the whole file (its statements may have collided with what was already there).
        db.exec("INSERT INTO dbwarden_migrations (version, description, checksum, state, statements_total, statements_done, fencing_token) VALUES (4, 'more_users', 'x', 'RUNNING', 2, 1, 1)");
        db.exec("INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (4, 'more users', true, '\\x00', 1)");
        let r = db.run(&sb, &["migrate"]);
        assert_eq!(r.code, 78, "{r:?}");
        assert!(r.stderr.contains("both may have run part of it"), "{r:?}");
        assert_eq!(db.history().last().map(String::as_str), Some("4:RUNNING"));
    }

    #[test]
    fn migrate_adopt_from_four_replicas_at_once_adopts_once_and_runs_the_new_file_once() {
        let sb = Sandbox::new();
        let db = Db::new("postgres", &sb);
        first_three(&sb);
        assert_eq!(sqlx_migrate(&db.sqlx_url(), &sb.migrations()).code, 0);
        fourth(&sb);
        let url = db.url();
        let children: Vec<_> = (0..4)
            .map(|_| sb.spawn(&["migrate", "--adopt", "-u", &url]))
            .collect();
        for c in children {
            let r = Run::wait(c, Duration::from_secs(120));
            assert_eq!(r.code, 0, "{r:?}");
        }
        assert_eq!(db.count("SELECT count(*) FROM users"), 3);
        assert_eq!(
            db.history(),
            ["1:APPLIED", "2:APPLIED", "3:APPLIED", "4:APPLIED"]
        );
        assert_eq!(
            db.count("SELECT count(*) FROM dbwarden_lock_audit WHERE action = 'adopt_sqlx'"),
            1
        );
    }
}

/// golang-migrate's table: one row, the latest version and whether it is dirty.
fn golang_migrate(db: &Db, sb: &Sandbox, version: i64, dirty: bool) {
    first_three(sb);
    for f in ["1_users.sql", "2_seed_users.sql", "3_teams.sql"]
        .iter()
        .take(version as usize)
    {
        db.exec(&std::fs::read_to_string(sb.migrations().join(f)).unwrap());
    }
    db.exec("CREATE TABLE schema_migrations (version BIGINT NOT NULL PRIMARY KEY, dirty BOOLEAN NOT NULL)");
    let dirty = if dirty { "TRUE" } else { "FALSE" };
    db.exec(&format!(
        "INSERT INTO schema_migrations (version, dirty) VALUES ({version}, {dirty})"
    ));
}

/// goose's table: a row per step, the newest row of a version deciding. The files are goose's
/// own: both directions in one file, the Down part dropping what the Up part made.
fn goose(db: &Db, sb: &Sandbox) {
    first_three(sb);
    for f in ["1_users.sql", "2_seed_users.sql"] {
        db.exec(&std::fs::read_to_string(sb.migrations().join(f)).unwrap());
    }
    for (f, down) in [
        ("1_users.sql", "DROP TABLE users;"),
        ("2_seed_users.sql", "DELETE FROM users;"),
        ("3_teams.sql", "DROP TABLE teams;"),
    ] {
        let up = std::fs::read_to_string(sb.migrations().join(f)).unwrap();
        sb.write_migration(
            f,
            &format!("-- +goose Up\n-- +goose StatementBegin\n{up}-- +goose StatementEnd\n\n-- +goose Down\n{down}\n"),
        );
    }
    let ddl = match db {
        Db::Pg(_) => {
            "CREATE TABLE goose_db_version (id integer PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY, version_id bigint NOT NULL, is_applied boolean NOT NULL, tstamp timestamp NOT NULL DEFAULT now())"
        }
        Db::My(_) => {
            "CREATE TABLE goose_db_version (id bigint(20) unsigned NOT NULL AUTO_INCREMENT, version_id bigint NOT NULL, is_applied boolean NOT NULL, tstamp timestamp NULL default now(), PRIMARY KEY(id))"
        }
        Db::Lite(_) => {
            "CREATE TABLE goose_db_version (id INTEGER PRIMARY KEY AUTOINCREMENT, version_id INTEGER NOT NULL, is_applied INTEGER NOT NULL, tstamp TIMESTAMP DEFAULT (datetime('now')))"
        }
    };
    db.exec(ddl);
    // Version 3 went up, then down again.
    db.exec(
        "INSERT INTO goose_db_version (version_id, is_applied) VALUES (0, TRUE), (1, TRUE), (2, TRUE), (3, TRUE), (3, FALSE)",
    );
}

mod other_tools {
    use super::*;

    fn from_golang_migrate(engine: &str) {
        let sb = Sandbox::new();
        let db = Db::new(engine, &sb);
        golang_migrate(&db, &sb, 3, false);
        refused(&db, &sb, "golang-migrate", "golang-migrate");
        let r = db.run(&sb, &["adopt", "--from", "golang-migrate", "--yes"]);
        assert_eq!(r.code, 0, "{r:?}");
        only_new_files_run(&db, &sb, &["1:APPLIED", "2:APPLIED", "3:APPLIED"]);
    }

    fn dirty_golang_migrate(engine: &str) {
        let sb = Sandbox::new();
        let db = Db::new(engine, &sb);
        golang_migrate(&db, &sb, 2, true);
        let r = db.run(&sb, &["adopt", "--yes"]);
        assert_eq!(r.code, 78, "{r:?}");
        assert!(r.stderr.contains("NEEDS_REVIEW: migration 2"), "{r:?}");
        assert_eq!(db.history(), ["1:APPLIED", "2:RUNNING"]);
        let r = db.run(&sb, &["migrate"]);
        assert_eq!(r.code, 78, "{r:?}");
        assert_eq!(
            db.count("SELECT count(*) FROM users"),
            2,
            "the seed golang-migrate ran is not run again"
        );
    }

    fn from_goose(engine: &str) {
        let sb = Sandbox::new();
        let db = Db::new(engine, &sb);
        goose(&db, &sb);
        refused(&db, &sb, "goose", "goose");
        let r = db.run(&sb, &["adopt", "--yes"]);
        assert_eq!(r.code, 0, "{r:?}");
        assert_eq!(db.history(), ["1:APPLIED", "2:APPLIED"]);
        fourth(&sb);
        let r = db.run(&sb, &["migrate"]);
        assert_eq!(r.code, 0, "{r:?}");
        assert!(
            r.stderr.contains("applied 2 migration(s)"),
            "3 and 4: {r:?}"
        );
        assert_eq!(db.count("SELECT count(*) FROM users"), 3);
    }

    #[test]
    fn golang_migrate_postgres() {
        from_golang_migrate("postgres");
    }

    #[test]
    fn golang_migrate_mariadb() {
        from_golang_migrate("mariadb");
    }

    #[test]
    fn golang_migrate_sqlite() {
        from_golang_migrate("sqlite");
    }

    #[test]
    fn golang_migrate_dirty_postgres() {
        dirty_golang_migrate("postgres");
    }

    #[test]
    fn golang_migrate_dirty_sqlite() {
        dirty_golang_migrate("sqlite");
    }

    #[test]
    fn goose_postgres() {
        from_goose("postgres");
    }

    #[test]
    fn goose_mariadb() {
        from_goose("mariadb");
    }

    #[test]
    fn goose_sqlite() {
        from_goose("sqlite");
    }

    #[test]
    fn a_rails_schema_migrations_table_is_not_golang_migrate() {
        let sb = Sandbox::new();
        let db = Db::new("postgres", &sb);
        first_three(&sb);
        db.exec("CREATE TABLE schema_migrations (version varchar PRIMARY KEY); INSERT INTO schema_migrations VALUES ('20240101000000')");
        let r = db.run(&sb, &["migrate"]);
        assert_eq!(r.code, 0, "{r:?}");
        assert_eq!(db.count("SELECT count(*) FROM users"), 2);
    }
}

#[test]
fn baseline_records_a_hand_built_database_without_running_it() {
    let sb = Sandbox::new();
    let db = Db::new("sqlite", &sb);
    first_three(&sb);
    db.exec("CREATE TABLE users (id INTEGER PRIMARY KEY, name VARCHAR(40) NOT NULL); INSERT INTO users VALUES (1, 'ada'), (2, 'bob');");
    let r = db.run(&sb, &["baseline", "9", "--yes"]);
    assert_eq!(r.code, 2, "no file has version 9: {r:?}");
    let r = db.run(&sb, &["baseline", "2"]);
    assert_eq!(r.code, 2, "no terminal and no --yes: {r:?}");
    let r = db.run(&sb, &["baseline", "2", "--dry-run"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("2 migration(s) to record"), "{r:?}");
    let r = db.run(&sb, &["baseline", "2", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(db.history(), ["1:APPLIED", "2:APPLIED"]);
    assert_eq!(
        db.count("SELECT count(*) FROM dbwarden_lock_audit WHERE action = 'baseline'"),
        1
    );
    let r = db.run(&sb, &["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("applied 1 migration(s)"), "{r:?}");
    assert_eq!(db.count("SELECT count(*) FROM users"), 2);
}
