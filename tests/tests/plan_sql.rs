//! `migrate --sql` prints the plan as SQL a reviewer can read and run: each file with its
//! transaction mode, a transactional file between BEGIN and COMMIT as written, a journaled one
//! statement by statement. Nothing is run and nothing is created; the printed SQL, run by hand
//! on an empty database, builds the same schema `migrate` builds.

use dbwarden_tests::{Sandbox, mysql, sqlite_exec, sqlite_query};

fn folder(sb: &Sandbox) {
    sb.write_migration(
        "0001_users.sql",
        "CREATE TABLE users (id INTEGER PRIMARY KEY, note TEXT DEFAULT 'a; b');\nCREATE INDEX users_note ON users (note);",
    );
    sb.write_migration(
        "0002_journaled.sql",
        "-- dbwarden:no-transaction\nCREATE TABLE IF NOT EXISTS audit (id INTEGER);\nINSERT INTO audit VALUES (1)",
    );
}

#[test]
fn sqlite_plan_is_runnable_sql_and_nothing_runs() {
    let sb = Sandbox::new();
    folder(&sb);
    let r = sb.run(&["migrate", "--sql"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!sb.db().exists(), "nothing was created: {r:?}");
    let out = &r.stdout;
    let begin = out.find("BEGIN;").expect("file 1 in a transaction");
    let users = out.find("CREATE TABLE users").unwrap();
    let commit = out.find("COMMIT;").unwrap();
    assert!(begin < users && users < commit, "{out}");
    assert!(
        out.contains("0001_users.sql (version 1): transaction"),
        "{out}"
    );
    assert!(
        out.contains("0002_journaled.sql (version 2): no-transaction"),
        "{out}"
    );
    assert!(
        out.contains("-- statement 2 of 2, journaled\nINSERT INTO audit VALUES (1);"),
        "{out}"
    );

    let by_hand = sb.path().join("by_hand.db");
    sqlite_exec(&by_hand, out);
    assert_eq!(sb.run(&["migrate"]).code, 0);
    let schema = |db: &std::path::Path| {
        sqlite_query(
            db,
            "SELECT name || ': ' || sql FROM sqlite_master WHERE name NOT LIKE 'dbwarden%' AND name NOT LIKE 'sqlite_%' AND sql IS NOT NULL ORDER BY name",
        )
    };
    assert_eq!(schema(&by_hand), schema(&sb.db()));
    assert_eq!(sqlite_query(&by_hand, "SELECT count(*) FROM audit"), ["1"]);
}

#[test]
fn mariadb_files_are_journaled_statement_by_statement() {
    let db = mysql::TestDb::new();
    let sb = Sandbox::new();
    folder(&sb);
    let url = db.mariadb_url();
    let r = sb.run(&["migrate", "--sql", "-u", &url]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        !r.stdout.contains("BEGIN;"),
        "MySQL DDL commits on its own: {}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("-- statement 1 of 2, journaled\nCREATE TABLE users"),
        "{}",
        r.stdout
    );
    assert!(!db.has_table("dbwarden_migrations"), "nothing was created");
}
