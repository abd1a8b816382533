//! The lease: what a successful acquire returns. It carries the fencing token, the holder and a
//! lost-signal, runs the heartbeat, and frees the lock when dropped on every path (error, panic
//! unwinding, cancellation of the future that owns it).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::{
    Beat, Error, FencingToken, Grant, Heartbeat, HeldLock, HolderInfo, MigrationStore, StatusRow,
};

/// Heartbeat cadence and the staleness threshold (docs/design.md §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatConfig {
    pub interval: Duration,
    pub ttl: Duration,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        HeartbeatConfig {
            interval: Duration::from_secs(15),
            ttl: Duration::from_secs(45),
        }
    }
}

impl HeartbeatConfig {
    /// Reject a zero interval or ttl, and `3 × interval > ttl` (a beat or two may fail before
    /// the lease is declared lost).
    pub fn validate(&self) -> Result<(), Error> {
        if self.ttl.is_zero() {
            return Err(Error::usage("lock_ttl must be greater than 0"));
        }
        if self.interval.is_zero() {
            return Err(Error::usage("heartbeat_interval must be greater than 0"));
        }
        if self.interval.saturating_mul(3) > self.ttl {
            return Err(Error::usage(format!(
                "heartbeat_interval ({}) × 3 exceeds lock_ttl ({}): lower the interval or raise the ttl",
                crate::duration::human(self.interval),
                crate::duration::human(self.ttl)
            )));
        }
        Ok(())
    }

    /// [`validate`](Self::validate), and a ttl no shorter than `min`, the shortest lease the
    /// `engine`'s server grants reliably.
    pub fn validate_lease(&self, engine: &str, min: Duration) -> Result<(), Error> {
        if !self.ttl.is_zero() && self.ttl < min {
            return Err(Error::usage(format!(
                "the {engine} lease ttl {} is too short: use at least {}",
                crate::duration::human(self.ttl),
                crate::duration::human(min)
            )));
        }
        self.validate()
    }

    /// A lease is lost after this long without a successful beat.
    pub fn grace(&self) -> Duration {
        self.ttl.saturating_sub(self.interval)
    }
}

/// When the last heartbeat succeeded, for leases that only a TTL protects (grade C).
#[derive(Debug)]
struct Freshness {
    last_ok: std::sync::Mutex<Instant>,
    grace: Duration,
}

impl Freshness {
    /// A beat that started at `at` succeeded.
    fn touch_at(&self, at: Instant) {
        if let Ok(mut t) = self.last_ok.lock() {
            *t = (*t).max(at);
        }
    }

    fn expired(&self) -> Option<Duration> {
        let since = self.last_ok.lock().ok()?.elapsed();
        (since >= self.grace).then_some(since)
    }
}

/// Where a journaled migration stands while none of its statements is in flight: statement
/// `index` of migration `version` has not been sent. The runner keeps it up to date around
/// every send (docs/design.md §10.3); when the lease is lost there, the holder knows what its
/// successor cannot, and says so with one fenced write before it lets go ([`Unsent`] is read
/// by `runner::finish`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unsent {
    pub version: i64,
    /// The migration is a down file (`dbwarden revert`), found beside its forward one.
    pub down: bool,
    pub index: usize,
    /// The `RUNNING` row at `index` was confirmed written; `false` while that write may still
    /// be in flight (the row is then written again before it is closed).
    pub begun: bool,
}

/// The holder's [`Unsent`] position, shared between the lease and the work done under it.
#[derive(Debug, Clone, Default)]
pub(crate) struct UnsentMark(Arc<std::sync::Mutex<Option<Unsent>>>);

impl UnsentMark {
    pub(crate) fn set(&self, at: Option<Unsent>) {
        if let Ok(mut cur) = self.0.lock() {
            *cur = at;
        }
    }

    pub(crate) fn get(&self) -> Option<Unsent> {
        self.0.lock().ok().and_then(|cur| *cur)
    }
}

/// Resolves when the lease is lost; cheap to clone and to poll.
#[derive(Debug, Clone)]
pub struct LostSignal(
    watch::Receiver<Option<String>>,
    Option<Arc<Freshness>>,
    /// The lease this one is held inside ([`Lease::tie_to`]): lost with it, checked in the
    /// same call (so its freshness counts at once, not when its heartbeat next runs).
    Option<Arc<LostSignal>>,
);

impl LostSignal {
    /// A signal that never fires (for code paths without a lease).
    pub fn never() -> Self {
        let (tx, rx) = watch::channel(None);
        std::mem::forget(tx);
        LostSignal(rx, None, None)
    }

    /// Lost: a beat found the lock gone, or (for a TTL lease) no beat has succeeded for
    /// `ttl − interval` — e.g. the process was paused past its lease and has just resumed,
    /// before its heartbeat could notice.
    pub fn is_lost(&self) -> bool {
        self.reason().is_some()
    }

    /// Why the lease was lost, once it is.
    pub fn reason(&self) -> Option<String> {
        if let Some(r) = self.0.borrow().clone() {
            return Some(r);
        }
        if let Some(since) = self.1.as_ref().and_then(|f| f.expired()) {
            return Some(format!(
                "no successful heartbeat for {}; the lease may have expired",
                crate::duration::human(since)
            ));
        }
        let outer = self.2.as_ref()?.reason()?;
        Some(format!("outer lease lost: {outer}"))
    }

    /// `Err(Error::Lost)` once lost: call before every statement.
    pub fn check(&self) -> Result<(), Error> {
        match self.reason() {
            Some(r) => Err(Error::Lost(r)),
            None => Ok(()),
        }
    }

    /// Wait until the lease is lost.
    pub async fn lost(&self) -> String {
        let mut rx = self.0.clone();
        loop {
            if let Some(r) = rx.borrow_and_update().clone() {
                return r;
            }
            if rx.changed().await.is_err() {
                // The lease (and its heartbeat) is gone without a loss: never resolves.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// A held lock. Dropping it frees the lock.
pub struct Lease {
    held: Option<Box<dyn HeldLock>>,
    token: FencingToken,
    holder: HolderInfo,
    previous: Option<StatusRow>,
    lost_tx: Arc<watch::Sender<Option<String>>>,
    lost: LostSignal,
    heartbeat: Option<JoinHandle<()>>,
    /// Forwarders from outer leases (see [`Lease::tie_to`]).
    ties: Vec<JoinHandle<()>>,
    unsent: UnsentMark,
}

impl Lease {
    /// Wrap a freshly taken primitive and start its heartbeat.
    pub fn start(grant: Grant, holder: HolderInfo, config: HeartbeatConfig) -> Self {
        Self::start_graded(grant, holder, config, crate::Grade::A)
    }

    /// [`Lease::start`] for a lock of `grade`: a grade C lease (only a TTL frees it) is also
    /// lost once no beat has succeeded for `ttl − interval`, checked at every
    /// [`LostSignal::check`] and not only when the next beat fails.
    pub fn start_graded(
        grant: Grant,
        holder: HolderInfo,
        config: HeartbeatConfig,
        grade: crate::Grade,
    ) -> Self {
        Self::start_at(grant, holder, config, grade, Instant::now())
    }

    /// [`Lease::start_graded`] for a primitive whose attempt began at `began`: the server set
    /// its copy of the lease no earlier, so `ttl − interval` is counted from there (on Redis
    /// behind Sentinel the answer waits for a replica, up to half an interval).
    pub fn start_at(
        grant: Grant,
        holder: HolderInfo,
        config: HeartbeatConfig,
        grade: crate::Grade,
        began: Instant,
    ) -> Self {
        let (tx, rx) = watch::channel(None);
        let lost_tx = Arc::new(tx);
        let fresh = (grade == crate::Grade::C).then(|| {
            Arc::new(Freshness {
                last_ok: std::sync::Mutex::new(began),
                grace: config.grace(),
            })
        });
        let task = tokio::spawn(heartbeat_loop(
            grant.heartbeat,
            config,
            lost_tx.clone(),
            fresh.clone(),
            began,
        ));
        Lease {
            token: grant.token,
            previous: grant.previous,
            held: Some(grant.held),
            holder,
            lost: LostSignal(rx, fresh, None),
            lost_tx,
            heartbeat: Some(task),
            ties: Vec::new(),
            unsent: UnsentMark::default(),
        }
    }

    /// Lose this lease too when `outer` is lost: for a lock held inside another one (the
    /// database lock of `migrate --redis-url` inside the Redis lease), so the run stops before
    /// its next statement when either is lost.
    pub fn tie_to(&mut self, outer: LostSignal) {
        self.lost.2 = Some(Arc::new(outer.clone()));
        let tx = self.lost_tx.clone();
        self.ties.push(tokio::spawn(async move {
            let reason = outer.lost().await;
            tx.send_if_modified(|cur| {
                if cur.is_none() {
                    *cur = Some(format!("outer lease lost: {reason}"));
                    true
                } else {
                    false
                }
            });
        }));
    }

    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    pub fn holder(&self) -> &HolderInfo {
        &self.holder
    }

    /// The status row as it was found before this acquire.
    pub fn previous(&self) -> Option<&StatusRow> {
        self.previous.as_ref()
    }

    pub fn lost_signal(&self) -> LostSignal {
        self.lost.clone()
    }

    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// Resolves if the lease is lost.
    pub async fn lost(&self) -> String {
        self.lost.lost().await
    }

    /// Declare the lease lost (e.g. a fenced write was rejected).
    pub fn mark_lost(&self, reason: impl Into<String>) {
        let reason = reason.into();
        self.lost_tx.send_if_modified(|cur| {
            if cur.is_none() {
                *cur = Some(reason);
                true
            } else {
                false
            }
        });
    }

    pub fn store(&mut self) -> Option<&mut (dyn MigrationStore + 'static)> {
        self.held.as_mut().and_then(|h| h.store())
    }

    /// Where the work under this lease stands when no statement of it is in flight.
    pub(crate) fn unsent_mark(&self) -> UnsentMark {
        self.unsent.clone()
    }

    /// A shared holder's read of the status row and history on its session (see
    /// [`crate::HeldLock::read_applied`]).
    pub async fn read_applied(&mut self) -> Option<Result<crate::lock::Snapshot, Error>> {
        match self.held.as_mut() {
            Some(h) => h.read_applied().await,
            None => None,
        }
    }

    /// Stop the heartbeat and free the lock, reporting any failure.
    pub async fn release(mut self) -> Result<(), Error> {
        if let Some(task) = self.heartbeat.take() {
            task.abort();
        }
        for tie in self.ties.drain(..) {
            tie.abort();
        }
        match self.held.take() {
            Some(held) => held.release().await,
            None => Ok(()),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(task) = self.heartbeat.take() {
            task.abort();
        }
        for tie in self.ties.drain(..) {
            tie.abort();
        }
        // `held` drops here; each engine frees its primitive in its own Drop.
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("token", &self.token)
            .field("holder", &self.holder)
            .field("lost", &self.lost.reason())
            .finish()
    }
}

/// Beat every `interval`; fire the lost-signal when a beat finds the lock gone, or once no beat
/// has succeeded for `ttl − interval`, measured from the *start* of the last successful beat
/// (the server renewed the lease no earlier than that) and fired at that moment, not at the next
/// beat's turn: a `dbwarden run` child is stopped before the lease can expire on the server, even
/// when `ttl` is a multiple of `interval` and failing beats fall due just after the deadline.
async fn heartbeat_loop(
    beater: Box<dyn Heartbeat>,
    config: HeartbeatConfig,
    lost: Arc<watch::Sender<Option<String>>>,
    fresh: Option<Arc<Freshness>>,
    began: Instant,
) {
    let grace = config.grace();
    let mut last_ok = began;
    let mut next = began + config.interval;
    let mut failure: Option<String> = None;
    let lose = |since: Instant, failure: &str| {
        let _ = lost.send(Some(format!(
            "no successful heartbeat for {} (last failure: {failure})",
            crate::duration::human(since.elapsed())
        )));
    };
    loop {
        let lose_at = last_ok + grace;
        // A beat due at the deadline itself still runs (with `ttl = 3 × interval`, one failed
        // beat in a row is tolerated, as `HeartbeatConfig::validate` promises).
        if let Some(f) = &failure
            && lose_at < next
        {
            tokio::time::sleep_until(lose_at).await;
            lose(last_ok, f);
            return;
        }
        tokio::time::sleep_until(next).await;
        let started = Instant::now();
        // After a pause (SIGSTOP) longer than an interval: one beat now, then on the interval
        // again, not the missed beats back to back.
        next = (next + config.interval).max(started + config.interval / 2);
        // After a failure, a beat may answer until the deadline, or for half an interval if it
        // is due at the deadline: either way the holder stops at least half an interval before
        // the server's copy of the lease (renewed no earlier than `last_ok`) can expire. Without
        // a failure a beat gets its whole turn: a grade A holder resumed from a pause still
        // holds its session's lock, and its beat says so.
        let deadline = match failure {
            Some(_) => lose_at
                .saturating_duration_since(started)
                .max(config.interval / 2),
            None => grace,
        }
        .min(config.interval);
        let outcome = tokio::time::timeout(deadline, beater.beat()).await;
        let failed = match outcome {
            Ok(Ok(Beat::Alive)) => {
                last_ok = started;
                if let Some(f) = &fresh {
                    f.touch_at(started);
                }
                failure = None;
                continue;
            }
            Ok(Ok(Beat::Gone(reason))) => {
                let _ = lost.send(Some(reason));
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!(
                "heartbeat did not answer within {}",
                crate::duration::human(deadline)
            ),
        };
        tracing::warn!(failure = %failed, "heartbeat failed");
        // Lost at the top of the loop: at once if the deadline has passed and no beat is due
        // at it; otherwise the beat due at the deadline gets its half interval first (a beat
        // that hung until the deadline is retried once, as with `ttl = 3 × interval`).
        failure = Some(failed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;

    use super::*;

    /// A scripted heartbeat: each beat pops the next outcome (the last one repeats).
    struct Scripted {
        outcomes: Mutex<Vec<Result<Beat, ()>>>,
        calls: Arc<AtomicUsize>,
        hang: bool,
    }

    #[async_trait]
    impl Heartbeat for Scripted {
        async fn beat(&self) -> Result<Beat, Error> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.hang {
                std::future::pending::<()>().await;
            }
            let mut o = self.outcomes.lock().unwrap();
            let next = if o.len() > 1 {
                o.remove(0)
            } else {
                o[0].clone()
            };
            next.map_err(|_| Error::unreachable("test", "connection refused"))
        }
    }

    fn spawn(outcomes: Vec<Result<Beat, ()>>, hang: bool) -> (LostSignal, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let beater = Box::new(Scripted {
            outcomes: Mutex::new(outcomes),
            calls: calls.clone(),
            hang,
        });
        let (tx, rx) = watch::channel(None);
        let cfg = HeartbeatConfig {
            interval: Duration::from_secs(15),
            ttl: Duration::from_secs(45),
        };
        tokio::spawn(heartbeat_loop(
            beater,
            cfg,
            Arc::new(tx),
            None,
            Instant::now(),
        ));
        (LostSignal(rx, None, None), calls)
    }

    #[tokio::test(start_paused = true)]
    async fn healthy_beats_never_lose_the_lease() {
        let (lost, calls) = spawn(vec![Ok(Beat::Alive)], false);
        tokio::time::sleep(Duration::from_secs(3599)).await;
        assert!(!lost.is_lost());
        assert_eq!(calls.load(Ordering::SeqCst), 239);
    }

    #[tokio::test(start_paused = true)]
    async fn a_beat_that_finds_the_lock_gone_fires_at_once() {
        let (lost, _) = spawn(
            vec![Ok(Beat::Alive), Ok(Beat::Gone("taken over".into()))],
            false,
        );
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert!(!lost.is_lost());
        let start = Instant::now();
        let reason = lost.lost().await;
        assert_eq!(reason, "taken over");
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_tolerated_until_ttl_minus_interval() {
        // beat at 15 ok, then failures from 30 on: lost once 30s passed since 15 -> at 45.
        let (lost, _) = spawn(vec![Ok(Beat::Alive), Err(())], false);
        let start = Instant::now();
        lost.lost().await;
        assert_eq!(start.elapsed(), Duration::from_secs(45));
        // one failure after a success does not lose it
        let (lost2, _) = spawn(vec![Ok(Beat::Alive), Err(()), Ok(Beat::Alive)], false);
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!lost2.is_lost());
    }

    /// Beats that succeed after `ok_takes`, then fail at once from the `fail_from`-th on.
    struct SlowThenFailing {
        ok_takes: Duration,
        fail_from: usize,
        calls: AtomicUsize,
    }

    #[async_trait]
    impl Heartbeat for SlowThenFailing {
        async fn beat(&self) -> Result<Beat, Error> {
            if self.calls.fetch_add(1, Ordering::SeqCst) + 1 >= self.fail_from {
                return Err(Error::unreachable("test", "connection refused"));
            }
            tokio::time::sleep(self.ok_takes).await;
            Ok(Beat::Alive)
        }
    }

    async fn lost_after(interval: u64, ttl: u64, ok_takes: Duration, fail_from: usize) -> Duration {
        let (tx, rx) = watch::channel(None);
        let beater = Box::new(SlowThenFailing {
            ok_takes,
            fail_from,
            calls: AtomicUsize::new(0),
        });
        let cfg = HeartbeatConfig {
            interval: Duration::from_secs(interval),
            ttl: Duration::from_secs(ttl),
        };
        let start = Instant::now();
        tokio::spawn(heartbeat_loop(beater, cfg, Arc::new(tx), None, start));
        LostSignal(rx, None, None).lost().await;
        start.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_counts_from_the_start_of_the_last_good_beat() {
        // The beat at 15 s succeeds, answering at 16 s; the server renewed the lease no earlier
        // than 15 s, so the holder is lost at 15 + (45 - 15) = 45 s, not at the beat due at 60 s
        // (when the server's copy expires and someone else may take it).
        assert_eq!(
            lost_after(15, 45, Duration::from_secs(1), 2).await,
            Duration::from_secs(45)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_between_two_beats_fires_there() {
        // ttl 35 s, interval 10 s: the beat at 10 s is the last good one; failures at 20 and
        // 30 s; lost at 10 + 25 = 35 s, not at the next beat's turn (40 s).
        assert_eq!(
            lost_after(10, 35, Duration::ZERO, 2).await,
            Duration::from_secs(35)
        );
    }

    /// Beats that follow a script: answer, hang (until the loop's timeout), or fail at once;
    /// the last step repeats.
    #[derive(Clone, Copy)]
    enum Step {
        Answer,
        Hang,
        Fail,
    }

    struct Steps(Mutex<Vec<Step>>);

    #[async_trait]
    impl Heartbeat for Steps {
        async fn beat(&self) -> Result<Beat, Error> {
            let step = {
                let mut s = self.0.lock().unwrap();
                if s.len() > 1 { s.remove(0) } else { s[0] }
            };
            match step {
                Step::Answer => Ok(Beat::Alive),
                Step::Hang => std::future::pending().await,
                Step::Fail => Err(Error::unreachable("test", "connection refused")),
            }
        }
    }

    /// When the lease of a holder beating `steps` (interval 15 s, ttl 45 s) is lost, if within
    /// `limit`.
    async fn lost_within(steps: Vec<Step>, limit: Duration) -> Option<Duration> {
        let (tx, rx) = watch::channel(None);
        let cfg = HeartbeatConfig::default();
        let start = Instant::now();
        tokio::spawn(heartbeat_loop(
            Box::new(Steps(Mutex::new(steps))),
            cfg,
            Arc::new(tx),
            None,
            start,
        ));
        tokio::time::timeout(limit, LostSignal(rx, None, None).lost())
            .await
            .ok()
            .map(|_| start.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn one_hung_beat_is_tolerated_at_ttl_three_intervals() {
        use Step::*;
        // 15 s answers; the beat at 30 s hangs until 45 s; the beat due at 45 s answers: kept.
        assert_eq!(
            lost_within(vec![Answer, Hang, Answer], Duration::from_secs(600)).await,
            None
        );
        // One failure at once is tolerated the same way.
        assert_eq!(
            lost_within(vec![Answer, Fail, Answer], Duration::from_secs(600)).await,
            None
        );
        // Hung, then the beat due at the deadline hangs too: lost half an interval past the
        // deadline (45 + 7.5 s), still before the server's copy expires (15 + 45 = 60 s).
        assert_eq!(
            lost_within(vec![Answer, Hang], Duration::from_secs(600)).await,
            Some(Duration::from_millis(52_500))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_server_loses_the_lease_within_the_ttl() {
        let (lost, _) = spawn(vec![Ok(Beat::Alive)], true);
        let start = Instant::now();
        let reason = lost.lost().await;
        assert!(reason.contains("did not answer"), "{reason}");
        assert!(
            start.elapsed() <= Duration::from_secs(45),
            "{:?}",
            start.elapsed()
        );
    }

    /// A held lock whose heartbeat always succeeds.
    struct Steady;

    #[async_trait]
    impl HeldLock for Steady {
        async fn release(self: Box<Self>) -> Result<(), Error> {
            Ok(())
        }
    }

    fn steady() -> Grant {
        let beat = Scripted {
            outcomes: Mutex::new(vec![Ok(Beat::Alive)]),
            calls: Arc::new(AtomicUsize::new(0)),
            hang: false,
        };
        Grant::new(FencingToken(7), None, beat, Steady)
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_tied_to_an_outer_one_is_lost_with_it() {
        let holder = HolderInfo::current(None, "test");
        let outer = Lease::start(steady(), holder.clone(), HeartbeatConfig::default());
        let mut inner = Lease::start(steady(), holder, HeartbeatConfig::default());
        inner.tie_to(outer.lost_signal());
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(!inner.is_lost());
        outer.mark_lost("expired");
        let reason = inner.lost().await;
        assert_eq!(reason, "outer lease lost: expired");
        // An outer lease released normally never fires the inner one.
        let holder = HolderInfo::current(None, "test");
        let outer = Lease::start(steady(), holder.clone(), HeartbeatConfig::default());
        let mut inner = Lease::start(steady(), holder, HeartbeatConfig::default());
        inner.tie_to(outer.lost_signal());
        outer.release().await.unwrap();
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(!inner.is_lost());
    }

    #[tokio::test]
    async fn an_outer_lease_past_its_freshness_loses_the_inner_one_without_waiting_for_a_beat() {
        // e.g. `migrate --redis-url` resumed after a pause past the Redis lease: its heartbeat
        // has not run yet, but the very next check must already refuse to write.
        let (tx, rx) = watch::channel(None);
        let stale = Arc::new(Freshness {
            last_ok: std::sync::Mutex::new(Instant::now()),
            grace: Duration::ZERO,
        });
        let outer = LostSignal(rx, Some(stale), None);
        let holder = HolderInfo::current(None, "test");
        let mut inner = Lease::start(steady(), holder, HeartbeatConfig::default());
        assert!(!inner.is_lost());
        inner.tie_to(outer);
        let e = inner.lost_signal().check().unwrap_err();
        assert!(e.is_lost(), "{e}");
        assert!(e.to_string().contains("outer lease lost"), "{e}");
        drop(tx);
    }

    #[test]
    fn config_rules() {
        let ok = HeartbeatConfig::default();
        assert!(ok.validate().is_ok());
        let bad = HeartbeatConfig {
            interval: Duration::from_secs(20),
            ttl: Duration::from_secs(45),
        };
        let e = bad.validate().unwrap_err();
        assert_eq!(e.exit_code().code(), 2);
        assert!(e.to_string().contains("× 3 exceeds lock_ttl"));
        let zero = HeartbeatConfig {
            interval: Duration::from_secs(1),
            ttl: Duration::ZERO,
        };
        assert!(zero.validate().is_err());
    }
}
