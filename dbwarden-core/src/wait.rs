//! Waiting for a busy lock: one policy for every engine. Backoff with full jitter, capped; an
//! engine that can hear a release wakes the waiter early (see [`crate::WakeUp`] and
//! [`crate::lock::pause`]).

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::error::BusyInfo;
use crate::lock::BrokenLock;
use crate::{Attempt, Error, HeartbeatConfig, HolderInfo, Lease, MigrationLock};

/// How long an engine may reuse what it read about the holder of a busy lock. The wait loop
/// shows only the first busy report (logged) and the last (the error when the wait runs out),
/// so re-reading the holder at every poll costs the server for nothing; one second of
/// staleness in the final message is the price.
pub const HOLDER_READ_REUSE: Duration = Duration::from_secs(1);

/// How long an engine waits for a connection it kept between acquisitions (or between a
/// release and the next look) to answer a check before opening a new one: an idle connection
/// may have been cut meanwhile, and a half-open one would otherwise stall the run.
pub const KEPT_SESSION_CHECK: Duration = Duration::from_secs(2);

/// How often a waiter looks again at a holder that may have died without a word: a crashed
/// PostgreSQL backend sends no NOTIFY, and a MySQL holder's process can be gone while the server
/// still keeps its session (and its lock). A try-lock or a liveness probe costs the server next
/// to nothing, so this bounds how long a dead holder delays the next run beyond the moment its
/// death can be seen.
pub const SILENT_DEATH_POLL: Duration = Duration::from_millis(200);

/// How long to wait for a busy lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Try once (`--wait 0`).
    No,
    /// Keep trying for up to this long (`--wait 5m`, the default).
    Up(Duration),
}

impl Wait {
    pub fn from_duration(d: Duration) -> Self {
        if d.is_zero() { Wait::No } else { Wait::Up(d) }
    }
}

/// Capped exponential backoff with jitter: the n-th pause is uniform in `[base/2, base]` where
/// `base = min(first × 2ⁿ, cap)`.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    cap: Duration,
}

impl Backoff {
    pub fn new(first: Duration, cap: Duration) -> Self {
        Backoff { next: first, cap }
    }

    pub fn next_pause(&mut self) -> Duration {
        let base = self.next.min(self.cap);
        self.next = (self.next * 2).min(self.cap);
        let lo = base.as_millis() as u64 / 2;
        let hi = (base.as_millis() as u64).max(lo + 1);
        Duration::from_millis(rand::rng().random_range(lo..=hi))
    }
}

/// The first pause after a server refused a connection for want of a slot
/// ([`crate::error::BusyInfo::server_full`]), and the cap of those pauses. Longer than a busy
/// lock's: a full server means many runners at once, each refused try costs the server a
/// process and a TLS handshake (measured: ~8 ms of server CPU), and a runner that has no
/// connection cannot hear a release anyway. The runners that did get in see the release at
/// once and free their slots as they finish; the cap bounds how long the others may sleep past
/// that (docs/BENCHMARKS.md, benchmark 9).
pub const FULL_SERVER_FIRST: Duration = Duration::from_secs(1);
pub const FULL_SERVER_CAP: Duration = Duration::from_secs(3);

/// The pauses of one wait: a busy lock's, and a full server's (see [`FULL_SERVER_FIRST`]).
#[derive(Debug, Clone)]
pub(crate) struct Pauses {
    busy: Backoff,
    full: Backoff,
}

impl Pauses {
    pub(crate) fn new(lock: &dyn MigrationLock) -> Self {
        Pauses {
            busy: Backoff::new(Duration::from_millis(25), lock.max_poll_interval()),
            full: Backoff::new(FULL_SERVER_FIRST, FULL_SERVER_CAP),
        }
    }

    /// Pause after a busy attempt, at most `remaining`: a busy lock is waited for through the
    /// engine, which may hear the release; a full server simply for longer.
    pub(crate) async fn pause(
        &mut self,
        lock: &dyn MigrationLock,
        info: &BusyInfo,
        remaining: Duration,
    ) {
        if info.server_full {
            // Hold nothing meanwhile: a runner that keeps a connection while it waits for a
            // second one (to check for a pooler, to claim with a heartbeat) keeps the next
            // runner from assembling its own, and when every slot is held so, nobody can
            // apply (found with 128 runners against a role limited to 12 connections).
            lock.stop_waiting().await;
            tokio::time::sleep(self.full.next_pause().min(remaining)).await;
        } else {
            crate::lock::pause(lock, self.busy.next_pause().min(remaining)).await;
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Duration::from_millis(25), Duration::from_millis(1000))
    }
}

/// Exclusive (a writer) or shared (readers together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Exclusive,
    Shared,
}

/// Acquire `lock` for `holder`, waiting per `wait`, and start the lease's heartbeat.
/// Returns [`Error::Busy`] (exit 3) with the holder when the wait runs out.
pub async fn acquire(
    lock: &dyn MigrationLock,
    holder: &HolderInfo,
    wait: Wait,
    heartbeat: HeartbeatConfig,
) -> Result<Lease, Error> {
    acquire_mode(lock, holder, Mode::Exclusive, wait, heartbeat).await
}

/// Run `f`, a step that waits for the lock per `wait`, within that wait plus one
/// `connect_timeout` of `lock`'s server ([`MigrationLock::reach`]). Each engine bounds its own
/// statements, but a link that stops answering in the middle of a wait (packets held, the
/// connection open) would otherwise cost a whole statement timeout on top of the wait; past the
/// bound the step ends as unreachable (exit 2, naming the server). Whatever `f` held when it is
/// cut off is dropped, as after a killed process: its connections close, and a lock it had just
/// taken is freed by the server or recovered like a dead holder's.
///
/// [`Wait::No`] (`--wait 0`) is one try and is not bounded here: a try may wait for a server
/// lock on the way (another runner creating the tables), and the engine's `connect_timeout`
/// and `statement_timeout` bound it.
pub async fn within_wait<T>(
    lock: &dyn MigrationLock,
    wait: Wait,
    f: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let (Wait::Up(waited), Some(reach)) = (wait, lock.reach()) else {
        return f.await;
    };
    match tokio::time::timeout(waited + reach.connect_timeout, f).await {
        Ok(r) => r,
        Err(_) => Err(Error::unreachable(
            reach.target,
            format!(
                "stopped answering while this run waited for the lock (a wait ends within --wait plus connect_timeout, {}); check the server and the network to it",
                crate::duration::human(reach.connect_timeout)
            ),
        )),
    }
}

/// [`acquire`] in either mode.
pub async fn acquire_mode(
    lock: &dyn MigrationLock,
    holder: &HolderInfo,
    mode: Mode,
    wait: Wait,
    heartbeat: HeartbeatConfig,
) -> Result<Lease, Error> {
    within_wait(
        lock,
        wait,
        acquire_unbounded(lock, holder, mode, wait, heartbeat),
    )
    .await
}

/// [`acquire_mode`] without the bound of [`within_wait`], for a caller that bounds a larger
/// step itself.
pub(crate) async fn acquire_unbounded(
    lock: &dyn MigrationLock,
    holder: &HolderInfo,
    mode: Mode,
    wait: Wait,
    heartbeat: HeartbeatConfig,
) -> Result<Lease, Error> {
    let deadline = match wait {
        Wait::No => None,
        Wait::Up(d) => Some(Instant::now() + d),
    };
    let mut pauses = Pauses::new(lock);
    let mut logged = false;
    // The engine records the holder's ttl and interval with the lock (lock-status judges the
    // holder by them).
    let holder = &holder.with_settings(&heartbeat);
    loop {
        // The server set its copy of the lease no earlier than this: the lease's clock starts
        // here, not when the answer came back (see `Lease::start_at`).
        let began = Instant::now();
        let attempt = match mode {
            Mode::Exclusive => lock.try_acquire(holder).await,
            Mode::Shared => match lock.shared() {
                Some(shared) => shared.try_acquire_shared(holder).await,
                None => Err(Error::usage(format!(
                    "the {} engine has no shared lock: drop --shared",
                    lock.engine()
                ))),
            },
        };
        let attempt = match attempt {
            Ok(a) => a,
            // An engine that meets a full server or a write-locked database while trying
            // says busy: retried like any other busy attempt, never fatal while time is left.
            Err(Error::Busy(info)) => Attempt::Busy(*info),
            Err(e) => return Err(e),
        };
        let attempt = match attempt {
            Attempt::BrokeThenBusy(b, info) => {
                record_break(lock, holder, None, None, *b).await;
                Attempt::Busy(info)
            }
            other => other,
        };
        match attempt {
            Attempt::Acquired(mut grant) => {
                if let Some(b) = grant.broken.take() {
                    let previous = grant.previous.clone();
                    let store = grant.held.store();
                    record_break(lock, holder, store, previous.as_ref(), *b).await;
                }
                return Ok(Lease::start_at(
                    grant,
                    holder.clone(),
                    heartbeat,
                    lock.grade(),
                    began,
                ));
            }
            Attempt::Busy(info) | Attempt::BrokeThenBusy(_, info) => {
                let now = Instant::now();
                let remaining = match deadline {
                    Some(d) if d > now => d - now,
                    _ => return Err(Error::Busy(Box::new(info))),
                };
                if !logged {
                    tracing::info!(namespace = %lock.namespace(), "lock busy, waiting: {info}");
                    logged = true;
                }
                pauses.pause(lock, &info, remaining).await;
            }
        }
    }
}

/// A dead or stale holder's lock broken (and taken, or lost to another runner): said on
/// stderr, and written to the audit table -- on the new holder's own session where it took
/// the lock -- before any migration runs. Best effort, and bounded (no heartbeat runs yet to
/// notice a silent network): the lock is ours (or not) either way, and a session that cannot
/// write the row says so at its next fenced write.
async fn record_break(
    lock: &dyn MigrationLock,
    me: &HolderInfo,
    store: Option<&mut (dyn crate::MigrationStore + 'static)>,
    previous: Option<&crate::StatusRow>,
    b: BrokenLock,
) {
    let record = b.record(lock.namespace(), me, previous);
    tracing::warn!(
        namespace = %lock.namespace(),
        "broke a stale lock held by {}: {}",
        record.holder_desc.as_deref().unwrap_or("an unknown holder"),
        record.reason
    );
    let bound = lock
        .reach()
        .map_or(AUDIT_BOUND, |r| r.connect_timeout.max(AUDIT_BOUND));
    let write = async {
        if let Some(store) = store
            && store.audit(&record).await.is_ok()
        {
            return Ok(());
        }
        // Without the holder's session, or where it could not write (a write-locked SQLite
        // file spools the row for the next holder): the lock's own way.
        lock.audit(&record).await
    };
    let written = tokio::time::timeout(bound, write).await;
    if !matches!(written, Ok(Ok(()))) {
        let why = match written {
            Ok(Err(e)) => e.to_string(),
            _ => format!("no answer within {}", crate::duration::human(bound)),
        };
        tracing::warn!(namespace = %lock.namespace(), "could not write the audit row of the broken lock: {why}");
    }
}

/// How long the audit row of a broken lock may take at least (a server's `connect_timeout`
/// where it is longer).
const AUDIT_BOUND: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_jittered_and_capped() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(800));
        let pauses: Vec<_> = (0..10).map(|_| b.next_pause()).collect();
        assert!(pauses[0] >= Duration::from_millis(50) && pauses[0] <= Duration::from_millis(100));
        for p in &pauses[4..] {
            assert!(
                *p >= Duration::from_millis(400) && *p <= Duration::from_millis(800),
                "{p:?}"
            );
        }
    }

    #[test]
    fn zero_wait_means_try_once() {
        assert_eq!(Wait::from_duration(Duration::ZERO), Wait::No);
        assert_eq!(
            Wait::from_duration(Duration::from_secs(1)),
            Wait::Up(Duration::from_secs(1))
        );
    }
}
