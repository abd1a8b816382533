//! SQLite only: an application holding the database's write lock while a runner acquires is
//! "busy", not a failed migration: the runner waits per --wait, or gives up with exit 3.

use std::time::Duration;

use dbwarden_tests::{Run, Sandbox};
use sqlx::Connection;

/// Hold `BEGIN IMMEDIATE` on the database until the returned sender is used (or dropped).
fn hold_write_lock(
    db: std::path::PathBuf,
) -> (std::thread::JoinHandle<()>, std::sync::mpsc::Sender<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
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
            let _ = tokio::task::spawn_blocking(move || released.recv()).await;
            sqlx::raw_sql("COMMIT").execute(&mut c).await.unwrap();
        });
    });
    rx.recv().unwrap();
    (h, release)
}

#[test]
fn a_write_locked_database_makes_the_runner_wait_not_fail() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    assert_eq!(sb.run(&["migrate"]).code, 0);
    sb.write_migration("0002_b.sql", "CREATE TABLE b (x INTEGER);");
    // busy_timeout 1s: the runner gives up while the application's transaction lasts
    std::fs::write(sb.path().join("dbwarden.toml"), "busy_timeout = \"1s\"\n").unwrap();

    // The application lets go when the test says so, after the first runner gave up.
    let (app, release) = hold_write_lock(sb.db());
    let r = sb.run(&["migrate", "--wait", "1s"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert!(r.stderr.contains("write-locked"), "{r:?}");
    assert!(
        !sb.path().join("dbwarden.db.dbwarden-lock").exists(),
        "lock file left behind"
    );
    let waiter = sb.spawn(&["migrate", "--wait", "30s"]);
    release.send(()).unwrap();
    app.join().unwrap();
    let r = Run::wait(waiter, Duration::from_secs(60));
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("applied 1 migration(s)"), "{r:?}");
}
