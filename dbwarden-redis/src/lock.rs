//! The Redis lease. Acquire is one Lua script: `SET dbwarden:{<ns>}:lock <lease id> NX PX <ttl>`
//! and, only when that succeeded, `INCR dbwarden:{<ns>}:fence` (the fencing token) and a JSON
//! holder record in `dbwarden:{<ns>}:holder` with the same expiry. Extend and release are
//! compare-and-pexpire / compare-and-delete scripts on the lease id; release also publishes on
//! `dbwarden:{<ns>}:released` so waiters retry at once. All keys carry the hash tag `{<ns>}`, so
//! on a Redis Cluster they live in one slot and every script runs on one node.
//!
//! Grade C: only the TTL frees the lock when its holder dies, so a crashed holder blocks the
//! namespace for up to one ttl. What it cannot prevent: a holder that is paused (SIGSTOP, a long
//! GC or VM freeze, a partition) for longer than the ttl keeps running on resume while another
//! holder already has the lock. Its lease reports lost at its next renewal, and writes it fences
//! with its token (see [`crate::RedisLock::fenced_set`]) are rejected, but writes it makes without
//! a fence check are not: fence every write that matters. A Redis failover that loses the last
//! writes (asynchronous replication) can also hand the lock out twice; the fence counter then
//! still only grows on the new primary if it received the INCR.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use dbwarden_core::error::BusyInfo;
use dbwarden_core::release::{GiveBack, ReleaseOnce};
use dbwarden_core::{Attempt, Beat, Error, FencingToken, Grant, Heartbeat, HeldLock, HolderInfo};
use redis::{Script, Value};
use uuid::Uuid;

use crate::RedisLock;
use crate::client::{Conn, RedisClient};
use crate::replication::{self, Confirm, Lua};
use crate::shared::{self, ENTER};

pub use crate::keys::{AUDIT_KEEP, HolderRecord, Keys, ms_to_time};
use crate::keys::{NOW, int, record};

/// KEYS lock fence holder readers; ARGV lease_id ttl_ms holder_json.
/// -> {1, token, now} | {0, holder_json|false, pttl, now} (pttl -3: live shared holders)
static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "{NOW}
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
if redis.call('ZCARD', KEYS[4]) > 0 then
  return {{0, false, -3, now}}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local token = redis.call('INCR', KEYS[2])
  local h = cjson.decode(ARGV[3])
  h['lease_id'] = ARGV[1]
  h['fencing_token'] = token
  h['acquired_at_ms'] = now
  h['heartbeat_at_ms'] = now
  h['ttl_ms'] = tonumber(ARGV[2])
  redis.call('SET', KEYS[3], cjson.encode(h), 'PX', ARGV[2])
  return {{1, token, now}}
end
return {{0, redis.call('GET', KEYS[3]), redis.call('PTTL', KEYS[1]), now}}"
    ))
});

/// KEYS lock holder; ARGV lease_id ttl_ms -> 1 extended | 0 not ours.
static EXTEND: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
{NOW}
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local raw = redis.call('GET', KEYS[2])
if raw then
  local h = cjson.decode(raw)
  h['heartbeat_at_ms'] = now
  redis.call('SET', KEYS[2], cjson.encode(h), 'PX', ARGV[2])
end
return 1"
    ))
});

/// The release script (compare-and-delete, then announce): KEYS lock holder; ARGV lease_id
/// channel token -> 1 released | 0 not ours (nothing changed). Public so that other clients
/// can release a dbwarden lease the same way.
pub const RELEASE_LUA: &str = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1";

static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));

/// One attempt to take the lease, exclusive or (`shared`) as one of the readers. With `confirm`,
/// a grant only counts once the replicas acknowledged it (else it is given back, and the
/// shortfall reported busy).
pub(crate) async fn try_enter(
    lock: &RedisLock,
    holder: &HolderInfo,
    shared: bool,
) -> Result<Attempt, Error> {
    let mut conn = lock.conn().await?;
    let keys = &lock.shared.keys;
    let lease_id = Uuid::new_v4().simple().to_string();
    let mut json = serde_json::to_value(holder).map_err(Error::database)?;
    json["namespace"] = lock.namespace.as_str().into();
    let confirm = lock.confirm();
    let lua = if shared { &*ENTER } else { &*ACQUIRE };
    let mut script = lua.script.prepare_invoke();
    if shared {
        script
            .key(&keys.lock)
            .key(&keys.readers)
            .key(&keys.readers_info)
            .key(&keys.fence)
            .key(&keys.holder);
    } else {
        script
            .key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.holder)
            .key(&keys.readers);
    }
    script
        .arg(&lease_id)
        .arg(ttl_ms(lock.ttl))
        .arg(json.to_string());
    let (reply, acked): (Vec<Value>, _) = replication::invoke(&mut conn, lua, &script, confirm)
        .await
        .map_err(|e| lock.client.error(e))?;
    if int(reply.first()) != 1 {
        // Held by someone else: their record (if readable); exclusive: the lock's remaining ttl
        // and the server's now.
        let record = record(reply.get(1));
        let (age, note) = if shared {
            let note = "a writer holds the lease; shared holders wait for it";
            (None, Some(note.into()))
        } else {
            let (pttl_ms, now_ms) = (int(reply.get(2)), int(reply.get(3)));
            let age = record.as_ref().map(|r| {
                Duration::from_millis(now_ms.saturating_sub(r.acquired_at_ms).max(0) as u64)
            });
            let note = if pttl_ms == -3 {
                Some("shared by live shared holder(s) (run --shared)".into())
            } else {
                (pttl_ms >= 0).then(|| format!("lease expires in {pttl_ms} ms unless renewed"))
            };
            (age, note)
        };
        return Ok(Attempt::Busy(BusyInfo {
            age,
            fencing_token: record.as_ref().map(|r| r.fencing_token),
            note,
            holder: record.map(|r| r.holder()),
            server_full: false,
        }));
    }
    let token = FencingToken(int(reply.get(1)).max(0) as u64);
    let holding = Arc::new(Holding {
        conn,
        client: lock.client.clone(),
        keys: keys.clone(),
        lease_id,
        ttl: lock.ttl,
        confirm,
        shared,
    });
    if let Some((acked, c)) = replication::short(confirm, acked) {
        // Not handed out: a failover now could lose it and grant it again. Give it back before
        // saying why (a shared place that cannot be given back expires by its ttl), and say
        // busy for now: core waits it out within `--wait`, like a full server.
        let given_back = holding.give_back(token).await;
        if !shared {
            given_back.map_err(|e| lock.client.error(e))?;
        }
        return Err(Error::Busy(Box::new(BusyInfo::not_confirmed(format!(
            "{} on {} was taken back: {}, and a failover could then grant it twice; waiting for a replica (INFO replication shows them)",
            if shared {
                "the shared lease"
            } else {
                "the lease"
            },
            lock.client.target(),
            replication::shortfall(acked, c)
        )))));
    }
    let held = RedisHeld(ReleaseOnce::new(OurLease {
        holding: holding.clone(),
        token,
    }));
    Ok(Attempt::Acquired(Grant::new(token, None, holding, held)))
}

pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    (ttl.as_millis() as u64).max(1)
}

/// A held lease (or a reader's place among the `shared` holders): the lease id that proves it
/// is ours, on a connection of its own lock. Renews it from beside the session that runs
/// migrations.
pub(crate) struct Holding {
    conn: Conn,
    client: RedisClient,
    keys: Keys,
    lease_id: String,
    ttl: Duration,
    /// Replicas that must acknowledge each renewal.
    confirm: Option<Confirm>,
    shared: bool,
}

impl Holding {
    /// Give it back: compare-and-delete the lease, or leave the readers, then announce it.
    /// `Ok(false)`: the exclusive lease was no longer ours (nothing changed).
    ///
    /// Tried twice when the first try meets a connection that broke or a server that is no
    /// longer the primary: behind Sentinel the release may be the first request after a
    /// failover (between two renewals), and its connection still goes to the killed primary
    /// (`broken pipe`); the second try asks the sentinels again and reaches the new one. A
    /// first try whose answer alone was lost and that did release makes the second say "not
    /// ours": reported as lost, never as released when it may not have been.
    async fn give_back(&self, token: FencingToken) -> redis::RedisResult<bool> {
        match self.give_back_once(token).await {
            Err(e) if crate::sentinel::moved(&e) => {
                tracing::debug!("redis: the release met {e}; trying once more");
                self.give_back_once(token).await
            }
            r => r,
        }
    }

    async fn give_back_once(&self, token: FencingToken) -> redis::RedisResult<bool> {
        let mut conn = self.conn.clone();
        let keys = &self.keys;
        if self.shared {
            let _: i64 = shared::LEAVE
                .key(&keys.readers)
                .key(&keys.readers_info)
                .arg(&self.lease_id)
                .arg(&keys.released)
                .invoke_async(&mut conn)
                .await?;
            return Ok(true);
        }
        let n: i64 = RELEASE
            .key(&keys.lock)
            .key(&keys.holder)
            .arg(&self.lease_id)
            .arg(&keys.released)
            .arg(token.0)
            .invoke_async(&mut conn)
            .await?;
        Ok(n == 1)
    }
}

/// The lease of one holder, given back only while its lease id is there.
pub(crate) struct OurLease {
    holding: Arc<Holding>,
    token: FencingToken,
}

#[async_trait]
impl GiveBack for OurLease {
    async fn give_back(&self) -> Result<bool, Error> {
        let h = &self.holding;
        h.give_back(self.token).await.map_err(|e| h.client.error(e))
    }

    fn what(&self) -> String {
        match self.holding.shared {
            true => format!("the shared Redis lease {}", self.holding.keys.readers),
            false => format!("the Redis lease {}", self.holding.keys.lock),
        }
    }
}

/// The held Redis lease, as [`HeldLock`]. Redis keeps no migration tables: `store()` is `None`.
pub(crate) struct RedisHeld(ReleaseOnce<OurLease>);

#[async_trait]
impl Heartbeat for Holding {
    async fn beat(&self) -> Result<Beat, Error> {
        let (lua, keys, what) = match self.shared {
            false => (
                &*EXTEND,
                [&self.keys.lock, &self.keys.holder],
                "Redis lease",
            ),
            true => (
                &*shared::RENEW,
                [&self.keys.readers, &self.keys.readers_info],
                "shared Redis lease",
            ),
        };
        let mut conn = self.conn.clone();
        let mut script = lua.script.prepare_invoke();
        script
            .key(keys[0])
            .key(keys[1])
            .arg(&self.lease_id)
            .arg(ttl_ms(self.ttl));
        let (n, acked): (i64, _) = replication::invoke(&mut conn, lua, &script, self.confirm)
            .await
            .map_err(|e| self.client.error(e))?;
        if n == 1
            && let Some((acked, c)) = replication::short(self.confirm, acked)
        {
            // A failed beat, not a lost lease yet: the copy on the replicas still runs to its
            // last confirmed renewal, and core declares the lease lost before that.
            return Err(Error::unreachable(
                self.client.target(),
                format!(
                    "the renewal of the {what} was not confirmed: {}; a failover now could lose it. Check the replicas (INFO replication), or lower replicas= in the URL",
                    replication::shortfall(acked, c)
                ),
            ));
        }
        Ok(match (n, self.shared) {
            (1, _) => Beat::Alive,
            (_, true) => Beat::Gone(
                "the shared Redis lease expired or was removed (`dbwarden unlock`?)".into(),
            ),
            (_, false) => Beat::Gone(format!(
                "the Redis lease {} expired or was taken over (paused longer than the ttl {}, or `dbwarden unlock`)",
                self.keys.lock,
                dbwarden_core::duration::human(self.ttl)
            )),
        })
    }
}

#[async_trait]
impl HeldLock for RedisHeld {
    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        self.0.release().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_shares_the_namespace_hash_tag() {
        let k = Keys::new("billing.v2");
        for key in [&k.lock, &k.fence, &k.holder, &k.audit, &k.released] {
            assert!(key.starts_with("dbwarden:{billing.v2}:"), "{key}");
        }
        assert_eq!(k.lock, "dbwarden:{billing.v2}:lock");
        assert_eq!(k.fence, "dbwarden:{billing.v2}:fence");
    }

    #[test]
    fn ttl_is_whole_milliseconds_never_zero() {
        assert_eq!(ttl_ms(Duration::from_secs(60)), 60_000);
        assert_eq!(ttl_ms(Duration::from_micros(10)), 1);
    }
}
