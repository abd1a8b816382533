//! Namespaces are independent lock streams: on one database, each has its own lock, status row
//! and (by default) its own history table.

use dbwarden_tests::{Sandbox, sqlite_count, sqlite_query};

#[test]
fn two_namespaces_on_one_database_keep_separate_histories() {
    let sb = Sandbox::new();
    let write = |dir: &str, name: &str, sql: &str| {
        std::fs::create_dir_all(sb.path().join(dir)).unwrap();
        std::fs::write(sb.path().join(dir).join(name), sql).unwrap();
    };
    write("app", "0001_users.sql", "CREATE TABLE users (id INTEGER);");
    write(
        "app",
        "0002_orders.sql",
        "CREATE TABLE orders (id INTEGER);",
    );
    write(
        "billing",
        "0001_invoices.sql",
        "CREATE TABLE invoices (id INTEGER);",
    );
    let app = sb.spawn(&["migrate", "--migrations", "app"]);
    let billing = sb.spawn(&[
        "migrate",
        "--migrations",
        "billing",
        "--namespace",
        "billing",
    ]);
    for c in [app, billing] {
        let r = dbwarden_tests::Run::wait(c, std::time::Duration::from_secs(60));
        assert_eq!(r.code, 0, "{r:?}");
    }
    let db = sb.db();
    assert_eq!(
        sqlite_count(&db, "SELECT count(*) FROM dbwarden_migrations"),
        2
    );
    assert_eq!(
        sqlite_count(&db, "SELECT count(*) FROM dbwarden_migrations_billing"),
        1
    );
    assert_eq!(
        sqlite_query(
            &db,
            "SELECT group_concat(namespace || ':' || fencing_token) FROM (SELECT * FROM dbwarden_lock ORDER BY namespace)"
        ),
        ["billing:1,default:1"]
    );
    // Running each again finds nothing pending (no cross-talk through a shared history).
    let r = sb.run(&[
        "migrate",
        "--migrations",
        "billing",
        "--namespace",
        "billing",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr
            .contains("applied 0 migration(s), 1 already applied"),
        "{r:?}"
    );
    let (code, v) = sb.status(&["--namespace", "billing"]);
    assert_eq!((code, v["namespace"].as_str()), (0, Some("billing")));
}
