//! SQLite only: an application holding the database's write lock while a runner acquires is
//! "busy", not a failed migration: the runner waits per --wait, or gives up with exit 3.

use std::time::Duration;

use dbwarden_tests::{Run, Sandbox};
use sqlx::Connection;

/// Hold `BEGIN IMMEDIATE` on the database for `hold`.
fn hold_write_lock(db: std::path::PathBuf, hold: Duration) -> std::thread::JoinHandle<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(&db);
            let mut c = sqlx::sqlite::SqliteConnection::connect_with(&opts)
                .await
                .unwrap();
            sqlx::raw_sql("BEGIN IMMEDIATE")
                .execute(&mut c)
                .await
                .unwrap();
            tx.send(()).unwrap();
            tokio::time::sleep(hold).await;
            sqlx::raw_sql("COMMIT").execute(&mut c).await.unwrap();
        });
    });
    rx.recv().unwrap();
    h
}

#[test]
fn a_write_locked_database_makes_the_runner_wait_not_fail() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    assert_eq!(sb.run(&["migrate"]).code, 0);
    sb.write_migration("0002_b.sql", "CREATE TABLE b (x INTEGER);");
    // busy_timeout 1s < the application's 4s transaction
    std::fs::write(sb.path().join("dbwarden.toml"), "busy_timeout = \"1s\"\n").unwrap();

    let app = hold_write_lock(sb.db(), Duration::from_secs(4));
    let r = sb.run(&["migrate", "--wait", "1s"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert!(r.stderr.contains("write-locked"), "{r:?}");
    assert!(
        !sb.path().join("dbwarden.db.dbwarden-lock").exists(),
        "lock file left behind"
    );
    let waiter = sb.spawn(&["migrate", "--wait", "30s"]);
    app.join().unwrap();
    let r = Run::wait(waiter, Duration::from_secs(60));
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("applied 1 migration(s)"), "{r:?}");
}
