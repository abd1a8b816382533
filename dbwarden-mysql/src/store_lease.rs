//! The store's side of the Galera lease: failures judged by its token, its proof, its give-back.

use dbwarden_core::{Error, FencingToken};
use dbwarden_sql::binds;

use crate::lock::bounded;
use crate::store::{MySqlStore, missing};
use crate::tables::db_err;

impl MySqlStore {
    /// After a failure on the lease: the lease is lost when the status row carries another
    /// token now, and when the token cannot be read on this session (it ended with its node:
    /// the run cannot go on, and the lease runs out after its ttl).
    pub(crate) async fn settle_lease(&mut self, token: FencingToken, e: Error) -> Error {
        // A transaction the failure left open (a refused commit, a statement cut off) first.
        self.rollback_quietly().await;
        let read = tokio::time::timeout(
            self.statement_timeout,
            binds::stored_token(&mut self.conn, &self.namespace, "", db_err),
        )
        .await;
        match read {
            Ok(Ok(now)) => match token.check(now) {
                Ok(()) => e,
                Err(lost) => Error::Lost(format!("{lost}; it failed with: {e}")),
            },
            _ => Error::Lost(format!(
                "the session on the node that holds the lease ended, so this run cannot go on (the lease runs out after its ttl); it failed with: {e}"
            )),
        }
    }

    /// The lease's proof, in the open transaction (or alone): a write to the status row while
    /// it carries `token`. Its write set holds the row, so on a Galera cluster a commit that
    /// races a takeover on another node fails certification instead of landing after it.
    pub(crate) async fn touch_lease(&mut self, token: FencingToken) -> Result<(), Error> {
        let n = sqlx::query(
            "UPDATE dbwarden_lock SET last_heartbeat_at = GREATEST(UTC_TIMESTAMP(6), last_heartbeat_at + INTERVAL 1 MICROSECOND) \
             WHERE namespace = ? AND fencing_token = ?",
        )
        .bind(&self.namespace)
        .bind(token.0 as i64)
        .execute(&mut self.conn)
        .await
        .map_err(db_err)?
        .rows_affected();
        if n == 1 {
            return Ok(());
        }
        token.check(binds::stored_token(&mut self.conn, &self.namespace, "", db_err).await?)?;
        Err(missing("proving the lease: the status row"))
    }

    /// The lease given back while it is still ours (`expires_at` cleared): the next runner
    /// takes it at once instead of after the ttl.
    pub(crate) async fn give_lease_back(&mut self, token: FencingToken) -> Result<(), Error> {
        // A transaction a lost lease left open must not be committed by this write.
        self.rollback_quietly().await;
        bounded(self.statement_timeout, "giving the lease back", async {
            sqlx::query(
                "UPDATE dbwarden_lock SET expires_at = NULL WHERE namespace = ? AND fencing_token = ?",
            )
            .bind(&self.namespace)
            .bind(token.0 as i64)
            .execute(&mut self.conn)
            .await
            .map_err(db_err)
        })
        .await?;
        Ok(())
    }
}
