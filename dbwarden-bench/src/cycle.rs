//! Benchmark 1, lock cycle cost: an uncontended acquire + release through the library, divided
//! by one trivial round trip on the same kind of connection.

use std::time::{Duration, Instant};

use dbwarden_core::wait::acquire;
use dbwarden_core::{HolderInfo, Wait};

use crate::engine::{Engine, Fresh};
use crate::error::Result;
use crate::report::{Row, Verdict};
use crate::stats::{ms, ratio, summarize};

pub const NAME: &str = "1. lock cycle ÷ round trip";
/// Goal: a cycle costs at most this many round trips (median).
const GOAL_ROUND_TRIPS: f64 = 4.0;
/// Stop counting cycles after this long, so one slow engine cannot eat the run's time budget
/// (the row then says how many cycles it got).
const TIME_CAP: Duration = Duration::from_secs(60);

pub async fn run(engine: &Engine, cycles: usize) -> Row {
    engine
        .with_fresh("cycle", async |fresh| measure(engine, fresh, cycles).await)
        .await
        .unwrap_or_else(|e| Row::not_measured(NAME, e.to_string()))
}

async fn measure(engine: &Engine, fresh: &Fresh, cycles: usize) -> Result<Row> {
    let settings = engine.settings(fresh);
    let lock = engine.lock(&settings)?;
    let hb = settings.heartbeat(lock.default_ttl())?;
    // The first cycles create the tables and open connections; not counted.
    let warm_up = (cycles / 20).max(10);
    let mut samples: Vec<Duration> = Vec::with_capacity(cycles);
    let mut started = Instant::now();
    for i in 0..warm_up + cycles {
        if i == warm_up {
            started = Instant::now();
        } else if i > warm_up && started.elapsed() > TIME_CAP {
            break;
        }
        let holder = HolderInfo::current(None, "dbwarden-bench lock-cycle");
        let t = Instant::now();
        let lease = acquire(lock.as_ref(), &holder, Wait::No, hb).await?;
        lease.release().await?;
        if i >= warm_up {
            samples.push(t.elapsed());
        }
    }
    let cycle = summarize(&samples);
    let rtt = summarize(&engine.round_trips(fresh, cycles).await?);
    let median_ratio = ratio(cycle.median, rtt.median);
    let p99_ratio = ratio(cycle.p99, rtt.median);
    Ok(Row::new(NAME)
        .result(format!("{median_ratio:.1}× median, {p99_ratio:.1}× p99"))
        .goal(
            format!("median ≤ {GOAL_ROUND_TRIPS}×"),
            Verdict::goal(median_ratio <= GOAL_ROUND_TRIPS),
        )
        .detail(format!(
            "cycle median {}, p99 {} ({} cycles{}); {} median {}, p99 {}",
            ms(cycle.median),
            ms(cycle.p99),
            cycle.n,
            if cycle.n < cycles {
                format!(", stopped at the {} s cap", TIME_CAP.as_secs())
            } else {
                String::new()
            },
            engine.kind.round_trip_name(),
            ms(rtt.median),
            ms(rtt.p99)
        )))
}
