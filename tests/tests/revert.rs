//! `dbwarden revert`: on every engine with migration tables, migrate → revert --steps 2 →
//! migrate restores the schema; history keeps reverted rows (REVERTED); bad input is exit 2 with
//! one line and touches nothing; a revert killed mid-file recovers like a migrate; runners
//! mixing `migrate` and `revert` at once never run a file twice in a row.

use std::time::{Duration, Instant};

use dbwarden_tests::{
    Run, Sandbox, clickhouse, kill9, mysql, pg, slow_select, sqlite_count, sqlite_query,
};

/// The engine under test: its URL, how it creates a table, and its schema as text.
trait Engine {
    fn url(&self) -> String;
    fn table(&self, name: &str) -> String;
    fn schema(&self, sb: &Sandbox) -> Vec<String>;
}

struct Sqlite;
impl Engine for Sqlite {
    fn url(&self) -> String {
        "sqlite://dbwarden.db".into()
    }
    fn table(&self, name: &str) -> String {
        format!("CREATE TABLE {name} (id INTEGER PRIMARY KEY, note TEXT)")
    }
    fn schema(&self, sb: &Sandbox) -> Vec<String> {
        sqlite_query(
            &sb.db(),
            "SELECT name || ': ' || sql FROM sqlite_master WHERE name NOT LIKE 'dbwarden%' ORDER BY name",
        )
    }
}

impl Engine for pg::PgDb {
    fn url(&self) -> String {
        self.url.clone()
    }
    fn table(&self, name: &str) -> String {
        format!("CREATE TABLE {name} (id INTEGER PRIMARY KEY, note TEXT)")
    }
    fn schema(&self, _sb: &Sandbox) -> Vec<String> {
        self.query(
            "SELECT table_name || '.' || column_name || ' ' || data_type FROM information_schema.columns \
             WHERE table_schema = 'public' AND table_name NOT LIKE 'dbwarden%' ORDER BY 1",
        )
    }
}

impl Engine for mysql::TestDb {
    fn url(&self) -> String {
        self.mariadb_url()
    }
    fn table(&self, name: &str) -> String {
        format!("CREATE TABLE {name} (id INTEGER PRIMARY KEY, note TEXT)")
    }
    fn schema(&self, _sb: &Sandbox) -> Vec<String> {
        self.query(&format!(
            "SELECT CONCAT(table_name, '.', column_name, ' ', column_type) FROM information_schema.columns \
             WHERE table_schema = '{}' AND table_name NOT LIKE 'dbwarden%' ORDER BY 1",
            self.name
        ))
    }
}

impl Engine for clickhouse::TestDb {
    fn url(&self) -> String {
        clickhouse::TestDb::url(self)
    }
    fn table(&self, name: &str) -> String {
        format!("CREATE TABLE {name} (id Int32, note String) ENGINE = MergeTree ORDER BY id")
    }
    fn schema(&self, _sb: &Sandbox) -> Vec<String> {
        self.lines(&format!(
            "SELECT concat(table, '.', name, ' ', type) FROM system.columns \
             WHERE database = '{}' AND table NOT LIKE 'dbwarden%' ORDER BY 1",
            self.name
        ))
    }
}

fn run(sb: &Sandbox, e: &dyn Engine, args: &[&str]) -> Run {
    let url = e.url();
    let mut a = vec![args[0], "-u", url.as_str()];
    a.extend_from_slice(&args[1..]);
    sb.run(&a)
}

fn history(sb: &Sandbox, e: &dyn Engine) -> Vec<(i64, String)> {
    let r = run(sb, e, &["history", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    let rows: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["version"].as_i64().unwrap(),
                r["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn token(sb: &Sandbox, e: &dyn Engine) -> serde_json::Value {
    let url = e.url();
    sb.status(&["-u", &url]).1["fencing_token"].clone()
}

fn round_trip(e: &dyn Engine) {
    let sb = Sandbox::new();
    for (v, t) in [(1, "a"), (2, "b"), (3, "c"), (4, "d")] {
        sb.write_migration(&format!("{v:04}_{t}.up.sql"), &format!("{};", e.table(t)));
        sb.write_migration(&format!("{v:04}_{t}.down.sql"), &format!("DROP TABLE {t};"));
    }
    let r = run(&sb, e, &["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    let full = e.schema(&sb);
    assert!(full.iter().any(|l| l.starts_with("d")), "{full:?}");

    // Bad input: exit 2, one line, nothing touched.
    let before = (history(&sb, e), token(&sb, e));
    for bad in [
        vec!["revert", "--to", "99", "--yes"],
        vec!["revert", "--steps", "0", "--yes"],
        vec!["revert", "--steps", "9", "--yes"],
        vec!["revert", "--to", "1", "--steps", "1", "--yes"],
        vec!["revert", "--steps", "1"], // no --yes and no terminal
    ] {
        let r = run(&sb, e, &bad);
        assert_eq!(r.code, 2, "{bad:?}: {r:?}");
        assert_eq!(r.stderr_lines().len(), 1, "{bad:?}: {r:?}");
    }
    std::fs::remove_file(sb.migrations().join("0003_c.down.sql")).unwrap();
    let r = run(&sb, e, &["revert", "--to", "2", "--yes"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("0003_c.down.sql"),
        "names the missing file: {r:?}"
    );
    sb.write_migration("0003_c.down.sql", "DROP TABLE c;");
    let r = run(&sb, e, &["revert", "--steps", "2", "--dry-run"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("0004_d.down.sql") && r.stdout.contains("0003_c.down.sql"),
        "{r:?}"
    );
    assert_eq!(
        (history(&sb, e), token(&sb, e)),
        before,
        "bad input and --dry-run touch nothing"
    );
    assert_eq!(e.schema(&sb), full);

    let r = run(&sb, e, &["revert", "--steps", "2", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("reverted 2 migration(s) (4, 3)"), "{r:?}");
    assert_eq!(
        history(&sb, e),
        [
            (1, "APPLIED".into()),
            (2, "APPLIED".into()),
            (3, "REVERTED".into()),
            (4, "REVERTED".into())
        ],
        "reverted rows are kept for audit"
    );
    let partial = e.schema(&sb);
    assert!(
        !partial.iter().any(|l| l.starts_with("c.")
            || l.starts_with("d.")
            || l.starts_with("c:")
            || l.starts_with("d:")),
        "{partial:?}"
    );
    let r = run(&sb, e, &["status", "--json"]);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["counts"]["reverted"], 2, "{v}");
    assert_eq!(
        run(&sb, e, &["validate"]).code,
        0,
        "reverted is pending, not a problem"
    );

    let r = run(&sb, e, &["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("applied 2 migration(s)"), "{r:?}");
    assert_eq!(
        e.schema(&sb),
        full,
        "migrate after revert restores the schema"
    );
    assert!(history(&sb, e).iter().all(|(_, s)| s == "APPLIED"));
}

#[test]
fn sqlite_round_trip() {
    round_trip(&Sqlite);
}

#[test]
fn postgres_round_trip() {
    round_trip(&pg::PgDb::new());
}

#[test]
fn mariadb_round_trip() {
    round_trip(&mysql::TestDb::new());
}

#[test]
fn clickhouse_round_trip() {
    round_trip(&clickhouse::TestDb::new());
}

/// A journaled down file killed in flight: `migrate` refuses to go over it (exit 2, naming the
/// way out), and the next `revert` resumes it at the statement that was in flight, without
/// running the one before again.
#[test]
fn a_revert_killed_mid_file_recovers() {
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_log.up.sql",
        "CREATE TABLE log (stmt TEXT PRIMARY KEY);",
    );
    sb.write_migration("0002_x.up.sql", "CREATE TABLE x (id INTEGER);");
    sb.write_migration(
        "0002_x.down.sql",
        &format!(
            "-- dbwarden:no-transaction\nINSERT INTO log VALUES ('down 2.1');\nCREATE TABLE IF NOT EXISTS slow AS {};\nDROP TABLE x;\n",
            slow_select(6)
        ),
    );
    assert_eq!(sb.run(&["migrate"]).code, 0);
    let reverting = sb.spawn(&["revert", "--steps", "1", "--yes"]);
    let t0 = Instant::now();
    while sqlite_count(
        &sb.db(),
        "SELECT count(*) FROM dbwarden_migrations WHERE version = 2 AND state = 'RUNNING' AND statements_done = 1",
    ) == 0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the revert never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300)); // statement 2 is in flight
    kill9(reverting);

    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("revert of migration 2")
            && r.stderr.contains("dbwarden revert --steps 1"),
        "{r:?}"
    );
    let (code, status) = sb.status(&[]);
    assert_eq!(code, 0, "{status}");

    let r = sb.run(&["revert", "--steps", "1", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("resuming at statement 2"), "{r:?}");
    assert_eq!(
        sqlite_query(
            &sb.db(),
            "SELECT state FROM dbwarden_migrations WHERE version = 2"
        ),
        ["REVERTED"]
    );
    assert_eq!(
        sqlite_count(&sb.db(), "SELECT count(*) FROM log"),
        1,
        "statement 1 ran once"
    );
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM sqlite_master WHERE name = 'x'"
        ),
        0
    );
    assert_eq!(sb.run(&["migrate"]).code, 0);
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM sqlite_master WHERE name = 'x'"
        ),
        1
    );
}

/// Eight runners at once, half `migrate`, half `revert --to 1`, several rounds: every one exits
/// 0, and per migration the log of ups and downs alternates (a file never ran twice in a row:
/// no two runs interleaved), with at most one up per migrate request and one down per revert.
fn mixed(e: &dyn Engine, log_table: &str, rounds: usize, ops: &dyn Fn(&Sandbox) -> Vec<String>) {
    mixed_with(e, log_table, rounds, ops, &|op| {
        format!("INSERT INTO log (op) VALUES ('{op}');")
    })
}

fn mixed_with(
    e: &dyn Engine,
    log_table: &str,
    rounds: usize,
    ops: &dyn Fn(&Sandbox) -> Vec<String>,
    log: &dyn Fn(&str) -> String,
) {
    let sb = Sandbox::new();
    sb.write_migration("0001_log.up.sql", &format!("{log_table};"));
    for v in 2..=4 {
        sb.write_migration(
            &format!("{v:04}_t{v}.up.sql"),
            &format!(
                "{};\n{}",
                e.table(&format!("t{v}")),
                log(&format!("up {v}"))
            ),
        );
        sb.write_migration(
            &format!("{v:04}_t{v}.down.sql"),
            &format!("DROP TABLE t{v};\n{}", log(&format!("down {v}"))),
        );
    }
    let url = e.url();
    let mut migrates = 0;
    let mut reverts = 0;
    for round in 0..rounds {
        let children: Vec<_> = (0..8)
            .map(|i| {
                if (i + round) % 2 == 0 {
                    migrates += 1;
                    sb.spawn(&["migrate", "-u", &url])
                } else {
                    reverts += 1;
                    sb.spawn(&["revert", "-u", &url, "--to", "1", "--yes"])
                }
            })
            .collect();
        for c in children {
            let r = Run::wait(c, Duration::from_secs(120));
            assert_eq!(r.code, 0, "{r:?}");
        }
    }
    let ops = ops(&sb);
    for v in 2..=4 {
        let mine: Vec<&str> = ops
            .iter()
            .filter(|o| o.ends_with(&format!(" {v}")))
            .map(|o| o.split(' ').next().unwrap())
            .collect();
        assert_eq!(mine.first(), Some(&"up"), "{ops:?}");
        for w in mine.windows(2) {
            assert_ne!(
                w[0], w[1],
                "migration {v} ran {} twice in a row: {ops:?}",
                w[0]
            );
        }
        let ups = mine.iter().filter(|o| **o == "up").count();
        let downs = mine.len() - ups;
        assert!(ups <= migrates && downs <= reverts, "{ops:?}");
    }
    assert!(
        ops.iter().any(|o| o.starts_with("down")),
        "some revert ran: {ops:?}"
    );
}

#[test]
fn sqlite_mixed_migrate_and_revert() {
    mixed(
        &Sqlite,
        "CREATE TABLE log (id INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL)",
        3,
        &|sb| sqlite_query(&sb.db(), "SELECT op FROM log ORDER BY id"),
    );
}

#[test]
fn postgres_mixed_migrate_and_revert() {
    let db = pg::PgDb::new();
    mixed(
        &db,
        "CREATE TABLE log (id SERIAL PRIMARY KEY, op TEXT NOT NULL)",
        3,
        &|_| db.query("SELECT op FROM log ORDER BY id"),
    );
}

#[test]
fn mariadb_mixed_migrate_and_revert() {
    let db = mysql::TestDb::new();
    mixed(
        &db,
        "CREATE TABLE log (id INTEGER AUTO_INCREMENT PRIMARY KEY, op VARCHAR(20) NOT NULL)",
        3,
        &|_| db.query("SELECT op FROM log ORDER BY id"),
    );
}

#[test]
fn clickhouse_mixed_migrate_and_revert() {
    let db = clickhouse::TestDb::new();
    // No auto-increment: runs are serialized by the lock, so the row count orders them.
    mixed_with(
        &db,
        "CREATE TABLE log (id UInt64, op String) ENGINE = MergeTree ORDER BY id",
        2,
        &|_| db.lines("SELECT op FROM log ORDER BY id"),
        &|op| format!("INSERT INTO log SELECT count() + 1, '{op}' FROM log;"),
    );
}

/// The same on the servers: a journaled down file killed during its slow (idempotent) second
/// statement; `migrate` refuses to go over it, the next `revert` resumes it there.
fn killed_revert_resumes(e: &dyn Engine, sleep: &str) {
    killed_revert_resumes_with(
        e,
        sleep,
        "CREATE TABLE log (stmt VARCHAR(20) PRIMARY KEY)",
        &[],
    );
}

/// `log`: the DDL of the table the down file writes to; `lease`: the killed run's lease
/// settings (a lease engine frees a dead holder's lock only at its ttl).
fn killed_revert_resumes_with(e: &dyn Engine, sleep: &str, log: &str, lease: &[&str]) {
    let sb = Sandbox::new();
    let url = e.url();
    sb.write_migration("0001_log.up.sql", &format!("{log};"));
    sb.write_migration("0002_x.up.sql", &format!("{};", e.table("x")));
    sb.write_migration(
        "0002_x.down.sql",
        &format!(
            "-- dbwarden:no-transaction\nINSERT INTO log VALUES ('down 2.1');\n{sleep};\nDROP TABLE x;\n"
        ),
    );
    assert_eq!(run(&sb, e, &["migrate"]).code, 0);
    let mut args = vec!["revert", "-u", &url, "--steps", "1", "--yes"];
    args.extend_from_slice(lease);
    let reverting = sb.spawn(&args);
    let t0 = Instant::now();
    loop {
        let r = run(&sb, e, &["history", "--json"]);
        let rows: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
        let started = rows
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["version"] == 2 && r["state"] == "RUNNING" && r["statements_done"] == 1);
        if started {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the revert never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300)); // the sleep is in flight
    kill9(reverting);

    let r = run(&sb, e, &["migrate", "--wait", "60s"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("revert of migration 2"), "{r:?}");
    let r = run(
        &sb,
        e,
        &["revert", "--steps", "1", "--yes", "--wait", "60s"],
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("resuming at statement 2"), "{r:?}");
    assert_eq!(
        history(&sb, e),
        [(1, "APPLIED".into()), (2, "REVERTED".into())]
    );
    assert!(
        !e.schema(&sb).iter().any(|l| l.starts_with("x.")),
        "the down file finished"
    );
    assert_eq!(run(&sb, e, &["migrate"]).code, 0);
    assert!(e.schema(&sb).iter().any(|l| l.starts_with("x.")));
}

#[test]
fn postgres_killed_revert_resumes() {
    let db = pg::PgDb::new();
    killed_revert_resumes(&db, "SELECT pg_sleep(4)");
    assert_eq!(
        db.count("SELECT count(*) FROM log"),
        1,
        "statement 1 ran once"
    );
}

#[test]
fn mariadb_killed_revert_resumes() {
    let db = mysql::TestDb::new();
    killed_revert_resumes(&db, "SELECT SLEEP(4)");
    assert_eq!(
        db.count("SELECT count(*) FROM log"),
        1,
        "statement 1 ran once"
    );
}

#[test]
fn clickhouse_killed_revert_resumes() {
    let db = clickhouse::TestDb::new();
    killed_revert_resumes_with(
        &db,
        "SELECT sleep(3)",
        "CREATE TABLE log (stmt String) ENGINE = MergeTree ORDER BY stmt",
        &["--lock-ttl", "6s", "--heartbeat-interval", "2s"],
    );
    assert_eq!(
        db.count("SELECT count() FROM log"),
        1,
        "statement 1 ran once"
    );
}

/// A revert killed mid-file whose down file is then edited (the usual fix of a failing down):
/// the row alone says it was a revert, so `migrate` still refuses to run the up file over it;
/// the next `revert` halts for review (the file changed under a journaled run), and `resolve
/// --retry` finishes the down file from the statement that was in flight.
#[test]
fn an_edited_down_file_is_still_a_revert_and_resolve_finishes_it() {
    let sb = Sandbox::new();
    sb.write_migration(
        "0001_log.up.sql",
        "CREATE TABLE log (stmt TEXT PRIMARY KEY);",
    );
    sb.write_migration(
        "0002_x.up.sql",
        "CREATE TABLE x (id INTEGER);\nINSERT INTO log VALUES ('up 2');",
    );
    let down = format!(
        "-- dbwarden:no-transaction\nINSERT INTO log VALUES ('down 2.1');\nCREATE TABLE IF NOT EXISTS slow AS {};\nDROP TABLE x;\n",
        slow_select(6)
    );
    sb.write_migration("0002_x.down.sql", &down);
    assert_eq!(sb.run(&["migrate"]).code, 0);
    let reverting = sb.spawn(&["revert", "--steps", "1", "--yes"]);
    let t0 = Instant::now();
    while sqlite_count(
        &sb.db(),
        "SELECT count(*) FROM dbwarden_migrations WHERE version = 2 AND state = 'RUNNING' AND statements_done = 1",
    ) == 0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the revert never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    kill9(reverting);
    sb.write_migration("0002_x.down.sql", &format!("{down}-- fixed by hand\n"));

    let r = sb.run(&["migrate"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("revert of migration 2"), "{r:?}");
    assert_eq!(
        sqlite_count(&sb.db(), "SELECT count(*) FROM log WHERE stmt = 'up 2'"),
        1,
        "the up file did not run again"
    );
    let r = sb.run(&["revert", "--steps", "1", "--yes"]);
    assert_eq!(r.code, 78, "{r:?}");
    assert!(r.stderr.contains("dbwarden resolve 2"), "{r:?}");
    let r = sb.run(&["resolve", "2", "--retry", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("revert of migration 2"), "{r:?}");
    assert_eq!(
        sqlite_query(
            &sb.db(),
            "SELECT state FROM dbwarden_migrations WHERE version = 2"
        ),
        ["REVERTED"]
    );
    assert_eq!(
        sqlite_count(&sb.db(), "SELECT count(*) FROM log WHERE stmt = 'down 2.1'"),
        1
    );
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM sqlite_master WHERE name = 'x'"
        ),
        0
    );
    let (code, status) = sb.status(&[]);
    assert_eq!(code, 0, "the halt was cleared: {status}");
}

/// `revert --steps 1` looked while another process held the lock, and the history changed
/// before it got the lock (here: migration 3 recorded reverted meanwhile, as another revert
/// would): it refuses (exit 2) instead of reverting migration 2, which nobody confirmed.
#[test]
fn steps_revert_exactly_what_they_showed() {
    let sb = Sandbox::new();
    for v in 1..=3 {
        sb.write_migration(
            &format!("{v:04}_t{v}.up.sql"),
            &format!("CREATE TABLE t{v} (x INTEGER);"),
        );
        sb.write_migration(
            &format!("{v:04}_t{v}.down.sql"),
            &format!("DROP TABLE t{v};"),
        );
    }
    assert_eq!(sb.run(&["migrate"]).code, 0);
    // The holder lets go when the test says so, not after a time it bets on.
    let holder = sb.spawn(&[
        "run",
        "--",
        "sh",
        "-c",
        "while [ ! -e go ]; do sleep 0.05; done",
    ]);
    sb.wait_status(&[], Duration::from_secs(20), |v| v["held"] == true);
    let mut reverting = dbwarden_tests::StderrWatch::new(
        sb.spawn(&["-v", "revert", "--steps", "1", "--yes", "--wait", "60s"]),
    );
    // It read the history (what it will revert) before it found the lock busy.
    reverting.wait_for("lock busy, waiting", Duration::from_secs(30));
    dbwarden_tests::sqlite_exec(
        &sb.db(),
        "UPDATE dbwarden_migrations SET state = 'REVERTED' WHERE version = 3; DROP TABLE t3;",
    );
    std::fs::write(sb.path().join("go"), "").unwrap();
    assert_eq!(Run::wait(holder, Duration::from_secs(30)).code, 0);
    let r = reverting.finish(Duration::from_secs(60));
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("history changed"), "{r:?}");
    assert_eq!(
        sqlite_query(
            &sb.db(),
            "SELECT state FROM dbwarden_migrations WHERE version = 2"
        ),
        ["APPLIED"]
    );
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM sqlite_master WHERE name = 't2'"
        ),
        1,
        "migration 2 was not reverted"
    );
}
