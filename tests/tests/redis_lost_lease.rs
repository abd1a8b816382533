//! A holder paused (SIGSTOP) for longer than the ttl: its lease expires, another process takes
//! the lock with a higher token, and when the paused one resumes its lease reports lost, the
//! write it fences with its old token is rejected, and its late release changes nothing.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dbwarden_tests::redis_util::{Peek, Probe, redis_url};
use dbwarden_tests::{Sandbox, signal, unique_name};
use rustix::process::Signal;

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
fn a_holder_paused_past_its_ttl_loses_the_lease_and_its_fenced_write_is_rejected() {
    let url = redis_url();
    let mut peek = Peek::connect(&url);
    let sb = Sandbox::new();
    let ns = unique_name("paused");
    let data = format!("app:{{{ns}}}:data");
    let lock_key = format!("dbwarden:{{{ns}}}:lock");
    let limit = Duration::from_secs(30);

    // A takes the lease (ttl 1 s, renewed every 333 ms) and writes with its token.
    let mut a = probe(&["hold", &url, &ns, "1000", &data]);
    let t1: u64 = a.expect("acquired ", limit)["acquired ".len()..]
        .parse()
        .unwrap();
    assert!(peek.get(&data).unwrap().contains(&format!("token {t1}")));

    // Paused: no renewals, so the lease expires after its ttl.
    signal(a.pid(), Signal::STOP);
    let t0 = Instant::now();
    while peek.exists(&lock_key) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the paused holder's lease never expired"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, status) = sb.status(&["-u", &url, "--namespace", &ns]);
    assert_eq!(code, 0, "{status}");
    assert_eq!(status["verdict"], "AVAILABLE", "{status}");

    // B takes it with a higher token and writes.
    let mut b = probe(&["hold", &url, &ns, "5000", &data]);
    let t2: u64 = b.expect("acquired ", limit)["acquired ".len()..]
        .parse()
        .unwrap();
    assert!(t2 > t1, "token {t2} after {t1}");
    let b_wrote = peek.get(&data).unwrap();
    assert!(b_wrote.contains(&format!("pid {} with token {t2}", b.pid())));

    // A resumes: lost at its next renewal, its fenced write rejected, its release refused.
    signal(a.pid(), Signal::CONT);
    let lost = a.expect("lost: ", limit);
    assert!(lost.contains("expired or was taken over"), "{lost}");
    let write = a.expect("fenced write ", limit);
    assert!(write.starts_with("fenced write rejected"), "{write}");
    assert!(write.contains(&format!("token {t1} is stale")), "{write}");
    let release = a.expect("release", limit);
    assert!(release.starts_with("release refused"), "{release}");
    let (code, lines) = a.finish(limit);
    assert_eq!(code, 0, "{lines:?}");

    // B is untouched: its data, its lock, its token.
    assert_eq!(peek.get(&data).unwrap(), b_wrote);
    let (code, status) = sb.status(&["-u", &url, "--namespace", &ns]);
    assert_eq!(code, 0, "{status}");
    assert_eq!(status["verdict"], "HEALTHY", "{status}");
    assert_eq!(status["holder"]["pid"], b.pid(), "{status}");
    assert_eq!(status["fencing_token"], t2, "{status}");
    assert_eq!(peek.fence(&ns), Some(t2));
}

/// `RedisLock::run` cancels its closure at the next await once the lease is lost (here: removed
/// by an unlock) and returns `Error::Lost`; the closure's later steps never happen.
#[test]
fn run_cancels_the_work_when_the_lease_is_lost() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use dbwarden_core::{AuditRecord, HolderInfo, MigrationLock, Wait};
    use dbwarden_redis::{RedisClient, RedisLock};

    let url = redis_url();
    Peek::connect(&url);
    let ns = unique_name("cancel");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let lock = RedisLock::new(RedisClient::from_url(&url).unwrap(), &ns)
            .ttl(Duration::from_millis(900));
        let steps = Arc::new(AtomicU32::new(0));
        let done = steps.clone();
        let work = lock.run(Wait::No, |lease| async move {
            for _ in 0..100 {
                let _ = lease.check_fence().await;
                done.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let operator = async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let other = RedisLock::new(RedisClient::from_url(&url).unwrap(), &ns);
            let me = HolderInfo::current(None, "test unlock");
            let record = AuditRecord::new(other.namespace(), "forced_unlock", &me, "test");
            dbwarden_core::unlock::force(&other, None, &record)
                .await
                .unwrap();
            Instant::now()
        };
        let (result, unlocked_at) = tokio::join!(work, operator);
        let noticed = unlocked_at.elapsed();
        let e = result.unwrap_err();
        assert!(e.is_lost(), "{e}");
        // Renewals every 300 ms: the loss is noticed at the next one, the work stops there.
        assert!(noticed < Duration::from_secs(5), "{noticed:?}");
        let after = steps.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(steps.load(Ordering::SeqCst), after, "the work kept running");
        assert!(after < 100);
    });
}
