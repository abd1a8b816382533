//! `dbwarden run --shared` on the lock-only engines: readers overlap (Redis: a sorted set changed
//! only by Lua scripts; etcd: a key per reader, each on its own lease), a writer waits until all
//! have left, and lock-status lists every shared holder.

use std::time::Duration;

use dbwarden_tests::{
    Run, Sandbox, etcd_url, redis_util::redis_url, spans, timed_script, unique_name,
};

#[test]
fn redis() {
    shared_runs_overlap_and_a_writer_waits_for_all_of_them(&redis_url());
}

#[test]
fn etcd() {
    shared_runs_overlap_and_a_writer_waits_for_all_of_them(&etcd_url());
}

fn shared_runs_overlap_and_a_writer_waits_for_all_of_them(url: &str) {
    let sb = Sandbox::new();
    let ns = unique_name("shared");
    let log = sb.path().join("log");
    let base = ["-u", url, "--namespace", ns.as_str()];
    let run = |extra: &[&str], script: &str| {
        let mut a = vec!["run"];
        a.extend_from_slice(&base);
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--", "sh", "-c", script]);
        a.iter().map(|s| s.to_string()).collect::<Vec<String>>()
    };
    let spawn = |args: Vec<String>| sb.spawn(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let a = spawn(run(&["--shared"], &timed_script(&log, "reader1", 2.0)));
    let b = spawn(run(&["--shared"], &timed_script(&log, "reader2", 2.0)));
    let t0 = std::time::Instant::now();
    loop {
        let (_, v) = sb.status(&base);
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
    let refused = run(&["--wait", "0"], &timed_script(&log, "refused", 0.1));
    let r = sb.run(&refused.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(r.code, 3, "a writer is refused while readers share: {r:?}");
    assert!(r.stderr.contains("shared"), "{r:?}");
    let writer = spawn(run(&["--wait", "60s"], &timed_script(&log, "writer", 0.5)));
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
    assert!(
        s.iter().all(|x| x.0 != "refused"),
        "the refused writer never ran: {s:?}"
    );
}
