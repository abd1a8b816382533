//! The heartbeat of a holder of the named lock, on a connection of its own.

use async_trait::async_trait;
use dbwarden_core::{Beat, Error, FencingToken, Heartbeat};
use sqlx::Connection;
use sqlx::mysql::MySqlConnection;

use crate::lock::{Endpoint, alive_name};

/// The heartbeat, from its own connection (the lock's session may be busy in a statement for a
/// long time): the lock must still belong to the lock session, and the status row must still
/// carry our fencing token.
pub(crate) struct LockBeat {
    pub endpoint: Endpoint,
    pub lock_name: String,
    pub lock_conn_id: u64,
    /// The liveness session's connection id.
    pub alive_conn_id: u64,
    pub namespace: String,
    pub token: FencingToken,
    pub conn: dbwarden_core::kept::Kept<MySqlConnection>,
}

#[async_trait]
impl Heartbeat for LockBeat {
    async fn beat(&self) -> Result<Beat, Error> {
        // Taken out while in use: a beat cancelled half-way drops the connection instead of
        // leaving it mid-protocol for the next beat.
        let mut conn = self.conn.checkout(self.endpoint.connect()).await?;
        let (owner, alive) = sqlx::query_as::<_, (Option<i64>, Option<i64>)>(
            "SELECT CAST(IS_USED_LOCK(?) AS SIGNED), CAST(IS_USED_LOCK(?) AS SIGNED)",
        )
        .bind(&self.lock_name)
        .bind(alive_name(self.lock_conn_id))
        .fetch_one(&mut *conn)
        .await
        .map_err(crate::tables::db_err)?;
        let owner = owner.map(|o| o as u64);
        if owner == Some(self.lock_conn_id) && alive.map(|a| a as u64) != Some(self.alive_conn_id) {
            conn.keep();
            return Ok(Beat::Gone(format!(
                "this run's liveness session (connection {}) ended: a waiting runner takes this run for dead and kills its lock session (connection {})",
                self.alive_conn_id, self.lock_conn_id
            )));
        }
        if owner != Some(self.lock_conn_id) {
            conn.keep();
            return Ok(Beat::Gone(match owner {
                None => format!(
                    "the lock session (connection {}) is gone: killed or disconnected, and the server freed the lock",
                    self.lock_conn_id
                ),
                Some(other) => format!(
                    "the lock now belongs to connection {other}, not to this run's connection {}",
                    self.lock_conn_id
                ),
            }));
        }
        let n = sqlx::query(
            "UPDATE dbwarden_lock SET last_heartbeat_at = UTC_TIMESTAMP(6) WHERE namespace = ? AND fencing_token = ?",
        )
        .bind(&self.namespace)
        .bind(self.token.0 as i64)
        .execute(&mut *conn)
        .await
        .map_err(crate::tables::db_err)?
        .rows_affected();
        conn.keep();
        if n == 0 {
            return Ok(Beat::Gone(format!(
                "fenced out: the status row no longer carries this run's token {} (forced unlock?)",
                self.token
            )));
        }
        Ok(Beat::Alive)
    }
}

impl LockBeat {
    pub(crate) async fn close(&self) {
        if let Some(c) = self.conn.take().await {
            let _ = c.close().await;
        }
    }
}
