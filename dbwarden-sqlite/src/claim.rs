//! What a take holds: the claim in the database (token, status row, spooled audit rows), the
//! flock'd sidecar with the connection that runs migrations, and the sidecar's heartbeat.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use dbwarden_core::error::BusyInfo;
use dbwarden_core::{
    AuditRecord, Beat, Error, FencingToken, Heartbeat, HeldLock, HolderInfo, MigrationStore,
    StatusRow,
};

use crate::SqliteLock;
use crate::lock::{self, Sidecar, SidecarBody};
use crate::store::{SqliteStore, bump_and_claim, create_tables};

impl SqliteLock {
    pub(crate) async fn claim(
        &self,
        sidecar: &Sidecar,
        holder: &HolderInfo,
    ) -> Result<(SqliteStore, FencingToken, Option<StatusRow>), Error> {
        let mut body = SidecarBody::new(holder, self.namespace.as_str());
        sidecar.write_body(&body)?;
        let mut conn = self.open(self.busy_timeout, true).await?;
        create_tables(&mut conn, &self.history_table).await?;
        let audits: Vec<AuditRecord> = lock::spool::drain(&self.spool_path);
        let (token, previous) =
            match bump_and_claim(&mut conn, self.namespace.as_str(), holder, &audits).await {
                Ok(v) => v,
                Err(e) => {
                    self.respool(&audits);
                    return Err(e);
                }
            };
        body.fencing_token = token.0;
        sidecar.write_body(&body)?;
        let store = SqliteStore {
            conn,
            namespace: self.namespace.to_string(),
            history_table: self.history_table.clone(),
            sqlx_mirror: false,
        };
        Ok((store, token, previous))
    }

    /// Put records back into the spool after a failed attempt to write them.
    fn respool(&self, records: &[AuditRecord]) {
        for r in records {
            if let Err(e) = lock::spool::append(&self.spool_path, r) {
                tracing::warn!("audit record lost: {e}");
            }
        }
    }
}

/// The held SQLite lock: the flock'd sidecar plus the connection that runs migrations.
pub(crate) struct SqliteHeld {
    pub(crate) sidecar: Arc<Sidecar>,
    pub(crate) spool_path: PathBuf,
    pub(crate) store: Option<SqliteStore>,
    pub(crate) released: bool,
}

pub(crate) struct SidecarHeartbeat(pub(crate) Arc<Sidecar>);

#[async_trait]
impl Heartbeat for SidecarHeartbeat {
    async fn beat(&self) -> Result<Beat, Error> {
        // File I/O can block (a hung network filesystem): keep it off the async workers so the
        // heartbeat's own timeout still fires.
        let sidecar = self.0.clone();
        let alive = tokio::task::spawn_blocking(move || sidecar.beat())
            .await
            .map_err(|e| Error::database(format!("heartbeat task failed: {e}")))??;
        if alive {
            Ok(Beat::Alive)
        } else {
            Ok(Beat::Gone(
                "the lock file was removed or replaced (forced unlock?)".into(),
            ))
        }
    }
}

#[async_trait]
impl HeldLock for SqliteHeld {
    fn store(&mut self) -> Option<&mut (dyn MigrationStore + 'static)> {
        self.store.as_mut().map(|s| s as _)
    }

    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        if let Some(mut store) = self.store.take() {
            // Move audit rows that declined runs spooled meanwhile into the table.
            for rec in lock::spool::drain(&self.spool_path) {
                if let Err(e) = store.audit(&rec).await {
                    tracing::warn!("could not write a spooled audit row: {e}");
                    let _ = lock::spool::append(&self.spool_path, &rec);
                }
            }
            store.close().await;
        }
        self.sidecar.release();
        self.released = true;
        Ok(())
    }
}

impl Drop for SqliteHeld {
    fn drop(&mut self) {
        if !self.released {
            self.sidecar.release();
        }
    }
}

/// Held by the writer of `body`, or by a process whose lock file could not be read.
pub(crate) fn busy(body: Option<&SidecarBody>) -> BusyInfo {
    body.map_or_else(BusyInfo::default, |b| b.busy(None))
}
