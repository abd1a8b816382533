//! One takeover judge for every engine (docs/design.md §7). An engine that finds a lock it
//! cannot simply take -- a ClickHouse lock table, a SQLite lock file whose flock the kernel
//! freed -- reports what it sees as a [`Probe`]; [`judge`] decides whether to wait, break it, or
//! leave it for a human. No engine keeps a staleness rule, a skew limit or a liveness rule of
//! its own.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::verdict::MAX_SKEW;

/// What the engine can tell about the holder's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Nothing (a server-side lease: only its age speaks).
    Unknown,
    /// Gone: a process on this host that no longer runs.
    Dead,
    /// Running on this host, although it does not hold the primitive (a reused pid, or a
    /// filesystem whose locks do not work).
    Alive,
    /// On another host, whose processes and locks this host cannot see.
    ForeignHost,
}

/// What an engine found about a holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Now, by the clock `last_seen` was written with (the server's, where it has one).
    pub now: DateTime<Utc>,
    /// The newest sign of life: the last heartbeat, or the record's creation if it has none.
    pub last_seen: DateTime<Utc>,
    /// When the holder says it started, by its own clock.
    pub started: Option<DateTime<Utc>>,
    /// The holder's ttl: its own where it recorded one, else the engine's default.
    pub ttl: Duration,
    /// The finest step of the timestamps (ClickHouse `DateTime`: whole seconds). Ages are
    /// compared at this resolution, so "older than the ttl" means more than the ttl really
    /// passed.
    pub resolution: Duration,
    pub process: Liveness,
}

impl Probe {
    /// A lease recorded in a status row (a holder with no session primitive behind it, e.g.
    /// PostgreSQL's `lock = "lease"`): judged by its newest heartbeat, all times by the
    /// server's clock `now`, and by the holder's own recorded ttl (else `fallback_ttl`).
    pub fn lease_row(row: &crate::StatusRow, now: DateTime<Utc>, fallback_ttl: Duration) -> Probe {
        Probe {
            now,
            last_seen: row.last_heartbeat_at.or(row.acquired_at).unwrap_or(now),
            started: None,
            ttl: lease_ttl(row, fallback_ttl),
            resolution: Duration::from_millis(1),
            process: Liveness::Unknown,
        }
    }
}

impl Probe {
    /// A holder whose primitive is a server session that outlives its process only while a
    /// statement runs (MySQL's named lock): whether the process lives is all there is to judge.
    /// A dead one is broken at once, a live one never.
    pub fn session_holder(process: Liveness) -> Probe {
        let now = Utc::now();
        Probe {
            now,
            last_seen: now,
            started: None,
            ttl: Duration::from_secs(3600),
            resolution: Duration::from_millis(1),
            process,
        }
    }
}

/// The ttl a lease row's holder is judged by: its recorded one; in a table without that column,
/// its expiry, which the holder wrote with its own ttl at its last heartbeat; else
/// `fallback_ttl`.
pub fn lease_ttl(row: &crate::StatusRow, fallback_ttl: Duration) -> Duration {
    row.lock_ttl_ms
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
        .or_else(|| {
            let (hb, exp) = (row.last_heartbeat_at?, row.expires_at?);
            (exp - hb).to_std().ok().filter(|d| !d.is_zero())
        })
        .unwrap_or(fallback_ttl)
}

/// Why a lock is never broken automatically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A timestamp more than [`MAX_SKEW`] in the future: a clock is wrong.
    Skew { what: &'static str, ahead: Duration },
    /// The holder is on another host.
    ForeignHost,
    /// The holder's process runs on this host.
    LiveProcess,
}

/// What to do about the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The holder may still be working: wait. Breaking becomes possible at the earliest after
    /// `retry_in` (wake a waiter then).
    Wait { age: Duration, retry_in: Duration },
    /// The holder is gone: break the lock (and audit it as a broken stale lock).
    Break { age: Duration },
    /// Leave it to a human.
    Refuse(Refusal),
}

/// Decide about a holder. In order: a holder on another host or a live process is never
/// broken; a process known dead is broken at once; otherwise timestamps in the future are a
/// skew refusal, and the lock is broken once the newest sign of life is older than the ttl
/// and the holder's own start time agrees.
pub fn judge(p: &Probe) -> Decision {
    let step = p.resolution.as_millis().max(1) as i64;
    let tick = |t: DateTime<Utc>| t.timestamp_millis().div_euclid(step);
    let span = |ticks: i64| Duration::from_millis((ticks.max(0) * step) as u64);
    let (now, last) = (tick(p.now), tick(p.last_seen));
    let age = span(now - last);
    match p.process {
        Liveness::ForeignHost => return Decision::Refuse(Refusal::ForeignHost),
        Liveness::Alive => return Decision::Refuse(Refusal::LiveProcess),
        Liveness::Dead => return Decision::Break { age },
        Liveness::Unknown => {}
    }
    let skew = (MAX_SKEW.as_millis() as i64).div_euclid(step);
    if last - now > skew {
        return Decision::Refuse(Refusal::Skew {
            what: "its newest heartbeat (server clock)",
            ahead: span(last - now),
        });
    }
    let started = p.started.map(tick);
    if let Some(s) = started.filter(|s| s - now > skew) {
        return Decision::Refuse(Refusal::Skew {
            what: "its start time (the holder's clock)",
            ahead: span(s - now),
        });
    }
    // The ttl rounded up to whole steps: an age of more steps means more than ttl passed.
    let ttl = (p.ttl.as_millis() as i64 + step - 1).div_euclid(step);
    let start_agrees = started.is_none_or(|s| now - s > ttl);
    if now - last > ttl && start_agrees {
        Decision::Break { age }
    } else {
        // The clock's next step comes at a phase we cannot see: breaking becomes possible
        // between `ttl − age` and one step later; look a quarter second after the earliest.
        Decision::Wait {
            age,
            retry_in: span(ttl - (now - last)) + Duration::from_millis(250),
        }
    }
}

/// Why a lock was free for a new holder while its status row still said a run was going: what
/// the engine saw, which [`broken_stale_lock`] turns into the audit row every engine writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Freed {
    /// The previous holder's server session ended without releasing, and the server freed its
    /// lock (`session`: "backend 4711", "connection 12"; `lock`: what the server freed).
    SessionEnded {
        session: String,
        lock: &'static str,
        state: crate::LockState,
    },
    /// The previous holder's process was gone (its liveness session had ended) while its server
    /// session still ran a statement; this run KILLed that session, which freed the lock.
    SessionKilled {
        session: String,
        state: crate::LockState,
    },
    /// A lease with no renewal for longer than its holder's ttl, by the server's clock.
    LeaseExpired {
        silent: Duration,
        /// The holder's ttl, where it recorded one.
        ttl: Option<Duration>,
        /// What its status row said, where the lease has one.
        state: Option<crate::LockState>,
    },
    /// The holder's process on this host no longer runs, and the kernel released its lock.
    ProcessDead {
        pid: u32,
        last_heartbeat: DateTime<Utc>,
        lock: &'static str,
    },
}

impl Freed {
    /// The audit row's reason.
    pub fn reason(&self) -> String {
        let left =
            |state: crate::LockState| format!("; its status row was left {}", state.as_str());
        match self {
            Freed::SessionEnded {
                session,
                lock,
                state,
            } => format!(
                "the previous holder's session ({session}) ended without releasing, so the server freed its {lock}{}",
                left(*state)
            ),
            Freed::SessionKilled { session, state } => format!(
                "the previous holder's process was gone (its liveness session had ended) while its session ({session}) still ran a statement; this run KILLed that session, which freed the lock{}",
                left(*state)
            ),
            Freed::LeaseExpired { silent, ttl, state } => format!(
                "the previous holder's lease expired: no heartbeat for {} by the server clock, over its ttl{}{}",
                crate::duration::human(*silent),
                ttl.map(|t| format!(" of {}", crate::duration::human(t)))
                    .unwrap_or_default(),
                state.map(left).unwrap_or_default()
            ),
            Freed::ProcessDead {
                pid,
                last_heartbeat,
                lock,
            } => format!(
                "holder pid {pid} on this host is dead (last heartbeat {}); the kernel had released its {lock}",
                last_heartbeat.format("%Y-%m-%dT%H:%M:%SZ")
            ),
        }
    }
}

/// The `broken_stale_lock` audit row of `me`, which took the lock over from a holder that left
/// it as `why` says. The caller names that holder (`about` / `about_row`).
pub fn broken_stale_lock(
    namespace: &crate::Namespace,
    me: &crate::HolderInfo,
    why: &Freed,
) -> crate::AuditRecord {
    crate::AuditRecord::new(namespace, "broken_stale_lock", me, why.reason())
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn a_session_holder_is_judged_by_its_process_alone() {
        assert!(matches!(
            judge(&Probe::session_holder(Liveness::Dead)),
            Decision::Break { .. }
        ));
        assert_eq!(
            judge(&Probe::session_holder(Liveness::Alive)),
            Decision::Refuse(Refusal::LiveProcess)
        );
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_broken_stale_lock_says_what_freed_it_and_what_the_row_said() {
        let ns = crate::Namespace::new("n").unwrap();
        let me = crate::HolderInfo::current(None, "me");
        let rec = broken_stale_lock(
            &ns,
            &me,
            &Freed::SessionEnded {
                session: "backend 4711".into(),
                lock: "advisory lock",
                state: crate::LockState::Running,
            },
        );
        assert_eq!(rec.action, "broken_stale_lock");
        assert_eq!(
            rec.reason,
            "the previous holder's session (backend 4711) ended without releasing, so the server freed its advisory lock; its status row was left RUNNING"
        );
        let lease = Freed::LeaseExpired {
            silent: 31 * SECOND,
            ttl: Some(30 * SECOND),
            state: None,
        };
        assert!(
            lease
                .reason()
                .contains("no heartbeat for 31s by the server clock, over its ttl of 30s"),
            "{}",
            lease.reason()
        );
        let killed = Freed::SessionKilled {
            session: "connection 12".into(),
            state: crate::LockState::Inspecting,
        };
        assert!(
            killed.reason().contains("KILLed that session")
                && killed.reason().contains("connection 12")
        );
    }

    /// A lease probe in whole seconds: last beat and start `*_ago` seconds before now.
    fn lease(last_ago: i64, started_ago: i64, ttl_s: u64) -> Probe {
        let now = Utc.timestamp_opt(1_800_000_000, 0).unwrap();
        Probe {
            now,
            last_seen: now - chrono::Duration::seconds(last_ago),
            started: Some(now - chrono::Duration::seconds(started_ago)),
            ttl: Duration::from_secs(ttl_s),
            resolution: SECOND,
            process: Liveness::Unknown,
        }
    }

    #[test]
    fn a_lease_is_stale_only_past_its_ttl_by_the_server_clock() {
        assert!(matches!(judge(&lease(1, 100, 3)), Decision::Wait { .. }));
        assert!(matches!(judge(&lease(3, 100, 3)), Decision::Wait { .. }));
        assert_eq!(
            judge(&lease(4, 100, 3)),
            Decision::Break {
                age: Duration::from_secs(4)
            }
        );
        // The holder's own start time disagrees (it says it started a moment ago): not stale.
        assert!(matches!(judge(&lease(10, 1, 3)), Decision::Wait { .. }));
        // A record without a start time ages from its creation alone.
        let created = Probe {
            started: None,
            ..lease(121, 0, 120)
        };
        assert!(matches!(judge(&created), Decision::Break { .. }));
    }

    #[test]
    fn the_wait_ends_when_breaking_becomes_possible() {
        assert_eq!(
            judge(&lease(1, 100, 3)),
            Decision::Wait {
                age: SECOND,
                retry_in: Duration::from_millis(2250)
            }
        );
    }

    #[test]
    fn timestamps_in_the_future_are_skew_and_never_broken() {
        assert!(matches!(
            judge(&lease(-301, 100, 3)),
            Decision::Refuse(Refusal::Skew { .. })
        ));
        assert!(matches!(
            judge(&lease(10, -400, 3)),
            Decision::Refuse(Refusal::Skew { .. })
        ));
        assert!(matches!(judge(&lease(-200, 100, 3)), Decision::Wait { .. }));
    }

    #[test]
    fn what_is_known_of_the_process_decides_first() {
        let fresh = lease(0, 0, 3600);
        let with = |process| Probe {
            process,
            ..fresh.clone()
        };
        assert_eq!(
            judge(&with(Liveness::Dead)),
            Decision::Break {
                age: Duration::ZERO
            }
        );
        assert_eq!(
            judge(&with(Liveness::Alive)),
            Decision::Refuse(Refusal::LiveProcess)
        );
        let old = Probe {
            process: Liveness::ForeignHost,
            ..lease(10_000, 10_000, 3)
        };
        assert_eq!(judge(&old), Decision::Refuse(Refusal::ForeignHost));
    }

    #[test]
    fn sub_second_clocks_compare_at_their_own_resolution() {
        let now = Utc.timestamp_opt(1_800_000_000, 0).unwrap();
        let p = |ago_ms: i64| Probe {
            now,
            last_seen: now - chrono::Duration::milliseconds(ago_ms),
            started: None,
            ttl: Duration::from_millis(1500),
            resolution: Duration::from_millis(1),
            process: Liveness::Unknown,
        };
        assert!(matches!(judge(&p(1500)), Decision::Wait { .. }));
        assert!(matches!(judge(&p(1501)), Decision::Break { .. }));
    }
}
