//! The keys of one namespace and what is stored in them: the holder record, the audit list's
//! length, and how a script's reply is read. Below the lease ([`crate::lock`]) and shared mode
//! ([`crate::shared`]), which both write them.

use chrono::{DateTime, Utc};
use redis::Value;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The keys of one namespace; `{<ns>}` is the cluster hash tag.
#[derive(Debug, Clone)]
pub struct Keys {
    pub lock: String,
    pub fence: String,
    pub holder: String,
    pub audit: String,
    /// The pub/sub channel a release is announced on (a channel, not a key).
    pub released: String,
    /// Shared holders (`run --shared`): a sorted set of lease id → expiry (server ms).
    pub readers: String,
    /// Shared holders' records: a hash of lease id → holder JSON.
    pub readers_info: String,
}

impl Keys {
    pub fn new(namespace: &str) -> Self {
        let k = |what: &str| format!("dbwarden:{{{namespace}}}:{what}");
        Keys {
            lock: k("lock"),
            fence: k("fence"),
            holder: k("holder"),
            audit: k("audit"),
            released: k("released"),
            readers: k("readers"),
            readers_info: k("readers:info"),
        }
    }
}

/// Audit entries kept in `dbwarden:{<ns>}:audit` (newest first).
pub const AUDIT_KEEP: i64 = 1000;

/// The JSON holder record in `dbwarden:{<ns>}:holder`. Times in milliseconds are the server's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderRecord {
    pub host: String,
    pub pid: u32,
    pub execution_id: Uuid,
    pub owner: String,
    pub command: String,
    pub started_at: DateTime<Utc>,
    #[serde(default)]
    pub namespace: String,
    /// The random value of the lock key: what release and extend compare against.
    #[serde(default)]
    pub lease_id: String,
    #[serde(default)]
    pub fencing_token: u64,
    #[serde(default)]
    pub acquired_at_ms: i64,
    #[serde(default)]
    pub heartbeat_at_ms: i64,
    #[serde(default)]
    pub ttl_ms: u64,
    /// The holder's heartbeat interval (absent in an older version's record).
    #[serde(default)]
    pub heartbeat_interval_ms: Option<u64>,
}

impl HolderRecord {
    pub fn holder(&self) -> dbwarden_core::HolderInfo {
        dbwarden_core::HolderInfo {
            host: self.host.clone(),
            pid: self.pid,
            execution_id: self.execution_id,
            owner: self.owner.clone(),
            command: self.command.clone(),
            started_at: self.started_at,
            lock_ttl_ms: (self.ttl_ms > 0).then_some(self.ttl_ms),
            heartbeat_interval_ms: self.heartbeat_interval_ms,
        }
    }
}

pub fn ms_to_time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// `now` as server milliseconds, in Lua (scripts are replicated by effects since Redis 5).
pub(crate) const NOW: &str = "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n";

pub(crate) fn int(v: Option<&Value>) -> i64 {
    match v {
        Some(Value::Int(i)) => *i,
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

pub(crate) fn text(v: Option<&Value>) -> Option<String> {
    match v {
        Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        Some(Value::SimpleString(s)) => Some(s.clone()),
        _ => None,
    }
}

pub(crate) fn record(v: Option<&Value>) -> Option<HolderRecord> {
    text(v).and_then(|s| serde_json::from_str(&s).ok())
}
