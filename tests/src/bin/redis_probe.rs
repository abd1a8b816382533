//! A small application that uses the Redis lease the way a replica would, for the Redis tests.
//! Every line it prints on stdout is a fact the test checks.
//!
//! ```text
//! redis_probe contend URL NS COUNT TTL_MS   COUNT times: acquire, critical section, release
//! redis_probe hold    URL NS TTL_MS KEY     acquire, wait until the lease is lost, then try a
//!                                           fenced write to KEY with the old token
//! redis_probe job     URL NS TTL_MS RUN_MS KEY   run a RUN_MS job under `RedisLock::run`,
//!                                                 with a fenced write to KEY every 100 ms
//! ```
//!
//! The critical section of `contend`: `INCR app:{NS}:inside` must answer 1 (nobody else is
//! inside), `RPUSH app:{NS}:order <token>` records the order in which holders held the lock,
//! the fence must still be ours, then `DECR`. It prints `token N` per acquisition and
//! `OVERLAP ...` / `FENCE ...` lines when something is wrong.

use std::io::Write;
use std::time::{Duration, Instant};

use dbwarden_core::Wait;
use dbwarden_redis::{RedisClient, RedisLock};
use dbwarden_tests::redis_util::CriticalSection;

fn say(line: impl AsRef<str>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", line.as_ref());
    let _ = out.flush();
}

fn arg(args: &[String], i: usize, what: &str) -> String {
    args.get(i)
        .cloned()
        .unwrap_or_else(|| panic!("redis_probe: missing {what}"))
}

fn num(args: &[String], i: usize, what: &str) -> u64 {
    arg(args, i, what)
        .parse()
        .unwrap_or_else(|_| panic!("redis_probe: {what} must be a number"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = arg(&args, 1, "mode");
    let url = arg(&args, 2, "url");
    let ns = arg(&args, 3, "namespace");
    let client = RedisClient::from_url(&url).unwrap_or_else(|e| panic!("{e}"));
    let code = match mode.as_str() {
        "contend" => {
            let ttl = Duration::from_millis(num(&args, 5, "ttl_ms"));
            let lock = RedisLock::new(client, &ns).ttl(ttl);
            contend(&lock, &url, &ns, num(&args, 4, "count")).await
        }
        "hold" => {
            let ttl = Duration::from_millis(num(&args, 4, "ttl_ms"));
            let lock = RedisLock::new(client, &ns).ttl(ttl);
            hold(&lock, &arg(&args, 5, "key")).await
        }
        "job" => {
            let ttl = Duration::from_millis(num(&args, 4, "ttl_ms"));
            let lock = RedisLock::new(client, &ns).ttl(ttl);
            let run = Duration::from_millis(num(&args, 5, "run_ms"));
            job(&lock, run, &arg(&args, 6, "key")).await
        }
        other => panic!("redis_probe: unknown mode {other}"),
    };
    std::process::exit(code);
}

async fn contend(lock: &RedisLock, url: &str, ns: &str, count: u64) -> i32 {
    let mut section = CriticalSection::open(url, ns).await;
    let mut bad = 0;
    for _ in 0..count {
        let lease = match lock.acquire(Wait::Up(Duration::from_secs(240))).await {
            Ok(l) => l,
            Err(e) => {
                say(format!("ERROR acquire: {e}"));
                return 1;
            }
        };
        let token = lease.fencing_token();
        for problem in section.enter(lock, token).await {
            say(problem);
            bad += 1;
        }
        say(format!("token {token}"));
        if let Err(e) = lease.release().await {
            say(format!("RELEASE token {token}: {e}"));
            bad += 1;
        }
    }
    say("done");
    i32::from(bad > 0)
}

async fn hold(lock: &RedisLock, key: &str) -> i32 {
    let lease = match lock.acquire(Wait::Up(Duration::from_secs(60))).await {
        Ok(l) => l,
        Err(e) => {
            say(format!("ERROR acquire: {e}"));
            return 1;
        }
    };
    let token = lease.fencing_token();
    match lock
        .fenced_set(
            token,
            key,
            format!("written by pid {} with token {token}", std::process::id()),
        )
        .await
    {
        Ok(()) => say(format!("acquired {token}")),
        Err(e) => {
            say(format!("ERROR first fenced write: {e}"));
            return 1;
        }
    }
    let reason = tokio::select! {
        r = lease.lost() => r,
        _ = tokio::time::sleep(Duration::from_secs(90)) => {
            say("never lost");
            return 1;
        }
    };
    say(format!("lost: {reason}"));
    match lock
        .fenced_set(
            token,
            key,
            format!(
                "STALE write by pid {} with token {token}",
                std::process::id()
            ),
        )
        .await
    {
        Ok(()) => say("fenced write ACCEPTED"),
        Err(e) if e.is_lost() => say(format!("fenced write rejected: {e}")),
        Err(e) => say(format!("fenced write failed otherwise: {e}")),
    }
    match lease.release().await {
        Ok(()) => say("released"),
        Err(e) => say(format!("release refused: {e}")),
    }
    0
}

async fn job(lock: &RedisLock, run: Duration, key: &str) -> i32 {
    let key = key.to_owned();
    let result = lock
        .run(Wait::Up(Duration::from_secs(60)), |lease| async move {
            say(format!("running {}", lease.fencing_token()));
            let t0 = Instant::now();
            let mut writes = 0u64;
            while t0.elapsed() < run {
                lock.fenced_set(lease.fencing_token(), &key, writes.to_string())
                    .await
                    .map_err(|e| format!("write {writes}: {e}"))?;
                writes += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok::<_, String>((lease.fencing_token(), writes, lease.is_lost()))
        })
        .await;
    match result {
        Ok(Ok((token, writes, lost))) => {
            say(format!(
                "job done token={token} writes={writes} lost={lost}"
            ));
            0
        }
        Ok(Err(e)) => {
            say(format!("job failed: {e}"));
            1
        }
        Err(e) => {
            say(format!("job error: {e}"));
            1
        }
    }
}
