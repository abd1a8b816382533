//! Benchmark 2, hand-over latency: from the moment a holder starts `release()` to the moment a
//! waiting contender's `acquire()` returns its lease. Nine tasks in this process, each with its
//! own lock object, take turns: one holds, eight wait. A task that has just released does not
//! queue again until someone else holds, so every counted acquisition is a hand-over to a task
//! that was already waiting.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dbwarden_core::wait::acquire;
use dbwarden_core::{HeartbeatConfig, HolderInfo, MigrationLock, Wait};
use tokio::sync::watch;

use crate::engine::{Engine, Fresh, Kind};
use crate::error::{Result, fail};
use crate::report::{Row, Verdict};
use crate::stats::{ms, summarize};

pub const NAME: &str = "2. hand-over latency";
/// Contenders waiting at each release.
pub const WAITERS: usize = 8;
/// How long each holder keeps the lock: long enough for the task that released last to be
/// waiting again.
const HOLD: Duration = Duration::from_millis(5);

struct Shared {
    /// Who released last, and when the release started.
    released: Mutex<Option<(usize, Instant)>>,
    samples: Mutex<Vec<Duration>>,
    /// Acquisitions so far.
    acquired: watch::Sender<usize>,
    target: usize,
}

pub async fn run(engine: &Engine, handovers: usize) -> Row {
    engine
        .with_fresh("handover", async |fresh| {
            measure(engine, fresh, handovers).await
        })
        .await
        .unwrap_or_else(|e| Row::not_measured(NAME, e.to_string()))
}

async fn measure(engine: &Engine, fresh: &Fresh, handovers: usize) -> Result<Row> {
    let settings = engine.settings(fresh);
    let mut locks = Vec::new();
    for _ in 0..=WAITERS {
        locks.push(Arc::<dyn MigrationLock>::from(engine.lock(&settings)?));
    }
    let poll = locks[0].max_poll_interval();
    let hb = settings.heartbeat(locks[0].default_ttl())?;
    // Tables and connections first, so the first hand-overs are not set-up.
    for lock in &locks {
        let holder = HolderInfo::current(None, "dbwarden-bench hand-over");
        acquire(
            lock.as_ref(),
            &holder,
            Wait::Up(Duration::from_secs(60)),
            hb,
        )
        .await?
        .release()
        .await?;
    }
    let shared = Arc::new(Shared {
        released: Mutex::new(None),
        samples: Mutex::new(Vec::with_capacity(handovers)),
        acquired: watch::channel(0).0,
        target: handovers,
    });
    let mut done = shared.acquired.subscribe();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, lock) in locks.into_iter().enumerate() {
        tasks.spawn(contender(i, lock, hb, shared.clone()));
    }
    let budget = Duration::from_secs(60) + (poll + Duration::from_millis(50)) * handovers as u32;
    let finished = tokio::time::timeout(budget, async {
        loop {
            if shared.samples.lock().map(|s| s.len()).unwrap_or(0) >= handovers {
                return Ok(());
            }
            tokio::select! {
                changed = done.changed() => if changed.is_err() { return Err(fail("contenders stopped")) },
                Some(joined) = tasks.join_next() => match joined {
                    Ok(Err(e)) => return Err(e),
                    Ok(Ok(())) => {}
                    Err(e) => return Err(fail(format!("contender panicked: {e}"))),
                },
            }
        }
    })
    .await;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    // Leases dropped by the aborted tasks free their primitives in the background.
    tokio::time::sleep(Duration::from_millis(200)).await;
    match finished {
        Ok(r) => r?,
        Err(_) => return Err(fail("hand-overs did not finish in time")),
    }

    let samples = shared.samples.lock().map_err(|_| fail("poisoned"))?.clone();
    let s = summarize(&samples);
    let (goal, verdict) = match engine.kind {
        Kind::Postgres | Kind::MariaDb | Kind::Redis => (
            "p50 ≤ 5 ms, p99 ≤ 50 ms".to_owned(),
            Verdict::goal(
                s.median <= Duration::from_millis(5) && s.p99 <= Duration::from_millis(50),
            ),
        ),
        Kind::ClickHouse => {
            let limit = poll + Duration::from_millis(10);
            (
                format!("p99 ≤ poll interval + 10 ms = {}", ms(limit)),
                Verdict::goal(s.p99 <= limit),
            )
        }
        // Every grant and release is a Raft write (a disk sync on a quorum): reported beside Redis.
        Kind::Sqlite | Kind::Etcd => ("report".to_owned(), Verdict::Reported),
    };
    Ok(Row::new(NAME)
        .result(format!("p50 {}, p99 {}", ms(s.median), ms(s.p99)))
        .goal(goal, verdict)
        .detail(format!(
            "{} hand-overs, {WAITERS} waiters, hold {}; max {}; waiter poll cap {}",
            s.n,
            ms(HOLD),
            ms(s.max),
            ms(poll)
        )))
}

async fn contender(
    me: usize,
    lock: Arc<dyn MigrationLock>,
    hb: HeartbeatConfig,
    shared: Arc<Shared>,
) -> Result<()> {
    let mut acquired = shared.acquired.subscribe();
    loop {
        let holder = HolderInfo::current(None, "dbwarden-bench hand-over");
        let lease = acquire(
            lock.as_ref(),
            &holder,
            Wait::Up(Duration::from_secs(600)),
            hb,
        )
        .await?;
        let now = Instant::now();
        if let Some((from, at)) = shared.released.lock().map_err(|_| fail("poisoned"))?.take()
            && from != me
            && let Ok(mut samples) = shared.samples.lock()
            && samples.len() < shared.target
        {
            samples.push(now - at);
        }
        let mut mine = 0;
        shared.acquired.send_modify(|n| {
            *n += 1;
            mine = *n;
        });
        tokio::time::sleep(HOLD).await;
        *shared.released.lock().map_err(|_| fail("poisoned"))? = Some((me, Instant::now()));
        lease.release().await?;
        // Queue again only once another contender holds.
        let _ =
            tokio::time::timeout(Duration::from_secs(30), acquired.wait_for(|n| *n > mine)).await;
    }
}
