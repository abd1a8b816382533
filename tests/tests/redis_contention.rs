//! Many holders contend for one Redis lease: 8 processes × 200 acquisitions plus 50 tokio tasks
//! in this process, all at once, on a single server and on a Redis Cluster. Never two holders
//! at once (a shared counter inside the critical section is always 1), and the fencing tokens
//! strictly increase in the order the holders held the lock. A waiter is woken by the release.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dbwarden_core::Wait;
use dbwarden_redis::{RedisClient, RedisLock};
use dbwarden_tests::redis_util::{
    CriticalSection, Peek, Probe, cluster_url, redis_url, sentinel_url,
};
use dbwarden_tests::unique_name;

const PROCESSES: usize = 8;
const PER_PROCESS: usize = 200;
const TASKS: usize = 50;
const PER_TASK: usize = 10;

fn strictly_increasing(xs: &[u64]) -> bool {
    xs.windows(2).all(|w| w[0] < w[1])
}

fn contention(url: &str) {
    let ns = unique_name("contend");
    let mut peek = Peek::connect(url);
    let t0 = Instant::now();
    let probes: Vec<Probe> = (0..PROCESSES)
        .map(|_| {
            Probe::new(
                Command::new(env!("CARGO_BIN_EXE_redis_probe"))
                    .args(["contend", url, &ns, &PER_PROCESS.to_string(), "10000"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("spawn redis_probe"),
            )
        })
        .collect();

    // Meanwhile, 50 tasks in this process share one RedisLock (one connection, one subscription).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let task_results: Vec<(Vec<u64>, Vec<String>)> = rt.block_on(async {
        let lock =
            RedisLock::new(RedisClient::from_url(url).unwrap(), &ns).ttl(Duration::from_secs(10));
        let handles: Vec<_> = (0..TASKS)
            .map(|_| {
                let lock = lock.clone();
                let url = url.to_owned();
                let ns = ns.clone();
                tokio::spawn(async move {
                    let mut section = CriticalSection::open(&url, &ns).await;
                    let mut tokens = Vec::new();
                    let mut problems = Vec::new();
                    for _ in 0..PER_TASK {
                        let lease = lock
                            .acquire(Wait::Up(Duration::from_secs(240)))
                            .await
                            .expect("acquire within 240s");
                        let token = lease.fencing_token();
                        problems.extend(section.enter(&lock, token).await);
                        tokens.push(token.0);
                        if let Err(e) = lease.release().await {
                            problems.push(format!("RELEASE token {token}: {e}"));
                        }
                    }
                    (tokens, problems)
                })
            })
            .collect();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.expect("task"));
        }
        out
    });

    let mut all: Vec<u64> = Vec::new();
    let mut owner = std::collections::HashMap::new();
    for (i, probe) in probes.into_iter().enumerate() {
        let (code, lines) = probe.finish(Duration::from_secs(240));
        let problems: Vec<&String> = lines
            .iter()
            .filter(|l| !l.starts_with("token ") && *l != "done")
            .collect();
        assert!(problems.is_empty(), "process {i}: {problems:?}");
        assert_eq!(code, 0, "process {i}: {lines:?}");
        let tokens: Vec<u64> = lines
            .iter()
            .filter_map(|l| l.strip_prefix("token "))
            .map(|t| t.parse().unwrap())
            .collect();
        assert_eq!(tokens.len(), PER_PROCESS, "process {i}");
        assert!(
            strictly_increasing(&tokens),
            "process {i} saw tokens go backwards: {tokens:?}"
        );
        owner.extend(tokens.iter().map(|t| (*t, i)));
        all.extend(tokens);
    }
    for (i, (tokens, problems)) in task_results.iter().enumerate() {
        assert!(problems.is_empty(), "task {i}: {problems:?}");
        assert_eq!(tokens.len(), PER_TASK);
        assert!(strictly_increasing(tokens), "task {i}: {tokens:?}");
        owner.extend(tokens.iter().map(|t| (*t, PROCESSES + i)));
        all.extend(tokens);
    }
    let elapsed = t0.elapsed();
    let total = PROCESSES * PER_PROCESS + TASKS * PER_TASK;
    assert_eq!(all.len(), total);
    let distinct: HashSet<u64> = all.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        total,
        "a fencing token was handed out twice"
    );

    // The order in which holders were inside the critical section is the order of their tokens.
    let order: Vec<u64> = peek
        .list(&format!("app:{{{ns}}}:order"))
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(order.len(), total);
    assert!(
        strictly_increasing(&order),
        "holders did not see strictly increasing tokens in holding order"
    );
    assert_eq!(
        peek.get(&format!("app:{{{ns}}}:inside")).as_deref(),
        Some("0")
    );
    assert_eq!(peek.fence(&ns), order.last().copied());
    assert!(
        !peek.exists(&format!("dbwarden:{{{ns}}}:lock")),
        "lock left behind"
    );
    // Handed between processes and tasks, not run in turns.
    let switches = order
        .windows(2)
        .filter(|w| owner.get(&w[0]) != owner.get(&w[1]))
        .count();
    eprintln!(
        "{url}: {total} acquisitions by {PROCESSES} processes and {TASKS} tasks in {elapsed:?} ({:?} each); tokens 1..={}; the lock changed hands between processes/tasks {switches} times",
        elapsed / total as u32,
        order.last().unwrap()
    );
}

#[test]
fn eight_processes_and_fifty_tasks_never_hold_the_lease_at_once() {
    contention(&redis_url());
}

#[test]
fn eight_processes_and_fifty_tasks_never_hold_at_once_on_a_redis_cluster() {
    contention(&cluster_url());
}

/// Behind Sentinel every grant is confirmed on the replica (`WAIT`) before it counts.
#[test]
fn eight_processes_and_fifty_tasks_never_hold_at_once_behind_sentinel() {
    contention(&sentinel_url());
}

/// A waiter that has backed off to long polls still takes over within milliseconds of a
/// release, because the release is announced on the pub/sub channel.
#[test]
fn a_waiter_takes_over_within_milliseconds_of_a_release() {
    handover(&redis_url());
}

#[test]
fn a_waiter_on_a_redis_cluster_takes_over_within_milliseconds_of_a_release() {
    handover(&cluster_url());
}

#[test]
fn a_waiter_behind_sentinel_takes_over_within_milliseconds_of_a_release() {
    handover(&sentinel_url());
}

fn handover(url: &str) {
    let url = url.to_owned();
    Peek::connect(&url);
    let ns = unique_name("handover");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let delays: Vec<Duration> = rt.block_on(async {
        let holder = RedisLock::new(RedisClient::from_url(&url).unwrap(), &ns);
        let waiter = RedisLock::new(RedisClient::from_url(&url).unwrap(), &ns);
        let mut delays = Vec::new();
        for _ in 0..6 {
            let lease = holder.acquire(Wait::No).await.unwrap();
            let w = waiter.clone();
            let waiting = tokio::spawn(async move {
                let lease = w.acquire(Wait::Up(Duration::from_secs(30))).await.unwrap();
                let at = Instant::now();
                lease.release().await.unwrap();
                at
            });
            // Long enough for the waiter's backoff to reach its longest pauses (up to 1 s).
            tokio::time::sleep(Duration::from_millis(3000)).await;
            let released = Instant::now();
            lease.release().await.unwrap();
            let acquired = waiting.await.unwrap();
            delays.push(acquired.saturating_duration_since(released));
        }
        delays
    });
    let mut sorted = delays.clone();
    sorted.sort();
    eprintln!("{url}: hand-over delays: {delays:?}");
    // Polling alone would wait half a pause on average here, ~400 ms; a woken waiter takes a
    // few milliseconds, and the bound leaves a loaded machine room.
    assert!(
        sorted[sorted.len() / 2] < Duration::from_millis(300),
        "hand-over took {delays:?}: the waiter was not woken by the release"
    );
}
