//! Shared mode (`dbwarden run --shared`): readers share, a writer excludes them all. Readers
//! live in a sorted set `dbwarden:{<ns>}:readers` (lease id → expiry in server milliseconds) with
//! their records in `dbwarden:{<ns>}:readers:info`; every change is one Lua script. A reader
//! enters only while the writer key is absent; the writer's acquire script refuses while any
//! unexpired reader is left (see `lock::ACQUIRE`). Like the exclusive lease, a reader that dies
//! is freed by its TTL (grade C).

use std::sync::LazyLock;

use dbwarden_core::HolderInfo;
use redis::{Script, Value};

use crate::client::Conn;
use crate::keys::{HolderRecord, Keys, NOW, record};
use crate::replication::Lua;

/// KEYS lock readers info fence holder; ARGV lease_id ttl_ms holder_json
/// -> {1, fence, now} | {0, writer_holder_json|false, now}
pub(crate) static ENTER: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "{NOW}
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {{0, redis.call('GET', KEYS[5]), now}}
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, id in ipairs(gone) do redis.call('HDEL', KEYS[3], id) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
local h = cjson.decode(ARGV[3])
h['lease_id'] = ARGV[1]
h['acquired_at_ms'] = now
h['heartbeat_at_ms'] = now
h['ttl_ms'] = ttl
redis.call('HSET', KEYS[3], ARGV[1], cjson.encode(h))
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
return {{1, tonumber(redis.call('GET', KEYS[4]) or '0'), now}}"
    ))
});

/// KEYS readers info; ARGV lease_id ttl_ms -> 1 renewed | 0 gone (expired or unlocked)
pub(crate) static RENEW: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "{NOW}
local exp = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not exp or tonumber(exp) <= now then return 0 end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[1])
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if raw then
  local h = cjson.decode(raw)
  h['heartbeat_at_ms'] = now
  redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(h))
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1"
    ))
});

/// KEYS readers info; ARGV lease_id channel -> 1 left | 0 was not in
pub(crate) static LEAVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local n = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[2], 'shared')
return n",
    )
});

/// KEYS readers info -> every unexpired reader's record
static LIST: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}
local out = {{}}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], now + 1, '+inf')) do
  local raw = redis.call('HGET', KEYS[2], id)
  if raw then table.insert(out, raw) end
end
return out"
    ))
});

/// Every live shared holder.
pub(crate) async fn holders(conn: &mut Conn, keys: &Keys) -> redis::RedisResult<Vec<HolderInfo>> {
    let raw: Vec<Value> = LIST
        .key(&keys.readers)
        .key(&keys.readers_info)
        .invoke_async(conn)
        .await?;
    Ok(raw
        .iter()
        .filter_map(|v| record(Some(v)))
        .map(|r: HolderRecord| r.holder())
        .collect())
}
