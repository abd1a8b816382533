//! A held lease: its heartbeat ([`LeaseBeat`]) renews `expires_at`; its release gives it back.

use std::sync::Arc;

use async_trait::async_trait;
use dbwarden_core::{Beat, Error, FencingToken, Heartbeat, HeldLock, MigrationStore};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection, Row};

use super::keep_in;
use crate::held::Kept;
use crate::literal::literal;
use crate::lock::{self, Target};
use crate::store::PgStore;
use crate::tables::{db_err, local_bounds};

/// Renews the lease (`expires_at` and `last_heartbeat_at`, by the server's clock) while the
/// token is ours, in one short transaction on a connection of its own.
pub(super) struct LeaseBeat {
    pub(super) target: Target,
    pub(super) conn: dbwarden_core::kept::Kept<PgConnection>,
    pub(super) lock_table: String,
    pub(super) namespace: String,
    pub(super) token: FencingToken,
    pub(super) ttl_ms: u64,
}

impl LeaseBeat {
    /// Give the lease back (`expires_at` cleared while the token is ours) and NOTIFY: a pooler
    /// has no LISTEN, but runners on the advisory lock beside us do.
    fn release_sql(&self, ms: u128) -> Result<String, Error> {
        let ns = literal(&self.namespace)?;
        let bounds = local_bounds(ms);
        // ROLLBACK first: a run that stopped inside a file's own transaction (its lease lost)
        // must not have that transaction committed by this one.
        Ok(format!(
            "ROLLBACK; BEGIN; {bounds};
         UPDATE {lock_table} SET expires_at = NULL WHERE namespace = {ns} AND fencing_token = {token};
         SELECT pg_notify('{channel}', {ns});
         COMMIT",
            lock_table = self.lock_table,
            token = self.token.0 as i64,
            channel = lock::RELEASE_CHANNEL,
        ))
    }

    async fn beat_on(&self, conn: &mut PgConnection) -> Result<Beat, Error> {
        let bounds = local_bounds(self.target.statement_timeout.as_millis().max(1));
        let ns = literal(&self.namespace)?;
        let done = sqlx::raw_sql(AssertSqlSafe(format!(
            "BEGIN; {bounds};
             UPDATE {t} SET last_heartbeat_at = clock_timestamp(),
                 expires_at = clock_timestamp() + {ttl} * interval '1 millisecond'
               WHERE namespace = {ns} AND fencing_token = {token} AND expires_at IS NOT NULL;
             COMMIT",
            t = self.lock_table,
            ttl = self.ttl_ms,
            token = self.token.0 as i64,
        )))
        .execute(&mut *conn)
        .await
        .map_err(|e| self.target.db_err(e))?;
        if done.rows_affected() == 1 {
            return Ok(Beat::Alive);
        }
        let row = sqlx::raw_sql(AssertSqlSafe(format!(
            "SELECT fencing_token::text FROM {} WHERE namespace = {ns}",
            self.lock_table
        )))
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| self.target.db_err(e))?;
        let now_has = match row {
            Some(r) => r.try_get::<String, _>(0).map_err(db_err)?,
            None => "no lock row".to_owned(),
        };
        Ok(Beat::Gone(format!(
            "fenced out: this run holds token {}, the database now has {now_has}",
            self.token
        )))
    }
}

#[async_trait]
impl Heartbeat for LeaseBeat {
    async fn beat(&self) -> Result<Beat, Error> {
        // Dropped with this future if the beat times out: never reused in an unknown state.
        let mut conn = self.conn.checkout(self.target.connect()).await?;
        let r = self.beat_on(&mut conn).await;
        if r.is_ok() {
            conn.keep();
        }
        r
    }
}

/// A held lease: the store's connection runs the migrations; the heartbeat renews the lease.
pub(super) struct LeaseHeld {
    pub(super) store: Option<PgStore>,
    pub(super) beat: Arc<LeaseBeat>,
    pub(super) keep: Kept,
}

#[async_trait]
impl HeldLock for LeaseHeld {
    fn store(&mut self) -> Option<&mut (dyn MigrationStore + 'static)> {
        self.store.as_mut().map(|s| s as _)
    }

    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        let aux = self.beat.conn.take().await;
        if let Some(aux) = aux {
            let _ = aux.close().await;
        }
        let Some(store) = self.store.take() else {
            return Ok(());
        };
        let target = self.beat.target.clone();
        let sql = self.beat.release_sql(store.ms)?;
        let (mut conn, touched) = store.into_conn();
        let r = target
            .bounded_db(
                "releasing the lease",
                sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut conn),
            )
            .await;
        match r {
            // A connection that ran only dbwarden's statements serves the next acquire.
            Ok(_) if !touched => keep_in(&self.keep, conn).await,
            Ok(_) => {
                let _ = conn.close().await;
            }
            Err(e) => {
                tracing::warn!(
                    "release: {e}; the lease stays until it expires (ttl {} ms)",
                    self.beat.ttl_ms
                );
            }
        }
        Ok(())
    }
}

impl Drop for LeaseHeld {
    fn drop(&mut self) {
        // Dropped without a release (a panic, a cancelled task): give the lease back when a
        // runtime is there to do it; otherwise it expires after its ttl.
        let Some(store) = self.store.take() else {
            return;
        };
        let Ok(sql) = self.beat.release_sql(store.ms) else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let target = self.beat.target.clone();
            rt.spawn(async move {
                let (mut conn, _) = store.into_conn();
                let _ = tokio::time::timeout(
                    target.statement_timeout,
                    sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut conn),
                )
                .await;
            });
        }
    }
}
