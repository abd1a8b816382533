//! The held ClickHouse lock: the lock table we created, the heartbeat that extends its lease,
//! and the store that writes through the fence. Release drops the lock table if it is still
//! ours (core's `ReleaseOnce`: once, or on drop).

use async_trait::async_trait;
use dbwarden_core::release::{GiveBack, ReleaseOnce};
use dbwarden_core::{Error, HeldLock, MigrationStore};
use uuid::Uuid;

use crate::lock::LockTable;
use crate::store::ClickHouseStore;

/// The lock table of one holder, dropped only while it names that holder.
pub(crate) struct OurTable {
    pub(crate) table: LockTable,
    pub(crate) execution_id: Uuid,
}

#[async_trait]
impl GiveBack for OurTable {
    async fn give_back(&self) -> Result<bool, Error> {
        self.table
            .drop_if_ours(self.execution_id)
            .await
            .map_err(|e| self.table.server.error(e))
    }

    fn what(&self) -> String {
        format!("the lock table {}", self.table.qualified())
    }
}

/// The held ClickHouse lock.
pub(crate) struct ChHeld {
    pub(crate) store: Option<ClickHouseStore>,
    pub(crate) table: ReleaseOnce<OurTable>,
}

#[async_trait]
impl HeldLock for ChHeld {
    fn store(&mut self) -> Option<&mut (dyn MigrationStore + 'static)> {
        self.store.as_mut().map(|s| s as _)
    }

    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        self.store = None;
        self.table.release().await
    }
}
