//! `dbwarden run -- <command>`: the lock around any program, exclusive or shared.

use std::path::Path;
use std::time::Duration;

use dbwarden_tests::{Run, Sandbox, spans, sqlite_count, timed_script};

/// A child command that sleeps and logs its span (see `dbwarden_tests::timed_script`).
fn timed(log: &Path, name: &str, secs: f64) -> Vec<String> {
    vec!["sh".into(), "-c".into(), timed_script(log, name, secs)]
}

fn args<'a>(head: &[&'a str], cmd: &'a [String]) -> Vec<&'a str> {
    let mut v = head.to_vec();
    v.push("--");
    v.extend(cmd.iter().map(String::as_str));
    v
}

#[test]
fn exit_codes_pass_through_and_the_child_sees_its_token() {
    let sb = Sandbox::new();
    let r = sb.run(&[
        "run",
        "--",
        "sh",
        "-c",
        "echo $DBWARDEN_FENCING_TOKEN $DBWARDEN_NAMESPACE $DBWARDEN_EXECUTION_ID; exit 7",
    ]);
    assert_eq!(r.code, 7, "{r:?}");
    let out: Vec<&str> = r.stdout.split_whitespace().collect();
    assert_eq!(out[0], "1");
    assert_eq!(out[1], "default");
    assert_eq!(out[2].len(), 36, "an execution id: {r:?}");
    let r = sb.run(&[
        "run",
        "--namespace",
        "backup",
        "--",
        "sh",
        "-c",
        "echo $DBWARDEN_FENCING_TOKEN $DBWARDEN_NAMESPACE",
    ]);
    assert_eq!((r.code, r.stdout.trim()), (0, "1 backup"), "{r:?}");
    let r = sb.run(&["run", "--", "sh", "-c", "echo $DBWARDEN_FENCING_TOKEN"]);
    assert_eq!(r.stdout.trim(), "2", "tokens increase per namespace: {r:?}");

    let r = sb.run(&["run", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(r.code, 128 + 15, "{r:?}");
    assert!(r.stderr.contains("killed by signal 15 (SIGTERM)"), "{r:?}");
    let r = sb.run(&["run", "--", "no-such-program-xyz"]);
    assert_eq!(r.code, 127, "{r:?}");
    // The lock was released each time.
    let (code, v) = sb.status(&[]);
    assert_eq!((code, v["held"].as_bool()), (0, Some(false)), "{v}");
}

#[test]
fn shared_runs_overlap_and_a_writer_waits_for_all_of_them() {
    let sb = Sandbox::new();
    let log = sb.path().join("log");
    let r1 = timed(&log, "reader1", 2.0);
    let r2 = timed(&log, "reader2", 2.0);
    let w = timed(&log, "writer", 1.0);
    let late_reader = timed(&log, "reader3", 0.1);
    let a = sb.spawn(&args(&["run", "--shared"], &r1));
    let b = sb.spawn(&args(&["run", "--shared"], &r2));
    sb.wait_status(&[], Duration::from_secs(20), |v| {
        v["shared_holders"].as_array().is_some_and(|a| a.len() == 2)
    });
    let (code, v) = sb.status(&[]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("HEALTHY")), "{v}");
    // A writer with --wait 0 is refused at once, naming a shared holder.
    let r = sb.run(&args(&["run", "--wait", "0"], &w));
    assert_eq!(r.code, 3, "{r:?}");
    assert!(r.stderr.contains("shared by 2 holder(s)"), "{r:?}");
    // A writer that waits starts only after both readers ended.
    let writer = sb.spawn(&args(&["run", "--wait", "60s"], &w));
    // the readers end and the writer takes over; only then start another reader
    sb.wait_status(&[], Duration::from_secs(30), |v| {
        v["held"] == true && v["holder"]["command"] == "dbwarden run -- sh"
    });
    let reader3 = sb.spawn(&args(&["run", "--shared", "--wait", "60s"], &late_reader));
    for c in [a, b, writer, reader3] {
        let r = Run::wait(c, Duration::from_secs(90));
        assert_eq!(r.code, 0, "{r:?}");
    }
    let s = spans(&log);
    let get = |n: &str| {
        s.iter()
            .find(|x| x.0 == n)
            .cloned()
            .unwrap_or_else(|| panic!("{n} missing: {s:?}"))
    };
    let (r1, r2, w, r3) = (
        get("reader1"),
        get("reader2"),
        get("writer"),
        get("reader3"),
    );
    assert!(r1.1 < r2.2 && r2.1 < r1.2, "the readers overlapped: {s:?}");
    assert!(
        w.1 >= r1.2 && w.1 >= r2.2,
        "the writer started after both readers ended: {s:?}"
    );
    assert!(
        r3.1 >= w.2,
        "a reader started while the writer held waited for it: {s:?}"
    );
}

#[test]
fn eight_exclusive_runs_take_turns_and_never_overlap() {
    let sb = Sandbox::new();
    let log = sb.path().join("log");
    let children: Vec<_> = (0..8)
        .map(|i| {
            let cmd = timed(&log, &format!("run{i}"), 5.0);
            sb.spawn(&args(
                &["run", "-u", "sqlite://x.db", "--wait", "60s"],
                &cmd,
            ))
        })
        .collect();
    for c in children {
        let r = Run::wait(c, Duration::from_secs(120));
        assert_eq!(r.code, 0, "{r:?}");
    }
    let mut s = spans(&log);
    assert_eq!(s.len(), 8, "{s:?}");
    s.sort_by(|a, b| a.1.total_cmp(&b.1));
    for pair in s.windows(2) {
        assert!(pair[1].1 >= pair[0].2, "overlap: {pair:?}");
    }
    assert_eq!(
        sqlite_count(
            &sb.path().join("x.db"),
            "SELECT fencing_token FROM dbwarden_lock"
        ),
        8
    );
}

#[test]
fn a_lost_lock_sends_the_child_sigterm_and_run_exits_4() {
    let sb = Sandbox::new();
    let log = sb.path().join("log");
    let script = format!(
        "trap 'echo got-TERM >> {log}; exit 0' TERM; echo started >> {log}; while true; do sleep 0.1; done",
        log = log.display()
    );
    let holder = sb.spawn(&[
        "run",
        "--heartbeat-interval",
        "1s",
        "--lock-ttl",
        "3s",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    sb.wait_status(&[], Duration::from_secs(20), |v| {
        v["held"] == true && v["status"]["state"] == "RUNNING"
    });
    let t0 = std::time::Instant::now();
    let r = sb.run(&["unlock", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    let r = Run::wait(holder, Duration::from_secs(30));
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("lock lost"), "{r:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "within about one heartbeat interval: {:?}",
        t0.elapsed()
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "started\ngot-TERM\n"
    );
}

#[test]
fn skip_if_locked_does_not_run_the_command() {
    let sb = Sandbox::new();
    let log = sb.path().join("log");
    let hold = timed(&log, "holder", 3.0);
    let holder = sb.spawn(&args(&["run"], &hold));
    sb.wait_status(&[], Duration::from_secs(20), |v| v["held"] == true);
    let r = sb.run(&[
        "run",
        "--skip-if-locked",
        "--",
        "sh",
        "-c",
        "echo ran > skipped",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("skipped"), "{r:?}");
    assert!(!sb.path().join("skipped").exists());
    assert_eq!(Run::wait(holder, Duration::from_secs(30)).code, 0);
}
