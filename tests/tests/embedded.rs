//! Migrations embedded in an application binary (the `dbwarden` crate's `embed_migrations!` and
//! `Migrator`, through `dbwarden/examples/replica.rs`): 8 replicas started at once against
//! PostgreSQL and against SQLite all exit 0 and apply each migration once; the embedded files
//! are recorded exactly as the command records the same files on disk; and a database whose
//! history disagrees with an embedded file is refused like a changed file on disk.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox, sqlite_count, sqlite_query};

/// The example binary, built once per test process in the profile of the tests.
fn replica_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-q", "-p", "dbwarden", "--example", "replica"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(status.success(), "cargo build --example replica failed");
        dir.join("examples").join("replica")
    })
    .clone()
}

fn replicas(sb: &Sandbox, url: &str, n: usize) -> Vec<Run> {
    let children: Vec<_> = (0..n)
        .map(|_| {
            Command::new(replica_bin())
                .current_dir(sb.path())
                .env("DATABASE_URL", url)
                .env_remove("DBWARDEN_NAMESPACE")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| Run::wait(c, Duration::from_secs(120)))
        .collect()
}

/// Every replica exits 0 and exactly one applied the five example migrations.
fn all_ready_one_applied(runs: &[Run]) {
    for r in runs {
        assert_eq!(r.code, 0, "{r:?}");
    }
    let appliers = runs
        .iter()
        .filter(|r| r.stderr.contains("applied 5 migration(s)"))
        .count();
    assert_eq!(appliers, 1, "{runs:#?}");
}

#[test]
fn eight_sqlite_replicas_apply_each_migration_once() {
    let sb = Sandbox::new();
    let runs = replicas(&sb, "sqlite://app.db", 8);
    all_ready_one_applied(&runs);
    let db = sb.path().join("app.db");
    assert_eq!(
        sqlite_count(
            &db,
            "SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"
        ),
        5
    );
    assert_eq!(
        sqlite_count(&db, "SELECT count(*) FROM users"),
        1,
        "the seed ran once"
    );

    // The command, on the same files on disk, sees them as applied and unchanged.
    let folder = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../dbwarden/examples/migrations"
    );
    let r = sb.run(&[
        "validate",
        "-u",
        "sqlite://app.db",
        "--migrations",
        folder,
        "--no-pending",
    ]);
    assert_eq!(r.code, 0, "embedded and on-disk checksums agree: {r:?}");
}

#[test]
fn eight_postgres_replicas_apply_each_migration_once() {
    let db = PgDb::new();
    let sb = Sandbox::new();
    let runs = replicas(&sb, &db.url, 8);
    all_ready_one_applied(&runs);
    assert_eq!(
        db.count("SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"),
        5
    );
    assert_eq!(db.count("SELECT count(*) FROM users"), 1);
    assert_eq!(
        db.count("SELECT count(DISTINCT fencing_token) FROM dbwarden_migrations"),
        1,
        "one run applied them all"
    );
}

#[test]
fn a_changed_embedded_file_is_refused_like_one_on_disk() {
    let sb = Sandbox::new();
    // The database was migrated from a folder whose 0003 differs from the embedded one.
    let folder = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../dbwarden/examples/migrations"
    );
    for entry in std::fs::read_dir(folder).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_owned();
        let mut sql = std::fs::read_to_string(&p).unwrap();
        if name.starts_with("0003") {
            sql.push_str("\n-- edited after it was applied\n");
        }
        sb.write_migration(&name, &sql);
    }
    let r = sb.run(&["migrate", "-u", "sqlite://app.db"]);
    assert_eq!(r.code, 0, "{r:?}");
    let before = sqlite_query(
        &sb.path().join("app.db"),
        "SELECT version || checksum FROM dbwarden_migrations ORDER BY version",
    );

    let runs = replicas(&sb, "sqlite://app.db", 2);
    for r in &runs {
        assert_eq!(r.code, 2, "{r:?}");
        assert!(
            r.stderr.contains("migration 3") && r.stderr.contains("changed after it was applied"),
            "{r:?}"
        );
    }
    assert_eq!(
        sqlite_query(
            &sb.path().join("app.db"),
            "SELECT version || checksum FROM dbwarden_migrations ORDER BY version"
        ),
        before,
        "nothing written"
    );
}
