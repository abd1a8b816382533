//! Taking the advisory lock: the session a try runs on, the try, a busy holder's read, the claim.

use std::sync::Arc;

use dbwarden_core::{Attempt, Error, Grant, HolderInfo};
use sqlx::postgres::PgConnection;

use crate::held::{PgHeartbeat, PgHeld};
use crate::store::PgStore;
use crate::waiter::Waiter;
use crate::{PgLock, lock, tables};

impl PgLock {
    /// The kept waiting session, else a new one with its spare connection.
    pub(crate) async fn session(&self) -> Result<(PgConnection, i32, Option<PgConnection>), Error> {
        match self.candidate.take().await {
            Some((conn, pid)) => Ok((conn, pid, None)),
            None => self.target.open_session_and_spare().await,
        }
    }

    pub(crate) async fn attempt(&self, conn: &mut PgConnection) -> Result<bool, Error> {
        self.target
            .bounded_db("pg_try_advisory_lock", lock::try_lock(conn, self.key))
            .await
    }

    /// Busy: the holder as read on `conn`, which is kept for the next attempt (shared or
    /// exclusive: a waiter keeps its session).
    pub(crate) async fn busy(&self, mut conn: PgConnection, pid: i32) -> Result<Attempt, Error> {
        let info = self
            .target
            .bounded("reading the holder", self.busy_info(&mut conn))
            .await?;
        self.candidate.put((conn, pid)).await;
        Ok(Attempt::Busy(info))
    }

    /// The listening connection a shared lock was just taken on, as a plain session. `None`
    /// when it did not come back as the same backend (the lock went with the old one).
    pub(crate) async fn listener_session(
        &self,
        w: Waiter,
        pid: i32,
    ) -> Option<(PgConnection, i32)> {
        let mut conn = w.into_connection(self.target.statement_timeout).await?;
        match lock::backend_pid(&mut conn).await {
            // Configured as every session is: it may take the exclusive lock next.
            Ok(p) if p == pid => match self.target.configure_session(&mut conn).await {
                Ok(()) => Some((conn, pid)),
                Err(_) => None,
            },
            _ => {
                tracing::debug!("the listening session changed backend; connecting anew");
                None
            }
        }
    }

    /// Whether the server has room for a LISTEN connection: at least a tenth of its slots free
    /// (asked on the kept waiting session; yes when there is none, or it cannot answer). A
    /// LISTEN only makes a waiter hear a release sooner than its poll; under a crowd that fills
    /// the server, a slot is worth more to a runner that has none.
    pub(crate) async fn room_to_listen(&self) -> bool {
        let mut kept = self.candidate.lock().await;
        let Some((conn, _)) = kept.as_mut() else {
            return true;
        };
        let asked = tokio::time::timeout(
            self.target.statement_timeout,
            sqlx::query_as::<_, (i32, i32)>(lock::FREE_SLOTS_SQL).fetch_one(&mut *conn),
        )
        .await;
        match asked {
            Ok(Ok((free, max))) => free >= (max / 10).max(1),
            _ => true,
        }
    }

    /// The session holding the lock now takes the tables, the token and the status row.
    pub(crate) async fn claim(
        &self,
        mut conn: PgConnection,
        pid: i32,
        spare: Option<PgConnection>,
        holder: &HolderInfo,
    ) -> Result<Grant, Error> {
        let ms = self.ms();
        // The heartbeat's connection first: if the server is full, nothing was written yet and
        // the attempt is simply busy (no status row left RUNNING for a run that never started).
        let kept_aux = self.kept_aux.take().await;
        let aux = match (spare, kept_aux) {
            (Some(c), kept) => {
                if let Some(k) = kept {
                    let _ = sqlx::Connection::close(k).await;
                }
                self.target.make_aux(c).await?
            }
            // Configured when it was made. Checked, briefly: an idle connection may have
            // been cut meanwhile (a half-open one would stall the first heartbeats).
            (None, Some(mut k)) => {
                let alive = tokio::time::timeout(
                    dbwarden_core::wait::KEPT_SESSION_CHECK,
                    sqlx::Connection::ping(&mut k),
                )
                .await;
                if matches!(alive, Ok(Ok(()))) {
                    k
                } else {
                    self.target.open_aux().await?
                }
            }
            (None, None) => self.target.open_aux().await?,
        };
        let claimed = self
            .target
            .bounded("claiming the lock", async {
                let settings = tables::ensure_tables(&mut conn, &self.tables, ms).await?;
                tables::bump_and_claim(self, &mut conn, holder, pid, settings).await
            })
            .await;
        let (token, previous, why) = match claimed {
            // A runner on `lock = "lease"` holds the namespace: our advisory lock goes back,
            // and the session and the heartbeat connection wait for the next try.
            Err(Error::Busy(info)) if !info.server_full => {
                let freed = self
                    .target
                    .bounded_db(
                        "releasing the advisory lock",
                        lock::unlock_quietly(&mut conn, self.key),
                    )
                    .await;
                if matches!(freed, Ok(true)) {
                    self.candidate.put((conn, pid)).await;
                    self.kept_aux.put(aux).await;
                }
                return Err(Error::Busy(info));
            }
            other => other?,
        };
        let heartbeat = Arc::new(PgHeartbeat {
            target: self.target.clone(),
            conn: dbwarden_core::kept::Kept::holding(aux),
            lock_table: self.tables.lock.clone(),
            namespace: self.namespace.to_string(),
            key: self.key,
            token,
            session_pid: pid,
        });
        let held = PgHeld {
            store: Some(PgStore {
                conn,
                tables: self.tables.clone(),
                namespace: self.namespace.to_string(),
                pid,
                ms,
                touched: false,
                sqlx: Default::default(),
                pooled: false,
                tx_bounds: String::new(),
                bounds_set: None,
                tx: None,
            }),
            keep: self.candidate.clone(),
            keep_aux: self.kept_aux.clone(),
            heartbeat: heartbeat.clone(),
        };
        Ok(Grant::new(token, previous, heartbeat, held).broke(why, None))
    }
}
