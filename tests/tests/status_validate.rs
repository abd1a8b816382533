//! `status --json` and `validate` on every engine with migration tables: a folder with one
//! pending, one changed, one missing and one out-of-order file is reported file by file,
//! `validate` exits 5, the JSON matches docs/status.schema.json, and nothing was written (the
//! history and the fencing token are as they were).

use dbwarden_tests::schema::violations;
use dbwarden_tests::{Run, Sandbox, clickhouse, mysql, pg};

fn schema() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/status.schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `dbwarden <args> -u <url>` in `sb`.
fn run(sb: &Sandbox, url: &str, args: &[&str]) -> Run {
    let mut a = vec![args[0], "-u", url];
    a.extend_from_slice(&args[1..]);
    sb.run(&a)
}

fn json(r: &Run) -> serde_json::Value {
    serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {r:?}"))
}

/// What a write would change: the history as `history --json` prints it, and the token.
fn written(sb: &Sandbox, url: &str) -> (String, serde_json::Value) {
    let h = run(sb, url, &["history", "--json"]);
    assert_eq!(h.code, 0, "{h:?}");
    let (_, status) = sb.status(&["-u", url]);
    (h.stdout, status["fencing_token"].clone())
}

/// `table(name)`: a statement creating a table in the engine's SQL.
fn every_standing(url: &str, table: fn(&str) -> String) {
    let sb = Sandbox::new();
    for (name, t) in [
        ("0001_a.sql", "a"),
        ("0002_b.sql", "b"),
        ("0003_c.sql", "c"),
        ("0005_e.sql", "e"),
    ] {
        sb.write_migration(name, &table(t));
    }
    let r = run(&sb, url, &["migrate"]);
    assert_eq!(r.code, 0, "{r:?}");
    let r = run(&sb, url, &["validate"]);
    assert_eq!(r.code, 0, "all applied as written: valid: {r:?}");

    sb.write_migration("0002_b.sql", &format!("{}\n-- edited", table("b")));
    std::fs::remove_file(sb.migrations().join("0003_c.sql")).unwrap();
    sb.write_migration("0004_d.sql", &table("d"));
    sb.write_migration("0006_f.sql", &table("f"));
    let before = written(&sb, url);

    let r = run(&sb, url, &["status", "--json"]);
    assert_eq!(r.code, 0, "status reports, it does not judge: {r:?}");
    let v = json(&r);
    let errs = violations(&schema(), &v);
    assert!(errs.is_empty(), "{errs:#?}\n{v}");
    let standings: Vec<(i64, &str)> = v["migrations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["version"].as_i64().unwrap(),
                m["standing"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        standings,
        [
            (1, "applied"),
            (2, "changed"),
            (3, "missing"),
            (4, "out_of_order"),
            (5, "applied"),
            (6, "pending"),
        ],
        "{v}"
    );
    assert_eq!(v["valid"], false, "{v}");
    assert_eq!(v["exit_code"], 5, "{v}");
    assert_eq!(v["lock"]["verdict"], "AVAILABLE", "{v}");
    assert_eq!(v["migrations"][0]["fencing_token"], 1, "{v}");
    assert!(v["migrations"][0]["execution_id"].is_string(), "{v}");
    let problems: Vec<&str> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(problems.len(), 3, "changed, missing, out of order: {v}");

    let r = run(&sb, url, &["validate"]);
    assert_eq!(r.code, 5, "{r:?}");
    for (v, what) in [
        ("migration 2", "changed"),
        ("migration 3", "missing"),
        ("migration 4", "below the highest applied"),
    ] {
        assert!(
            r.stderr.lines().any(|l| l.contains(v) && l.contains(what)),
            "{v} {what}: {r:?}"
        );
    }
    assert!(!r.stderr.contains("migration 6"), "pending is fine: {r:?}");
    let r = run(&sb, url, &["validate", "--json"]);
    assert_eq!(r.code, 5, "{r:?}");
    assert!(violations(&schema(), &json(&r)).is_empty(), "{r:?}");

    // With the file restored, the missing one accepted as history and out-of-order allowed,
    // only the pending ones are left: valid, unless --no-pending.
    sb.write_migration("0002_b.sql", &table("b"));
    std::fs::remove_file(sb.migrations().join("0004_d.sql")).unwrap();
    sb.write_migration("0003_c.sql", &table("c"));
    let r = run(&sb, url, &["validate"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("1 pending"), "{r:?}");
    let r = run(&sb, url, &["validate", "--no-pending"]);
    assert_eq!(r.code, 5, "{r:?}");
    assert!(r.stderr.contains("migration 6"), "{r:?}");
    sb.write_migration("0004_d.sql", &table("d"));
    let r = run(&sb, url, &["validate", "--allow-out-of-order"]);
    assert_eq!(r.code, 0, "out of order allowed: {r:?}");

    assert_eq!(
        written(&sb, url),
        before,
        "status and validate wrote nothing"
    );
}

#[test]
fn sqlite() {
    every_standing("sqlite://dbwarden.db", |t| {
        format!("CREATE TABLE {t} (x INTEGER);")
    });
}

#[test]
fn postgres() {
    let db = pg::PgDb::new();
    every_standing(&db.url, |t| format!("CREATE TABLE {t} (x INTEGER);"));
}

#[test]
fn mariadb() {
    let db = mysql::TestDb::new();
    every_standing(&db.mariadb_url(), |t| {
        format!("CREATE TABLE {t} (x INTEGER);")
    });
}

#[test]
fn clickhouse() {
    let db = clickhouse::TestDb::new();
    every_standing(&db.url(), |t| {
        format!("CREATE TABLE {t} (x Int32) ENGINE = Memory;")
    });
}

#[test]
fn bad_input_is_one_line_exit_2() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    let r = sb.run(&["validate", "--migrations", "no_such_dir"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(r.stderr_lines().len(), 1, "{r:?}");
    let r = sb.run(&["status", "-u", "redis://127.0.0.1:6379"]);
    assert_eq!(r.code, 2, "a lock-only engine has no history: {r:?}");
    assert!(
        !sb.db().exists(),
        "nothing was created by status or validate"
    );
}
