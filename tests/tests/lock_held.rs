//! While another runner holds the lock: skip, wait-then-give-up, and what lock-status says,
//! on every engine (`every_engine`); a paused SQLite holder keeps its flock here.

use std::time::Duration;

use dbwarden_tests::{Run, Sandbox, signal, slow_select};
use rustix::process::Signal;

/// Start a runner that holds the lock for a while (a slow migration) and wait until it does.
fn start_holder(sb: &Sandbox, extra: &[&str]) -> std::process::Child {
    sb.write_migration(
        "0001_ran.sql",
        "CREATE TABLE ran (version INTEGER PRIMARY KEY);",
    );
    sb.write_migration(
        "0002_slow.sql",
        &format!("CREATE TABLE slow AS {};", slow_select(8)),
    );
    let mut args = vec!["migrate"];
    args.extend_from_slice(extra);
    let child = sb.spawn(&args);
    sb.wait_status(extra, Duration::from_secs(30), |v| {
        v["held"] == true && v["status"]["state"] == "RUNNING"
    });
    child
}

#[test]
fn a_paused_holder_is_reported_stuck_and_keeps_its_lock() {
    let sb = Sandbox::new();
    let short = ["--lock-ttl", "2s", "--heartbeat-interval", "500ms"];
    let holder = start_holder(&sb, &short);
    signal(holder.id(), Signal::STOP);
    let v = sb.wait_status(&short, Duration::from_secs(10), |v| v["verdict"] == "STUCK");
    assert_eq!(v["held"], true);
    assert!(v["heartbeat_age_s"].as_f64().unwrap() > 2.0, "{v}");
    let r = sb.run(&[
        "lock-status",
        "--lock-ttl",
        "2s",
        "--heartbeat-interval",
        "500ms",
    ]);
    assert_eq!(r.code, 10, "{r:?}");
    assert!(r.stdout.starts_with("STUCK"), "{r:?}");
    assert!(r.stdout.contains("next step"), "{r:?}");
    // The kernel still holds its flock: nobody else may start.
    let r = sb.run(&["migrate", "--wait", "0"]);
    assert_eq!(r.code, 3, "{r:?}");
    signal(holder.id(), Signal::CONT);
    let done = Run::wait(holder, Duration::from_secs(120));
    assert_eq!(done.code, 0, "{done:?}");
    let (code, v) = sb.status(&[]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("AVAILABLE")));
}

/// A holder inside a slow migration, the same on every engine.
mod every_engine {
    use dbwarden_tests::chaos::Target;
    use dbwarden_tests::modes::Case;
    use std::time::Duration;

    /// lock-status names the holder (pid, host, token; HEALTHY, exit 0); `--skip-if-locked`
    /// exits 0 with one line, `--wait 1s` gives up after about a second with exit 3 naming
    /// the holder and its token, `--wait 0` tries once; none of them takes a token or runs a
    /// statement, and each is audited as a `lock_conflict`.
    fn others_are_declined_naming_the_holder(target: &dyn Target) {
        let case = Case::relaxed(target);
        let name = target.name();
        case.log_table();
        // 4 × 3 s (ClickHouse's `sleep` stops at 3 s): longer than the declined runs below
        // take on a loaded machine.
        case.slow_between(2, 4, 3000);
        let holder = case.spawn_guarded(&[]);
        case.wait_inside(2, 1);
        let (code, v) = case.lock_status();
        assert_eq!(
            (code, v["verdict"].as_str()),
            (0, Some("HEALTHY")),
            "[{name}] {v}"
        );
        assert_eq!(v["engine"], name, "{v}");
        assert_eq!(v["held"], true, "{v}");
        assert_eq!(v["holder"]["pid"], holder.id(), "[{name}] {v}");
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(v["holder"]["host"], host.trim(), "[{name}] {v}");
        let token = v["fencing_token"].as_u64().expect("a token");
        let r = case.on_lock(&["lock-status"]);
        assert_eq!(r.code, 0, "[{name}] {r:?}");
        assert!(r.stdout.starts_with("HEALTHY"), "[{name}] {r:?}");
        assert!(
            r.stdout.contains(&format!("pid={}", holder.id())),
            "[{name}] {r:?}"
        );
        assert!(
            r.stdout.contains(&format!("fencing token     {token}")),
            "[{name}] {r:?}"
        );

        let pid = format!("pid={}", holder.id());
        let r = case.migrate(&["--skip-if-locked"]);
        assert_eq!(r.code, 0, "[{name}] {r:?}");
        assert_eq!(r.stderr_lines().len(), 1, "[{name}] {r:?}");
        assert!(
            r.stderr.contains("skipped") && r.stderr.contains(&pid),
            "[{name}] {r:?}"
        );
        assert!(r.stdout.is_empty(), "[{name}] {r:?}");

        let r = case.migrate(&["--wait", "1s"]);
        assert_eq!(r.code, 3, "[{name}] {r:?}");
        assert!(
            r.elapsed >= Duration::from_secs(1),
            "[{name}] {:?}",
            r.elapsed
        );
        // It gave up: it did not wait for the holder's 12 s.
        assert!(
            r.elapsed < Duration::from_secs(9),
            "[{name}] {:?}",
            r.elapsed
        );
        assert_eq!(r.stderr_lines().len(), 1, "[{name}] {r:?}");
        assert!(
            r.stderr.contains("lock busy: held by host="),
            "[{name}] {r:?}"
        );
        assert!(r.stderr.contains(&pid), "[{name}] {r:?}");
        // ClickHouse's busy view is its lock table, whose rows carry the token from the
        // holder's first heartbeat on; the other engines name it at once.
        if name != "clickhouse" {
            assert!(
                r.stderr.contains(&format!("token {token}")),
                "[{name}] {r:?}"
            );
        }

        let r = case.migrate(&["--wait", "0"]);
        assert_eq!(r.code, 3, "[{name}] {r:?}");
        assert!(r.stderr.contains(&pid), "[{name}] {r:?}");

        let (_, v) = case.lock_status();
        assert_eq!(
            v["fencing_token"], token,
            "[{name}] no one else took a token: {v}"
        );
        assert_eq!(v["holder"]["pid"], holder.id(), "[{name}] {v}");
        assert_eq!(
            case.ran("m2.s1"),
            1,
            "[{name}] no declined run ran a statement"
        );
        let h = holder.wait(Duration::from_secs(120));
        assert_eq!(h.code, 0, "[{name}] {h:?}");
        assert_eq!(case.applied(), [1, 2], "[{name}]");
        // One holder wrote every row (on the Redis lease: the token of the SQLite lock under
        // it, not the lease's).
        let tokens = case.tokens();
        assert!(
            tokens.windows(2).all(|w| w[0] == w[1]),
            "[{name}] {tokens:?}"
        );

        // The next holder (a new migration to apply) writes what a SQLite file write-locked
        // by the holder's statement kept in the spool; by then every engine has the three.
        case.inserts(3, 1);
        let r = case.migrate(&[]);
        assert_eq!(r.code, 0, "[{name}] {r:?}");
        assert_eq!(case.audits("lock_conflict"), 3, "[{name}]");
    }

    mod declined {
        dbwarden_tests::every_engine!(
            super::others_are_declined_naming_the_holder,
            [sqlite, postgres, mysql, clickhouse, redis]
        );
    }
}
