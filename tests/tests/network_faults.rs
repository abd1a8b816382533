//! Networks that stop answering instead of refusing, on every networked engine, through the fault
//! proxy (tests/src/proxy.rs): the proxy sits between one `dbwarden` process and the real server
//! while every other process (the other runner, `lock-status`) talks to the server directly.
//!
//! - A waiter whose link holds (packets swallowed, connection open) ends within `--wait` plus
//!   one `connect_timeout`, exit 2 naming the server it could not reach; before the fix a
//!   PostgreSQL waiter with `--wait 4s` took 33 s (a whole statement timeout more).
//! - `lock-status`, `unlock` and `history` (no `--wait`) behind a link that slows and then holds
//!   mid-command end within `connect_timeout` plus `statement_timeout`, exit 2.
//! - A holder whose link holds loses its lock within `ttl − interval`, stops its work (the
//!   child of `run` gets SIGTERM, and writes nothing more) and exits 4; the lock is then taken
//!   again by a runner on a working link.
//! - Runners on a slow link (200 ms each way) still apply each migration once and all exit 0.
//! - A `migrate` holder whose link holds mid-statement exits 4 within `ttl − interval` instead
//!   of waiting for an answer that never comes; the next runner applies each migration once.
//! - `adopt`, `baseline`, `revert` and `resolve` holders whose link holds during their last write (held
//!   server-side on the audit table by another session, so the hold finds them mid-write) exit
//!   4 within `ttl − interval` too (PostgreSQL, MariaDB); `migrate` then goes on from there.
//! - A link cut (reset) mid-statement is recovered like a `kill -9` of the holder (PostgreSQL,
//!   MariaDB, ClickHouse; Redis's link carries the lease, not statements).
//! - A holder whose whole server froze (SIGSTOP of every process of a server the test started
//!   for itself: Redis, PostgreSQL, MariaDB, ClickHouse) loses its lock within `ttl − interval`
//!   and exits 4.
//!
//! SQLite is a local file and has no network to fail.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use dbwarden_tests::proxy::{Fault, FaultProxy, host_port};
use dbwarden_tests::{Run, Sandbox, clickhouse, free_port, mysql, pg, redis_util, unique_name};

/// One networked server, with a database (or namespace) of this test's own.
enum Server {
    Postgres(pg::PgDb),
    MariaDb(mysql::TestDb),
    ClickHouse(clickhouse::TestDb),
    Redis(String),
}

impl Server {
    fn postgres() -> Self {
        Server::Postgres(pg::PgDb::new())
    }
    fn mariadb() -> Self {
        Server::MariaDb(mysql::TestDb::new())
    }
    fn clickhouse() -> Self {
        Server::ClickHouse(clickhouse::TestDb::new())
    }
    fn redis() -> Self {
        Server::Redis(unique_name("netfault"))
    }

    fn url(&self) -> String {
        match self {
            Server::Postgres(db) => db.url.clone(),
            Server::MariaDb(db) => db.url.clone(),
            Server::ClickHouse(db) => db.url(),
            Server::Redis(_) => redis_util::redis_url(),
        }
    }

    /// `-u URL` (and the namespace, on Redis) for a command line.
    fn target(&self, url: &str) -> Vec<String> {
        let mut v = vec!["-u".to_owned(), url.to_owned()];
        if let Server::Redis(ns) = self {
            v.extend(["--namespace".to_owned(), ns.clone()]);
        }
        v
    }

    /// A statement that takes about a second, in this server's SQL.
    fn sleep_sql(&self) -> &'static str {
        match self {
            Server::Postgres(_) => "SELECT pg_sleep(1);",
            Server::MariaDb(_) => "DO SLEEP(1);",
            Server::ClickHouse(_) => "SELECT sleep(1);",
            Server::Redis(_) => unreachable!("Redis keeps no migrations"),
        }
    }

    /// How many migrations the history table holds as applied, read directly.
    fn applied(&self) -> Vec<i64> {
        let sql =
            "SELECT version FROM dbwarden_migrations WHERE state = 'APPLIED' ORDER BY version";
        let rows = match self {
            Server::Postgres(db) => db.query(sql),
            Server::MariaDb(db) => db.query(sql),
            Server::ClickHouse(db) => db.lines(&format!("{sql} FORMAT TSV")),
            Server::Redis(_) => unreachable!(),
        };
        rows.iter().map(|v| v.parse().unwrap()).collect()
    }

    /// [`Server::applied`], empty while the history table does not exist yet.
    fn applied_so_far(&self) -> Vec<i64> {
        let sql =
            "SELECT version FROM dbwarden_migrations WHERE state = 'APPLIED' ORDER BY version";
        let rows: Vec<String> = match self {
            Server::Postgres(db) => db
                .client()
                .try_rows(sql)
                .map(|r| r.into_iter().map(|mut c| c.remove(0)).collect())
                .unwrap_or_default(),
            Server::MariaDb(db) => db.try_query(sql).unwrap_or_default(),
            Server::ClickHouse(db) => db
                .try_query(&format!("{sql} FORMAT TSV"))
                .map(|t| t.lines().map(str::to_owned).collect())
                .unwrap_or_default(),
            Server::Redis(_) => unreachable!(),
        };
        rows.iter().map(|v| v.parse().unwrap()).collect()
    }
}

fn cmd(
    sb: &Sandbox,
    server: &Server,
    url: &str,
    args: &[&str],
    extra_env: &[(&str, &str)],
) -> Child {
    let mut a: Vec<String> = vec![args[0].to_owned()];
    a.extend(server.target(url));
    a.extend(args[1..].iter().map(|s| s.to_string()));
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let mut c = sb.cmd(&a);
    for (k, v) in extra_env {
        c.env(k, v);
    }
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dbwarden")
}

/// Wait until `lock-status` on the direct URL says the lock is held.
fn wait_held(sb: &Sandbox, server: &Server) {
    let t = server.target(&server.url());
    let t: Vec<&str> = t.iter().map(String::as_str).collect();
    sb.wait_status(&t, Duration::from_secs(30), |v| v["held"] == true);
}

/// A holder on a working link (`run -- sleep 60`), waited for until it holds.
fn direct_holder(sb: &Sandbox, server: &Server) -> Child {
    let holder = cmd(
        sb,
        server,
        &server.url(),
        &["run", "--", "sleep", "60"],
        &[],
    );
    wait_held(sb, server);
    holder
}

fn stop(child: Child) {
    dbwarden_tests::signal(child.id(), rustix::process::Signal::TERM);
    let _ = Run::wait(child, Duration::from_secs(30));
}

/// The waiter's bound: `--wait 4s` plus `connect_timeout` 2 s, and 1.5 s for starting a
/// process and the machine's load.
const WAIT: Duration = Duration::from_secs(4);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const SLACK: Duration = Duration::from_millis(1500);

fn a_waiter_behind_a_held_link_ends_within_its_wait(server: Server) {
    let sb = Sandbox::new();
    let waiter_cmd: &[&str] = match server {
        // The SQL engines' waiter is `migrate` with something pending: it looks, tries, waits.
        Server::Redis(_) => &["run", "--wait", "4s", "--", "true"],
        _ => {
            sb.write_migration("0001_a.sql", server.sleep_sql());
            &["migrate", "--wait", "4s"]
        }
    };
    let holder = direct_holder(&sb, &server);
    let proxy = FaultProxy::start(&host_port(&server.url()));
    held_midway_ends_unreachable_in_time(&sb, &server, &proxy, waiter_cmd);
    stop(holder);
}

/// Run `args` through `proxy` with `connect_timeout` 2 s; 1.5 s in (waiting, talking to the
/// server), the link holds. The command must end unreachable (exit 2), naming the server, within
/// its 4 s wait plus `connect_timeout` (and the slack).
fn held_midway_ends_unreachable_in_time(
    sb: &Sandbox,
    server: &Server,
    proxy: &FaultProxy,
    args: &[&str],
) {
    dbwarden_tests::dbwarden_bin(); // built before the clock starts
    let started = Instant::now();
    let child = cmd(
        sb,
        server,
        &proxy.url(&server.url()),
        args,
        &[("DBWARDEN_CONNECT_TIMEOUT", "2s")],
    );
    std::thread::sleep(Duration::from_millis(1500));
    proxy.set(Fault::Hold);
    let r = Run::wait(child, Duration::from_secs(120));
    let took = started.elapsed();
    assert_eq!(r.code, 2, "a held link is unreachable (exit 2): {r:?}");
    assert!(
        r.stderr.contains(&proxy.addr().to_string()),
        "the error names the server it could not reach: {r:?}"
    );
    assert!(
        took <= WAIT + CONNECT_TIMEOUT + SLACK,
        "{args:?} with connect_timeout 2s took {took:?}: {r:?}"
    );
}

/// The readiness gate (`wait --timeout 4s`) for a migration nobody applies, behind a link that
/// holds: exit 2 naming the server within the timeout plus `connect_timeout`, not exit 3 a
/// statement timeout later.
fn a_gate_behind_a_held_link_ends_within_its_timeout(server: Server) {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", server.sleep_sql());
    let proxy = FaultProxy::start(&host_port(&server.url()));
    held_midway_ends_unreachable_in_time(&sb, &server, &proxy, &["wait", "--timeout", "4s"]);
}

/// The one-shot commands (no `--wait`: `lock-status`, `unlock`, `history`) behind a link that
/// slows down and then holds in the middle of the command: exit 2 naming the server within
/// `connect_timeout` plus `statement_timeout`, whichever step the hold caught.
fn one_shot_commands_behind_a_held_link_end_in_time(server: Server) {
    let sb = Sandbox::new();
    let holder = direct_holder(&sb, &server);
    let mut commands: Vec<&[&str]> = vec![&["lock-status"], &["unlock", "--yes"]];
    if !matches!(server, Server::Redis(_)) {
        commands.push(&["history"]);
    }
    dbwarden_tests::dbwarden_bin(); // built before the clock starts
    for args in commands {
        let proxy = FaultProxy::start(&host_port(&server.url()));
        // 400 ms each way: whatever the command does takes a few round trips, so the hold
        // 1 s in finds it midway.
        proxy.set(Fault::Delay(Duration::from_millis(400)));
        let started = Instant::now();
        let child = cmd(
            &sb,
            &server,
            &proxy.url(&server.url()),
            args,
            &[
                ("DBWARDEN_CONNECT_TIMEOUT", "2s"),
                ("DBWARDEN_STATEMENT_TIMEOUT", "3s"),
            ],
        );
        std::thread::sleep(Duration::from_millis(1000));
        proxy.set(Fault::Hold);
        let r = Run::wait(child, Duration::from_secs(120));
        let took = started.elapsed();
        assert_eq!(
            r.code, 2,
            "{args:?}: a held link is unreachable (exit 2): {r:?}"
        );
        assert!(
            r.stderr.contains(&proxy.addr().to_string()),
            "{args:?}: the error names the server it could not reach: {r:?}"
        );
        assert!(
            took <= CONNECT_TIMEOUT + Duration::from_secs(3) + SLACK,
            "{args:?} with connect_timeout 2s and statement_timeout 3s took {took:?}: {r:?}"
        );
    }
    // Nothing was unlocked behind the held link: the holder still holds.
    wait_held(&sb, &server);
    stop(holder);
}

/// A `sh -c` script that appends a line to `marks` every 50 ms: the work of a `run` holder.
fn writer(marks: &std::path::Path) -> String {
    format!(
        "while true; do date +%s%N >> {}; sleep 0.05; done",
        marks.display()
    )
}

/// The holder's command wrote, and writes nothing more now that the holder has exited.
fn assert_stopped_writing(marks: &std::path::Path) {
    let len = std::fs::metadata(marks).unwrap().len();
    assert!(len > 0, "the child ran");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        std::fs::metadata(marks).unwrap().len(),
        len,
        "the child of a holder that lost its lock kept writing"
    );
}

/// `proxy` holds; `holder` (ttl 6 s, heartbeat 2 s) must lose its lock and exit 4 within
/// ttl − interval (4 s) of the hold, plus the slack.
fn holder_loses_the_held_link(proxy: &FaultProxy, holder: Child) {
    proxy.set(Fault::Hold);
    let held_at = Instant::now();
    let r = Run::wait(holder, Duration::from_secs(60));
    let took = held_at.elapsed();
    assert_eq!(r.code, 4, "a holder that lost its lock exits 4: {r:?}");
    assert!(
        took <= Duration::from_secs(6 - 2) + SLACK,
        "the holder must stop within ttl − interval (4 s) of the hold; took {took:?}: {r:?}"
    );
}

fn a_holder_behind_a_held_link_stops_and_exits_4(server: Server) {
    let sb = Sandbox::new();
    let proxy = FaultProxy::start(&host_port(&server.url()));
    let marks = sb.path().join("marks");
    let work = writer(&marks);
    let holder = cmd(
        &sb,
        &server,
        &proxy.url(&server.url()),
        &[
            "run",
            "--lock-ttl",
            "6s",
            "--heartbeat-interval",
            "2s",
            "--kill-after",
            "2s",
            "--",
            "sh",
            "-c",
            &work,
        ],
        &[("DBWARDEN_CONNECT_TIMEOUT", "2s")],
    );
    wait_held(&sb, &server);
    // Working for a moment, then the link holds.
    std::thread::sleep(Duration::from_millis(500));
    holder_loses_the_held_link(&proxy, holder);
    // Its work stopped with it: nothing is written after it exited.
    assert_stopped_writing(&marks);
    // The link is cut for good; a runner on a working link takes the lock (after the lease
    // runs out where the lock is a lease) and says which token it got.
    drop(proxy);
    let next = cmd(
        &sb,
        &server,
        &server.url(),
        &["run", "--wait", "60s", "--", "true"],
        &[],
    );
    let n = Run::wait(next, Duration::from_secs(90));
    assert_eq!(
        n.code, 0,
        "the lock is taken again after the lost holder: {n:?}"
    );
}

/// Eight runners at once, each behind a link that delays every chunk 200 ms each way: every
/// migration applied once, every runner exit 0. On Redis the runners guard a local SQLite
/// database with the lease (`migrate --redis-url`): the slow link is the one to Redis.
fn runners_on_a_slow_link_apply_each_migration_once(server: Server) {
    let sb = Sandbox::new();
    let table = match server {
        Server::ClickHouse(_) => "CREATE TABLE t (x Int64) ENGINE = Log;",
        _ => "CREATE TABLE t (x INTEGER);",
    };
    sb.write_migration("0001_t.sql", table);
    sb.write_migration("0002_a.sql", "INSERT INTO t VALUES (1);");
    sb.write_migration("0003_b.sql", "INSERT INTO t VALUES (2);");
    if let Server::Redis(_) = server {
        std::fs::write(
            sb.path().join("dbwarden.toml"),
            "history_table = \"dbwarden_migrations\"\n",
        )
        .unwrap();
    }
    let proxy = FaultProxy::start(&host_port(&server.url()));
    proxy.set(Fault::Delay(Duration::from_millis(200)));
    let url = proxy.url(&server.url());
    let runners: Vec<Child> = (0..8)
        .map(|_| match &server {
            Server::Redis(ns) => {
                let mut c = sb.cmd(&[
                    "migrate",
                    "--redis-url",
                    &url,
                    "--namespace",
                    ns,
                    "--wait",
                    "5m",
                ]);
                c.stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            }
            _ => cmd(&sb, &server, &url, &["migrate", "--wait", "5m"], &[]),
        })
        .collect();
    for r in runners {
        let r = Run::wait(r, Duration::from_secs(280));
        assert_eq!(r.code, 0, "{r:?}");
    }
    let (applied, rows) = match &server {
        Server::Postgres(db) => (server.applied(), db.query("SELECT x FROM t ORDER BY x")),
        Server::MariaDb(db) => (server.applied(), db.query("SELECT x FROM t ORDER BY x")),
        Server::ClickHouse(db) => (
            server.applied(),
            db.lines("SELECT x FROM t ORDER BY x FORMAT TSV"),
        ),
        Server::Redis(_) => (
            dbwarden_tests::sqlite_query(
                &sb.db(),
                "SELECT version FROM dbwarden_migrations WHERE state = 'APPLIED' ORDER BY version",
            )
            .iter()
            .map(|v| v.parse().unwrap())
            .collect(),
            dbwarden_tests::sqlite_query(&sb.db(), "SELECT x FROM t ORDER BY x"),
        ),
    };
    assert_eq!(applied, vec![1, 2, 3]);
    assert_eq!(rows, ["1", "2"], "each insert ran once");
}

/// One test per engine, named `<module>::<engine>`, each running `scenario` on a fresh
/// database (or namespace) of that engine.
macro_rules! per_engine {
    ($module:ident, $scenario:ident, [$($engine:ident),+]) => {
        mod $module {
            use super::*;
            $(
                #[test]
                fn $engine() {
                    $scenario(Server::$engine());
                }
            )+
        }
    };
}

per_engine!(
    waiter_held_link,
    a_waiter_behind_a_held_link_ends_within_its_wait,
    [postgres, mariadb, clickhouse, redis]
);

per_engine!(
    gate_held_link,
    a_gate_behind_a_held_link_ends_within_its_timeout,
    [postgres, mariadb, clickhouse]
);

per_engine!(
    one_shot_held_link,
    one_shot_commands_behind_a_held_link_end_in_time,
    [postgres, mariadb, clickhouse, redis]
);

per_engine!(
    holder_held_link,
    a_holder_behind_a_held_link_stops_and_exits_4,
    [postgres, mariadb, clickhouse, redis]
);

per_engine!(
    slow_link,
    runners_on_a_slow_link_apply_each_migration_once,
    [postgres, mariadb, clickhouse, redis]
);

/// Three migrations, the second with a 3–4 s statement after an insert, and a `migrate` holder
/// (ttl 6 s, heartbeat 2 s, `env`) behind `proxy`, returned 0.8 s into that statement.
fn holder_mid_statement(
    sb: &Sandbox,
    server: &Server,
    proxy: &FaultProxy,
    env: &[(&str, &str)],
) -> Child {
    let (table, slow) = match server {
        Server::Postgres(_) => (
            "CREATE TABLE t (x INTEGER);",
            "INSERT INTO t VALUES (1);\nSELECT pg_sleep(4);",
        ),
        Server::MariaDb(_) => (
            "CREATE TABLE t (x INTEGER);",
            "INSERT INTO t VALUES (1);\nSELECT SLEEP(4);",
        ),
        // ClickHouse's sleep() stops at 3 s.
        Server::ClickHouse(_) => (
            "CREATE TABLE t (x Int64) ENGINE = Log;",
            "INSERT INTO t VALUES (1);\nSELECT sleep(3);",
        ),
        Server::Redis(_) => unreachable!("the Redis link carries no statement"),
    };
    sb.write_migration("0001_t.sql", table);
    sb.write_migration("0002_slow.sql", slow);
    sb.write_migration("0003_b.sql", "INSERT INTO t VALUES (2);");
    // A short lease, so that the lease engine's lock (ClickHouse) runs out within the test.
    let holder = cmd(
        sb,
        server,
        &proxy.url(&server.url()),
        &["migrate", "--lock-ttl", "6s", "--heartbeat-interval", "2s"],
        env,
    );
    let t0 = Instant::now();
    while server.applied_so_far() != vec![1] {
        assert!(t0.elapsed() < Duration::from_secs(30), "0001 never applied");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(800));
    holder
}

/// A runner on a working link (`--wait wait`) recovers the holder's half-done 0002 as after a
/// kill: exit 0, 1, 2 and 3 applied, and 0002's insert ran once.
fn next_runner_applies_each_once(sb: &Sandbox, server: &Server, wait: &str) {
    let next = cmd(sb, server, &server.url(), &["migrate", "--wait", wait], &[]);
    let n = Run::wait(next, Duration::from_secs(90));
    assert_eq!(n.code, 0, "{n:?}");
    assert_eq!(server.applied(), vec![1, 2, 3]);
    let rows = match server {
        Server::Postgres(db) => db.query("SELECT x FROM t ORDER BY x"),
        Server::MariaDb(db) => db.query("SELECT x FROM t ORDER BY x"),
        Server::ClickHouse(db) => db.lines("SELECT x FROM t ORDER BY x FORMAT TSV"),
        Server::Redis(_) => unreachable!(),
    };
    assert_eq!(rows, ["1", "2"], "0002's insert ran once");
}

/// A link cut (reset) in the middle of a migration's statement: the holder stops with an error,
/// the server ends its session (rolling the migration back and freeing the lock), lock-status
/// says DEAD, and the next runner recovers as after a `kill -9`: every migration applied once.
fn a_link_cut_mid_statement_recovers_like_a_kill(server: Server) {
    let sb = Sandbox::new();
    let proxy = FaultProxy::start(&host_port(&server.url()));
    let holder = holder_mid_statement(&sb, &server, &proxy, &[]);
    proxy.set(Fault::Cut);
    let r = Run::wait(holder, Duration::from_secs(60));
    assert_ne!(
        r.code, 0,
        "a holder whose link was cut did not finish: {r:?}"
    );
    let t = server.target(&server.url());
    let t: Vec<&str> = t.iter().map(String::as_str).collect();
    let v = sb.wait_status(&t, Duration::from_secs(30), |v| v["held"] == false);
    assert_eq!(v["verdict"], "DEAD", "{v}");
    next_runner_applies_each_once(&sb, &server, "30s");
}

per_engine!(
    cut_link,
    a_link_cut_mid_statement_recovers_like_a_kill,
    [postgres, mariadb, clickhouse]
);

/// A `migrate` holder whose link holds in the middle of a migration's statement (no answer, no
/// error, no end): it loses its lock within `ttl − interval` and exits 4 without waiting for the
/// statement that will never answer. Once the link is gone the server ends the session, and the
/// next runner applies every migration once. Before the fix a holder on any of the three
/// engines waited on its held link for good.
fn a_migrating_holder_behind_a_held_link_exits_4_in_time(server: Server) {
    let sb = Sandbox::new();
    let proxy = FaultProxy::start(&host_port(&server.url()));
    let env = [("DBWARDEN_CONNECT_TIMEOUT", "2s")];
    let holder = holder_mid_statement(&sb, &server, &proxy, &env);
    holder_loses_the_held_link(&proxy, holder);
    // The link goes for good: the server sees the session end.
    drop(proxy);
    next_runner_applies_each_once(&sb, &server, "60s");
}

per_engine!(
    migrating_held_link,
    a_migrating_holder_behind_a_held_link_exits_4_in_time,
    [postgres, mariadb, clickhouse]
);

/// A session of the test's own that keeps the audit table from being written (reads still
/// go through) until it is dropped.
enum AuditBlocker {
    Postgres(pg::Client),
    MariaDb(mysql::Session),
}

impl AuditBlocker {
    fn start(server: &Server) -> Self {
        match server {
            Server::Postgres(db) => {
                let mut c = db.client();
                c.exec("BEGIN");
                c.exec("LOCK TABLE dbwarden_lock_audit IN EXCLUSIVE MODE");
                AuditBlocker::Postgres(c)
            }
            Server::MariaDb(db) => {
                let mut s = db.session();
                s.exec("LOCK TABLES dbwarden_lock_audit READ");
                AuditBlocker::MariaDb(s)
            }
            _ => unreachable!("only PostgreSQL and MariaDB lock a table for a session"),
        }
    }

    /// Wait until another session waits to write the audit table.
    fn wait_for_writer(server: &Server) {
        let t0 = Instant::now();
        loop {
            let waiting = match server {
                Server::Postgres(db) => db.count(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND wait_event_type = 'Lock' AND query ILIKE '%dbwarden_lock_audit%'",
                ),
                Server::MariaDb(db) => db.count(
                    "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() \
                     AND state LIKE 'Waiting for table%' AND info LIKE '%dbwarden_lock_audit%'",
                ),
                _ => unreachable!(),
            };
            if waiting > 0 {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the command never came to write its audit row"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn release(self) {
        match self {
            AuditBlocker::Postgres(mut c) => c.exec("COMMIT"),
            AuditBlocker::MariaDb(mut s) => s.exec("UNLOCK TABLES"),
        }
    }
}

/// `command` (ttl 6 s, heartbeat 2 s) behind `proxy` holds the lock and has done its work, and
/// its last write (the audit row) waits on a table another session keeps; then the link holds,
/// and that session lets go, so the server finishes the write and its answer is swallowed. The
/// command must lose its lock and exit 4 within ttl − interval, not wait for that answer,
/// with its work before the audit row done (`recorded` applied); once the link is gone,
/// `migrate` on a working link exits 0 with `applied` applied. Before the fix, the four
/// commands waited on a held link for good on PostgreSQL (whose bounds are the server's) and
/// for two statement timeouts (about 60 s) on MariaDB.
fn a_holding_command_behind_a_held_link_exits_4(
    sb: &Sandbox,
    server: &Server,
    command: &[&str],
    recorded: &[i64],
    applied: &[i64],
) {
    let proxy = FaultProxy::start(&host_port(&server.url()));
    let blocker = AuditBlocker::start(server);
    let mut args = command.to_vec();
    args.extend(["--yes", "--lock-ttl", "6s", "--heartbeat-interval", "2s"]);
    let holder = cmd(
        sb,
        server,
        &proxy.url(&server.url()),
        &args,
        &[("DBWARDEN_CONNECT_TIMEOUT", "2s")],
    );
    AuditBlocker::wait_for_writer(server);
    proxy.set(Fault::Hold);
    blocker.release();
    let held_at = Instant::now();
    let r = Run::wait(holder, Duration::from_secs(60));
    let took = held_at.elapsed();
    assert_eq!(
        r.code, 4,
        "{command:?}: a holder that lost its lock exits 4: {r:?}"
    );
    assert!(
        took <= Duration::from_secs(6 - 2) + SLACK,
        "{command:?} must stop within ttl − interval (4 s) of the hold; took {took:?}: {r:?}"
    );
    assert_eq!(server.applied(), recorded, "what {command:?} did");
    drop(proxy);
    let next = cmd(
        sb,
        server,
        &server.url(),
        &["migrate", "--wait", "60s"],
        &[],
    );
    let n = Run::wait(next, Duration::from_secs(90));
    assert_eq!(n.code, 0, "after {command:?}: {n:?}");
    assert_eq!(server.applied(), applied, "after {command:?}");
}

/// The direct URL's `-u` (and namespace) plus `args`, run to completion.
fn direct(sb: &Sandbox, server: &Server, args: &[&str]) -> Run {
    Run::wait(
        cmd(sb, server, &server.url(), args, &[]),
        Duration::from_secs(90),
    )
}

/// `baseline 3` records 2 and 3 without running them, then its audit row meets the held link.
fn a_baseline_behind_a_held_link_exits_4(server: Server) {
    let sb = Sandbox::new();
    sb.write_migration("0001_t.sql", "CREATE TABLE t (x INTEGER);");
    sb.write_migration("0002_a.sql", "INSERT INTO t VALUES (2);");
    sb.write_migration("0003_b.sql", "INSERT INTO t VALUES (3);");
    let r = direct(&sb, &server, &["migrate", "--to", "1"]);
    assert_eq!(r.code, 0, "{r:?}");
    a_holding_command_behind_a_held_link_exits_4(
        &sb,
        &server,
        &["baseline", "3"],
        &[1, 2, 3],
        &[1, 2, 3],
    );
    let rows = match &server {
        Server::Postgres(db) => db.count("SELECT count(*) FROM t"),
        Server::MariaDb(db) => db.count("SELECT count(*) FROM t"),
        _ => unreachable!(),
    };
    assert_eq!(rows, 0, "a baseline runs no migration");
}

/// `revert --steps 1` undoes 0002, then its audit row meets the held link.
fn a_revert_behind_a_held_link_exits_4(server: Server) {
    let sb = Sandbox::new();
    sb.write_migration("0001_t.sql", "CREATE TABLE t (x INTEGER);");
    sb.write_migration("0002_u.sql", "CREATE TABLE u (x INTEGER);");
    sb.write_migration("0002_u.down.sql", "DROP TABLE u;");
    let r = direct(&sb, &server, &["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    a_holding_command_behind_a_held_link_exits_4(
        &sb,
        &server,
        &["revert", "--steps", "1"],
        &[1],
        &[1, 2],
    );
}

/// `resolve 2 --mark-applied` records the failed 0002 as applied, then its audit row meets the
/// held link.
fn a_resolve_behind_a_held_link_exits_4(server: Server) {
    let sb = Sandbox::new();
    sb.write_migration("0001_t.sql", "CREATE TABLE t (x INTEGER);");
    sb.write_migration("0002_bad.sql", "INSERT INTO no_such_table VALUES (1);");
    let r = direct(&sb, &server, &["migrate"]);
    assert_eq!(r.code, 1, "0002 fails: {r:?}");
    a_holding_command_behind_a_held_link_exits_4(
        &sb,
        &server,
        &["resolve", "2", "--mark-applied"],
        &[1, 2],
        &[1, 2],
    );
}

/// `adopt` records golang-migrate's version 1, then its audit row meets the held link.
fn an_adopt_behind_a_held_link_exits_4(server: Server) {
    let sb = Sandbox::new();
    sb.write_migration("0001_t.sql", "CREATE TABLE t (x INTEGER);");
    sb.write_migration("0002_u.sql", "CREATE TABLE u (x INTEGER);");
    let setup = [
        "CREATE TABLE t (x INTEGER)",
        "CREATE TABLE schema_migrations (version BIGINT NOT NULL PRIMARY KEY, dirty BOOLEAN NOT NULL)",
        "INSERT INTO schema_migrations (version, dirty) VALUES (1, false)",
    ];
    for sql in setup {
        match &server {
            Server::Postgres(db) => db.exec(sql),
            Server::MariaDb(db) => db.exec(sql),
            _ => unreachable!(),
        }
    }
    // A lock-holding command that runs nothing creates dbwarden's tables, the audit table too.
    let r = direct(&sb, &server, &["run", "--", "true"]);
    assert_eq!(r.code, 0, "{r:?}");
    a_holding_command_behind_a_held_link_exits_4(&sb, &server, &["adopt"], &[1], &[1, 2]);
}

per_engine!(
    adopt_held_link,
    an_adopt_behind_a_held_link_exits_4,
    [postgres, mariadb]
);

per_engine!(
    baseline_held_link,
    a_baseline_behind_a_held_link_exits_4,
    [postgres, mariadb]
);

per_engine!(
    revert_held_link,
    a_revert_behind_a_held_link_exits_4,
    [postgres, mariadb]
);

per_engine!(
    resolve_held_link,
    a_resolve_behind_a_held_link_exits_4,
    [postgres, mariadb]
);

/// A server of this test's own, started on a free loopback port and stopped on drop, so that
/// the test can freeze all of it (SIGSTOP) without touching the shared servers.
struct OwnServer {
    url: String,
    pids: Box<dyn Fn() -> Vec<u32>>,
    stop: Box<dyn Fn()>,
    _dir: tempfile::TempDir,
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        for pid in (self.pids)() {
            dbwarden_tests::signal(pid, rustix::process::Signal::CONT);
        }
        (self.stop)();
    }
}

fn sh(cmd: &str) -> String {
    let out = std::process::Command::new("bash")
        .args(["-c", cmd])
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn pids_of(pattern: &str) -> Vec<u32> {
    let out = std::process::Command::new("pgrep")
        .args(["-f", pattern])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A private redis-server (nothing on disk).
fn own_redis() -> OwnServer {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    sh(&format!(
        "redis-server --daemonize yes --bind 127.0.0.1 --port {port} --save '' --appendonly no --dir {d} --logfile {d}/redis.log --pidfile {d}/redis.pid; \
         for i in $(seq 100); do redis-cli -p {port} ping >/dev/null 2>&1 && exit 0; sleep 0.05; done; exit 1",
        d = dir.path().display()
    ));
    let pidfile = dir.path().join("redis.pid");
    let pids = move || {
        std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .into_iter()
            .collect()
    };
    let pids2 = pids.clone();
    OwnServer {
        url: format!("redis://127.0.0.1:{port}"),
        pids: Box::new(pids),
        stop: Box::new(move || {
            for pid in pids2() {
                dbwarden_tests::signal(pid, rustix::process::Signal::KILL);
            }
        }),
        _dir: dir,
    }
}

/// A private PostgreSQL cluster (initdb as the postgres user, trust auth, its own port).
fn own_postgres() -> OwnServer {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let bin = sh("ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1");
    sh(&format!(
        "chown postgres {d} && cd /tmp && \
         runuser -u postgres -- {bin}/initdb -D {data} -A trust -U root >/dev/null && \
         runuser -u postgres -- {bin}/pg_ctl -D {data} -l {d}/pg.log -w -o \"-p {port} -k {d} -c listen_addresses=127.0.0.1 -c fsync=off\" start >/dev/null",
        d = dir.path().display(),
        data = data.display()
    ));
    let data2 = data.clone();
    let pattern = format!("postgres.*-D {}", data.display());
    OwnServer {
        url: format!("postgres://root@127.0.0.1:{port}/postgres"),
        // The postmaster and every backend (their command lines do not name the data folder,
        // but they are the postmaster's children).
        pids: Box::new(move || {
            let mut v = pids_of(&pattern);
            if let Some(&pm) = v.first() {
                v.extend(pids_of_children(pm));
            }
            v
        }),
        stop: Box::new(move || {
            let _ = std::process::Command::new("runuser")
                .args(["-u", "postgres", "--", &format!("{bin}/pg_ctl")])
                .args([
                    "-D",
                    &data2.display().to_string(),
                    "-m",
                    "immediate",
                    "stop",
                ])
                .output();
        }),
        _dir: dir,
    }
}

/// The pid in `path` (a server's pid file), if it is there yet.
fn pid_in(path: &std::path::Path) -> Vec<u32> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .into_iter()
        .collect()
}

/// A server that is one process, known by the pid file `pid_file` in `dir`: frozen by stopping
/// that process, stopped by killing it.
fn one_process_server(url: String, dir: tempfile::TempDir, pid_file: &str) -> OwnServer {
    let pidfile = dir.path().join(pid_file);
    let pidfile2 = pidfile.clone();
    OwnServer {
        url,
        pids: Box::new(move || pid_in(&pidfile)),
        stop: Box::new(move || {
            for pid in pid_in(&pidfile2) {
                dbwarden_tests::signal(pid, rustix::process::Signal::KILL);
            }
        }),
        _dir: dir,
    }
}

/// A private MariaDB (one process; every connection is a thread of it), with no grant tables
/// so root logs in over TCP without a password, and a database `test`.
fn own_mariadb() -> OwnServer {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    sh(&format!(
        "mariadb-install-db --no-defaults --datadir={d}/data --user=root --auth-root-authentication-method=normal --skip-test-db >{d}/install.log 2>&1 && \
         (setsid mariadbd --no-defaults --datadir={d}/data --port={port} --bind-address=127.0.0.1 --socket={d}/sock --pid-file={d}/pid --user=root \
            --skip-grant-tables --innodb-buffer-pool-size=16M --skip-log-bin >{d}/server.log 2>&1 </dev/null &) && \
         for i in $(seq 300); do mariadb -h127.0.0.1 -P{port} -uroot -e 'CREATE DATABASE IF NOT EXISTS test' 2>/dev/null && exit 0; sleep 0.1; done; cat {d}/server.log >&2; exit 1",
        d = dir.path().display()
    ));
    one_process_server(format!("mysql://root@127.0.0.1:{port}/test"), dir, "pid")
}

/// A private ClickHouse (Debian's 18.16, one process), started from the packaged config with
/// its own ports and folders, like `scripts/services.sh clickhouse`.
fn own_clickhouse() -> OwnServer {
    let (http, tcp) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    sh(&format!(
        "clickhouse-server --daemon --pid-file={d}/ch.pid --config-file=/etc/clickhouse-server/config.xml -- \
            --path={d}/ --tmp_path={d}/tmp/ --user_files_path={d}/user_files/ --format_schema_path={d}/format_schemas/ \
            --http_port={http} --tcp_port={tcp} --interserver_http_port=0 \
            --logger.log={d}/ch.log --logger.errorlog={d}/ch.err.log >{d}/stdout.log 2>&1 </dev/null && \
         for i in $(seq 300); do curl -sf --max-time 1 'http://127.0.0.1:{http}/?query=SELECT%201' >/dev/null && exit 0; sleep 0.1; done; \
         tail -20 {d}/ch.err.log >&2; exit 1",
        d = dir.path().display()
    ));
    one_process_server(
        format!("http://127.0.0.1:{http}/?database=default"),
        dir,
        "ch.pid",
    )
}

fn pids_of_children(parent: u32) -> Vec<u32> {
    let out = std::process::Command::new("pgrep")
        .args(["-P", &parent.to_string()])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A holder whose whole server froze (every server process SIGSTOPped): it loses its lock
/// within `ttl − interval`, its command is stopped and writes nothing more, exit 4.
fn a_holder_whose_server_froze_stops_and_exits_4(server: OwnServer) {
    let sb = Sandbox::new();
    let marks = sb.path().join("marks");
    let work = writer(&marks);
    let holder = sb
        .cmd(&[
            "run",
            "-u",
            &server.url,
            "--lock-ttl",
            "6s",
            "--heartbeat-interval",
            "2s",
            "--kill-after",
            "2s",
            "--",
            "sh",
            "-c",
            &work,
        ])
        .env("DBWARDEN_CONNECT_TIMEOUT", "2s")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    sb.wait_status(&["-u", &server.url], Duration::from_secs(30), |v| {
        v["held"] == true
    });
    std::thread::sleep(Duration::from_millis(500));
    let pids = (server.pids)();
    assert!(!pids.is_empty(), "the server's processes");
    for &pid in &pids {
        dbwarden_tests::signal(pid, rustix::process::Signal::STOP);
    }
    let frozen_at = Instant::now();
    let r = Run::wait(holder, Duration::from_secs(60));
    let took = frozen_at.elapsed();
    for &pid in &pids {
        dbwarden_tests::signal(pid, rustix::process::Signal::CONT);
    }
    assert_eq!(r.code, 4, "a holder that lost its lock exits 4: {r:?}");
    assert!(
        took <= Duration::from_secs(6 - 2) + SLACK,
        "the holder must stop within ttl − interval (4 s) of the freeze; took {took:?}: {r:?}"
    );
    assert!(
        r.stderr.contains("heartbeat") && !r.stderr.contains('\u{1b}'),
        "the log says why, in plain text when stderr is not a terminal: {r:?}"
    );
    assert_stopped_writing(&marks);
}

mod frozen_server {
    use super::*;

    #[test]
    fn redis() {
        a_holder_whose_server_froze_stops_and_exits_4(own_redis());
    }
    #[test]
    fn postgres() {
        a_holder_whose_server_froze_stops_and_exits_4(own_postgres());
    }
    #[test]
    fn mariadb() {
        a_holder_whose_server_froze_stops_and_exits_4(own_mariadb());
    }
    #[test]
    fn clickhouse() {
        a_holder_whose_server_froze_stops_and_exits_4(own_clickhouse());
    }
}
