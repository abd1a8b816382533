//! Reading and breaking the lease from outside: `lock-status`, `unlock`, the audit list, and the
//! fence checks an application uses to fence its own writes. Redis keeps no status or history
//! table; the holder record stands in for the status row while the lease is held.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use dbwarden_core::{AuditRecord, FencingToken};
use redis::{Script, Value};

use crate::client::Conn;
use crate::keys::{AUDIT_KEEP, HolderRecord, Keys, NOW, int, ms_to_time, record, text};

/// Append `ARGV[n]` (an audit JSON object) to `KEYS[k]` with the server time, keep the newest.
fn audit_push(k: usize, n: usize) -> String {
    format!(
        "{NOW}local a = cjson.decode(ARGV[{n}])
a['at_ms'] = now
redis.call('LPUSH', KEYS[{k}], cjson.encode(a))
redis.call('LTRIM', KEYS[{k}], 0, {})
",
        AUDIT_KEEP - 1
    )
}

/// KEYS lock holder fence -> {now_ms, lock value|false, holder json|false, pttl, fence|false}
static OBSERVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}return {{now, redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[3])}}"
    ))
});

/// KEYS lock holder fence audit; ARGV lease_id audit_json channel -> 1 | 0 (changed meanwhile).
/// Bumping the fence makes the removed holder's fenced writes fail at once.
static UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('INCR', KEYS[3])
{}redis.call('PUBLISH', ARGV[3], 'unlocked')
return 1",
        audit_push(4, 2)
    ))
});

/// KEYS audit; ARGV audit_json
static AUDIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{}return 1", audit_push(1, 1))));

/// KEYS fence target; ARGV token value -> 1 written | 0 fenced out
static FENCED_SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
return 1",
    )
});

/// The lease as read by one script: consistent, by the server clock.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub now: DateTime<Utc>,
    /// The lock key's value (the holder's lease id) when held.
    pub lease_id: Option<String>,
    /// The holder record, when it belongs to the current lease.
    pub record: Option<HolderRecord>,
    pub pttl_ms: i64,
    /// The last fencing token handed out (or bumped by an unlock).
    pub fence: Option<u64>,
}

impl Snapshot {
    pub fn expires_at(&self) -> Option<DateTime<Utc>> {
        (self.lease_id.is_some() && self.pttl_ms >= 0)
            .then(|| self.now + chrono::Duration::milliseconds(self.pttl_ms))
    }
}

pub(crate) async fn snapshot(conn: &mut Conn, keys: &Keys) -> redis::RedisResult<Snapshot> {
    let reply: Vec<Value> = OBSERVE
        .key(&keys.lock)
        .key(&keys.holder)
        .key(&keys.fence)
        .invoke_async(conn)
        .await?;
    let now_ms = int(reply.first());
    let lease_id = text(reply.get(1));
    let record = record(reply.get(2)).filter(|r| Some(&r.lease_id) == lease_id.as_ref());
    let pttl_ms = match reply.get(3) {
        Some(Value::Int(i)) => *i,
        _ => -2,
    };
    let fence = text(reply.get(4)).and_then(|s| s.parse().ok());
    Ok(Snapshot {
        now: ms_to_time(now_ms),
        lease_id,
        record,
        pttl_ms,
        fence,
    })
}

/// Remove the lease with this lease id, bump the fence and audit, in one script.
pub(crate) async fn unlock(
    conn: &mut Conn,
    keys: &Keys,
    lease_id: &str,
    audit: &AuditRecord,
) -> redis::RedisResult<bool> {
    let n: i64 = UNLOCK
        .key(&keys.lock)
        .key(&keys.holder)
        .key(&keys.fence)
        .key(&keys.audit)
        .arg(lease_id)
        .arg(audit_json(audit))
        .arg(&keys.released)
        .invoke_async(conn)
        .await?;
    Ok(n == 1)
}

fn audit_json(audit: &AuditRecord) -> String {
    serde_json::to_string(audit).unwrap_or_else(|_| "{}".to_owned())
}

pub(crate) async fn audit(
    conn: &mut Conn,
    keys: &Keys,
    record: &AuditRecord,
) -> redis::RedisResult<()> {
    let _: i64 = AUDIT
        .key(&keys.audit)
        .arg(audit_json(record))
        .invoke_async(conn)
        .await?;
    Ok(())
}

/// The fence counter's current value.
pub(crate) async fn fence(conn: &mut Conn, keys: &Keys) -> redis::RedisResult<Option<u64>> {
    redis::cmd("GET").arg(&keys.fence).query_async(conn).await
}

pub(crate) async fn fenced_set(
    conn: &mut Conn,
    keys: &Keys,
    token: FencingToken,
    key: &str,
    value: &[u8],
) -> redis::RedisResult<bool> {
    let n: i64 = FENCED_SET
        .key(&keys.fence)
        .key(key)
        .arg(token.0)
        .arg(value)
        .invoke_async(conn)
        .await?;
    Ok(n == 1)
}

/// The cluster hash tag of `key` (the part between the first `{` and the next `}`, if not empty).
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &key[open + 1..close])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_tags_follow_the_cluster_rule() {
        assert_eq!(hash_tag("app:{billing}:counter"), Some("billing"));
        assert_eq!(hash_tag("dbwarden:{a.b}:lock"), Some("a.b"));
        assert_eq!(hash_tag("app:{}:{x}"), None);
        assert_eq!(hash_tag("plain"), None);
        assert_eq!(hash_tag("a{b"), None);
    }
}
