//! `dbwarden run` on PostgreSQL: shared holders (`pg_try_advisory_lock_shared`) overlap, a writer
//! waits for all of them, and a killed lock session stops the wrapped command.

use std::time::Duration;

use dbwarden_tests::pg::PgDb;
use dbwarden_tests::{Run, Sandbox};
use dbwarden_tests::{spans, timed_script};

#[test]
fn shared_runs_overlap_and_a_writer_waits_for_all_of_them() {
    let db = PgDb::new();
    let sb = Sandbox::new();
    let log = sb.path().join("log");
    let r1 = timed_script(&log, "reader1", 2.0);
    let r2 = timed_script(&log, "reader2", 2.0);
    let w = timed_script(&log, "writer", 0.5);
    let a = db.spawn(&sb, &["run", "--shared", "--", "sh", "-c", &r1]);
    let b = db.spawn(&sb, &["run", "--shared", "--", "sh", "-c", &r2]);
    let t0 = std::time::Instant::now();
    loop {
        let (_, v) = sb.status(&["-u", &db.url]);
        if v["shared_holders"].as_array().is_some_and(|a| a.len() == 2) {
            assert_eq!(v["verdict"], "HEALTHY", "{v}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "readers never both held: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = db.run(&sb, &["run", "--wait", "0", "--", "sh", "-c", &w]);
    assert_eq!(r.code, 3, "a writer is refused while readers share: {r:?}");
    assert!(r.stderr.contains("shared by 2 holder(s)"), "{r:?}");
    let writer = db.spawn(&sb, &["run", "--wait", "60s", "--", "sh", "-c", &w]);
    for c in [a, b, writer] {
        let r = Run::wait(c, Duration::from_secs(90));
        assert_eq!(r.code, 0, "{r:?}");
    }
    let s = spans(&log);
    let get = |n: &str| {
        s.iter()
            .find(|x| x.0 == n)
            .cloned()
            .unwrap_or_else(|| panic!("{n}: {s:?}"))
    };
    let (r1, r2, w) = (get("reader1"), get("reader2"), get("writer"));
    assert!(r1.1 < r2.2 && r2.1 < r1.2, "the readers overlapped: {s:?}");
    assert!(
        w.1 >= r1.2 && w.1 >= r2.2,
        "the writer started after both readers ended: {s:?}"
    );
}

#[test]
fn killing_the_lock_session_sends_the_child_sigterm_and_run_exits_4() {
    let db = PgDb::new();
    let sb = Sandbox::new();
    let log = sb.path().join("log");
    let script = format!(
        "trap 'echo got-TERM >> {log}; exit 0' TERM; echo started >> {log}; while true; do sleep 0.1; done",
        log = log.display()
    );
    let holder = db.spawn(
        &sb,
        &[
            "run",
            "--heartbeat-interval",
            "1s",
            "--lock-ttl",
            "3s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let t0 = std::time::Instant::now();
    let backend = loop {
        let (_, v) = sb.status(&["-u", &db.url]);
        if v["held"] == true {
            break v["session_id"].as_str().unwrap_or_default().to_owned();
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "never held: {v}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let pid: i64 = backend
        .trim_start_matches(|c: char| !c.is_ascii_digit())
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap_or_default()
        .parse()
        .unwrap_or_else(|_| panic!("a backend pid in {backend:?}"));
    // Held is not yet running: the lock is taken before the status row is claimed. Kill the
    // session only once the child runs (a kill inside the claim is "cannot reach", exit 2).
    while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains("started")) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the child never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed_at = std::time::Instant::now();
    assert_eq!(
        db.query(&format!("SELECT pg_terminate_backend({pid})::text")),
        ["true"]
    );
    let r = Run::wait(holder, Duration::from_secs(30));
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("lock lost"), "{r:?}");
    // One heartbeat interval (1 s) plus the child's trap; generous for a loaded machine.
    assert!(
        killed_at.elapsed() < Duration::from_secs(4),
        "{:?}",
        killed_at.elapsed()
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "started\ngot-TERM\n"
    );
}
