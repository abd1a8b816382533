//! A seeded chaos driver: K `dbwarden migrate` processes over a migration set that mixes
//! transactional, journaled-idempotent and journaled-non-idempotent migrations, while the driver
//! `kill -9`s holders, pauses and resumes runners (SIGSTOP/SIGCONT), holds, delays and cuts a
//! runner's network (each runner of a networked target talks to the server through its own fault
//! proxy, tests/src/proxy.rs) and, where the target can, restarts the database server.
//! Afterwards it checks the invariants. A failing seed is printed
//! and can be replayed with `DBWARDEN_CHAOS_SEED=<seed>`.

use std::process::Child;
use std::time::{Duration, Instant};

use rustix::process::Signal;

use crate::proxy::{Fault, FaultProxy, host_port};
use crate::{Run, Sandbox, signal};

/// What the driver needs from an engine.
pub trait Target {
    fn name(&self) -> &'static str;
    /// A fresh, empty database for one scenario (its URL).
    fn fresh_database(&self, sb: &Sandbox) -> String;
    /// One row/column query on that database (e.g. `SELECT count(*) ...`), as strings.
    fn query(&self, sb: &Sandbox, url: &str, sql: &str) -> Vec<String>;
    /// A statement that takes about `ms` milliseconds.
    fn slow(&self, ms: u32) -> String;
    /// Restart the server (kills every session); false where the target has none.
    fn restart_server(&self) -> bool {
        false
    }
    /// The service name for `scripts/services.sh`, if the target has a server.
    fn service(&self) -> Option<&'static str> {
        None
    }
    /// Extra flags for every runner (short heartbeats for lease engines, ...).
    fn runner_flags(&self) -> Vec<String> {
        vec![]
    }
    /// Flags for `lock-status` (the runner flags, minus what lock-status does not take).
    fn status_flags(&self) -> Vec<String> {
        self.runner_flags()
    }
    /// A query listing the tables of the scenario's database (None: the database is a file
    /// in the sandbox, whose listing already shows whether anything was created).
    fn tables_sql(&self) -> Option<&'static str> {
        None
    }
    /// The lock is a lease that runs out while its holder is paused (grade C: ClickHouse, the
    /// Redis lease), rather than a session the server keeps for a live process.
    fn lease_expires(&self) -> bool {
        false
    }
    /// The lock is kept in the server's own durable state (ClickHouse's lease row), so a
    /// graceful restart shorter than the lease does not take it away.
    fn lock_outlives_restart(&self) -> bool {
        false
    }
    /// A migration and its history row commit together (else every file is journaled).
    fn transactional(&self) -> bool {
        true
    }
    /// The migrations folder is shared by the engines; a few need their own DDL words.
    fn int_type(&self) -> &'static str {
        "INTEGER"
    }
    /// The side table every non-idempotent statement inserts into (unique key where the
    /// engine has one; the per-migration count catches a second run either way).
    fn log_table_ddl(&self) -> String {
        format!(
            "CREATE TABLE chaos_log (id VARCHAR(64) PRIMARY KEY, n {})",
            self.int_type()
        )
    }
    /// `CREATE TABLE IF NOT EXISTS <name>`, empty or filled from `select`.
    fn create_table(&self, name: &str, select: Option<&str>) -> String {
        match select {
            Some(q) => format!("CREATE TABLE IF NOT EXISTS {name} AS {q}"),
            None => format!("CREATE TABLE IF NOT EXISTS {name} (x {})", self.int_type()),
        }
    }
    fn drop_database(&self, _url: &str) {}
    /// The URL of the lock the runners take on `url`: the database itself, or the outer lease
    /// an operator reads with `lock-status` and breaks with `unlock` (Redis).
    fn lock_url(&self, url: &str) -> String {
        url.to_owned()
    }
    /// The lock's URL pointed at a port where nothing listens (127.0.0.1:1), with a user and
    /// the password `hunter2` (None: the lock is a local file).
    fn unreachable_url(&self) -> Option<String> {
        None
    }
    /// How many audit rows with `action` the lock has written, wherever it keeps them.
    fn audits(&self, sb: &Sandbox, url: &str, action: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM dbwarden_lock_audit WHERE action = '{action}'");
        let got = self.query(sb, url, &sql);
        got.first()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("[{}] cannot count audit rows: {got:?}", self.name()))
    }
    /// The `host:port` of the server the runners reach over the network (None: a local file).
    /// Each runner then talks to it through a fault proxy of its own.
    fn upstream(&self, _url: &str) -> Option<String> {
        None
    }
}

/// `argv` with every URL that points at `upstream` pointed at `proxy` instead.
fn through(argv: &[String], upstream: &str, proxy: &FaultProxy) -> Vec<String> {
    argv.iter()
        .map(|a| {
            if a.contains("://") && host_port(a) == upstream {
                proxy.url(a)
            } else {
                a.clone()
            }
        })
        .collect()
}

/// What a scenario did.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub scenarios: u32,
    pub kills: u32,
    pub pauses: u32,
    pub restarts: u32,
    /// Network faults on a runner's link: held, delayed or cut.
    pub net_faults: u32,
    pub runners: u32,
    pub halted_for_review: u32,
    pub violations: Vec<String>,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.scenarios += o.scenarios;
        self.kills += o.kills;
        self.pauses += o.pauses;
        self.restarts += o.restarts;
        self.net_faults += o.net_faults;
        self.runners += o.runners;
        self.halted_for_review += o.halted_for_review;
        self.violations.extend(o.violations.iter().cloned());
    }
}

/// The seeded generator (xorshift64*; the same sequence the property tests use), so a printed
/// seed replays the same scenario.
pub use dbwarden_core::migration::properties::Rng;

/// The kinds of migration in the set, and for each statement whether it is idempotent.
#[derive(Debug, Clone)]
struct Planned {
    version: u32,
    no_transaction: bool,
    idempotent: Vec<bool>,
    statements: Vec<String>,
}

/// Write the migration set; return what each statement is.
fn write_set(target: &dyn Target, sb: &Sandbox, rng: &mut Rng) -> Vec<Planned> {
    let first = target.log_table_ddl();
    sb.write_migration("0001_chaos_log.sql", &format!("{first};"));
    let mut plan = vec![Planned {
        version: 1,
        no_transaction: false,
        idempotent: vec![false],
        statements: vec![first],
    }];
    for v in 2..=6u32 {
        let kind = rng.below(3); // 0 transactional, 1 journaled idempotent, 2 journaled mixed
        let mut stmts = Vec::new();
        let mut idem = Vec::new();
        let n = 2 + rng.below(3) as u32;
        for s in 1..=n {
            let slow = rng.below(3) == 0;
            let (sql, is_idem) = match (kind, s % 2) {
                (1, _) | (2, 1) => (
                    if slow {
                        let q = target.slow(150 + rng.below(300) as u32);
                        target.create_table(&format!("t_{v}_{s}"), Some(&q))
                    } else {
                        target.create_table(&format!("t_{v}_{s}"), None)
                    },
                    true,
                ),
                _ if slow => (
                    format!(
                        "INSERT INTO chaos_log (id, n) SELECT 'm{v}.s{s}', count(*) FROM ({}) q",
                        target.slow(150 + rng.below(300) as u32)
                    ),
                    false,
                ),
                _ => (
                    format!("INSERT INTO chaos_log (id, n) VALUES ('m{v}.s{s}', {s})"),
                    false,
                ),
            };
            stmts.push(sql);
            idem.push(is_idem);
            if kind == 0 && slow {
                stmts.push(target.slow(150 + rng.below(300) as u32));
                idem.push(true);
            }
        }
        let mut text = String::new();
        if kind != 0 {
            text.push_str("-- dbwarden:no-transaction\n");
        }
        for s in &stmts {
            text.push_str(s);
            text.push_str(";\n");
        }
        sb.write_migration(&format!("{v:04}_chaos_{v}.sql"), &text);
        plan.push(Planned {
            version: v,
            no_transaction: kind != 0,
            idempotent: idem,
            statements: stmts,
        });
    }
    plan
}

/// The history as dbwarden itself reads it (engine-neutral: `dbwarden history --json`).
fn history_json(sb: &Sandbox, url: &str, flags: &[String]) -> Vec<serde_json::Value> {
    let mut args = vec!["history", "--json", "-u", url];
    let ns = flags.iter().position(|f| f == "--namespace");
    if let Some(i) = ns {
        args.extend(["--namespace", flags[i + 1].as_str()]);
    }
    let r = sb.run(&args);
    serde_json::from_str::<Vec<serde_json::Value>>(r.stdout.trim()).unwrap_or_default()
}

fn status_json(sb: &Sandbox, url: &str, flags: &[String]) -> serde_json::Value {
    let mut args = vec!["lock-status", "--json", "-u", url];
    args.extend(flags.iter().map(String::as_str));
    let r = sb.run(&args);
    serde_json::from_str(r.stdout.trim()).unwrap_or(serde_json::Value::Null)
}

/// Run one scenario with `seed`; returns its stats (violations included, not panicking).
pub fn scenario(target: &dyn Target, seed: u64, runners: usize) -> Stats {
    let mut stats = Stats {
        scenarios: 1,
        ..Stats::default()
    };
    let mut rng = Rng::new(seed);
    let sb = Sandbox::new();
    let url = target.fresh_database(&sb);
    let plan = write_set(target, &sb, &mut rng);
    let flags = target.runner_flags();
    let status_flags = target.status_flags();
    let mut args: Vec<String> = vec![
        "migrate".into(),
        "-u".into(),
        url.clone(),
        "--wait".into(),
        "60s".into(),
    ];
    args.extend(flags.iter().cloned());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();

    let mut live: Vec<Child> = Vec::new();
    let mut paused: Vec<(u32, Instant)> = Vec::new();
    // (exit code, last lines of stderr, whether its network was faulted)
    let mut codes: Vec<(i32, String, bool)> = Vec::new();
    let upstream = target.upstream(&url);
    // Each networked runner's own fault proxy, by pid; faults end at their instant.
    let mut proxies: std::collections::HashMap<u32, FaultProxy> = Default::default();
    let mut faulted: std::collections::HashSet<u32> = Default::default();
    let mut faults: Vec<(u32, Instant)> = Vec::new();
    let mut started = 0usize;
    let budget = runners + 2; // a few late starters keep the race going
    let t0 = Instant::now();
    let mut actions = 0;
    while (started < budget || !live.is_empty()) && t0.elapsed() < Duration::from_secs(120) {
        // reap finished runners
        let mut i = 0;
        while i < live.len() {
            match live[i].try_wait() {
                Ok(Some(_)) => {
                    let child = live.remove(i);
                    let pid = child.id();
                    let r = Run::wait(child, Duration::from_secs(5));
                    let line = last_lines(&r.stderr);
                    codes.push((r.code, line, faulted.contains(&pid)));
                    proxies.remove(&pid);
                }
                _ => i += 1,
            }
        }
        // resume pauses that are due
        paused.retain(|(pid, until)| {
            if Instant::now() >= *until {
                signal(*pid, Signal::CONT);
                false
            } else {
                true
            }
        });
        // heal links whose fault is over (a held link delivers what it kept)
        faults.retain(|(pid, until)| {
            if Instant::now() >= *until {
                if let Some(p) = proxies.get(pid) {
                    p.set(Fault::Pass);
                }
                false
            } else {
                true
            }
        });
        if started < runners || (started < budget && rng.below(10) == 0) {
            match &upstream {
                Some(up) => {
                    let proxy = FaultProxy::start(up);
                    let a = through(&args, up, &proxy);
                    let a: Vec<&str> = a.iter().map(String::as_str).collect();
                    let child = sb.spawn(&a);
                    proxies.insert(child.id(), proxy);
                    live.push(child);
                }
                None => live.push(sb.spawn(&argv)),
            }
            started += 1;
            stats.runners += 1;
            continue;
        }
        std::thread::sleep(Duration::from_millis(20 + rng.below(120) as u64));
        if actions >= 4 || live.is_empty() {
            continue;
        }
        match rng.below(10) {
            0..=2 => {
                // kill -9 whoever holds the lock right now (if it is one of ours)
                let v = status_json(&sb, &url, &status_flags);
                let pid = v["holder"]["pid"].as_u64().map(|p| p as u32);
                if let Some(pos) = live.iter().position(|c| Some(c.id()) == pid) {
                    let child = live.remove(pos);
                    signal(child.id(), Signal::KILL);
                    signal(child.id(), Signal::CONT);
                    let _ = Run::wait(child, Duration::from_secs(10));
                    codes.push((-9, "killed by the driver".into(), false));
                    stats.kills += 1;
                    actions += 1;
                }
            }
            3 => {
                let c = &live[rng.below(live.len())];
                if !paused.iter().any(|(p, _)| *p == c.id()) {
                    signal(c.id(), Signal::STOP);
                    paused.push((
                        c.id(),
                        Instant::now() + Duration::from_millis(200 + rng.below(1500) as u64),
                    ));
                    stats.pauses += 1;
                    actions += 1;
                }
            }
            4 if rng.below(4) == 0 && target.restart_server() => {
                stats.restarts += 1;
                actions += 1;
            }
            5 | 6 if !proxies.is_empty() => {
                // The link of a runner (the holder, half the time) holds, slows or is cut.
                let holder = status_json(&sb, &url, &status_flags)["holder"]["pid"]
                    .as_u64()
                    .map(|p| p as u32);
                let pids: Vec<u32> = live.iter().map(Child::id).collect();
                let pid = match holder.filter(|p| pids.contains(p)) {
                    Some(p) if rng.below(2) == 0 => p,
                    _ => pids[rng.below(pids.len())],
                };
                if let Some(proxy) = proxies.get(&pid) {
                    let (fault, lasts) = match rng.below(3) {
                        0 => (Fault::Hold, 200 + rng.below(2800)),
                        1 => (
                            Fault::Delay(Duration::from_millis(20 + rng.below(180) as u64)),
                            500 + rng.below(3000),
                        ),
                        _ => (Fault::Cut, rng.below(500)),
                    };
                    proxy.set(fault);
                    faults.retain(|(p, _)| *p != pid);
                    faults.push((pid, Instant::now() + Duration::from_millis(lasts as u64)));
                    faulted.insert(pid);
                    stats.net_faults += 1;
                    actions += 1;
                }
            }
            _ => {}
        }
    }
    for (pid, _) in paused.drain(..) {
        signal(pid, Signal::CONT);
    }
    for (pid, _) in faults.drain(..) {
        if let Some(p) = proxies.get(&pid) {
            p.set(Fault::Pass);
        }
    }
    for child in live.drain(..) {
        let pid = child.id();
        let r = Run::wait(child, Duration::from_secs(90));
        let line = last_lines(&r.stderr);
        codes.push((r.code, line, faulted.contains(&pid)));
    }
    drop(proxies);
    let tag = format!("[{} seed {seed}]", target.name());
    for (code, line, net_fault) in &codes {
        // A server that restarted, or a link that held or was cut, is unreachable for a while.
        let last = line.lines().last().unwrap_or("");
        let unreachable =
            *code == 2 && (stats.restarts > 0 || *net_fault) && last.contains("cannot reach");
        if ![0, 3, 4, 78, -9].contains(code) && !unreachable {
            stats
                .violations
                .push(format!("{tag} a runner exited {code}: {line}"));
        }
    }

    // Settle: one more run without chaos must finish the job or halt exactly at review. A
    // restarted server must be up again first (services.sh waits for it).
    if let (Some(svc), true) = (target.service(), stats.restarts > 0) {
        let services = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/services.sh");
        sh(&format!("bash {services} {svc}"));
    }
    let settle = sb.run(&argv);
    let query = |sql: &str| target.query(&sb, &url, sql);
    let rows = history_json(&sb, &url, &status_flags);
    let row = |v: u32| {
        rows.iter()
            .find(|r| r["version"].as_u64() == Some(u64::from(v)))
    };
    let applied: Vec<&serde_json::Value> =
        rows.iter().filter(|r| r["state"] == "APPLIED").collect();
    match settle.code {
        0 => {
            if applied.len() != plan.len() {
                stats.violations.push(format!(
                    "{tag} after a clean final run, {} migrations are APPLIED, want {}",
                    applied.len(),
                    plan.len()
                ));
            }
        }
        78 => {
            stats.halted_for_review += 1;
            let v = status_json(&sb, &url, &status_flags);
            let version = v["status"]["migration_version"].as_u64().unwrap_or(0) as u32;
            let done = row(version)
                .filter(|r| r["state"] == "RUNNING")
                .and_then(|r| r["statements_done"].as_u64())
                .map(|d| d as usize);
            let planned = plan.iter().find(|p| p.version == version);
            let ok = match (planned, done) {
                // dbwarden's own classification of the statement that was in flight
                (Some(p), Some(d)) => {
                    (p.no_transaction || !target.transactional())
                        && d < p.statements.len()
                        && !dbwarden_core::migration::is_idempotent(&p.statements[d])
                }
                _ => false,
            };
            if !ok || v["verdict"] != "NEEDS_REVIEW" {
                stats.violations.push(format!(
                    "{tag} halted for review at migration {version} (statements_done {done:?}), which is not a non-idempotent statement in flight; lock-status: {}",
                    v["verdict"]
                ));
            }
        }
        other => stats.violations.push(format!(
            "{tag} the settling run exited {other}: {}",
            settle.stderr.trim()
        )),
    }
    // No statement ran twice: every APPLIED migration logged each of its INSERTs exactly once
    // (a unique key also refuses a second one where the engine has keys).
    for p in plan.iter().filter(|p| p.version > 1) {
        if row(p.version).is_none_or(|r| r["state"] != "APPLIED") {
            continue;
        }
        let inserts = p.idempotent.iter().filter(|i| !**i).count();
        let logged = query(&format!(
            "SELECT count(*) FROM chaos_log WHERE id LIKE 'm{}.s%'",
            p.version
        ));
        if logged != [inserts.to_string()] {
            stats.violations.push(format!(
                "{tag} migration {} logged {logged:?} statements, want {inserts}",
                p.version
            ));
        }
    }
    // Fencing tokens recorded in history never go backwards in the order migrations applied.
    let tokens: Vec<u64> = applied
        .iter()
        .filter_map(|r| r["fencing_token"].as_u64())
        .collect();
    if tokens.windows(2).any(|w| w[1] < w[0]) {
        stats
            .violations
            .push(format!("{tag} fencing tokens go backwards: {tokens:?}"));
    }
    let v = status_json(&sb, &url, &status_flags);
    let end = v["verdict"].as_str().unwrap_or("?");
    if !(end == "AVAILABLE" || (end == "NEEDS_REVIEW" && settle.code == 78)) {
        stats
            .violations
            .push(format!("{tag} lock-status ends {end}"));
    }
    target.drop_database(&url);
    stats
}

/// Run `n` scenarios from `DBWARDEN_CHAOS_SEED` (or a time-based seed), printing seeds.
pub fn campaign(target: &dyn Target, n: u32, runners: usize) -> Stats {
    let base: u64 = std::env::var("DBWARDEN_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    let mut total = Stats::default();
    for i in 0..n as u64 {
        let seed = base.wrapping_add(i);
        eprintln!(
            "chaos {}: scenario {} seed {seed} (replay: DBWARDEN_CHAOS_SEED={seed})",
            target.name(),
            i + 1
        );
        let s = scenario(target, seed, runners);
        total.add(&s);
    }
    eprintln!(
        "chaos {}: {} scenarios, {} runners, {} kills, {} pauses, {} restarts, {} network faults, {} halted for review, {} invariant violations",
        target.name(),
        total.scenarios,
        total.runners,
        total.kills,
        total.pauses,
        total.restarts,
        total.net_faults,
        total.halted_for_review,
        total.violations.len()
    );
    total
}

/// The SQLite target: one file per scenario.
pub struct Sqlite;

impl Target for Sqlite {
    fn name(&self) -> &'static str {
        "sqlite"
    }
    fn fresh_database(&self, sb: &Sandbox) -> String {
        format!("sqlite://{}", sb.path().join("chaos.db").display())
    }
    fn query(&self, sb: &Sandbox, _url: &str, sql: &str) -> Vec<String> {
        crate::sqlite_query(&sb.path().join("chaos.db"), sql)
    }
    fn slow(&self, ms: u32) -> String {
        format!(
            "SELECT count(*) AS n FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {}) SELECT x FROM c)",
            ms as u64 * 5_000
        )
    }
    fn runner_flags(&self) -> Vec<String> {
        vec![
            "--lock-ttl".into(),
            "2s".into(),
            "--heartbeat-interval".into(),
            "500ms".into(),
        ]
    }
}

/// Restart a server with a shell command (only the chaos campaigns do this; they run last and
/// one at a time, see scripts/test.sh).
fn sh(cmd: &str) -> bool {
    std::process::Command::new("bash")
        .args(["-c", cmd])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// MySQL / MariaDB: a database per scenario; restarts stop and start mariadbd.
#[derive(Default)]
pub struct MySql {
    dbs: std::sync::Mutex<Vec<crate::mysql::TestDb>>,
}

impl Target for MySql {
    fn unreachable_url(&self) -> Option<String> {
        Some("mysql://scott:hunter2@127.0.0.1:1/app".to_owned())
    }
    fn name(&self) -> &'static str {
        "mysql"
    }
    fn service(&self) -> Option<&'static str> {
        Some("mariadb")
    }
    fn fresh_database(&self, _sb: &Sandbox) -> String {
        let db = crate::mysql::TestDb::new();
        let url = db.url.clone();
        self.dbs.lock().unwrap().push(db);
        url
    }
    fn query(&self, _sb: &Sandbox, url: &str, sql: &str) -> Vec<String> {
        let dbs = self.dbs.lock().unwrap();
        let db = dbs
            .iter()
            .find(|d| d.url == url)
            .expect("a scenario database");
        db.try_query(sql).unwrap_or_default()
    }
    fn slow(&self, ms: u32) -> String {
        format!("SELECT SLEEP({}) AS s", f64::from(ms) / 1000.0)
    }
    fn tables_sql(&self) -> Option<&'static str> {
        Some("SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()")
    }
    fn transactional(&self) -> bool {
        false
    }
    fn restart_server(&self) -> bool {
        sh(
            // By its pid file: another mariadbd (the Galera node of services.sh) runs beside it.
            "start-stop-daemon --stop --quiet --retry 30 --pidfile /run/mysqld/mysqld.pid --exec /usr/sbin/mariadbd; \
            start-stop-daemon --start --quiet --oknodo --background --pidfile /run/mysqld/mysqld.pid --exec /usr/sbin/mariadbd; \
            for i in $(seq 100); do mariadb --no-defaults --protocol=TCP -h 127.0.0.1 -u root -e 'SELECT 1' >/dev/null 2>&1 && exit 0; sleep 0.1; done; exit 1",
        )
    }
    fn drop_database(&self, url: &str) {
        self.dbs.lock().unwrap().retain(|d| d.url != url);
    }
    fn upstream(&self, url: &str) -> Option<String> {
        Some(host_port(url))
    }
}

/// Redis: the lease replicas take (`migrate --redis-url`) around a SQLite database; restarts
/// stop and start redis-server (it keeps nothing on disk, so the lease vanishes with it).
pub struct Redis {
    pub url: String,
    pub namespace: String,
}

impl Default for Redis {
    fn default() -> Self {
        Redis {
            url: crate::redis_util::redis_url(),
            namespace: crate::unique_name("chaos"),
        }
    }
}

impl Target for Redis {
    fn unreachable_url(&self) -> Option<String> {
        Some("redis://scott:hunter2@127.0.0.1:1".to_owned())
    }
    fn name(&self) -> &'static str {
        "redis"
    }
    fn service(&self) -> Option<&'static str> {
        Some("redis")
    }
    fn fresh_database(&self, sb: &Sandbox) -> String {
        std::fs::write(
            sb.path().join("dbwarden.toml"),
            "history_table = \"dbwarden_migrations\"\n",
        )
        .unwrap();
        format!("sqlite://{}", sb.path().join("chaos.db").display())
    }
    fn query(&self, sb: &Sandbox, _url: &str, sql: &str) -> Vec<String> {
        crate::sqlite_query(&sb.path().join("chaos.db"), sql)
    }
    fn slow(&self, ms: u32) -> String {
        Sqlite.slow(ms)
    }
    fn runner_flags(&self) -> Vec<String> {
        vec![
            "--redis-url".into(),
            self.url.clone(),
            "--namespace".into(),
            self.namespace.clone(),
            "--lock-ttl".into(),
            "2s".into(),
            "--heartbeat-interval".into(),
            "500ms".into(),
        ]
    }
    fn status_flags(&self) -> Vec<String> {
        vec![
            "--namespace".into(),
            self.namespace.clone(),
            "--lock-ttl".into(),
            "2s".into(),
            "--heartbeat-interval".into(),
            "500ms".into(),
        ]
    }
    fn lease_expires(&self) -> bool {
        true
    }
    fn lock_url(&self, _url: &str) -> String {
        self.url.clone()
    }
    /// The lease's audit list, `dbwarden:{<ns>}:audit`.
    fn audits(&self, _sb: &Sandbox, _url: &str, action: &str) -> i64 {
        let mut peek = crate::redis_util::Peek::connect(&self.url);
        let rows = peek.audit(&self.namespace);
        rows.iter().filter(|r| r["action"] == action).count() as i64
    }
    /// The runners reach Redis over the network; the SQLite file is local.
    fn upstream(&self, _url: &str) -> Option<String> {
        Some(host_port(&self.url))
    }
    fn restart_server(&self) -> bool {
        sh(
            "redis-cli -h 127.0.0.1 -p 6379 shutdown nosave >/dev/null 2>&1; \
            for i in $(seq 50); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || break; sleep 0.1; done; \
            redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save '' --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log; \
            for i in $(seq 100); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && exit 0; sleep 0.1; done; exit 1",
        )
    }
}

/// ClickHouse: a database per scenario; no unique keys (the per-migration counts catch a
/// second run), Log tables, `sleep()` for slow statements; restarts stop and start the server.
#[derive(Default)]
pub struct ClickHouse {
    dbs: std::sync::Mutex<Vec<crate::clickhouse::TestDb>>,
}

impl Target for ClickHouse {
    fn unreachable_url(&self) -> Option<String> {
        Some("clickhouse://scott:hunter2@127.0.0.1:1/app".to_owned())
    }
    fn name(&self) -> &'static str {
        "clickhouse"
    }
    fn service(&self) -> Option<&'static str> {
        Some("clickhouse")
    }
    fn fresh_database(&self, _sb: &Sandbox) -> String {
        let db = crate::clickhouse::TestDb::new();
        let url = db.url();
        self.dbs.lock().unwrap().push(db);
        url
    }
    fn query(&self, _sb: &Sandbox, url: &str, sql: &str) -> Vec<String> {
        let dbs = self.dbs.lock().unwrap();
        let db = dbs
            .iter()
            .find(|d| d.url() == url)
            .expect("a scenario database");
        db.try_query(sql)
            .map(|t| {
                t.lines()
                    .map(str::to_owned)
                    .filter(|l| !l.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }
    fn slow(&self, ms: u32) -> String {
        format!("SELECT sleep({}) AS s", f64::from(ms) / 1000.0)
    }
    fn tables_sql(&self) -> Option<&'static str> {
        Some("SELECT name FROM system.tables WHERE database = currentDatabase()")
    }
    fn log_table_ddl(&self) -> String {
        "CREATE TABLE chaos_log (id String, n Int64) ENGINE = Log".into()
    }
    fn create_table(&self, name: &str, select: Option<&str>) -> String {
        match select {
            Some(q) => format!("CREATE TABLE IF NOT EXISTS {name} ENGINE = Log AS {q}"),
            None => format!("CREATE TABLE IF NOT EXISTS {name} (x Int64) ENGINE = Log"),
        }
    }
    fn transactional(&self) -> bool {
        false
    }
    fn lease_expires(&self) -> bool {
        true
    }
    fn lock_outlives_restart(&self) -> bool {
        true
    }
    fn runner_flags(&self) -> Vec<String> {
        vec![
            "--lock-ttl".into(),
            "2s".into(),
            "--heartbeat-interval".into(),
            "500ms".into(),
        ]
    }
    fn restart_server(&self) -> bool {
        let services = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/services.sh");
        sh(&format!(
            "pid=$(cat ${{DBWARDEN_CI_STATE:-/var/lib/dbwarden-ci}}/clickhouse/clickhouse.pid 2>/dev/null) || exit 1; \
             kill \"$pid\"; for i in $(seq 300); do kill -0 \"$pid\" 2>/dev/null || break; sleep 0.1; done; \
             bash {services} clickhouse"
        ))
    }
    fn drop_database(&self, url: &str) {
        self.dbs.lock().unwrap().retain(|d| d.url() != url);
    }
    fn upstream(&self, url: &str) -> Option<String> {
        Some(host_port(url))
    }
}

/// PostgreSQL: a database per scenario; restarts go through pg_ctlcluster.
#[derive(Default)]
pub struct Postgres {
    dbs: std::sync::Mutex<Vec<crate::pg::PgDb>>,
}

impl Target for Postgres {
    fn unreachable_url(&self) -> Option<String> {
        Some("postgres://scott:hunter2@127.0.0.1:1/app".to_owned())
    }
    fn name(&self) -> &'static str {
        "postgres"
    }
    fn service(&self) -> Option<&'static str> {
        Some("postgres")
    }
    fn fresh_database(&self, _sb: &Sandbox) -> String {
        let db = crate::pg::PgDb::new();
        let url = db.url.clone();
        self.dbs.lock().unwrap().push(db);
        url
    }
    fn query(&self, _sb: &Sandbox, url: &str, sql: &str) -> Vec<String> {
        let dbs = self.dbs.lock().unwrap();
        let db = dbs
            .iter()
            .find(|d| d.url == url)
            .expect("a scenario database");
        db.client()
            .try_rows(sql)
            .map(|rows| {
                rows.into_iter()
                    .filter_map(|r| r.into_iter().next())
                    .collect()
            })
            .unwrap_or_default()
    }
    fn slow(&self, ms: u32) -> String {
        format!("SELECT 1 AS s FROM pg_sleep({})", f64::from(ms) / 1000.0)
    }
    fn tables_sql(&self) -> Option<&'static str> {
        Some(
            "SELECT tablename::text FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
        )
    }
    fn restart_server(&self) -> bool {
        sh(
            "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | sort -V | tail -1) main restart -m fast; \
            for i in $(seq 100); do pg_isready -q -h 127.0.0.1 -p 5432 && exit 0; sleep 0.1; done; exit 1",
        )
    }
    fn drop_database(&self, url: &str) {
        self.dbs.lock().unwrap().retain(|d| d.url != url);
    }
    fn upstream(&self, url: &str) -> Option<String> {
        Some(host_port(url))
    }
}

/// The last lines a runner wrote to stderr: enough to see what it was doing when a violation
/// is reported (its last line alone says only how it ended).
fn last_lines(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}
