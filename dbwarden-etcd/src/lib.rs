//! dbwarden-etcd: the etcd lease (grade C, a lock only), for a lock that must keep its promise
//! while a majority of the cluster lives. `etcd://[user:password@]host:2379[,…][/prefix]`.
//!
//! Under `<prefix>/<namespace>/`: `lock`, the holder record, created in a transaction only while
//! absent (and no shared holder is there), on an etcd lease core's heartbeat renews, its create
//! revision the fencing token; `readers/<lease>`, the shared holders; `audit/<time>-<id>`, the
//! audit rows. A waiter is woken by a watch from the last revision it read. Waiting, staleness
//! and unlock decisions are core's (docs/engines.md, "etcd").
#![forbid(unsafe_code)]

mod conn;
mod held;

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dbwarden_core::config::Settings;
use dbwarden_core::error::BusyInfo;
use dbwarden_core::lock::{Broke, Sighting};
use dbwarden_core::{
    Attempt, AuditRecord, Error, Grade, HeartbeatConfig, HolderInfo, MigrationLock, Namespace,
    Observation, Reach, SharedLock, WakeUp,
};
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};
use tokio::sync::OnceCell;

use crate::conn::{Conn, Where};

/// The shortest ttl accepted: etcd grants leases in whole seconds and none shorter than about
/// one and a half election timeouts (2 s with etcd's defaults).
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// How long an audit row is kept (etcd deletes it then, with the lease it was written under).
pub const AUDIT_KEPT: Duration = Duration::from_secs(30 * 24 * 3600);

/// This engine in the registry (`dbwarden_core::registry`).
pub static ENGINE: dbwarden_core::registry::Engine = dbwarden_core::registry::Engine {
    name: "etcd",
    schemes: &["etcd"],
    open: from_settings,
    lease_lock: false,
};

/// The lock for `settings.database_url` (an etcd URL) and `settings.namespace`, validated
/// without connecting.
pub fn from_settings(settings: &Settings) -> Result<Box<dyn MigrationLock>, Error> {
    Ok(Box::new(EtcdLock::from_settings(settings)?))
}

/// What the `lock` key (and a reader's key) holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    #[serde(flatten)]
    holder: HolderInfo,
    /// When this holder took it, by its own clock (etcd has none to offer).
    acquired_at: DateTime<Utc>,
}

/// The etcd lease of one namespace.
pub struct EtcdLock {
    place: Where,
    namespace: Namespace,
    /// `<prefix>/<namespace>/`, what a waiter watches; the lock key and the shared holders'.
    base: String,
    lock: String,
    readers: String,
    heartbeat: HeartbeatConfig,
    conn: OnceCell<Conn>,
}

impl EtcdLock {
    pub fn from_settings(settings: &Settings) -> Result<Self, Error> {
        let place = Where::parse(&settings.database_url, settings)?;
        let heartbeat = settings.heartbeat(dbwarden_core::lock::DEFAULT_TTL)?;
        heartbeat.validate_lease("etcd", MIN_TTL)?;
        let base = format!("{}/{}/", place.prefix, settings.namespace);
        Ok(EtcdLock {
            lock: format!("{base}lock"),
            readers: format!("{base}readers/"),
            base,
            place,
            namespace: settings.namespace.clone(),
            heartbeat,
            conn: OnceCell::new(),
        })
    }

    async fn conn(&self) -> Result<&Conn, Error> {
        self.conn.get_or_try_init(|| Conn::open(&self.place)).await
    }

    /// One attempt: a lease, then the key created in a transaction only while the lock is free
    /// (and, for a writer, no shared holder is there).
    async fn try_enter(&self, holder: &HolderInfo, shared: bool) -> Result<Attempt, Error> {
        let conn = self.conn().await?;
        let lease = conn.grant(self.heartbeat.ttl).await?;
        let record = Record {
            holder: holder.clone(),
            acquired_at: Utc::now(),
        };
        let value = serde_json::to_string(&record).map_err(Error::database)?;
        let lock = &self.lock;
        let readers = || GetOptions::new().with_prefix().with_count_only();
        let absent = |key: &str| Compare::create_revision(key, CompareOp::Equal, 0);
        let (key, when) = match shared {
            true => (format!("{}{lease:x}", self.readers), vec![absent(lock)]),
            false => (
                lock.clone(),
                vec![absent(lock), absent(&self.readers).with_prefix()],
            ),
        };
        let put = etcd_client::PutOptions::new().with_lease(lease);
        let txn = Txn::new()
            .when(when)
            .and_then([TxnOp::put(key.as_str(), value, Some(put))])
            .or_else([
                TxnOp::get(lock.as_str(), None),
                TxnOp::get(self.readers.as_str(), Some(readers())),
            ]);
        let reply = conn.txn("take the lock", txn).await?;
        let revision = reply.header().map_or(0, |h| h.revision());
        let mut gets = reply.op_responses().into_iter().filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        });
        let found = gets.next().and_then(|g| g.kvs().first().cloned());
        // A first try whose answer was lost may have created the key already: ours by lease.
        let ours = found.as_ref().filter(|kv| kv.lease() == lease);
        if reply.succeeded() || ours.is_some() {
            let token = ours.map_or(revision, |kv| kv.create_revision()).max(0) as u64;
            // Each renewal try within a third of the interval: a beat gets past a member that
            // does not answer before core's beat deadline (one interval) passes.
            let conn = conn.each_try_within(self.heartbeat.interval / 3);
            return Ok(held::granted(conn, lease, key, token));
        }
        conn.revoke(lease).await;
        let note = match (shared, &found) {
            (true, _) => "a writer holds the lease; shared holders wait for it".to_owned(),
            (false, None) => format!(
                "shared by {} live shared holder(s) (run --shared)",
                gets.next().map_or(0, |g| g.count())
            ),
            (false, Some(kv)) => format!("held under etcd lease {:x} while renewed", kv.lease()),
        };
        let record = found.as_ref().and_then(read_record);
        Ok(Attempt::Busy(BusyInfo {
            age: (record.as_ref()).and_then(|r| (Utc::now() - r.acquired_at).to_std().ok()),
            fencing_token: found.as_ref().map(|kv| kv.create_revision() as u64),
            note: Some(note),
            holder: record.map(|r| r.holder),
            ..BusyInfo::default()
        }))
    }

    /// The `lock` key as it is now, if any.
    async fn lock_key(&self) -> Result<Option<KeyValue>, Error> {
        let conn = self.conn().await?;
        let mut reply = conn.get("read the lock", &self.lock, None).await?;
        Ok(reply.take_kvs().into_iter().next())
    }

    /// An audit row, as a put under a lease of its own: etcd deletes it after [`AUDIT_KEPT`].
    /// Its key, fixed before any try, tells a retried write that the first one landed.
    async fn audit_row(&self, conn: &Conn, record: &AuditRecord) -> Result<(String, TxnOp), Error> {
        let lease = conn.grant(AUDIT_KEPT).await?;
        let row = serde_json::to_string(record).map_err(Error::database)?;
        let key = format!(
            "{}audit/{:013}-{}",
            self.base,
            Utc::now().timestamp_millis(),
            uuid::Uuid::new_v4().simple()
        );
        let put = etcd_client::PutOptions::new().with_lease(lease);
        Ok((key.clone(), TxnOp::put(key, row, Some(put))))
    }
}

fn read_record(kv: &KeyValue) -> Option<Record> {
    serde_json::from_slice(kv.value()).ok()
}

#[async_trait]
impl SharedLock for EtcdLock {
    async fn try_acquire_shared(&self, holder: &HolderInfo) -> Result<Attempt, Error> {
        self.try_enter(holder, true).await
    }

    async fn shared_holders(&self) -> Result<Vec<HolderInfo>, Error> {
        let conn = self.conn().await?;
        let opts = GetOptions::new().with_prefix();
        let reply = conn
            .get("read the shared holders", &self.readers, Some(opts))
            .await?;
        Ok(reply
            .kvs()
            .iter()
            .filter_map(read_record)
            .map(|r| r.holder)
            .collect())
    }
}

#[async_trait]
impl WakeUp for EtcdLock {
    async fn wait_for_release(&self, max: Duration) {
        match self.conn().await {
            Ok(conn) => conn.wait_for_delete(&self.base, max).await,
            Err(_) => tokio::time::sleep(max).await,
        }
    }
}

#[async_trait]
impl MigrationLock for EtcdLock {
    fn identity(&self) -> dbwarden_core::Identity<'_> {
        dbwarden_core::Identity {
            engine: "etcd",
            grade: Grade::C,
            namespace: &self.namespace,
            reach: Some(Reach {
                target: self.place.target.clone(),
                connect_timeout: self.place.connect_timeout,
            }),
        }
    }

    async fn try_acquire(&self, holder: &HolderInfo) -> Result<Attempt, Error> {
        self.try_enter(holder, false).await
    }

    fn wake_up(&self) -> Option<&dyn WakeUp> {
        Some(self)
    }

    fn shared(&self) -> Option<&dyn SharedLock> {
        Some(self)
    }

    async fn observe(&self) -> Result<Observation, Error> {
        let kv = self.lock_key().await?;
        let now = Utc::now();
        let mut o = Observation::new(self.engine(), self.grade(), self.namespace.as_str(), now);
        o.notes.push(
            "etcd lease: only its ttl frees it when the holder dies; it keeps no migration history"
                .to_owned(),
        );
        let Some(kv) = kv else { return Ok(o) };
        let conn = self.conn().await?;
        // etcd records no renewal time: the lease's remaining ttl says when it was last renewed
        // (to the second), by the server's own count, whatever the clocks say.
        let (granted, left) = conn.time_to_live(kv.lease()).await?;
        let renewed = now - (granted - left);
        let holder = read_record(&kv).map(|r| (r.holder, r.acquired_at));
        let session = format!("lease {:x} of {}", kv.lease(), self.lock);
        let token = kv.create_revision() as u64;
        Ok(o.held_lease(holder, token, session, Some(renewed), Some(now + left)))
    }

    async fn sight(&self) -> Result<Sighting, Error> {
        let Some(kv) = self.lock_key().await? else {
            return Ok(Sighting::default());
        };
        let record = read_record(&kv);
        Ok(Sighting {
            current: record.as_ref().map(|r| r.holder.execution_id),
            anything: true,
            holder: record.map(|r| r.holder),
            session: Some(format!("{:x}", kv.lease())),
            token: Some(kv.create_revision() as u64),
            row: None,
        })
    }

    /// Delete the key only while it is the one sighted (same lease, same create revision) and
    /// write the audit row in the same transaction; then end the holder's lease, so its next
    /// renewal hears it. The next holder's key has a larger create revision: the old token is
    /// fenced out.
    async fn break_lock(
        &self,
        seen: &Sighting,
        _expected: Option<uuid::Uuid>,
        record: AuditRecord,
    ) -> Result<Broke, Error> {
        let (Some(lease), Some(token)) = (
            seen.session
                .as_deref()
                .and_then(|s| i64::from_str_radix(s, 16).ok()),
            seen.token,
        ) else {
            return Ok(Broke::Changed);
        };
        let conn = self.conn().await?;
        let lock = self.lock.as_str();
        let (key, row) = self.audit_row(conn, &record).await?;
        let txn = Txn::new()
            .when([
                Compare::lease(lock, CompareOp::Equal, lease),
                Compare::create_revision(lock, CompareOp::Equal, token as i64),
            ])
            .and_then([TxnOp::delete(lock, None), row])
            .or_else([TxnOp::get(key, None)]);
        let reply = conn.txn("remove the lock", txn).await?;
        // Our audit row there: a first try whose answer was lost removed it.
        let landed = || match reply.op_responses().first() {
            Some(TxnOpResponse::Get(g)) => !g.kvs().is_empty(),
            _ => false,
        };
        if !reply.succeeded() && !landed() {
            return Ok(Broke::Changed);
        }
        conn.revoke(lease).await;
        Ok(Broke::Unlocked)
    }

    async fn audit(&self, record: &AuditRecord) -> Result<(), Error> {
        let conn = self.conn().await?;
        let (_, put) = self.audit_row(conn, record).await?;
        conn.txn("write an audit row", Txn::new().and_then([put]))
            .await
            .map(drop)
    }
}
