//! Hooks on lock events: every runner of a scenario appends each event it hears, one JSON line,
//! to one file (`cat >> events.jsonl`). Each event fires exactly once per occurrence -- one
//! `lock_broken` however many runners race for a dead holder's lock, one `lock_lost` from a
//! holder paused past its lease, one `unlocked`, one `halted_for_review`, one
//! `migration_failed` -- every event matches docs/events.schema.json, and none holds a
//! password. A hook that fails or hangs changes nothing else: the same exit code and history as
//! without it, and the run ends within `hook_timeout` plus a margin.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dbwarden_tests::chaos::{Postgres, Redis, Sqlite, Target};
use dbwarden_tests::modes::{Case, Guard};
use dbwarden_tests::schema::violations;
use dbwarden_tests::{Run, signal};
use rustix::process::Signal;
use serde_json::Value;

/// The hook every runner of a case gets, and the events it wrote.
struct Hook {
    file: PathBuf,
}

impl Hook {
    fn new(case: &Case) -> Hook {
        Hook {
            file: case.sb.path().join("events.jsonl"),
        }
    }

    /// `--hook 'cat >> events.jsonl'`.
    fn flags(&self) -> [String; 2] {
        ["--hook".into(), format!("cat >> '{}'", self.file.display())]
    }

    /// Every event so far, each checked against the schema and for the password.
    fn events(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.file).unwrap_or_default();
        assert!(
            !text.contains("s3cret"),
            "an event holds a password: {text}"
        );
        let schema: Value = serde_json::from_str(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../docs/events.schema.json"
            ))
            .unwrap(),
        )
        .unwrap();
        text.lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {l:?}"));
                let errs = violations(&schema, &v);
                assert!(errs.is_empty(), "{errs:#?}\n{v}");
                v
            })
            .collect()
    }

    /// The events named `name`.
    fn named(&self, name: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == name)
            .collect()
    }

    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .events()
            .iter()
            .map(|e| e["event"].as_str().unwrap_or_default().to_owned())
            .collect();
        v.sort();
        v
    }
}

fn args(flags: &[String]) -> Vec<&str> {
    flags.iter().map(String::as_str).collect()
}

/// A holder killed with kill -9 inside a journaled migration, then four runners at once: one
/// of them takes the dead holder's lock over, and that is the one `lock_broken`, naming it.
fn kill9_then_a_crowd(target: &dyn Target) {
    let case = Case::new(target);
    let hook = Hook::new(&case);
    let flags = hook.flags();
    case.log_table();
    case.slow_idempotent(2, 3000);
    case.inserts(3, 1);
    let holder = case.spawn_guarded(&args(&flags));
    let dead = holder.id();
    case.wait_inside(2, 1);
    holder.kill9();

    let crowd: Vec<Guard> = (0..4).map(|_| case.spawn_guarded(&args(&flags))).collect();
    let pids: Vec<u32> = crowd.iter().map(Guard::id).collect();
    for r in crowd.into_iter().map(|g| g.wait(Duration::from_secs(90))) {
        assert_eq!(r.code, 0, "[{}] {r:?}", target.name());
    }
    case.assert_each_ran_once(&["m2.s1", "m2.s3", "m3.s1"]);
    assert_eq!(case.applied(), [1, 2, 3]);

    assert_eq!(
        hook.names(),
        ["lock_broken"],
        "[{}] one broken lock, nothing else",
        target.name()
    );
    let e = &hook.named("lock_broken")[0];
    assert_eq!(e["previous_holder"]["pid"], dead, "{e}");
    assert_eq!(e["previous_state"], "RUNNING", "{e}");
    assert_eq!(e["previous_migration_version"], 2, "{e}");
    assert!(
        pids.contains(&(e["runner"]["pid"].as_u64().unwrap() as u32)),
        "{e}"
    );
    assert_eq!(e["engine"], target.name(), "{e}");
    assert_eq!(e["database"], case.url.as_str(), "{e}");
    let tokens = case.tokens();
    assert_eq!(
        e["fencing_token"].as_u64(),
        tokens.last().copied(),
        "the breaker's token is the one migration 3 carries: {e} {tokens:?}"
    );
}

#[test]
fn sqlite_kill9_then_a_crowd_hears_of_one_broken_lock() {
    kill9_then_a_crowd(&Sqlite);
}

#[test]
fn postgres_kill9_then_a_crowd_hears_of_one_broken_lock() {
    kill9_then_a_crowd(&Postgres::default());
}

/// `migrate --redis-url`: the holder is paused (SIGSTOP) past its 2 s Redis lease, a successor
/// takes the lease; on SIGCONT the paused holder hears `lock_lost` and exits 4, and the
/// successor, taking the database lock it left behind, hears `lock_broken` naming it.
#[test]
fn redis_a_holder_paused_past_its_lease_hears_lock_lost_and_the_taker_lock_broken() {
    let target = Redis::default();
    let case = Case::new(&target);
    let hook = Hook::new(&case);
    let flags = hook.flags();
    case.log_table();
    case.slow_idempotent(2, 3000);
    case.inserts(3, 1);
    let holder = case.spawn_guarded(&args(&flags));
    let paused = holder.id();
    case.wait_inside(2, 1);
    signal(paused, Signal::STOP);
    let successor = case.spawn_guarded(&args(&flags));
    let taker = successor.id();
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        hook.events().is_empty(),
        "nothing has happened yet: the successor waits for the database lock"
    );
    signal(paused, Signal::CONT);
    let p = holder.wait(Duration::from_secs(60));
    let s = successor.wait(Duration::from_secs(60));
    assert_eq!(p.code, 4, "{p:?}");
    assert_eq!(s.code, 0, "{s:?}");
    case.assert_each_ran_once(&["m2.s1", "m2.s3", "m3.s1"]);

    assert_eq!(hook.names(), ["lock_broken", "lock_lost"]);
    let lost = &hook.named("lock_lost")[0];
    assert_eq!(lost["runner"]["pid"], paused, "{lost}");
    assert!(lost["reason"].as_str().unwrap().contains("lease"), "{lost}");
    let broken = &hook.named("lock_broken")[0];
    assert_eq!(broken["runner"]["pid"], taker, "{broken}");
    assert_eq!(broken["previous_holder"]["pid"], paused, "{broken}");
    assert_eq!(
        broken["previous_fencing_token"], lost["fencing_token"],
        "{broken} {lost}"
    );
}

/// `unlock` of a paused holder: one `unlocked` naming it, with the verdict it was removed
/// under; resumed, the holder hears `lock_lost` once and exits 4.
fn unlock_a_paused_holder(target: &dyn Target) {
    let case = Case::patient(target);
    let hook = Hook::new(&case);
    let flags = hook.flags();
    case.log_table();
    case.slow_idempotent(2, 3000);
    case.inserts(3, 1);
    let holder = case.spawn_guarded(&args(&flags));
    let pid = holder.id();
    case.wait_inside(2, 1);
    signal(pid, Signal::STOP);
    case.wait_status(Duration::from_secs(30), |code, v| {
        code == 10 && v["verdict"] == "STUCK"
    });
    let mut cmd = vec!["unlock", "--yes"];
    cmd.extend(args(&flags));
    let r = case.run(&cmd);
    assert_eq!(r.code, 0, "{r:?}");
    let unlocked = hook.named("unlocked");
    assert_eq!(unlocked.len(), 1, "{unlocked:?}");
    assert_eq!(unlocked[0]["unlocked_holder"]["pid"], pid, "{unlocked:?}");
    assert_eq!(unlocked[0]["verdict"], "STUCK", "{unlocked:?}");
    assert_ne!(unlocked[0]["runner"]["pid"], pid, "{unlocked:?}");

    signal(pid, Signal::CONT);
    let r = holder.wait(Duration::from_secs(60));
    assert_eq!(r.code, 4, "[{}] {r:?}", target.name());
    assert_eq!(hook.names(), ["lock_lost", "unlocked"]);
    let lost = &hook.named("lock_lost")[0];
    assert_eq!(lost["runner"]["pid"], pid, "{lost}");
    assert_eq!(
        lost["fencing_token"], unlocked[0]["fencing_token"],
        "{lost}"
    );
    // Once a run has finished the work, there is nothing to unlock: no event.
    assert_eq!(case.migrate(&args(&flags)).code, 0);
    let r = case.run(&cmd);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("nothing to unlock"), "{r:?}");
    assert_eq!(hook.named("unlocked").len(), 1);
    assert_eq!(hook.named("lock_lost").len(), 1);
}

#[test]
fn sqlite_unlock_of_a_paused_holder_fires_unlocked_then_its_lock_lost() {
    unlock_a_paused_holder(&Sqlite);
}

#[test]
fn postgres_unlock_of_a_paused_holder_fires_unlocked_then_its_lock_lost() {
    unlock_a_paused_holder(&Postgres::default());
}

/// `recovery_policy = halt` after a kill -9: three runners all exit 78, one `lock_broken` and
/// one `halted_for_review` (the others meet the halt; they do not halt again).
fn halt_after_a_kill(target: &dyn Target) {
    let case = Case::new(target);
    let hook = Hook::new(&case);
    let mut flags = hook.flags().to_vec();
    flags.extend(["--recovery-policy".into(), "halt".into()]);
    case.log_table();
    case.slow_idempotent(2, 3000);
    let holder = case.spawn_guarded(&args(&flags));
    case.wait_inside(2, 1);
    holder.kill9();
    let runs: Vec<Run> = (0..3)
        .map(|_| case.spawn_guarded(&args(&flags)))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|g| g.wait(Duration::from_secs(90)))
        .collect();
    for r in &runs {
        assert_eq!(r.code, 78, "[{}] {r:?}", target.name());
    }
    assert_eq!(hook.names(), ["halted_for_review", "lock_broken"]);
    let halted = &hook.named("halted_for_review")[0];
    assert_eq!(halted["version"], 2, "{halted}");
    let broken = &hook.named("lock_broken")[0];
    assert_eq!(halted["runner"], broken["runner"], "the breaker halted");
    // Halting again on a later run is not a new halt.
    assert_eq!(case.migrate(&args(&flags)).code, 78);
    assert_eq!(hook.names(), ["halted_for_review", "lock_broken"]);
}

#[test]
fn sqlite_halt_after_a_kill_fires_halted_for_review_once() {
    halt_after_a_kill(&Sqlite);
}

#[test]
fn postgres_halt_after_a_kill_fires_halted_for_review_once() {
    halt_after_a_kill(&Postgres::default());
}

/// `resolve` takes a dead holder's lock over like `migrate` does, and its hook hears that one
/// `lock_broken`, naming the holder killed inside migration 2.
fn resolve_after_a_kill(target: &dyn Target) {
    let case = Case::new(target);
    let hook = Hook::new(&case);
    let flags = hook.flags();
    case.log_table();
    case.slow_idempotent(2, 3000);
    let holder = case.spawn_guarded(&[]);
    let dead = holder.id();
    case.wait_inside(2, 1);
    holder.kill9();
    let mut cmd = vec!["resolve", "2", "--mark-applied", "--yes", "--wait", "30s"];
    cmd.extend(args(&flags));
    let r = case.run(&cmd);
    assert_eq!(r.code, 0, "[{}] {r:?}", target.name());
    assert_eq!(case.applied(), [1, 2]);
    assert_eq!(hook.names(), ["lock_broken"], "[{}]", target.name());
    let e = &hook.named("lock_broken")[0];
    assert_eq!(e["previous_holder"]["pid"], dead, "{e}");
    assert_eq!(e["previous_migration_version"], 2, "{e}");
}

#[test]
fn sqlite_resolve_after_a_kill_fires_lock_broken_once() {
    resolve_after_a_kill(&Sqlite);
}

#[test]
fn postgres_resolve_after_a_kill_fires_lock_broken_once() {
    resolve_after_a_kill(&Postgres::default());
}

/// A down file that fails: `revert` exits 1 and its hook hears one `migration_failed`.
#[test]
fn a_failing_down_file_fires_migration_failed_once() {
    let case = Case::relaxed(&Sqlite);
    let hook = Hook::new(&case);
    case.log_table();
    case.sb
        .write_migration("0002_table.sql", "CREATE TABLE reverted (id INTEGER);");
    case.sb
        .write_migration("0002_table.down.sql", "DROP TABLE no_such_table;");
    assert_eq!(case.migrate(&[]).code, 0);
    let flags = hook.flags();
    let mut cmd = vec!["revert", "--steps", "1", "--yes"];
    cmd.extend(args(&flags));
    let r = case.run(&cmd);
    assert_eq!(r.code, 1, "{r:?}");
    assert_eq!(hook.names(), ["migration_failed"]);
    let e = &hook.named("migration_failed")[0];
    assert_eq!(e["version"], 2, "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("no_such_table"),
        "{e}"
    );
}

/// A failing migration: exit 1 and one `migration_failed` with its version, description and
/// error. On PostgreSQL the URL carries a password the server does not check: no event shows it.
fn failing_migration(target: &dyn Target, password: bool) {
    let case = Case::relaxed(target);
    let hook = Hook::new(&case);
    let url = if password {
        case.url.replacen("://root@", "://root:s3cret@", 1)
    } else {
        case.url.clone()
    };
    assert_eq!(password, url.contains("s3cret"), "{url}");
    case.log_table();
    case.sb
        .write_migration("0002_broken.sql", "INSERT INTO no_such_table VALUES (1);");
    let mut cmd = vec!["migrate", "-u", url.as_str(), "--wait", "30s"];
    let flags = hook.flags();
    cmd.extend(args(&flags));
    let r = case.sb.run(&cmd);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(!r.stderr.contains("s3cret"), "{r:?}");
    assert_eq!(hook.names(), ["migration_failed"]);
    let e = &hook.named("migration_failed")[0];
    assert_eq!(e["version"], 2, "{e}");
    assert_eq!(e["description"], "broken", "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("no_such_table"),
        "{e}"
    );
    if password {
        assert!(e["database"].as_str().unwrap().contains("root:***@"), "{e}");
    }
    assert_eq!(case.applied(), [1]);
}

#[test]
fn sqlite_a_failing_migration_fires_migration_failed_once() {
    failing_migration(&Sqlite, false);
}

#[test]
fn postgres_a_failing_migration_fires_migration_failed_once_without_the_password() {
    failing_migration(&Postgres::default(), true);
}

/// What a user sees of a run: its exit code and the history rows (version, state).
type Outcome = (i32, Vec<(u64, String)>);

fn outcome(case: &Case, r: &Run) -> Outcome {
    let rows = case
        .history()
        .iter()
        .map(|h| {
            (
                h["version"].as_u64().unwrap(),
                h["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (r.code, rows)
}

/// Migration 1 applies, migration 2 fails (an event), migration 3 never runs: the run with
/// `hook`, and what it left.
fn failing_run(hook: Option<&str>, timeout: &str) -> (Outcome, Run, Case<'static>) {
    let case = Case::relaxed(&Sqlite);
    case.log_table();
    case.sb
        .write_migration("0002_broken.sql", "INSERT INTO no_such_table VALUES (1);");
    case.inserts(3, 1);
    let mut extra = vec!["--hook-timeout", timeout];
    if let Some(h) = hook {
        extra.extend(["--hook", h]);
    }
    let r = case.migrate(&extra);
    (outcome(&case, &r), r, case)
}

fn alive(pid: i32) -> bool {
    // Signal 0: is there such a process (a zombie counts; ours are reaped by init).
    rustix::process::Pid::from_raw(pid)
        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

#[test]
fn a_hook_that_fails_or_hangs_changes_nothing_else() {
    let (without, plain, _c0) = failing_run(None, "10s");
    assert_eq!(without.0, 1, "{plain:?}");
    assert_eq!(
        without.1,
        [(1, "APPLIED".to_owned()), (2, "FAILED".to_owned())],
        "{plain:?}"
    );

    // exit 1: the same outcome, and one warning naming the event.
    let (failing, r, _c1) = failing_run(Some("cat > /dev/null; exit 1"), "10s");
    assert_eq!(failing, without, "{r:?}");
    assert!(
        r.stderr
            .lines()
            .any(|l| l.contains("hook for migration_failed failed")),
        "{r:?}"
    );

    // sleeps past its 1 s bound: the same outcome, killed with the sleep it started, and the
    // run ends within the bound plus a margin.
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("sleep.pid");
    let late = tmp.path().join("late");
    let hanging = format!(
        "sleep 30 & echo $! > '{}'; wait; echo late > '{}'",
        pidfile.display(),
        late.display()
    );
    let (hung, r, _c2) = failing_run(Some(&hanging), "1s");
    assert_eq!(hung, without, "{r:?}");
    assert!(
        r.elapsed < plain.elapsed + Duration::from_secs(1) + Duration::from_secs(4),
        "took {:?} (without a hook {:?})",
        r.elapsed,
        plain.elapsed
    );
    assert!(
        r.stderr
            .lines()
            .any(|l| l.contains("hook for migration_failed") && l.contains("hook_timeout")),
        "{r:?}"
    );
    let sleep: i32 = wait_for_file(&pidfile).trim().parse().unwrap();
    let t0 = Instant::now();
    while alive(sleep) && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(sleep), "the hook's sleep {sleep} outlived its bound");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!late.exists(), "the hook ran on past its bound");
}

fn wait_for_file(p: &Path) -> String {
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(p)
            && !s.trim().is_empty()
        {
            return s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{} never written",
            p.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
