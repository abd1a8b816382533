//! The held ClickHouse lock: the lock table we created, the heartbeat that extends its lease,
//! and the store that writes through the fence. Release drops the lock table if it is still ours.

use async_trait::async_trait;
use dbwarden_core::{Error, HeldLock, MigrationStore};
use uuid::Uuid;

use crate::lock::LockTable;
use crate::store::ClickHouseStore;

/// The held ClickHouse lock.
pub(crate) struct ChHeld {
    pub(crate) table: LockTable,
    pub(crate) execution_id: Uuid,
    pub(crate) store: Option<ClickHouseStore>,
    pub(crate) released: bool,
}

#[async_trait]
impl HeldLock for ChHeld {
    fn store(&mut self) -> Option<&mut (dyn MigrationStore + 'static)> {
        self.store.as_mut().map(|s| s as _)
    }

    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        self.released = true;
        self.store = None;
        match self.table.drop_if_ours(self.execution_id).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                tracing::warn!(
                    "the lock table {} was no longer ours at release; left alone",
                    self.table.qualified()
                );
                Ok(())
            }
            Err(e) => Err(self.table.server.error(e)),
        }
    }
}

impl Drop for ChHeld {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Best effort: an async drop needs a runtime; if there is none (or the process exits
        // first) the lease runs out after its TTL.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let table = self.table.clone();
            let id = self.execution_id;
            rt.spawn(async move {
                let _ = table.drop_if_ours(id).await;
            });
        }
    }
}
