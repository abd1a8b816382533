//! The held lock: the lock session (inside the [`PgStore`]) plus a heartbeat on a second
//! connection, which keeps beating while the lock session is busy in a long statement.

use std::sync::Arc;

use async_trait::async_trait;
use dbwarden_core::{Beat, Error, FencingToken, Heartbeat, HeldLock, MigrationStore};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

use crate::lock::{self, Target};
use crate::store::PgStore;

/// A heartbeat connection kept for the lock's next acquire.
pub type Kept = Arc<dbwarden_core::kept::Kept<PgConnection>>;

/// Renews `last_heartbeat_at` and checks ownership from a second connection.
pub struct PgHeartbeat {
    pub(crate) target: Target,
    /// Reconnected on the next beat after any failure.
    pub(crate) conn: dbwarden_core::kept::Kept<PgConnection>,
    pub(crate) lock_table: String,
    pub(crate) namespace: String,
    pub(crate) key: i64,
    pub(crate) token: FencingToken,
    /// The lock session's backend pid.
    pub(crate) session_pid: i32,
}

impl PgHeartbeat {
    async fn beat_on(&self, conn: &mut PgConnection) -> Result<Beat, Error> {
        let e = |e| self.target.db_err(e);
        sqlx::raw_sql("BEGIN")
            .execute(&mut *conn)
            .await
            .map_err(e)?;
        let r = async {
            // Row lock first: a new holder cannot bump the token between our check and write.
            let current: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT fencing_token FROM {} WHERE namespace = $1 FOR UPDATE",
                self.lock_table
            )))
            .bind(&self.namespace)
            .fetch_optional(&mut *conn)
            .await
            .map_err(e)?;
            if let Err(Error::Lost(why)) = self.token.check(current) {
                return Ok(Beat::Gone(why));
            }
            match lock::holder_pid(conn, self.key).await.map_err(e)? {
                Some(pid) if pid == self.session_pid => {}
                Some(pid) => {
                    return Ok(Beat::Gone(format!(
                        "the advisory lock now belongs to backend {pid}, not to our lock session (backend {})",
                        self.session_pid
                    )));
                }
                None => {
                    return Ok(Beat::Gone(format!(
                        "the lock session (backend {}) no longer holds the advisory lock: it was terminated or disconnected",
                        self.session_pid
                    )));
                }
            }
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE {} SET last_heartbeat_at = now() WHERE namespace = $1 AND fencing_token = $2",
                self.lock_table
            )))
            .bind(&self.namespace)
            .bind(self.token.0 as i64)
            .execute(&mut *conn)
            .await
            .map_err(e)?;
            Ok(Beat::Alive)
        }
        .await;
        let end = if matches!(r, Ok(Beat::Alive)) {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        sqlx::raw_sql(end).execute(&mut *conn).await.map_err(e)?;
        r
    }
}

#[async_trait]
impl Heartbeat for PgHeartbeat {
    async fn beat(&self) -> Result<Beat, Error> {
        // If this future is dropped (the beat timed out), `conn` goes with it: never reused in
        // an unknown state.
        let mut conn = self.conn.checkout(self.target.open_aux()).await?;
        let r = self.beat_on(&mut conn).await;
        if r.is_ok() {
            conn.keep();
        }
        r
    }
}

/// The held PostgreSQL lock. Dropping it closes the lock session, which frees the advisory lock
/// on the server.
pub struct PgHeld {
    pub(crate) store: Option<PgStore>,
    /// Where a clean release leaves the lock session and the heartbeat connection for the
    /// lock's next acquire (see [`PgHeld::release`]).
    pub(crate) keep: crate::shared::Kept,
    pub(crate) keep_aux: Kept,
    pub(crate) heartbeat: Arc<PgHeartbeat>,
}

#[async_trait]
impl HeldLock for PgHeld {
    fn store(&mut self) -> Option<&mut (dyn MigrationStore + 'static)> {
        self.store.as_mut().map(|s| s as _)
    }

    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        // The lock first, so a waiter's hand-over does not wait for the heartbeat
        // connection's goodbye; that connection is closed after.
        let aux = self.heartbeat.conn.take().await;
        let Some(store) = self.store.take() else {
            if let Some(aux) = aux {
                let _ = aux.close().await;
            }
            return Ok(());
        };
        let (target, key, ns) = (
            &self.heartbeat.target,
            self.heartbeat.key,
            &self.heartbeat.namespace,
        );
        let pid = store.pid;
        let (mut conn, touched) = store.into_conn();
        let r = target
            .bounded_db(
                "releasing the lock",
                lock::unlock_and_notify_on_clean_session(&mut conn, key, ns),
            )
            .await;
        // Not kept either: a session left inside a transaction block (a dbwarden write cut
        // short); closing it rolls that back.
        let outside_tx = matches!(r, Ok((_, true)));
        let r = r.map(|(unlocked, _)| unlocked);
        // A session that ran only dbwarden's own statements (a lock taken around other work,
        // or a run with nothing to apply) is as clean as a new one: the lock keeps it and the
        // heartbeat connection for its next acquire, which then opens nothing. Anything else
        // is closed, which frees the lock in any case.
        let keep = matches!(r, Ok(true)) && outside_tx && !touched;
        let left = match keep {
            true => self.keep.offer((conn, pid)).await.map(|(c, _)| c),
            false => Some(conn),
        };
        if let Some(conn) = left {
            let _ = conn.close().await;
        }
        let left = match (keep, aux) {
            (true, Some(aux)) => self.keep_aux.offer(aux).await,
            (_, aux) => aux,
        };
        if let Some(aux) = left {
            let _ = aux.close().await;
        }
        match r {
            Ok(true) => {}
            Ok(false) => tracing::warn!("release: the lock session did not hold the advisory lock"),
            Err(e) => tracing::warn!("release: {e}; the session was closed, which frees the lock"),
        }
        Ok(())
    }
}
