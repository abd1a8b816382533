//! A job that runs five times the ttl keeps its lease through renewals (every ttl/3): nobody
//! else gets in, every fenced write it makes succeeds, and it releases at the end, so a waiter
//! takes over at once instead of after another ttl.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dbwarden_tests::redis_util::{Peek, Probe, redis_url};
use dbwarden_tests::{Sandbox, unique_name};

fn probe(args: &[&str]) -> Probe {
    Probe::new(
        Command::new(env!("CARGO_BIN_EXE_redis_probe"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn redis_probe"),
    )
}

#[test]
fn a_job_running_five_ttls_keeps_its_lease_and_releases_at_the_end() {
    let url = redis_url();
    let mut peek = Peek::connect(&url);
    let sb = Sandbox::new();
    let ns = unique_name("renew");
    let data = format!("app:{{{ns}}}:data");
    let lock_key = format!("dbwarden:{{{ns}}}:lock");

    // ttl 1 s, a 5 s job with a fenced write every 100 ms.
    let mut job = probe(&["job", &url, &ns, "1000", "5000", &data]);
    let token: u64 = job.expect("running ", Duration::from_secs(30))["running ".len()..]
        .parse()
        .unwrap();
    let started = Instant::now();
    // A contender that waits for the lock the whole time.
    let waiter = probe(&["contend", &url, &ns, "1", "1000"]);

    // Throughout the job, lock-status names the job's process and token.
    let mut looks = 0;
    while started.elapsed() < Duration::from_millis(4500) {
        let (code, status) = sb.status(&[
            "-u",
            &url,
            "--namespace",
            &ns,
            "--lock-ttl",
            "1s",
            "--heartbeat-interval",
            "300ms",
        ]);
        assert_eq!(code, 0, "{status}");
        assert_eq!(status["verdict"], "HEALTHY", "{status}");
        assert_eq!(status["holder"]["pid"], job.pid(), "{status}");
        assert_eq!(status["fencing_token"], token, "{status}");
        let left = peek.query::<i64>(redis::cmd("PTTL").arg(&lock_key));
        assert!(left > 0 && left <= 1000, "pttl {left}");
        looks += 1;
        std::thread::sleep(Duration::from_millis(400));
    }
    // Looks spread over the job (several renewals apart); how many fit depends on the load.
    assert!(looks >= 2, "{looks} look(s)");

    let (code, lines) = job.finish(Duration::from_secs(30));
    let ran = started.elapsed();
    assert_eq!(code, 0, "{lines:?}");
    let done = lines
        .iter()
        .find(|l| l.starts_with("job done"))
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert!(done.contains(&format!("token={token} ")), "{done}");
    assert!(done.ends_with("lost=false"), "{done}");
    let writes: u64 = done
        .split_whitespace()
        .find_map(|w| w.strip_prefix("writes="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(writes >= 20, "{done}");
    assert!(ran >= Duration::from_secs(5), "{ran:?}");

    // `run` returned Ok only after its compare-and-delete succeeded; the waiter got the next token.
    let (code, lines) = waiter.finish(Duration::from_secs(30));
    assert_eq!(code, 0, "{lines:?}");
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("token "))
            .cloned()
            .collect::<Vec<_>>(),
        vec![format!("token {}", token + 1)]
    );
    assert!(!peek.exists(&lock_key));
    assert_eq!(peek.get(&data), Some((writes - 1).to_string()));
}
