//! One failure mode, every engine: the scenarios of `contention.rs`, `crash_recovery.rs`,
//! `paused_holder.rs` and `server_restart.rs` written once against [`Target`] (the engine
//! adapters the chaos driver uses) and instantiated per engine in those files.
//!
//! Every scenario uses the same small migration set: `chaos_log` (one row per non-idempotent
//! statement, keyed by `m<version>.s<statement>`, so a statement that ran twice shows up as a
//! count of 2), then migrations whose statements insert into it, around one slow statement the
//! driver acts on while it runs.

use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::chaos::Target;
use crate::{Run, Sandbox};

/// Short heartbeats, so a paused holder is STUCK (or its lease gone) within seconds.
const TTL: &[&str] = &["--lock-ttl", "2s", "--heartbeat-interval", "500ms"];

/// One scenario's database and migrations folder.
pub struct Case<'a> {
    pub target: &'a dyn Target,
    pub sb: Sandbox,
    pub url: String,
    runner: Vec<String>,
    status: Vec<String>,
}

impl<'a> Case<'a> {
    pub fn new(target: &'a dyn Target) -> Case<'a> {
        Case::with_ttl(target, TTL)
    }

    /// With `--lock-ttl 4s --heartbeat-interval 1s`: a holder resumed after a pause longer
    /// than its TTL gets a whole second for its first beat, even on a loaded machine.
    pub fn patient(target: &'a dyn Target) -> Case<'a> {
        Case::with_ttl(target, &["--lock-ttl", "4s", "--heartbeat-interval", "1s"])
    }

    /// With the engine's default lock TTL and heartbeat: where nothing is paused or killed,
    /// a loaded machine must not make anyone lose a 2 s lease.
    pub fn relaxed(target: &'a dyn Target) -> Case<'a> {
        Case::with_ttl(target, &[])
    }

    /// With these `--lock-ttl` / `--heartbeat-interval` flags instead of the engine's.
    pub fn with_ttl(target: &'a dyn Target, ttl: &[&str]) -> Case<'a> {
        Case::with_ttls(target, ttl, ttl)
    }

    /// Runners with the `runner_ttl` flags; `lock-status`, `unlock` and the other observers
    /// with `status_ttl` (empty: the engine's defaults).
    pub fn with_ttls(target: &'a dyn Target, runner_ttl: &[&str], status_ttl: &[&str]) -> Case<'a> {
        let sb = Sandbox::new();
        let url = target.fresh_database(&sb);
        let with_ttl = |flags: Vec<String>, ttl: &[&str]| {
            let mut out = Vec::new();
            let mut it = flags.into_iter();
            while let Some(f) = it.next() {
                if f == "--lock-ttl" || f == "--heartbeat-interval" {
                    it.next();
                } else {
                    out.push(f);
                }
            }
            out.extend(ttl.iter().map(|s| s.to_string()));
            out
        };
        let runner = with_ttl(target.runner_flags(), runner_ttl);
        let status = with_ttl(target.status_flags(), status_ttl);
        Case {
            target,
            sb,
            url,
            runner,
            status,
        }
    }

    /// Migration 1: the side table every non-idempotent statement writes to.
    pub fn log_table(&self) {
        self.sb.write_migration(
            "0001_chaos_log.sql",
            &format!("{};", self.target.log_table_ddl()),
        );
    }

    /// A migration of single-row inserts `m<v>.s1..=m<v>.s<n>` (transactional where the engine
    /// has transactions).
    pub fn inserts(&self, v: u32, n: u32) {
        let body: String = (1..=n).map(|s| format!("{};\n", insert(v, s))).collect();
        self.sb
            .write_migration(&format!("{v:04}_inserts_{v}.sql"), &body);
    }

    /// A journaled (no-transaction) migration: `m<v>.s1`, then an idempotent slow statement
    /// (`CREATE TABLE IF NOT EXISTS t_<v> AS <slow>`), then `m<v>.s3`.
    pub fn slow_idempotent(&self, v: u32, ms: u32) {
        let slow = self
            .target
            .create_table(&format!("t_{v}"), Some(&self.target.slow(ms)));
        self.sb.write_migration(
            &format!("{v:04}_slow_{v}.sql"),
            &format!(
                "-- dbwarden:no-transaction\n{};\n{slow};\n{};\n",
                insert(v, 1),
                insert(v, 3)
            ),
        );
    }

    /// A journaled migration whose slow statement is not idempotent: `m<v>.s1`, then
    /// `m<v>.s2` inserted by a statement that takes `ms`.
    pub fn slow_insert(&self, v: u32, ms: u32) {
        self.sb.write_migration(
            &format!("{v:04}_slow_insert_{v}.sql"),
            &format!(
                "-- dbwarden:no-transaction\n{};\nINSERT INTO chaos_log (id, n) SELECT 'm{v}.s2', count(*) FROM ({}) q;\n",
                insert(v, 1),
                self.target.slow(ms)
            ),
        );
    }

    /// A journaled migration that keeps its holder inside it for `steps × ms`, wherever one
    /// statement's time is capped (ClickHouse's `sleep`, 3 s): `m<v>.s1`, then `steps`
    /// idempotent slow statements (`t_<v>_1..`), then `m<v>.s<steps + 2>`.
    pub fn slow_between(&self, v: u32, steps: u32, ms: u32) {
        let slow = self.target.slow(ms);
        let body: String = (1..=steps)
            .map(|i| {
                let t = self.target.create_table(&format!("t_{v}_{i}"), Some(&slow));
                format!("{t};\n")
            })
            .collect();
        self.sb.write_migration(
            &format!("{v:04}_slow_between_{v}.sql"),
            &format!(
                "-- dbwarden:no-transaction\n{};\n{body}{};\n",
                insert(v, 1),
                insert(v, steps + 2)
            ),
        );
    }

    /// `dbwarden <cmd> -u URL <engine flags> <extra>`.
    fn argv(&self, cmd: &[&str], flags: &[String], extra: &[&str]) -> Vec<String> {
        self.argv_on(&self.url, cmd, flags, extra)
    }

    /// `dbwarden <cmd> -u <url> <engine flags> <extra>`.
    fn argv_on(&self, url: &str, cmd: &[&str], flags: &[String], extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        a.extend(["-u".to_owned(), url.to_owned()]);
        a.extend(flags.iter().cloned());
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    /// `migrate` in the background, killed (and resumed, if paused) should the test fail
    /// before it is reaped.
    pub fn spawn_guarded(&self, extra: &[&str]) -> Guard {
        Guard(Some(self.spawn_migrate(extra)))
    }

    /// `migrate` in the background (`--wait 60s` unless `extra` says otherwise).
    pub fn spawn_migrate(&self, extra: &[&str]) -> Child {
        let mut extra = extra.to_vec();
        if !extra
            .iter()
            .any(|e| *e == "--wait" || *e == "--skip-if-locked")
        {
            extra.extend(["--wait", "60s"]);
        }
        let a = self.argv(&["migrate"], &self.runner, &extra);
        self.sb
            .spawn(&a.iter().map(String::as_str).collect::<Vec<_>>())
    }

    pub fn migrate(&self, extra: &[&str]) -> Run {
        Run::wait(self.spawn_migrate(extra), Duration::from_secs(120))
    }

    /// `resolve <version> <how> --yes`.
    pub fn resolve(&self, version: u32, how: &str) -> Run {
        let v = version.to_string();
        let a = self.argv(&["resolve", &v, how, "--yes"], &self.status, &[]);
        self.sb
            .run(&a.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// `dbwarden <cmd…> -u URL <engine flags>`, to completion.
    pub fn run(&self, cmd: &[&str]) -> Run {
        let a = self.argv(cmd, &self.status, &[]);
        self.sb
            .run(&a.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// `lock-status --json`: its exit code and object.
    pub fn status(&self) -> (i32, Value) {
        let a = self.argv(&["lock-status", "--json"], &self.status, &[]);
        let r = self
            .sb
            .run(&a.iter().map(String::as_str).collect::<Vec<_>>());
        let v = serde_json::from_str(r.stdout.trim())
            .unwrap_or_else(|e| panic!("lock-status --json is not JSON ({e}): {r:?}"));
        (r.code, v)
    }

    /// `dbwarden <cmd…>` pointed at the lock the runners take ([`Target::lock_url`]): the
    /// database, or the outer lease (Redis), as an operator would.
    pub fn on_lock(&self, cmd: &[&str]) -> Run {
        let url = self.target.lock_url(&self.url);
        let a = self.argv_on(&url, cmd, &self.status, &[]);
        self.sb
            .run(&a.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// `lock-status --json` on the lock the runners take: its exit code and object.
    pub fn lock_status(&self) -> (i32, Value) {
        let r = self.on_lock(&["lock-status", "--json"]);
        let v = serde_json::from_str(r.stdout.trim())
            .unwrap_or_else(|e| panic!("lock-status --json is not JSON ({e}): {r:?}"));
        (r.code, v)
    }

    /// How many audit rows with `action` the lock has written.
    pub fn audits(&self, action: &str) -> i64 {
        self.target.audits(&self.sb, &self.url, action)
    }

    /// Poll lock-status until `pred` holds; panics with the last answer after `limit`.
    pub fn wait_status(&self, limit: Duration, pred: impl Fn(i32, &Value) -> bool) -> Value {
        let t0 = Instant::now();
        loop {
            let (code, v) = self.status();
            if pred(code, &v) {
                return v;
            }
            assert!(
                t0.elapsed() < limit,
                "[{}] lock-status never matched within {limit:?}; last (exit {code}): {v}",
                self.target.name()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The history as `dbwarden history --json` prints it (empty if it failed: a poll).
    pub fn history(&self) -> Vec<Value> {
        let r = self.history_run();
        serde_json::from_str(r.stdout.trim()).unwrap_or_default()
    }

    /// `dbwarden history --json` on the scenario's database, as run.
    pub fn history_run(&self) -> Run {
        let ns: Vec<&str> = match self.status.iter().position(|f| f == "--namespace") {
            Some(i) => vec!["--namespace", self.status[i + 1].as_str()],
            None => vec![],
        };
        let mut a = vec!["history", "--json", "-u", self.url.as_str()];
        a.extend(ns);
        self.sb.run(&a)
    }

    /// Poll the history until migration `v` is RUNNING with exactly `done` statements
    /// journaled (the runner is then inside statement `done + 1`; make that one slow enough
    /// to be caught -- a poll is one `dbwarden history` process).
    pub fn wait_inside(&self, v: u32, done: u64) {
        let t0 = Instant::now();
        loop {
            let rows = self.history();
            if rows.iter().any(|r| {
                r["version"].as_u64() == Some(u64::from(v))
                    && r["state"] == "RUNNING"
                    && r["statements_done"].as_u64() == Some(done)
            }) {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "[{}] migration {v} never got past statement {done}: {rows:?}",
                self.target.name()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Poll the history until migration `v` is RUNNING (a batch of statements, or one, is in
    /// flight once the journal entry that opens it is there).
    pub fn wait_running(&self, v: u32) {
        let t0 = Instant::now();
        loop {
            let rows = self.history();
            if rows
                .iter()
                .any(|r| r["version"].as_u64() == Some(u64::from(v)) && r["state"] == "RUNNING")
            {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "[{}] migration {v} never started: {rows:?}",
                self.target.name()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The versions recorded APPLIED, in order.
    pub fn applied(&self) -> Vec<u64> {
        self.history()
            .iter()
            .filter(|r| r["state"] == "APPLIED")
            .filter_map(|r| r["version"].as_u64())
            .collect()
    }

    /// How many times statement `id` (`m<v>.s<n>`) ran.
    pub fn ran(&self, id: &str) -> i64 {
        let got = self.target.query(
            &self.sb,
            &self.url,
            &format!("SELECT count(*) FROM chaos_log WHERE id = '{id}'"),
        );
        got.first()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("[{}] cannot count {id}: {got:?}", self.target.name()))
    }

    /// Every statement of the set ran exactly once.
    pub fn assert_each_ran_once(&self, ids: &[&str]) {
        let counts: Vec<(String, i64)> = ids.iter().map(|i| (i.to_string(), self.ran(i))).collect();
        assert!(
            counts.iter().all(|(_, n)| *n == 1),
            "[{}] every statement must have run exactly once: {counts:?}",
            self.target.name()
        );
    }

    /// Fencing tokens in history never go backwards (in version order), and how many distinct
    /// holders wrote them.
    pub fn tokens(&self) -> Vec<u64> {
        let tokens: Vec<u64> = self
            .history()
            .iter()
            .filter(|r| r["state"] == "APPLIED")
            .filter_map(|r| r["fencing_token"].as_u64())
            .collect();
        assert!(
            tokens.windows(2).all(|w| w[0] <= w[1]),
            "[{}] fencing tokens go backwards: {tokens:?}",
            self.target.name()
        );
        tokens
    }

    /// lock-status ends AVAILABLE with exit 0.
    pub fn assert_available(&self) {
        let (code, v) = self.status();
        assert_eq!(
            (code, v["verdict"].as_str()),
            (0, Some("AVAILABLE")),
            "[{}] {v}",
            self.target.name()
        );
    }
}

impl Drop for Case<'_> {
    fn drop(&mut self) {
        self.target.drop_database(&self.url);
    }
}

/// A runner that must not outlive a failed test (a stopped process would stay forever).
pub struct Guard(Option<Child>);

impl Guard {
    pub fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// Wait for it to exit (at most `limit`).
    pub fn wait(mut self, limit: Duration) -> Run {
        Run::wait(self.0.take().expect("not reaped yet"), limit)
    }

    /// `kill -9` it (see [`crate::kill9`]).
    pub fn kill9(mut self) {
        crate::kill9(self.0.take().expect("not reaped yet"));
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            crate::signal(c.id(), rustix::process::Signal::KILL);
            crate::signal(c.id(), rustix::process::Signal::CONT);
            let _ = c.wait();
        }
    }
}

/// The target an engine's name stands for, as [`every_engine!`] names its tests.
pub fn target(engine: &str) -> Box<dyn Target> {
    use crate::chaos::{ClickHouse, MySql, Postgres, Redis, Sqlite};
    match engine {
        "sqlite" => Box::new(Sqlite),
        "postgres" => Box::new(Postgres::default()),
        "mysql" => Box::new(MySql::default()),
        "clickhouse" => Box::new(ClickHouse::default()),
        "redis" => Box::new(Redis::default()),
        other => panic!("no chaos target named {other}"),
    }
}

/// One test per engine, named after it, each running `scenario(&dyn Target)` on a fresh
/// database of that engine: `every_engine!(scenario, [sqlite, postgres, mysql, clickhouse,
/// redis]);` inside the scenario's own `mod`.
#[macro_export]
macro_rules! every_engine {
    ($scenario:path, [$($engine:ident),+ $(,)?]) => {
        $(
            #[test]
            fn $engine() {
                $scenario(&*$crate::modes::target(stringify!($engine)));
            }
        )+
    };
}

fn insert(v: u32, s: u32) -> String {
    format!("INSERT INTO chaos_log (id, n) VALUES ('m{v}.s{s}', {s})")
}
