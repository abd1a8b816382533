//! How migration statements meet the table locks an application holds (docs/operations.md,
//! "Locks your migrations take"). A statement such as `ALTER TABLE` that waits for its lock
//! queues every later query on that table behind it: one blocked `ALTER` stalls the
//! application. So each statement may wait only `lock_timeout`; an attempt that runs out is
//! rolled back (it did nothing) and retried after a growing, jittered pause, at most
//! `lock_retries` times and never past `--wait`, each retry naming what blocks it.
//!
//! Anchors: GitLab's `with_lock_retries` starts at 0.1 s and ramps up over 41 steps; pgroll
//! waits 500 ms per try with jittered exponential backoff; strong_migrations 10 s. dbwarden
//! takes 2 s per try -- short enough that a query queued behind a waiting statement waits at
//! most that long, long enough that an ordinary busy table (transactions of a few hundred ms)
//! lets the statement through on its first or second try -- and pauses from 0.5 s doubling to
//! 10 s, so ten retries span about a minute and a half of someone else's transaction.

use std::time::Duration;

/// The table-lock bounds a run's migrations run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockRetry {
    /// How long one statement may wait for a table lock (zero: as long as the server lets it).
    pub timeout: Duration,
    /// How many times an attempt that ran out of `timeout` is retried.
    pub retries: u32,
    /// How long one statement may run (`None`: as long as it takes).
    pub statement_timeout: Option<Duration>,
}

impl Default for LockRetry {
    fn default() -> Self {
        LockRetry {
            timeout: Self::DEFAULT_TIMEOUT,
            retries: Self::DEFAULT_RETRIES,
            statement_timeout: None,
        }
    }
}

impl LockRetry {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
    pub const DEFAULT_RETRIES: u32 = 10;
    const FIRST_PAUSE: Duration = Duration::from_millis(500);
    const LONGEST_PAUSE: Duration = Duration::from_secs(10);

    /// No bound and no retry: statements wait for their locks as long as the server lets them.
    pub const OFF: LockRetry = LockRetry {
        timeout: Duration::ZERO,
        retries: 0,
        statement_timeout: None,
    };

    /// The bounds for one file: its `-- dbwarden:lock-timeout` / `-- dbwarden:statement-timeout`
    /// directives first, then these. `None` means unbounded.
    pub fn for_file(
        &self,
        lock_timeout: Option<Duration>,
        statement_timeout: Option<Duration>,
    ) -> (Option<Duration>, Option<Duration>) {
        let lock = lock_timeout.unwrap_or(self.timeout);
        let statement = statement_timeout.or(self.statement_timeout);
        (
            (!lock.is_zero()).then_some(lock),
            statement.filter(|d| !d.is_zero()),
        )
    }

    /// The pause before retry `n` (1 for the first): from 0.5 s, doubling, at most 10 s, with
    /// ±25 % jitter from `seed` so runners that met the same blocker do not return in step.
    pub fn pause(n: u32, seed: u64) -> Duration {
        let base = Self::FIRST_PAUSE
            .saturating_mul(1u32 << n.saturating_sub(1).min(10))
            .min(Self::LONGEST_PAUSE);
        let spread = base.as_millis() as u64 / 2;
        let jitter = if spread == 0 { 0 } else { seed % spread };
        base - Duration::from_millis(spread / 2) + Duration::from_millis(jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_to_a_cap_with_jitter() {
        for seed in [0, 1, 7, 123_456_789] {
            let p1 = LockRetry::pause(1, seed);
            assert!((375..=625).contains(&(p1.as_millis() as u64)), "{p1:?}");
            let p10 = LockRetry::pause(10, seed);
            assert!(
                (7_500..=12_500).contains(&(p10.as_millis() as u64)),
                "{p10:?}"
            );
            assert!(LockRetry::pause(3, seed) > LockRetry::pause(1, seed));
        }
    }

    #[test]
    fn a_files_directives_come_first_and_zero_is_off() {
        let r = LockRetry::default();
        assert_eq!(r.for_file(None, None), (Some(Duration::from_secs(2)), None));
        assert_eq!(
            r.for_file(
                Some(Duration::from_secs(10)),
                Some(Duration::from_secs(7200))
            ),
            (
                Some(Duration::from_secs(10)),
                Some(Duration::from_secs(7200))
            )
        );
        assert_eq!(r.for_file(Some(Duration::ZERO), None), (None, None));
        assert_eq!(LockRetry::OFF.for_file(None, None), (None, None));
    }
}
