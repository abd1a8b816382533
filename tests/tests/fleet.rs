//! `dbwarden migrate --targets FILE`: one process migrates many PostgreSQL databases, at most
//! `--parallel` at a time, each migration once, a failing or unreachable target never stopping
//! the others, `--canary` and `--max-failures` stopping new starts, two fleet runs at once
//! sharing the work, and a rerun after `kill -9` finishing the job (docs/operations.md,
//! "Fleets").

use std::io::Write;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use dbwarden_tests::pg::{Client, PgDb, base_url};
use dbwarden_tests::{Run, Sandbox};

/// Three migrations; the last writes a ledger row (a migration that ran twice shows as 2).
fn folder(sb: &Sandbox, slow: f64) {
    sb.write_migration("0001_users.sql", "CREATE TABLE users (id int);");
    sb.write_migration("0002_ledger.sql", "CREATE TABLE ledger (what text);");
    sb.write_migration(
        "0003_fill.sql",
        &format!("INSERT INTO ledger VALUES ('applied');\nSELECT pg_sleep({slow});"),
    );
}

fn databases(n: usize) -> Vec<PgDb> {
    (0..n).map(|_| PgDb::new()).collect()
}

/// One `[[targets]]` table.
fn target(name: Option<&str>, url: &str, migrations: Option<&str>) -> String {
    let mut t = String::from("[[targets]]\n");
    if let Some(n) = name {
        t.push_str(&format!("name = \"{n}\"\n"));
    }
    t.push_str(&format!("database_url = \"{url}\"\n"));
    if let Some(m) = migrations {
        t.push_str(&format!("migrations = \"{m}\"\n"));
    }
    t
}

/// Write `text` as the sandbox's targets file; its path.
fn write_targets(sb: &Sandbox, text: &str) -> String {
    let path = sb.path().join("targets.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A `[[targets]]` file naming each database `tenant-<i>`, then `extra`.
fn targets_file(sb: &Sandbox, dbs: &[PgDb], extra: &str) -> String {
    let mut text: String = dbs
        .iter()
        .enumerate()
        .map(|(i, db)| target(Some(&format!("tenant-{i}")), &db.url, None))
        .collect();
    text.push_str(extra);
    write_targets(sb, &text)
}

/// A migrations folder whose only file fails (a syntax error); its path.
fn broken(sb: &Sandbox) -> String {
    let dir = sb.path().join("broken");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("0001_bad.sql"), "CREATE TABLE t (;").unwrap();
    dir.display().to_string()
}

fn applied_once(db: &PgDb) {
    assert_eq!(
        db.query("SELECT string_agg(version || ' ' || state, ',' ORDER BY version) FROM dbwarden_migrations"),
        ["1 APPLIED,2 APPLIED,3 APPLIED"],
        "{}",
        db.name
    );
    assert_eq!(
        db.query("SELECT count(*) FROM ledger"),
        ["1"],
        "{}",
        db.name
    );
}

fn untouched(db: &PgDb) -> bool {
    db.query("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'dbwarden%'") == ["0"]
}

/// The most connections the server saw at once in `dbs`, sampled every 10 ms until stopped.
struct Connections {
    stop: Arc<AtomicBool>,
    most: Arc<AtomicI64>,
    handle: std::thread::JoinHandle<()>,
}

impl Connections {
    fn watch(dbs: &[PgDb]) -> Connections {
        let names: Vec<String> = dbs.iter().map(|d| format!("'{}'", d.name)).collect();
        let sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname IN ({})",
            names.join(",")
        );
        let (stop, most) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicI64::new(0)),
        );
        let (s, m) = (stop.clone(), most.clone());
        let handle = std::thread::spawn(move || {
            let mut c = Client::connect(&base_url());
            while !s.load(Ordering::SeqCst) {
                m.fetch_max(c.count(&sql), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Connections { stop, most, handle }
    }

    fn most(self) -> i64 {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().unwrap();
        self.most.load(Ordering::SeqCst)
    }
}

#[test]
fn twenty_databases_in_one_process_bounded_each_migration_once() {
    let dbs = databases(20);
    let sb = Sandbox::new();
    folder(&sb, 0.2);
    let file = targets_file(&sb, &dbs, "");
    let seen = Connections::watch(&dbs);
    let r = sb.run(&["migrate", "--targets", &file, "--parallel", "4", "--json"]);
    let most = seen.most();
    assert_eq!(r.code, 0, "{r:?}");
    for db in &dbs {
        applied_once(db);
    }
    // One line per target as it ends, then the summary.
    assert!(r.stderr.contains("[20/20] tenant-"), "{r:?}");
    assert!(
        r.stderr
            .contains("20 target(s): 20 migrated, 0 up to date, 0 failed, 0 not started"),
        "{r:?}"
    );
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).expect("--json");
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["targets"].as_array().unwrap().len(), 20);
    assert_eq!(v["targets"][7]["name"], "tenant-7");
    assert_eq!(v["targets"][7]["outcome"], "applied");
    // A runner holds at most two sessions on PostgreSQL (the lock's and the migrations'):
    // four targets in flight are never more than 4 × 2 connections, + 2 for a finished
    // target's sessions the server still lists for a moment after they closed.
    eprintln!("most dbwarden connections at once: {most}");
    assert!(
        most <= 4 * 2 + 2,
        "{most} connections at once with --parallel 4"
    );
    // A second pass finds every target up to date.
    let r = sb.run(&["migrate", "--targets", &file]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("0 migrated, 20 up to date"), "{r:?}");
    for db in &dbs {
        applied_once(db);
    }
}

/// A target whose migration fails and one whose server does not answer: the others all apply,
/// the summary names both with their reasons, and the exit code is the most severe target's
/// (1, a failed migration, over 2, an unreachable server).
#[test]
fn a_failing_and_an_unreachable_target_never_stop_the_others() {
    let dbs = databases(5);
    let bad = PgDb::new();
    let sb = Sandbox::new();
    folder(&sb, 0.0);
    let extra = target(Some("broken"), &bad.url, Some(&broken(&sb)))
        + &target(Some("gone"), "postgres://root@127.0.0.1:1/nowhere", None);
    let file = targets_file(&sb, &dbs, &extra);
    let r = sb.run(&[
        "migrate",
        "--targets",
        &file,
        "--parallel",
        "3",
        "--wait",
        "5s",
        "--json",
    ]);
    assert_eq!(r.code, 1, "{r:?}");
    for db in &dbs {
        applied_once(db);
    }
    assert!(
        r.stderr.contains("failed: broken (exit 1)") && r.stderr.contains("failed: gone (exit 2)"),
        "{r:?}"
    );
    assert!(
        r.stderr.contains("5 migrated, 0 up to date, 2 failed"),
        "{r:?}"
    );
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).expect("--json");
    assert_eq!(v["exit_code"], 1);
    assert_eq!(v["targets"][5]["outcome"], "failed");
    assert_eq!(v["targets"][5]["exit_code"], 1);
    assert_eq!(v["targets"][6]["exit_code"], 2);
    assert_eq!(
        bad.query("SELECT count(*) FROM pg_tables WHERE tablename = 't'"),
        ["0"]
    );
}

/// `--canary 1` with the first target failing: nothing else starts.
#[test]
fn a_failed_canary_starts_nothing_else() {
    let bad = PgDb::new();
    let dbs = databases(4);
    let sb = Sandbox::new();
    folder(&sb, 0.0);
    let mut text = target(Some("canary"), &bad.url, Some(&broken(&sb)));
    for db in &dbs {
        text.push_str(&target(None, &db.url, None));
    }
    let file = write_targets(&sb, &text);
    let r = sb.run(&["migrate", "--targets", &file, "--canary", "1"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("not started: the canary wave"), "{r:?}");
    assert!(
        r.stderr
            .contains("0 migrated, 0 up to date, 1 failed, 4 not started"),
        "{r:?}"
    );
    assert!(dbs.iter().all(untouched), "no other target was touched");
}

/// `--max-failures 2`, one at a time, four failing targets first: after the second failure no
/// new target starts.
#[test]
fn the_failure_budget_stops_new_starts() {
    let bad: Vec<PgDb> = databases(4);
    let good = databases(3);
    let sb = Sandbox::new();
    folder(&sb, 0.0);
    let failing = broken(&sb);
    let mut text: String = bad
        .iter()
        .map(|db| target(None, &db.url, Some(&failing)))
        .collect();
    for db in &good {
        text.push_str(&target(None, &db.url, None));
    }
    let file = write_targets(&sb, &text);
    let r = sb.run(&[
        "migrate",
        "--targets",
        &file,
        "--parallel",
        "1",
        "--max-failures",
        "2",
    ]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("2 failed, 5 not started"), "{r:?}");
    assert!(r.stderr.contains("(--max-failures 2)"), "{r:?}");
    assert!(good.iter().all(untouched));
    assert!(untouched(&bad[2]) && untouched(&bad[3]));
}

/// Two fleet runs at once over the same twelve databases (two CI jobs): both exit 0 and each
/// migration ran once, the per-target locks deciding who applies each.
#[test]
fn two_fleets_at_once_share_the_work() {
    let dbs = databases(12);
    let sb = Sandbox::new();
    folder(&sb, 0.3);
    let file = targets_file(&sb, &dbs, "");
    let args = ["migrate", "--targets", file.as_str(), "--parallel", "3"];
    let a = sb.spawn(&args);
    let b = sb.spawn(&args);
    let (a, b) = (
        Run::wait(a, Duration::from_secs(120)),
        Run::wait(b, Duration::from_secs(120)),
    );
    assert_eq!(a.code, 0, "{a:?}");
    assert_eq!(b.code, 0, "{b:?}");
    for db in &dbs {
        applied_once(db);
    }
}

/// A plain list of URLs on standard input (`psql -Atc "select …" | dbwarden migrate --targets -`).
#[test]
fn urls_on_standard_input() {
    let dbs = databases(3);
    let sb = Sandbox::new();
    folder(&sb, 0.0);
    let list: String = dbs.iter().map(|d| format!("{}\n", d.url)).collect();
    let mut child = sb
        .cmd(&["migrate", "--targets", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("# tenants\n{list}").as_bytes())
        .unwrap();
    let r = Run::wait(child, Duration::from_secs(60));
    assert_eq!(r.code, 0, "{r:?}");
    for db in &dbs {
        applied_once(db);
    }
}

/// `kill -9` of the fleet process once some targets are done: the rerun finishes every target,
/// none applied twice, the half-done ones recovered by the usual rules.
#[test]
fn a_rerun_after_kill_9_finishes_the_fleet() {
    let dbs = databases(8);
    let sb = Sandbox::new();
    folder(&sb, 1.0);
    let file = targets_file(&sb, &dbs, "");
    let mut child = sb.spawn(&["migrate", "--targets", &file, "--parallel", "2"]);
    // Kill it at an observed moment: two targets are done and others are under way.
    let done = || {
        dbs.iter()
            .filter(|d| {
                d.query(
                    "SELECT count(*) FROM pg_tables WHERE tablename = 'dbwarden_migrations'",
                ) == ["1"]
                    && d.query("SELECT count(*) FROM dbwarden_migrations WHERE version = 3 AND state = 'APPLIED'") == ["1"]
            })
            .count()
    };
    let t0 = std::time::Instant::now();
    while done() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(60), "no target finished");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    let _ = child.wait();
    assert!(done() < dbs.len(), "killed before the end");
    let r = sb.run(&["migrate", "--targets", &file, "--parallel", "2"]);
    assert_eq!(r.code, 0, "{r:?}");
    for db in &dbs {
        applied_once(db);
    }
}

/// Bad input: a line that is no URL is exit 2 naming the line, and nothing is written to the
/// targets listed before it; `-u` with `--targets` is refused.
#[test]
fn a_bad_targets_file_writes_nothing() {
    let db = PgDb::new();
    let sb = Sandbox::new();
    folder(&sb, 0.0);
    let file = sb.path().join("list");
    std::fs::write(&file, format!("{}\nnot a url\n", db.url)).unwrap();
    let r = sb.run(&["migrate", "--targets", file.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("line 2: not a database URL"), "{r:?}");
    assert_eq!(r.stderr.trim().lines().count(), 1, "{r:?}");
    assert!(untouched(&db));
    let r = sb.run(&[
        "migrate",
        "--targets",
        file.to_str().unwrap(),
        "-u",
        &db.url,
    ]);
    assert_eq!(r.code, 2, "{r:?}");
    // lock-status reads the same file the same way, and a bad one is the same one-line error.
    let r = sb.run(&["lock-status", "--targets", file.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("line 2: not a database URL"), "{r:?}");
    assert_eq!(r.stderr.trim().lines().count(), 1, "{r:?}");
    let twice = sb.path().join("twice");
    std::fs::write(&twice, format!("{0}\n{0}\n", db.url)).unwrap();
    let r = sb.run(&["migrate", "--targets", twice.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("list each once"), "{r:?}");
    // A flag a fleet run cannot honour is refused, never dropped.
    let list = sb.path().join("one");
    std::fs::write(&list, format!("{}\n", db.url)).unwrap();
    let one = list.to_str().unwrap();
    for extra in [
        ["--redis-url", "redis://127.0.0.1:6379"],
        ["--hook", "true"],
    ] {
        let mut args = vec!["migrate", "--targets", one];
        args.extend_from_slice(&extra);
        let r = sb.run(&args);
        assert_eq!(r.code, 2, "{extra:?}: {r:?}");
        assert!(
            r.stderr.contains("without hooks and without an outer lock"),
            "{r:?}"
        );
    }
    let r = sb.run(&["lock-status", "--targets", one, "--format", "openmetrics"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("the exporter serves many targets"),
        "{r:?}"
    );
    assert!(untouched(&db));
}

/// The verdict of `lock-status -u URL --json` for one database.
fn verdict(sb: &Sandbox, url: &str) -> String {
    let r = sb.run(&["lock-status", "-u", url, "--json"]);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap_or_default();
    v["verdict"].as_str().unwrap_or("?").to_owned()
}

/// Wait (30 s at most) until `url`'s lock says `want`.
fn wait_for(sb: &Sandbox, url: &str, want: &str) {
    let t0 = std::time::Instant::now();
    while verdict(sb, url) != want {
        assert!(t0.elapsed() < Duration::from_secs(30), "never {want}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `lock-status --targets`: one verdict per target — a migrated database AVAILABLE, a running
/// holder HEALTHY, a holder killed with kill -9 DEAD, a server that is not there unreadable —
/// and the most severe (DEAD, 11) as the exit code, in text and in JSON.
#[test]
fn lock_status_over_targets_gives_each_verdict_and_exits_with_the_worst() {
    let dbs = databases(3);
    let sb = Sandbox::new();
    folder(&sb, 0.0);
    assert_eq!(sb.run(&["migrate", "-u", &dbs[0].url]).code, 0);
    // The command must not keep the holder's stdout/stderr open once the holder is killed.
    let sleeper = ["--", "sh", "-c", "exec sleep 60 >/dev/null 2>&1"];
    let mut healthy = sb.spawn(&[&["run", "-u", &dbs[1].url][..], &sleeper].concat());
    let dying = sb.spawn(&[&["run", "-u", &dbs[2].url][..], &sleeper].concat());
    wait_for(&sb, &dbs[1].url, "HEALTHY");
    wait_for(&sb, &dbs[2].url, "HEALTHY");
    // A status row written by the claim: the verdict after the kill is DEAD, not AVAILABLE.
    let claimed =
        |db: &PgDb| db.query("SELECT count(*) FROM dbwarden_lock WHERE state = 'RUNNING'") == ["1"];
    let t0 = std::time::Instant::now();
    while !claimed(&dbs[2]) {
        assert!(t0.elapsed() < Duration::from_secs(30), "never claimed");
        std::thread::sleep(Duration::from_millis(50));
    }
    dbwarden_tests::kill9(dying);
    wait_for(&sb, &dbs[2].url, "DEAD");
    let file = targets_file(
        &sb,
        &dbs,
        &target(Some("gone"), "postgres://root@127.0.0.1:1/nowhere", None),
    );

    let r = sb.run(&["lock-status", "--targets", &file, "--parallel", "2"]);
    assert_eq!(r.code, 11, "{r:?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[0], "tenant-0: AVAILABLE", "{r:?}");
    assert!(
        lines[1].starts_with("tenant-1: HEALTHY (holder host="),
        "{r:?}"
    );
    assert!(lines[2].starts_with("tenant-2: DEAD"), "{r:?}");
    assert!(
        lines[3].starts_with("gone: cannot read it (exit 2)"),
        "{r:?}"
    );
    assert_eq!(
        lines[4], "4 target(s): 1 AVAILABLE, 1 HEALTHY, 1 DEAD, 1 unreadable; exit 11",
        "{r:?}"
    );
    assert!(r.stdout.contains("next: the holder died mid-run"), "{r:?}");

    let r = sb.run(&["lock-status", "--targets", &file, "--json"]);
    assert_eq!(r.code, 11, "{r:?}");
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).expect("--json");
    assert_eq!(v["exit_code"], 11);
    let verdicts: Vec<&str> = (0..3)
        .map(|i| v["targets"][i]["verdict"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(verdicts, ["AVAILABLE", "HEALTHY", "DEAD"], "{v}");
    assert_eq!(v["targets"][3]["name"], "gone");
    assert_eq!(v["targets"][3]["exit_code"], 2);

    // Without the dead one, the unreachable server is the worst: exit 2.
    let file = targets_file(
        &sb,
        &dbs[..2],
        &target(Some("gone"), "postgres://root@127.0.0.1:1/nowhere", None),
    );
    assert_eq!(sb.run(&["lock-status", "--targets", &file]).code, 2);
    let _ = healthy.kill();
    let _ = healthy.wait();
}

/// `status` and `validate` with `--targets`: which tenants are up to date, one line each. A
/// database migrated to the end, one a migration behind, one whose folder changed an applied
/// file, and a server that is not there.
#[test]
fn status_and_validate_over_targets_say_which_tenants_are_behind() {
    let dbs = databases(3);
    let sb = Sandbox::new();
    folder(&sb, 0.0);
    assert_eq!(sb.run(&["migrate", "-u", &dbs[0].url]).code, 0);
    assert_eq!(sb.run(&["migrate", "-u", &dbs[1].url, "--to", "2"]).code, 0);
    assert_eq!(sb.run(&["migrate", "-u", &dbs[2].url]).code, 0);
    // tenant-2's folder: the same files, the first one edited after it was applied.
    let edited = sb.path().join("edited");
    std::fs::create_dir_all(&edited).unwrap();
    for f in ["0001_users.sql", "0002_ledger.sql", "0003_fill.sql"] {
        std::fs::copy(sb.migrations().join(f), edited.join(f)).unwrap();
    }
    std::fs::write(
        edited.join("0001_users.sql"),
        "CREATE TABLE users (id bigint);",
    )
    .unwrap();
    let text = target(Some("tenant-0"), &dbs[0].url, None)
        + &target(Some("tenant-1"), &dbs[1].url, None)
        + &target(Some("tenant-2"), &dbs[2].url, edited.to_str())
        + &target(Some("gone"), "postgres://root@127.0.0.1:1/nowhere", None);
    let file = write_targets(&sb, &text);
    let before: Vec<String> = dbs
        .iter()
        .map(|db| {
            db.query("SELECT count(*) || ' ' || max(fencing_token) FROM dbwarden_lock")[0].clone()
        })
        .collect();

    let r = sb.run(&["status", "--targets", &file]);
    assert_eq!(r.code, 2, "{r:?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines[0], "tenant-0: 3 applied, 0 pending; lock AVAILABLE",
        "{r:?}"
    );
    assert_eq!(
        lines[1], "tenant-1: 2 applied, 1 pending; lock AVAILABLE",
        "{r:?}"
    );
    assert_eq!(
        lines[2], "tenant-2: 2 applied, 0 pending, 1 changed; lock AVAILABLE",
        "{r:?}"
    );
    assert!(
        lines[3].starts_with("gone: cannot read it (exit 2)"),
        "{r:?}"
    );
    assert_eq!(
        lines[4], "4 target(s): 2 up to date, 1 with pending migrations, 1 unreadable; exit 2",
        "{r:?}"
    );

    let r = sb.run(&["validate", "--targets", &file]);
    assert_eq!(r.code, 5, "{r:?}");
    assert!(
        r.stdout.contains("tenant-1: valid: 2 applied, 1 pending"),
        "{r:?}"
    );
    assert!(r.stdout.contains("tenant-2: invalid (exit 5): "), "{r:?}");
    // After a deploy, a tenant left behind is invalid too.
    let r = sb.run(&["validate", "--targets", &file, "--no-pending", "--json"]);
    assert_eq!(r.code, 5, "{r:?}");
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).expect("--json");
    let valid: Vec<&serde_json::Value> = (0..3).map(|i| &v["targets"][i]["valid"]).collect();
    assert_eq!(valid, [true, false, false], "{v}");
    assert_eq!(v["targets"][1]["counts"]["pending"], 1);
    assert_eq!(v["targets"][3]["name"], "gone");
    assert_eq!(v["targets"][3]["exit_code"], 2);

    // Read without the lock: no status row was written, no token moved.
    let after: Vec<String> = dbs
        .iter()
        .map(|db| {
            db.query("SELECT count(*) || ' ' || max(fencing_token) FROM dbwarden_lock")[0].clone()
        })
        .collect();
    assert_eq!(before, after);
}

/// SQLite database-per-tenant: `sqlite://tenants/*.db` is one target per tenant file; the
/// files dbwarden and SQLite put beside them are never taken for tenants (the second pass
/// finds exactly the same thirty, all up to date); a pattern that matches nothing is exit 2.
#[test]
fn a_sqlite_glob_is_one_target_per_tenant_file() {
    let sb = Sandbox::new();
    sb.write_migration("0001_users.sql", "CREATE TABLE users (id INTEGER);");
    sb.write_migration("0002_ledger.sql", "CREATE TABLE ledger (what TEXT);");
    sb.write_migration("0003_fill.sql", "INSERT INTO ledger VALUES ('applied');");
    let dir = sb.path().join("tenants");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..30 {
        // An empty file is an empty SQLite database.
        std::fs::write(dir.join(format!("t-{i:02}.db")), "").unwrap();
    }
    std::fs::write(dir.join("README.txt"), "not a tenant").unwrap();
    let file = write_targets(&sb, "sqlite://tenants/*.db\n");
    let r = sb.run(&["migrate", "--targets", &file, "--parallel", "4"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("30 target(s): 30 migrated"), "{r:?}");
    for i in 0..30 {
        let db = dir.join(format!("t-{i:02}.db"));
        assert_eq!(
            dbwarden_tests::sqlite_count(&db, "SELECT count(*) FROM ledger"),
            1,
            "{}",
            db.display()
        );
    }
    let r = sb.run(&["migrate", "--targets", &file]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.contains("30 target(s): 0 migrated, 30 up to date"),
        "{r:?}"
    );
    let r = sb.run(&["status", "--targets", &file]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout
            .contains("tenants/t-07.db: 3 applied, 0 pending; lock AVAILABLE"),
        "{r:?}"
    );
    let none = write_targets(&sb, "sqlite://tenants/*.sqlite3\n");
    let r = sb.run(&["migrate", "--targets", &none]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("matches no file"), "{r:?}");
}

/// Schema-per-tenant on PostgreSQL: twelve schemas of one database, each target with its
/// `schema` (where its dbwarden tables live), its own `namespace` (so they run side by side)
/// and the tenant's `search_path` in the URL (so the files' unqualified names land in the
/// tenant's schema): every schema gets its tables and its own history, each migration once.
#[test]
fn schema_per_tenant_each_schema_its_own_history() {
    let db = PgDb::new();
    let sb = Sandbox::new();
    sb.write_migration("0001_users.sql", "CREATE TABLE users (id int);");
    sb.write_migration("0002_ledger.sql", "CREATE TABLE ledger (what text);");
    sb.write_migration("0003_fill.sql", "INSERT INTO ledger VALUES ('applied');");
    let mut text = String::new();
    for i in 0..12 {
        let schema = format!("tenant_{i:02}");
        db.exec(&format!("CREATE SCHEMA {schema}"));
        text.push_str(&format!(
            "[[targets]]\nname = \"{schema}\"\ndatabase_url = \"{}?options=-c%20search_path%3D{schema}\"\nschema = \"{schema}\"\nnamespace = \"{schema}\"\n",
            db.url
        ));
    }
    let file = write_targets(&sb, &text);
    let r = sb.run(&["migrate", "--targets", &file, "--parallel", "4"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("12 target(s): 12 migrated"), "{r:?}");
    for i in 0..12 {
        let schema = format!("tenant_{i:02}");
        assert_eq!(
            db.query(&format!(
                "SELECT string_agg(version || ' ' || state, ',' ORDER BY version) FROM {schema}.dbwarden_migrations"
            )),
            ["1 APPLIED,2 APPLIED,3 APPLIED"],
            "{schema}"
        );
        assert_eq!(
            db.count(&format!("SELECT count(*) FROM {schema}.ledger")),
            1,
            "{schema}"
        );
    }
    assert_eq!(
        db.count("SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename IN ('users', 'ledger', 'dbwarden_migrations')"),
        0,
        "nothing landed in public"
    );
    let r = sb.run(&["status", "--targets", &file]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout
            .contains("tenant_11: 3 applied, 0 pending; lock AVAILABLE"),
        "{r:?}"
    );
}

/// On a terminal the fleet draws one progress line in place (a bar, each outcome counted, what
/// runs, an ETA) and prints only failures above it, then the summary; the same run in a pipe
/// prints one line per target (the other tests). The terminal is a real pseudo-terminal
/// (`script` from util-linux).
#[test]
fn on_a_terminal_the_fleet_draws_a_progress_line_and_keeps_only_failures() {
    let sb = Sandbox::new();
    sb.write_migration("0001_users.sql", "CREATE TABLE users (id INTEGER);");
    let dir = sb.path().join("tenants");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..12 {
        std::fs::write(dir.join(format!("t-{i:02}.db")), "").unwrap();
    }
    let file = write_targets(
        &sb,
        "sqlite://tenants/*.db\npostgres://root@127.0.0.1:1/nowhere\n",
    );
    let bin = dbwarden_tests::dbwarden_bin();
    let line = format!(
        "'{}' migrate --targets '{file}' --parallel 3",
        bin.display()
    );
    let mut c = std::process::Command::new("script");
    c.args(["-qefc", &line, "/dev/null"])
        .current_dir(sb.path())
        .stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k == "DATABASE_URL" || k.starts_with("DBWARDEN_") || k == "RUST_LOG" {
            c.env_remove(k);
        }
    }
    let out = c
        .output()
        .expect("script (util-linux) runs dbwarden on a pty");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    // Redrawn in place, counting up to the end.
    let draws: Vec<&str> = text
        .split("\r\x1b[2K")
        .filter(|d| d.starts_with("dbwarden: ["))
        .filter(|d| d.contains(" · running "))
        .collect();
    assert!(draws.len() >= 13, "one draw per ended target: {text:?}");
    assert!(
        draws.iter().any(|d| d.contains(
            "] 13/13 · migrated 12 · up to date 0 · failed 1 · not started 0 · running 0 · done"
        )),
        "{text:?}"
    );
    assert!(
        draws.iter().any(|d| d.contains("ETA ")),
        "an ETA while it runs: {text:?}"
    );
    // Only the failure is printed for good, then the summary.
    assert!(
        text.contains("nowhere: FAILED (exit 2)"),
        "the failure stays on screen: {text:?}"
    );
    assert!(
        !text.contains("t-03.db: applied"),
        "successes are counted, not listed: {text:?}"
    );
    assert!(
        text.contains("13 target(s): 12 migrated, 0 up to date, 1 failed"),
        "{text:?}"
    );
    for i in 0..12 {
        let db = dir.join(format!("t-{i:02}.db"));
        assert_eq!(
            dbwarden_tests::sqlite_count(&db, "SELECT count(*) FROM users"),
            0,
            "{}",
            db.display()
        );
    }
}
