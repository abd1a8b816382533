//! Who holds a lock, and the fencing token that proves it.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Strictly increasing per (database, namespace) with every successful acquire; persisted and
/// never reused. Every write a holder makes is conditional on the stored token still being its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The fence check every SQL store makes inside its write transaction: `current` is the
    /// token stored for the namespace now (`None`: no status row). Anything but this holder's
    /// own token means another runner took over (or `unlock` fenced this one out): the write
    /// must not happen and the lock is lost.
    pub fn check(self, current: Option<i64>) -> Result<(), crate::Error> {
        match current {
            Some(t) if t as u64 == self.0 => Ok(()),
            other => Err(crate::Error::Lost(format!(
                "fenced out: this run holds token {self}, the database now has {}",
                other.map_or_else(|| "no lock row".to_owned(), |t| t.to_string())
            ))),
        }
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The identity of a lock holder, written next to the lock and shown by `lock-status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderInfo {
    pub host: String,
    pub pid: u32,
    pub execution_id: Uuid,
    /// `--owner`, default `host:pid`.
    pub owner: String,
    /// The command line that took the lock (`dbwarden migrate`, `dbwarden run -- pg_dump`).
    pub command: String,
    pub started_at: DateTime<Utc>,
    /// The holder's own staleness threshold and heartbeat cadence, recorded with the lock so
    /// `lock-status` judges the holder by its settings, not by the observer's defaults. `None`
    /// where they were not recorded (a holder of an older version, another tool).
    #[serde(default)]
    pub lock_ttl_ms: Option<u64>,
    #[serde(default)]
    pub heartbeat_interval_ms: Option<u64>,
}

impl HolderInfo {
    /// A holder for this process with a fresh execution id.
    pub fn current(owner: Option<String>, command: impl Into<String>) -> Self {
        let host = hostname();
        let pid = std::process::id();
        HolderInfo {
            owner: owner.unwrap_or_else(|| format!("{host}:{pid}")),
            host,
            pid,
            execution_id: Uuid::new_v4(),
            command: command.into(),
            started_at: Utc::now(),
            lock_ttl_ms: None,
            heartbeat_interval_ms: None,
        }
    }

    /// This holder with `heartbeat`'s ttl and interval recorded (see [`HolderInfo::lock_ttl_ms`]).
    pub fn with_settings(&self, heartbeat: &crate::HeartbeatConfig) -> Self {
        HolderInfo {
            lock_ttl_ms: Some(heartbeat.ttl.as_millis() as u64),
            heartbeat_interval_ms: Some(heartbeat.interval.as_millis() as u64),
            ..self.clone()
        }
    }

    /// The recorded ttl, if any.
    pub fn lock_ttl(&self) -> Option<std::time::Duration> {
        self.lock_ttl_ms
            .filter(|&ms| ms > 0)
            .map(std::time::Duration::from_millis)
    }
}

/// This machine's host name (from `/proc/sys/kernel/hostname`, `$HOSTNAME`, or `localhost`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned())
}
