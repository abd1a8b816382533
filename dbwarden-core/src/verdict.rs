//! Verdicts of `dbwarden lock-status` (docs/design.md §8), decided once for every engine.

use std::time::Duration;

use serde::Serialize;

use crate::{ExitCode, LockState, Observation};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    Available,
    Healthy,
    Stuck,
    Dead,
    NeedsReview,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Available => "AVAILABLE",
            Verdict::Healthy => "HEALTHY",
            Verdict::Stuck => "STUCK",
            Verdict::Dead => "DEAD",
            Verdict::NeedsReview => "NEEDS_REVIEW",
        }
    }

    pub fn exit_code(self) -> ExitCode {
        match self {
            Verdict::Available | Verdict::Healthy => ExitCode::OK,
            Verdict::Stuck => ExitCode::STUCK,
            Verdict::Dead => ExitCode::DEAD,
            Verdict::NeedsReview => ExitCode::NEEDS_REVIEW,
        }
    }

    /// The one next step for the person on call.
    pub fn next_step(self) -> &'static str {
        match self {
            Verdict::Available => "nothing to do: the next `dbwarden migrate` takes the lock",
            Verdict::Healthy => "nothing to do: a holder is running and heartbeating; wait for it",
            Verdict::Stuck => {
                "the holder stopped heartbeating (paused or wedged): check that process; if it is gone for good, run `dbwarden unlock --holder <execution id>`"
            }
            Verdict::Dead => {
                "the holder died mid-run: run `dbwarden migrate`; it inspects the half-done migration and resumes or halts safely"
            }
            Verdict::NeedsReview => {
                "recovery halted: inspect the migration named above, then `dbwarden resolve <version> --retry | --mark-applied | --abandon`"
            }
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Age of the newest heartbeat by the server clock, clamped at zero.
pub fn heartbeat_age(obs: &Observation) -> Option<Duration> {
    let hb = obs
        .last_heartbeat_at
        .or_else(|| obs.status.as_ref().and_then(|s| s.last_heartbeat_at))?;
    Some((obs.server_now - hb).to_std().unwrap_or(Duration::ZERO))
}

/// The staleness threshold a holder is judged by: its own recorded `lock_ttl` (from the holder
/// or, failing that, the status row), else `fallback` (the observer's configured or default
/// ttl) for holders that recorded none.
pub fn judged_ttl(obs: &Observation, fallback: Duration) -> Duration {
    obs.holder
        .as_ref()
        .and_then(|h| h.lock_ttl())
        .or_else(|| {
            obs.status
                .as_ref()
                .and_then(|s| s.lock_ttl_ms)
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis)
        })
        .unwrap_or(fallback)
}

/// The verdict for an observation; `fallback_ttl` is the staleness threshold for a holder
/// that recorded none of its own (see [`judged_ttl`]).
pub fn decide(obs: &Observation, fallback_ttl: Duration) -> Verdict {
    let ttl = judged_ttl(obs, fallback_ttl);
    let state = obs.status.as_ref().map(|s| s.state);
    if obs.held && !obs.holder_gone {
        return match heartbeat_age(obs) {
            Some(age) if age > ttl => Verdict::Stuck,
            _ => Verdict::Healthy,
        };
    }
    match state {
        Some(LockState::NeedsReview) => Verdict::NeedsReview,
        Some(s) if s.is_active() => Verdict::Dead,
        _ => Verdict::Available,
    }
}

/// The verdict when shared holders (`run --shared`) may hold the lock without a writer: they
/// count as a healthy holder.
pub fn decide_with_shared(obs: &Observation, ttl: Duration, shared_holders: usize) -> Verdict {
    match decide(obs, ttl) {
        Verdict::Available if shared_holders > 0 => Verdict::Healthy,
        v => v,
    }
}

/// How far ahead of the server clock a holder timestamp may be before it is a skew error.
pub const MAX_SKEW: Duration = Duration::from_secs(300);

/// A holder timestamp more than [`MAX_SKEW`] in the future: clock skew. Such a lock is never
/// broken automatically.
pub fn clock_skew(obs: &Observation) -> Option<Duration> {
    let hb = obs
        .last_heartbeat_at
        .or_else(|| obs.status.as_ref().and_then(|s| s.last_heartbeat_at))?;
    let ahead = (hb - obs.server_now).to_std().ok()?;
    (ahead > MAX_SKEW).then_some(ahead)
}

/// Where the status row disagrees with the primitive (or the clocks disagree), say how.
pub fn discrepancy(obs: &Observation) -> Option<String> {
    if let Some(ahead) = clock_skew(obs) {
        return Some(format!(
            "the holder's heartbeat is {} in the future by the server clock (clock skew): never broken automatically; fix the holder host's clock",
            crate::duration::human(ahead)
        ));
    }
    let status = obs.status.as_ref();
    match (obs.held, status) {
        (true, Some(s)) if !s.state.is_active() => Some(format!(
            "the lock is held but the status row says {} (the holder may be a tool that does not write it)",
            s.state.as_str()
        )),
        (true, Some(s)) => match (&obs.holder, s.execution_id) {
            (Some(h), Some(e)) if h.execution_id != e => Some(format!(
                "the lock is held by execution {} but the status row names execution {e}",
                h.execution_id
            )),
            _ => None,
        },
        (true, None) => Some("the lock is held but there is no status row".to_owned()),
        (false, Some(s)) if s.state.is_active() => Some(format!(
            "the status row says {} but nothing holds the lock",
            s.state.as_str()
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};

    use super::*;
    use crate::{Grade, StatusRow};

    fn obs(held: bool, state: Option<LockState>, age_s: i64) -> Observation {
        let now = Utc.with_ymd_and_hms(2026, 11, 30, 3, 25, 18).unwrap();
        Observation {
            engine: "test",
            grade: Grade::B,
            namespace: "default".into(),
            held,
            holder_gone: false,
            holder: None,
            fencing_token: Some(17),
            last_heartbeat_at: Some(now - chrono::Duration::seconds(age_s)),
            server_now: now,
            expires_at: None,
            session_id: None,
            status: state.map(|state| StatusRow {
                namespace: "default".into(),
                execution_id: None,
                owner_id: None,
                migration_version: Some(3),
                migration_checksum: None,
                fencing_token: 17,
                host: None,
                pid: None,
                db_connection_id: None,
                state,
                acquired_at: None,
                last_heartbeat_at: None,
                expires_at: None,
                lock_ttl_ms: None,
                heartbeat_interval_ms: None,
            }),
            notes: vec![],
        }
    }

    const TTL: Duration = Duration::from_secs(45);

    #[test]
    fn the_table_of_spec_7() {
        use LockState::*;
        assert_eq!(decide(&obs(false, None, 0), TTL), Verdict::Available);
        assert_eq!(
            decide(&obs(false, Some(Complete), 0), TTL),
            Verdict::Available
        );
        assert_eq!(decide(&obs(true, Some(Running), 10), TTL), Verdict::Healthy);
        assert_eq!(decide(&obs(true, Some(Running), 45), TTL), Verdict::Healthy);
        assert_eq!(decide(&obs(true, Some(Running), 46), TTL), Verdict::Stuck);
        assert_eq!(decide(&obs(false, Some(Running), 0), TTL), Verdict::Dead);
        assert_eq!(decide(&obs(false, Some(Inspecting), 0), TTL), Verdict::Dead);
        assert_eq!(
            decide(&obs(false, Some(NeedsReview), 0), TTL),
            Verdict::NeedsReview
        );
        // Still held, but the engine knows the holder's process is gone (MySQL's liveness
        // session): DEAD, whatever the heartbeat's age.
        let gone = Observation {
            holder_gone: true,
            ..obs(true, Some(Running), 1)
        };
        assert_eq!(decide(&gone, TTL), Verdict::Dead);
        assert_eq!(Verdict::Stuck.exit_code().code(), 10);
        assert_eq!(Verdict::Dead.exit_code().code(), 11);
        assert_eq!(Verdict::NeedsReview.exit_code().code(), 12);
    }

    #[test]
    fn a_holder_is_judged_by_its_own_recorded_ttl() {
        let mut o = obs(true, Some(LockState::Running), 10);
        // Recorded 6 s: a 10 s old heartbeat is stuck, whatever the observer's 45 s default.
        o.status.as_mut().unwrap().lock_ttl_ms = Some(6_000);
        assert_eq!(judged_ttl(&o, TTL), Duration::from_secs(6));
        assert_eq!(decide(&o, TTL), Verdict::Stuck);
        // The holder's record wins over the status row's; nothing recorded: the fallback.
        o.holder = Some(crate::HolderInfo {
            lock_ttl_ms: Some(120_000),
            ..crate::HolderInfo::current(None, "test")
        });
        assert_eq!(decide(&o, TTL), Verdict::Healthy);
        let plain = obs(true, Some(LockState::Running), 46);
        assert_eq!(judged_ttl(&plain, TTL), TTL);
        assert_eq!(decide(&plain, TTL), Verdict::Stuck);
    }

    #[test]
    fn future_heartbeats_clamp_to_zero_age() {
        let o = obs(true, Some(LockState::Running), -120);
        assert_eq!(heartbeat_age(&o), Some(Duration::ZERO));
        assert_eq!(decide(&o, TTL), Verdict::Healthy);
    }

    #[test]
    fn a_heartbeat_far_in_the_future_is_clock_skew() {
        let o = obs(true, Some(LockState::Running), -301);
        assert!(clock_skew(&o).is_some());
        assert!(discrepancy(&o).unwrap().contains("clock skew"));
        assert!(clock_skew(&obs(true, Some(LockState::Running), -299)).is_none());
    }

    #[test]
    fn discrepancies_are_named() {
        assert!(discrepancy(&obs(false, Some(LockState::Running), 0)).is_some());
        assert!(discrepancy(&obs(true, None, 0)).is_some());
        assert!(discrepancy(&obs(false, Some(LockState::Complete), 0)).is_none());
    }
}
