//! The held MySQL lock: its store (which owns the locked session), its liveness session, and
//! what a clean release keeps for the lock's next acquire.

use std::sync::Arc;

use async_trait::async_trait;
use dbwarden_core::{Error, HeldLock, MigrationStore};
use sqlx::Connection;

use crate::beat::LockBeat;
use crate::lock::{Alive, KeptAlive, KeptSession};
use crate::store::MySqlStore;

/// The held MySQL lock: the store owns the locked session.
///
/// Dropping it drops that connection, which closes its socket: the server ends the session and
/// frees the named lock on every path (error, panic, cancellation).
pub(crate) struct MySqlHeld {
    /// Declared before `alive`: dropped first, so the lock session closes before the liveness
    /// session does.
    pub store: Option<MySqlStore>,
    pub alive: Option<Alive>,
    pub keep: KeptSession,
    pub keep_alive: KeptAlive,
    pub beat: Arc<LockBeat>,
}

#[async_trait]
impl HeldLock for MySqlHeld {
    fn store(&mut self) -> Option<&mut (dyn MigrationStore + 'static)> {
        self.store.as_mut().map(|s| s as _)
    }

    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        self.beat.close().await;
        let (r, clean) = match self.store.take() {
            Some(store) => store.release().await,
            None => (Ok(()), None),
        };
        // A session that ran only dbwarden's own statements is kept, with its liveness session
        // (still holding the liveness lock named after it), for the lock's next acquire; a
        // migration's session settings must not outlive it, so that one was closed.
        let mut alive = self.alive.take();
        if let Some(s) = clean {
            // Both slots locked together: the session is kept only with its liveness session.
            let mut slot = self.keep.lock().await;
            let mut alive_slot = self.keep_alive.lock().await;
            if slot.is_none() && alive_slot.is_none() && alive.is_some() {
                *alive_slot = alive.take();
                *slot = Some(s);
            } else {
                drop((slot, alive_slot));
                let _ = s.conn.close().await;
            }
        }
        // Only after the lock is free: a waiter seeing the lock held and the liveness lock free
        // would take this run for dead.
        if let Some(alive) = alive {
            let _ = alive.conn.close().await;
        }
        r
    }
}
