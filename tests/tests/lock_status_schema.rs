//! `lock-status --json` matches the committed schema docs/lock-status.schema.json in every
//! verdict we can produce on SQLite.

use std::time::Duration;

use dbwarden_tests::schema::violations;
use dbwarden_tests::{Run, Sandbox, signal, slow_select};
use rustix::process::Signal;

fn schema() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/lock-status.schema.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn assert_valid(sb: &Sandbox, want: &str, extra: &[&str]) -> serde_json::Value {
    let (code, v) = sb.status(extra);
    assert_eq!(v["verdict"], want, "{v}");
    assert_eq!(i64::from(code), v["exit_code"].as_i64().unwrap(), "{v}");
    let errs = violations(&schema(), &v);
    assert!(errs.is_empty(), "{want}: {errs:#?}\n{v}");
    v
}

#[test]
fn the_validator_catches_what_it_should() {
    let s = schema();
    let mut bad = serde_json::json!({"verdict": "MAYBE"});
    assert!(!violations(&s, &bad).is_empty());
    bad["verdict"] = "AVAILABLE".into();
    assert!(
        violations(&s, &bad)
            .iter()
            .any(|e| e.contains("missing required held"))
    );
}

#[test]
fn every_verdict_matches_the_schema() {
    let sb = Sandbox::new();
    assert_valid(&sb, "AVAILABLE", &[]); // no database at all
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb.write_migration(
        "0002_slow.sql",
        &format!(
            "-- dbwarden:no-transaction\nINSERT INTO a VALUES (1);\nCREATE TABLE slow AS {};",
            slow_select(6)
        ),
    );
    let short = ["--lock-ttl", "2s", "--heartbeat-interval", "500ms"];
    let mut args = vec!["migrate"];
    args.extend_from_slice(&short);
    let holder = sb.spawn(&args);
    sb.wait_status(&short, Duration::from_secs(30), |v| {
        v["held"] == true && v["status"]["state"] == "RUNNING"
    });
    let v = assert_valid(&sb, "HEALTHY", &short);
    assert!(v["holder"].is_object());
    // pause it inside the slow, non-idempotent statement 2 of migration 2
    let t0 = std::time::Instant::now();
    while dbwarden_tests::sqlite_count(
        &sb.db(),
        "SELECT count(*) FROM dbwarden_migrations WHERE version = 2 AND statements_done = 1",
    ) == 0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "migration 2 never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(holder.id(), Signal::STOP);
    sb.wait_status(&short, Duration::from_secs(10), |v| v["verdict"] == "STUCK");
    assert_valid(&sb, "STUCK", &short);
    signal(holder.id(), Signal::KILL);
    signal(holder.id(), Signal::CONT);
    let _ = Run::wait(holder, Duration::from_secs(10));
    assert_valid(&sb, "DEAD", &[]);
    // the runner that takes over, told to halt on any dead predecessor, halts for review
    let r = sb.run(&["migrate", "--recovery-policy", "halt"]);
    assert_eq!(r.code, 78, "{r:?}");
    let v = assert_valid(&sb, "NEEDS_REVIEW", &[]);
    assert_eq!(v["status"]["migration_version"], 2);
}
