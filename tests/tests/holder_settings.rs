//! `lock-status` judges a holder by the ttl the holder itself runs with, recorded with the lock,
//! not by the observer's own default. Before, a holder running with `--lock-ttl 4s` was shown
//! "ttl 45s" (120 s on ClickHouse, 60 s on Redis), and a paused one stayed HEALTHY for 45 s.
//!
//! Also: a status table written by an older version, without the columns that record the
//! holder's settings, still reads, and the next run adds them.

use std::time::{Duration, Instant};

use dbwarden_tests::chaos::{ClickHouse, MySql, Postgres, Redis, Sqlite, Target};
use dbwarden_tests::modes::Case;
use dbwarden_tests::signal;
use rustix::process::Signal;

/// The holder runs with a 4 s ttl and a 1 s heartbeat; the observer is left at its defaults.
const HOLDER_TTL: &[&str] = &["--lock-ttl", "4s", "--heartbeat-interval", "1s"];

fn judged_by_its_own_ttl(target: &dyn Target) {
    let name = target.name();
    let case = Case::with_ttls(target, HOLDER_TTL, &[]);
    case.log_table();
    // Long enough that the pause below lands inside it on a fast machine too (a session lock's
    // holder is paused there); a lease engine only waits for it.
    case.slow_idempotent(2, if target.lease_expires() { 3000 } else { 10_000 });
    case.inserts(3, 1);
    let holder = case.spawn_guarded(&[]);
    let pid = holder.id();
    case.wait_inside(2, 1);

    let v = case.wait_status(Duration::from_secs(10), |code, v| {
        code == 0 && v["verdict"] == "HEALTHY"
    });
    assert_eq!(v["ttl_s"].as_f64(), Some(4.0), "[{name}] {v}");
    assert_eq!(
        v["holder"]["lock_ttl_ms"].as_u64(),
        Some(4000),
        "[{name}] {v}"
    );
    if name != "clickhouse" {
        // ClickHouse's lock table records the lease ttl only.
        assert_eq!(
            v["holder"]["heartbeat_interval_ms"].as_u64(),
            Some(1000),
            "[{name}] {v}"
        );
    }
    let human = case.run(&["lock-status"]);
    assert!(
        human.stdout.contains("(ttl 4s)"),
        "[{name}] the human view names the holder's ttl: {human:?}"
    );

    if target.lease_expires() {
        // A lease runs out on its own; paused_holder.rs covers what happens then.
        let r = holder.wait(Duration::from_secs(60));
        assert_eq!(r.code, 0, "[{name}] {r:?}");
    } else {
        // Paused: STUCK once its own 4 s pass, long before the observer's default ttl.
        signal(pid, Signal::STOP);
        let t0 = Instant::now();
        // Within 20 s (wait_status panics otherwise): the default ttl is 45 s.
        let v = case.wait_status(Duration::from_secs(20), |code, v| {
            code == 10 && v["verdict"] == "STUCK"
        });
        assert_eq!(v["holder"]["pid"].as_u64(), Some(u64::from(pid)), "{v}");
        eprintln!("[{name}] STUCK after {:?}: {v}", t0.elapsed());
        signal(pid, Signal::CONT);
        let r = holder.wait(Duration::from_secs(60));
        assert_eq!(r.code, 0, "[{name}] the resumed holder finishes: {r:?}");
    }
    case.assert_each_ran_once(&["m2.s1", "m2.s3", "m3.s1"]);
    assert_eq!(case.applied(), [1, 2, 3]);
    case.assert_available();
}

#[test]
fn sqlite_holder_is_judged_by_its_own_ttl() {
    judged_by_its_own_ttl(&Sqlite);
}

#[test]
fn postgres_holder_is_judged_by_its_own_ttl() {
    judged_by_its_own_ttl(&Postgres::default());
}

#[test]
fn mysql_holder_is_judged_by_its_own_ttl() {
    judged_by_its_own_ttl(&MySql::default());
}

#[test]
fn clickhouse_holder_is_judged_by_its_own_ttl() {
    judged_by_its_own_ttl(&ClickHouse::default());
}

#[test]
fn redis_holder_is_judged_by_its_own_ttl() {
    judged_by_its_own_ttl(&Redis::default());
}

/// A database whose status table an older version created (no holder-settings columns).
fn older_status_table(target: &dyn Target) {
    let name = target.name();
    let case = Case::relaxed(target);
    case.log_table();
    let r = case.migrate(&[]);
    assert_eq!(r.code, 0, "[{name}] {r:?}");
    for column in ["lock_ttl_ms", "heartbeat_interval_ms"] {
        case.target.query(
            &case.sb,
            &case.url,
            &format!("ALTER TABLE dbwarden_lock DROP COLUMN {column}"),
        );
    }
    // Still read (SELECT * and a missing column read as "not recorded").
    let (code, v) = case.status();
    assert_eq!(code, 0, "[{name}] {v}");
    assert_eq!(v["verdict"], "AVAILABLE", "[{name}] {v}");

    case.inserts(2, 1);
    let r = case.migrate(&["--lock-ttl", "50s"]);
    assert_eq!(r.code, 0, "[{name}] {r:?}");
    case.assert_each_ran_once(&["m2.s1"]);
    assert_eq!(case.applied(), [1, 2]);
    let (_, v) = case.status();
    assert_eq!(
        v["status"]["lock_ttl_ms"].as_u64(),
        Some(50_000),
        "[{name}] the run added the columns and recorded its ttl: {v}"
    );
}

#[test]
fn sqlite_older_status_table() {
    older_status_table(&Sqlite);
}

#[test]
fn postgres_older_status_table() {
    older_status_table(&Postgres::default());
}

#[test]
fn mysql_older_status_table() {
    older_status_table(&MySql::default());
}

/// What both "may not alter" tests share. `sql` runs as the administrator; `grant` creates the
/// restricted user and returns its name; `drop_user` removes it. As that user, on a status table
/// an older version created: `migrate` exits 0 and applies the pending insert without adding
/// the columns, and lock-status reads the table.
struct Restricted<'a> {
    admin_url: &'a str,
    exec: &'a dyn Fn(&str),
    count: &'a dyn Fn(&str) -> i64,
    grant: &'a dyn Fn(&str),
    drop_user: &'a dyn Fn(&str),
    columns_sql: &'a str,
}

fn migrates_without_alter(r: Restricted<'_>) {
    let sb = dbwarden_tests::Sandbox::new();
    sb.write_migration("0001_t.sql", "CREATE TABLE t (x INT);");
    let run = sb.run(&["migrate", "-u", r.admin_url]);
    assert_eq!(run.code, 0, "{run:?}");
    (r.exec)(
        "ALTER TABLE dbwarden_lock DROP COLUMN lock_ttl_ms, DROP COLUMN heartbeat_interval_ms",
    );
    let user = dbwarden_tests::unique_name("writer");
    (r.grant)(&user);
    let url = r.admin_url.replacen("://root@", &format!("://{user}@"), 1);
    assert_ne!(
        url, r.admin_url,
        "the test database URL names the root user"
    );
    sb.write_migration("0002_i.sql", "INSERT INTO t VALUES (1);");
    let run = sb.run(&["migrate", "-u", &url]);
    let status = sb.run(&["lock-status", "-u", &url]);
    let rows = (r.count)("SELECT count(*) FROM t");
    let columns = (r.count)(r.columns_sql);
    (r.drop_user)(&user);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(rows, 1);
    assert_eq!(columns, 0, "the user could not alter the table");
    assert_eq!(status.code, 0, "{status:?}");
    assert!(status.stdout.contains("AVAILABLE"), "{status:?}");
}

/// A role that may write the tables but not alter them (it does not own them): the claim cannot
/// add the columns, so it records no settings and migrates all the same.
#[test]
fn postgres_a_role_that_may_not_alter_an_older_status_table_still_migrates() {
    let db = dbwarden_tests::pg::PgDb::new();
    migrates_without_alter(Restricted {
        admin_url: &db.url,
        exec: &|sql| db.exec(sql),
        count: &|sql| db.count(sql),
        grant: &|role| {
            db.exec(&format!(
                "CREATE ROLE {role} LOGIN; GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}; GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}"
            ))
        },
        drop_user: &|role| db.exec(&format!("DROP OWNED BY {role}; DROP ROLE {role}")),
        columns_sql: "SELECT count(*) FROM information_schema.columns WHERE table_name = 'dbwarden_lock' AND column_name = 'lock_ttl_ms'",
    });
}

/// The same on MariaDB: a user with CREATE but without ALTER on the database.
#[test]
fn mysql_a_user_that_may_not_alter_an_older_status_table_still_migrates() {
    let db = dbwarden_tests::mysql::TestDb::new();
    migrates_without_alter(Restricted {
        admin_url: &db.url,
        exec: &|sql| db.exec(sql),
        count: &|sql| db.count(sql),
        grant: &|user| {
            db.exec(&format!("CREATE USER '{user}'@'%'"));
            db.exec(&format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `{}`.* TO '{user}'@'%'",
                db.name
            ));
        },
        drop_user: &|user| db.exec(&format!("DROP USER '{user}'@'%'")),
        columns_sql: "SELECT count(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'dbwarden_lock' AND column_name = 'lock_ttl_ms'",
    });
}
