//! Shared mode (`dbwarden run --shared`): readers share, a writer excludes them all. Readers
//! live in a sorted set `dbwarden:{<ns>}:readers` (lease id → expiry in server milliseconds) with
//! their records in `dbwarden:{<ns>}:readers:info`; every change is one Lua script. A reader
//! enters only while the writer key is absent; the writer's acquire script refuses while any
//! unexpired reader is left (see `lock::ACQUIRE`). Like the exclusive lease, a reader that dies
//! is freed by its TTL (grade C).

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use dbwarden_core::error::BusyInfo;
use dbwarden_core::{Attempt, Error, FencingToken, Grant, HeldLock, HolderInfo};
use redis::{Script, Value};

use crate::client::{Conn, RedisClient};
use crate::lock::{
    HolderRecord, Holding, Keys, NOW, Renewal, grant_not_confirmed, int, record, ttl_ms,
};
use crate::replication::{self, Confirm, Lua};

/// KEYS lock readers info fence holder; ARGV lease_id ttl_ms holder_json
/// -> {1, fence, now} | {0, writer_holder_json|false, now}
static ENTER: LazyLock<Lua> = LazyLock::new(|| {
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
static LEAVE: LazyLock<Script> = LazyLock::new(|| {
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

/// Give a reader's place back.
async fn leave(r: &Holding) -> redis::RedisResult<()> {
    let mut conn = r.conn.clone();
    let _: i64 = LEAVE
        .key(&r.keys.readers)
        .key(&r.keys.readers_info)
        .arg(&r.lease_id)
        .arg(&r.keys.released)
        .invoke_async(&mut conn)
        .await?;
    Ok(())
}

/// A held shared lease.
pub(crate) struct SharedHeld {
    reader: Arc<Holding>,
    released: bool,
}

/// One attempt to join the readers.
pub(crate) async fn try_acquire(
    mut conn: Conn,
    client: RedisClient,
    keys: &Keys,
    ttl: Duration,
    holder: &HolderInfo,
    namespace: &str,
    confirm: Option<Confirm>,
) -> Result<Attempt, Error> {
    let lease_id = uuid::Uuid::new_v4().simple().to_string();
    let mut json = serde_json::to_value(holder).map_err(Error::database)?;
    json["namespace"] = namespace.into();
    let mut script = ENTER.script.prepare_invoke();
    script
        .key(&keys.lock)
        .key(&keys.readers)
        .key(&keys.readers_info)
        .key(&keys.fence)
        .key(&keys.holder)
        .arg(&lease_id)
        .arg(ttl_ms(ttl))
        .arg(json.to_string());
    let (reply, acked): (Vec<Value>, _) = replication::invoke(&mut conn, &ENTER, &script, confirm)
        .await
        .map_err(|e| client.error(e))?;
    if int(reply.first()) != 1 {
        let writer = record(reply.get(1));
        return Ok(Attempt::Busy(BusyInfo {
            fencing_token: writer.as_ref().map(|r| r.fencing_token),
            holder: writer.map(|r| r.holder()),
            age: None,
            note: Some("a writer holds the lease; shared holders wait for it".into()),
            server_full: false,
        }));
    }
    let reader = Arc::new(Holding {
        conn,
        client,
        keys: keys.clone(),
        lease_id,
        ttl,
        confirm,
    });
    if let Some((acked, c)) = replication::short(confirm, acked) {
        // Not handed out: give the place back before saying why.
        let _ = leave(&reader).await;
        return Err(grant_not_confirmed(
            &reader.client,
            "the shared lease",
            acked,
            c,
        ));
    }
    let token = FencingToken(int(reply.get(1)).max(0) as u64);
    let beat = Renewal {
        h: reader.clone(),
        shared: true,
    };
    let held = SharedHeld {
        reader,
        released: false,
    };
    Ok(Attempt::Acquired(Grant::new(token, None, beat, held)))
}

#[async_trait]
impl HeldLock for SharedHeld {
    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        self.released = true;
        leave(&self.reader)
            .await
            .map_err(|e| self.reader.client.error(e))
    }
}

impl Drop for SharedHeld {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let reader = self.reader.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = leave(&reader).await;
            });
        }
    }
}
