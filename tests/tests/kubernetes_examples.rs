//! The commands of `examples/kubernetes/`, run as the manifests run them (each container's
//! `command`, `DATABASE_URL` from the environment, `$(POD_NAME)` expanded) against a real
//! PostgreSQL: what examples/kubernetes/README.md promises for each shape holds. The commands
//! are read from the YAML files, so an edit there is tested here.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox};

/// Every container `command` of `file`, in order, as the argument vectors Kubernetes runs.
fn commands(file: &str) -> Vec<Vec<String>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/kubernetes")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        text.contains("- name: DATABASE_URL"),
        "{file}: the URL comes from DATABASE_URL"
    );
    let found: Vec<Vec<String>> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("command: "))
        .map(|a| serde_json::from_str(a).unwrap_or_else(|e| panic!("{file}: {a}: {e}")))
        .collect();
    assert!(!found.is_empty(), "{file} has no command");
    for c in &found {
        assert_eq!(c[0], "dbwarden", "{file}: {c:?}");
    }
    found
}

/// Start `command` as the pod would: `/migrations` is the sandbox's folder, `$(POD_NAME)` is
/// `pod`, the database URL comes from `DATABASE_URL` only.
fn start(sb: &Sandbox, db: &PgDb, command: &[String], pod: &str) -> Child {
    let folder = sb.migrations().display().to_string();
    let args: Vec<String> = command[1..]
        .iter()
        .map(|a| match a.as_str() {
            "/migrations" => folder.clone(),
            "$(POD_NAME)" => pod.to_owned(),
            _ => a.clone(),
        })
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    sb.cmd(&args)
        .env("DATABASE_URL", &db.url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dbwarden")
}

/// Three migrations, the last one slow enough that every replica meets the holder.
fn folder(sb: &Sandbox) {
    sb.write_migration("0001_users.sql", "CREATE TABLE users (id int);");
    sb.write_migration("0002_ledger.sql", "CREATE TABLE ledger (what text);");
    sb.write_migration(
        "0003_slow.sql",
        "INSERT INTO ledger VALUES ('applied');\nSELECT pg_sleep(2);",
    );
}

fn applied_once(db: &PgDb) {
    assert_eq!(
        db.query("SELECT string_agg(version || ' ' || state, ',' ORDER BY version) FROM dbwarden_migrations"),
        ["1 APPLIED,2 APPLIED,3 APPLIED"]
    );
    assert_eq!(
        db.query("SELECT count(*) FROM ledger"),
        ["1"],
        "no migration ran twice"
    );
}

/// init-container-migrate.yaml: every replica runs `migrate` at once; exactly one applies, the
/// others wait for it and find nothing left, and every init container exits 0.
#[test]
fn every_replica_migrating_at_start_up_applies_once_and_all_exit_0() {
    let cmds = commands("init-container-migrate.yaml");
    assert_eq!(cmds.len(), 1, "one init container: {cmds:?}");
    let db = PgDb::new();
    let sb = Sandbox::new();
    folder(&sb);
    let pods: Vec<String> = (0..4).map(|i| format!("app-7d9f-{i}")).collect();
    let children: Vec<Child> = pods.iter().map(|p| start(&sb, &db, &cmds[0], p)).collect();
    let runs: Vec<Run> = children
        .into_iter()
        .map(|c| Run::wait(c, Duration::from_secs(120)))
        .collect();
    for r in &runs {
        assert_eq!(r.code, 0, "{r:?}");
    }
    applied_once(&db);
    let appliers = runs
        .iter()
        .filter(|r| r.stderr.contains("applied 3 migration(s)"))
        .count();
    assert_eq!(appliers, 1, "exactly one replica applies: {runs:?}");
    // lock-status names the pod that last held the lock, by its $(POD_NAME).
    let owner = db.query("SELECT owner_id FROM dbwarden_lock");
    assert!(pods.contains(&owner[0]), "owner {owner:?}");
}

/// job-and-wait.yaml: the replicas' `wait` init containers start before the Job's `migrate`,
/// block until every migration is applied, exit 0, and never take the lock (the Job's owner
/// is the last holder).
#[test]
fn replicas_waiting_for_the_job_start_once_it_has_applied_everything() {
    let cmds = commands("job-and-wait.yaml");
    assert_eq!(
        cmds.len(),
        2,
        "the Job's migrate and the replicas' wait: {cmds:?}"
    );
    let (job, wait) = (&cmds[0], &cmds[1]);
    assert_eq!(job[1], "migrate");
    assert_eq!(wait[1], "wait");
    let db = PgDb::new();
    let sb = Sandbox::new();
    folder(&sb);
    let waiters: Vec<Child> = (0..4)
        .map(|i| start(&sb, &db, wait, &format!("app-{i}")))
        .collect();
    // The replicas are up and waiting before the Job starts.
    std::thread::sleep(Duration::from_millis(500));
    let r = Run::wait(start(&sb, &db, job, "job"), Duration::from_secs(120));
    assert_eq!(r.code, 0, "{r:?}");
    for w in waiters {
        let w = Run::wait(w, Duration::from_secs(60));
        assert_eq!(w.code, 0, "{w:?}");
    }
    applied_once(&db);
    assert_eq!(
        db.query("SELECT owner_id FROM dbwarden_lock"),
        ["job/app-migrate-1-4-2"],
        "only the Job took the lock"
    );
    // A replica started later (a scale-up) passes at once.
    let late = Run::wait(start(&sb, &db, wait, "app-9"), Duration::from_secs(30));
    assert_eq!(late.code, 0, "{late:?}");
}
