//! A held etcd lease: renewed by core's heartbeat, given back once by core's
//! [`ReleaseOnce`]. The lock key lives as long as the lease does.

use std::sync::Arc;

use async_trait::async_trait;
use dbwarden_core::release::{GiveBack, ReleaseOnce};
use dbwarden_core::{Attempt, Beat, Error, FencingToken, Grant, Heartbeat, HeldLock};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::conn::Conn;

/// One holder's lease and key (the lock key, or its own key among the shared holders).
pub(crate) struct Holding {
    conn: Conn,
    lease: i64,
    key: String,
}

/// The take that succeeded, as core wants it.
pub(crate) fn granted(conn: Conn, lease: i64, key: String, token: u64) -> Attempt {
    let holding = Arc::new(Holding { conn, lease, key });
    let held = EtcdHeld(ReleaseOnce::new(OurLease(holding.clone())));
    Attempt::Acquired(Grant::new(FencingToken(token), None, holding, held))
}

#[async_trait]
impl Heartbeat for Holding {
    /// One renewal of the lease, then that its key is still on it: an `unlock` deletes the
    /// lock key before it ends the lease.
    async fn beat(&self) -> Result<Beat, Error> {
        if !self.conn.keep_alive(self.lease).await? {
            return Ok(Beat::Gone(format!(
                "the etcd lease {:x} of {} expired or was revoked (paused longer than its ttl, or `dbwarden unlock`)",
                self.lease, self.key
            )));
        }
        let reply = self.conn.get("check the lock", &self.key, None).await?;
        Ok(match reply.kvs().first() {
            Some(kv) if kv.lease() == self.lease => Beat::Alive,
            _ => Beat::Gone(format!(
                "{} is no longer on this holder's lease (`dbwarden unlock`?)",
                self.key
            )),
        })
    }
}

/// The holding, given back only while the key is still on its lease.
pub(crate) struct OurLease(Arc<Holding>);

#[async_trait]
impl GiveBack for OurLease {
    async fn give_back(&self) -> Result<bool, Error> {
        let h = &self.0;
        let key = h.key.as_str();
        let txn = Txn::new()
            .when([Compare::lease(key, CompareOp::Equal, h.lease)])
            .and_then([TxnOp::delete(key, None)]);
        let mut ours = h.conn.txn("give the lock back", txn).await?.succeeded();
        if !ours {
            // A first try whose answer was lost deleted it, if the key is gone while our lease
            // still lives (an unlock or an expiry ends the lease too).
            let gone = h
                .conn
                .get("check the lock", key, None)
                .await?
                .kvs()
                .is_empty();
            ours = gone && h.conn.time_to_live(h.lease).await?.1 > chrono::TimeDelta::zero();
        }
        h.conn.revoke(h.lease).await;
        Ok(ours)
    }

    fn what(&self) -> String {
        format!("the etcd lease of {}", self.0.key)
    }
}

/// The held etcd lease, as [`HeldLock`]. etcd keeps no migration tables: no store.
pub(crate) struct EtcdHeld(ReleaseOnce<OurLease>);

#[async_trait]
impl HeldLock for EtcdHeld {
    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        self.0.release().await
    }
}
