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

/// The example binaries, built once per test process in the profile of the tests.
fn example_bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-q", "-p", "dbwarden", "--examples"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(
            status.success(),
            "cargo build -p dbwarden --examples failed"
        );
        dir.join("examples")
    });
    dir.join(name)
}

fn replica_bin() -> PathBuf {
    example_bin("replica")
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

/// `Migrator::run_targets` (through `dbwarden/examples/tenants.rs`): two application processes
/// at once, each migrating the same six tenant databases two at a time, both exit 0 and every
/// tenant has each migration once; a tenant that is not there is reported and fails only itself.
#[test]
fn two_processes_migrate_the_same_tenants_each_migration_once() {
    let dbs: Vec<PgDb> = (0..6).map(|_| PgDb::new()).collect();
    let urls: Vec<&str> = dbs.iter().map(|d| d.url.as_str()).collect();
    let spawn = |urls: &[&str]| {
        Command::new(example_bin("tenants"))
            .arg("2")
            .args(urls)
            .env_remove("DBWARDEN_NAMESPACE")
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(&urls), spawn(&urls));
    let runs = [
        Run::wait(a, Duration::from_secs(120)),
        Run::wait(b, Duration::from_secs(120)),
    ];
    let mut applied_now = 0;
    for r in &runs {
        assert_eq!(r.code, 0, "{r:?}");
        let reports: serde_json::Value = serde_json::from_str(r.stdout.trim()).expect("reports");
        for t in reports.as_array().unwrap() {
            assert_eq!(t["outcome"], "applied", "{t}");
            applied_now += t["applied"].as_u64().unwrap();
        }
    }
    // Between them, every migration of every tenant was applied once.
    assert_eq!(applied_now, 5 * 6, "{runs:#?}");
    for db in &dbs {
        assert_eq!(
            db.count("SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"),
            5
        );
        assert_eq!(
            db.count("SELECT count(*) FROM users"),
            1,
            "the seed ran once"
        );
    }

    // One tenant unreachable: the others are ready, it fails alone with exit 2.
    let more = PgDb::new();
    let r = Run::wait(
        spawn(&[&more.url, "postgres://root@127.0.0.1:1/nowhere"]),
        Duration::from_secs(120),
    );
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(
        more.count("SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"),
        5
    );
    let reports: serde_json::Value = serde_json::from_str(r.stdout.trim()).expect("reports");
    assert_eq!(reports[1]["outcome"], "failed", "{reports}");
    assert_eq!(reports[1]["exit_code"], 2, "{reports}");

    // A URL that is no URL: nothing runs at all.
    let fresh = PgDb::new();
    let r = Run::wait(
        spawn(&[&fresh.url, "nonsense://x"]),
        Duration::from_secs(60),
    );
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(
        fresh.count("SELECT count(*) FROM pg_tables WHERE tablename = 'dbwarden_migrations'"),
        0
    );
}
