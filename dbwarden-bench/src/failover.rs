//! Benchmark 6, failover: `kill -9` of a holder stuck in a long migration → a waiting runner
//! holds. The waiter's acquisition is detected by polling the library's `observe()` (what
//! `lock-status --json` reads) until the fencing token moves past the dead holder's.
//!
//! PostgreSQL, MariaDB and ClickHouse hold with `dbwarden migrate` of one long migration; Redis
//! keeps no migration tables and SQLite's lock does not depend on what the holder does, so there
//! the holder is `dbwarden run -- sleep 600`.

use std::path::Path;
use std::time::{Duration, Instant};

use dbwarden_core::{MigrationLock, Observation};
use rustix::process::{Pid, Signal, kill_process, kill_process_group};

use crate::engine::{Engine, Fresh, Kind};
use crate::error::{Result, fail};
use crate::process::{Invocation, Running, Tools};
use crate::report::{Row, Verdict};
use crate::stats::{ms, summarize};

pub const NAME: &str = "6. failover after kill -9";
/// How long the waiter waits before the holder is killed (its backoff reaches its cap).
const WAITER_SETTLE: Duration = Duration::from_secs(2);
/// The n-th kill comes n × this later still, so the kills fall at different phases of the
/// holder's heartbeat and of the server's own checks (MariaDB looks at a sleeping session's
/// client every 5 s): a fixed phase would measure one point of a periodic curve.
const KILL_SPREAD: Duration = Duration::from_millis(900);
const POLL: Duration = Duration::from_millis(5);

/// Short lease flags for the TTL engines: (ttl, heartbeat interval).
fn lease_flags(kind: Kind) -> Option<(Duration, Duration)> {
    match kind {
        Kind::Redis | Kind::Etcd => Some((Duration::from_secs(3), Duration::from_secs(1))),
        Kind::ClickHouse => Some((Duration::from_secs(6), Duration::from_secs(2))),
        _ => None,
    }
}

fn invocation(
    tools: &Tools,
    kind: Kind,
    fresh: &Fresh,
    long: Option<&Path>,
    wait: &str,
) -> Invocation {
    let ns = fresh.namespace.as_str();
    let mut inv = match long {
        Some(dir) => tools
            .dbwarden(&[
                "migrate",
                "-u",
                &fresh.url,
                "--namespace",
                ns,
                "--wait",
                wait,
            ])
            .arg("--migrations")
            .arg(dir),
        None => tools.dbwarden(&["run", "-u", &fresh.url, "--namespace", ns, "--wait", wait]),
    };
    if let Some((ttl, interval)) = lease_flags(kind) {
        inv = inv.args([
            "--lock-ttl".to_owned(),
            format!("{}ms", ttl.as_millis()),
            "--heartbeat-interval".to_owned(),
            format!("{}ms", interval.as_millis()),
        ]);
    }
    if long.is_none() {
        inv = inv.args(["--", "sleep", "600"]);
    }
    inv
}

async fn observe(lock: &dyn MigrationLock) -> Option<Observation> {
    tokio::time::timeout(Duration::from_secs(5), lock.observe())
        .await
        .ok()?
        .ok()
}

/// Poll until `until` holds for an observation, or `limit` passes.
async fn poll_until(
    lock: &dyn MigrationLock,
    limit: Duration,
    until: impl Fn(&Observation) -> bool,
) -> Option<(Instant, Observation)> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(o) = observe(lock).await
            && until(&o)
        {
            return Some((Instant::now(), o));
        }
        tokio::time::sleep(POLL).await;
    }
    None
}

fn kill_group(r: &Running) {
    if let Some(pid) = r.pid().and_then(|p| Pid::from_raw(p as i32)) {
        let _ = kill_process_group(pid, Signal::KILL);
    }
}

/// One failover; the time from the kill to the waiter holding.
async fn once(
    engine: &Engine,
    tools: &Tools,
    long: Option<&Path>,
    settle: Duration,
) -> Result<Duration> {
    engine
        .with_fresh("failover", async |fresh| {
            let settings = engine.settings(fresh);
            let lock = engine.lock(&settings)?;
            let mut holder = tools.spawn(
                &invocation(tools, engine.kind, fresh, long, "0"),
                false,
                true,
            )?;
            let mut waiter: Option<Running> = None;
            let result = async {
                let pid = holder.pid().ok_or_else(|| fail("holder exited at once"))?;
                let held = poll_until(lock.as_ref(), Duration::from_secs(30), |o| {
                    o.held && o.holder.as_ref().is_some_and(|h| h.pid == pid)
                })
                .await;
                let Some((_, first)) = held else {
                    return Err(fail("the holder never held the lock"));
                };
                let _ = first;
                // Let the long statement start.
                tokio::time::sleep(Duration::from_millis(500)).await;
                let w = tools.spawn(
                    &invocation(tools, engine.kind, fresh, long, "5m"),
                    false,
                    true,
                )?;
                waiter = Some(w);
                tokio::time::sleep(settle).await;
                if let Some(w) = waiter.as_mut()
                    && w.child.try_wait()?.is_some()
                {
                    return Err(fail("the waiter exited before the holder was killed"));
                }
                if holder.child.try_wait()?.is_some() {
                    return Err(fail("the holder exited before it was killed"));
                }
                // The token to beat is read now, not when the holder was first seen: the first
                // sighting can come before the claim wrote its token (ClickHouse writes the
                // lease before the status row), which made a failover look like 10 ms.
                let before = observe(lock.as_ref()).await;
                let token = match before {
                    Some(o) if o.held && o.holder.as_ref().is_some_and(|h| h.pid == pid) => {
                        o.fencing_token.unwrap_or(0)
                    }
                    other => {
                        return Err(fail(format!(
                            "the holder did not hold the lock when it was to be killed: {:?}",
                            other.map(|o| (o.held, o.holder.map(|h| h.pid), o.fencing_token))
                        )));
                    }
                };
                let killed = Instant::now();
                kill_process(
                    Pid::from_raw(pid as i32).ok_or_else(|| fail("bad pid"))?,
                    Signal::KILL,
                )
                .map_err(|e| fail(format!("kill -9 {pid}: {e}")))?;
                // Reap it at once, as a supervisor would: dbwarden-sqlite takes an unreaped (zombie)
                // pid for a live holder and keeps waiting.
                let _ = holder.child.wait().await;
                let limit = Duration::from_secs(30)
                    + lease_flags(engine.kind).map_or(Duration::ZERO, |(t, _)| t);
                match poll_until(lock.as_ref(), limit, |o| {
                    o.fencing_token.unwrap_or(0) > token
                })
                .await
                {
                    Some((at, _)) => Ok(at - killed),
                    None => Err(fail(format!(
                        "the waiter did not hold within {} of the kill",
                        ms(limit)
                    ))),
                }
            }
            .await;
            kill_group(&holder);
            let _ = holder.child.wait().await;
            if let Some(mut w) = waiter {
                kill_group(&w);
                let _ = w.child.wait().await;
            }
            drop(lock);
            result
        })
        .await
}

pub async fn run(engine: &Engine, tools: &Tools, long: Option<&Path>, repeats: usize) -> Row {
    let mut samples = Vec::new();
    for i in 0..repeats {
        match once(engine, tools, long, WAITER_SETTLE + KILL_SPREAD * i as u32).await {
            Ok(d) => samples.push(d),
            Err(e) => return Row::not_measured(NAME, e.to_string()),
        }
    }
    let s = summarize(&samples);
    let (goal, verdict) = match (engine.kind, lease_flags(engine.kind)) {
        (Kind::Postgres | Kind::MariaDb, _) => (
            "≤ 1000 ms (every run)".to_owned(),
            Verdict::goal(s.max <= Duration::from_secs(1)),
        ),
        (_, Some((ttl, interval))) => (
            format!("≤ ttl + interval = {} (every run)", ms(ttl + interval)),
            Verdict::goal(s.max <= ttl + interval),
        ),
        _ => ("report".to_owned(), Verdict::Reported),
    };
    let holder = match long {
        Some(_) => "holder: migrate in a long migration",
        None => "holder: run -- sleep 600",
    };
    let lease = lease_flags(engine.kind).map_or(String::new(), |(t, i)| {
        format!(", --lock-ttl {} --heartbeat-interval {}", ms(t), ms(i))
    });
    Row::new(NAME)
        .result(format!("median {}, max {}", ms(s.median), ms(s.max)))
        .goal(goal, verdict)
        .detail(format!(
            "{} kills; {holder}{lease}; the n-th kill {} + n × {} after the waiter started; detected by polling observe() every {}",
            s.n,
            ms(WAITER_SETTLE),
            ms(KILL_SPREAD),
            ms(POLL)
        ))
}
