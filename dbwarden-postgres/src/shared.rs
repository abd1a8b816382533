//! Shared mode (`dbwarden run --shared`): `pg_try_advisory_lock_shared` on the same key, on a
//! session of its own. Readers share; the exclusive lock of a migration excludes them all (and
//! they exclude it). A shared holder has no store and does not bump the fencing token; its
//! session's `application_name` names its execution so `lock-status` can list it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use dbwarden_core::{
    Attempt, Beat, Error, FencingToken, Grant, Heartbeat, HeldLock, HolderInfo, SharedLock,
    Snapshot, StatusRow,
};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection, Row};
use uuid::Uuid;

use crate::lock::{self, Target};
use crate::tables::{self, Tables};
use crate::{Listening, PgLock};

const APP_PREFIX: &str = "dbwarden-shared:";

/// A verified session kept between attempts: a busy attempt's, or a released shared holder's.
pub type Kept = Arc<dbwarden_core::kept::Kept<(PgConnection, i32)>>;

/// One shared try on `conn`, with the backend pid it was taken on.
pub async fn attempt_with_pid(
    conn: &mut PgConnection,
    key: i64,
) -> Result<(bool, i32), sqlx::Error> {
    let row = sqlx::query("SELECT pg_try_advisory_lock_shared($1), pg_backend_pid()")
        .bind(key)
        .fetch_one(conn)
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

const SHARED_SQL: &str = "SELECT l.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), 'local'), \
       coalesce(a.backend_start, now()) \
     FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.mode = 'ShareLock' \
       AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid \
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     ORDER BY a.backend_start";

/// Every session holding `key` in shared mode in this database.
pub async fn holders(conn: &mut PgConnection, key: i64) -> Result<Vec<HolderInfo>, sqlx::Error> {
    let (hi, lo) = lock::key_parts(key);
    let rows = sqlx::query(SHARED_SQL)
        .bind(hi)
        .bind(lo)
        .fetch_all(conn)
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let pid: i32 = r.try_get(0).unwrap_or_default();
            let app: String = r.try_get(1).unwrap_or_default();
            let host: String = r.try_get(2).unwrap_or_default();
            let since: chrono::DateTime<chrono::Utc> = r.try_get(3).unwrap_or_default();
            let execution_id = app
                .strip_prefix(APP_PREFIX)
                .and_then(|u| Uuid::parse_str(u).ok())
                .unwrap_or_default();
            HolderInfo {
                owner: format!("backend {pid}"),
                host,
                pid: pid as u32,
                execution_id,
                command: "dbwarden run --shared".into(),
                started_at: since,
                lock_ttl_ms: None,
                heartbeat_interval_ms: None,
            }
        })
        .collect())
}

impl PgLock {
    async fn attempt_shared(&self, conn: &mut PgConnection) -> Result<bool, Error> {
        let q =
            sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock_shared($1)").bind(self.key);
        self.target
            .bounded_db("pg_try_advisory_lock_shared", q.fetch_one(conn))
            .await
    }

    /// One attempt at the shared lock, on the verified session kept from the last busy attempt
    /// or a fresh one. `Err(session)` when a writer holds it, to describe the holder on and to
    /// keep for the next attempt; once held, see [`PgLock::hold_shared`].
    pub(crate) async fn try_shared(
        &self,
        holder: &HolderInfo,
    ) -> Result<Result<Grant, (PgConnection, i32)>, Error> {
        let session = self.candidate.take().await;
        let kept = session.is_some();
        let (mut conn, mut pid) = match session {
            Some(s) => s,
            None => self.target.open_session().await?,
        };
        let got = match self.attempt_shared(&mut conn).await {
            Ok(got) => got,
            // A kept session may have died while we waited (server restart): one fresh try.
            Err(e) if kept => {
                tracing::debug!("shared try-lock failed ({e}); reconnecting once");
                (conn, pid) = self.target.open_session().await?;
                self.attempt_shared(&mut conn).await?
            }
            Err(e) => return Err(e),
        };
        if !got {
            return Ok(Err((conn, pid)));
        }
        self.hold_shared(holder, (conn, pid)).await.map(Ok)
    }

    /// `session` just took the shared lock (once: advisory locks count, and a release unlocks
    /// once): name it for `lock-status` and read the status row on it (the token a shared
    /// holder reports, and what `migrate` looks at). A clean release gives the session back
    /// for the next attempt.
    pub(crate) async fn hold_shared(
        &self,
        holder: &HolderInfo,
        (mut conn, pid): (PgConnection, i32),
    ) -> Result<Grant, Error> {
        let (target, tables, key) = (&self.target, &self.tables, self.key);
        let name = format!(
            "SET application_name = '{APP_PREFIX}{}'",
            holder.execution_id
        );
        target
            .bounded_db(
                "naming the shared session",
                sqlx::raw_sql(AssertSqlSafe(name)).execute(&mut conn),
            )
            .await?;
        let status = target
            .bounded(
                "reading the status row",
                tables::status_if_any(&mut conn, tables, self.namespace.as_str()),
            )
            .await?;
        let token = FencingToken(status.as_ref().map_or(0, |s| s.fencing_token));
        let beat = Arc::new(SharedBeat {
            target: target.clone(),
            conn: Default::default(),
            key,
            pid,
        });
        let held = PgSharedHeld {
            conn: Some((conn, pid)),
            keep: self.candidate.clone(),
            tables: tables.clone(),
            status,
            beat: beat.clone(),
            key,
        };
        Ok(Grant::new(token, None, beat, held))
    }
}

#[async_trait]
impl SharedLock for PgLock {
    /// One shared attempt (a full server is `Error::Busy`, which the wait policy retries).
    async fn try_acquire_shared(&self, holder: &HolderInfo) -> Result<Attempt, Error> {
        let mut on_listener = None;
        {
            let mut listening = self.listening.lock().await;
            if let Listening::On(w) = &mut *listening {
                self.seen.store(w.heard(), Ordering::SeqCst);
                // A run waiting to look again keeps one connection, the listening one, and
                // tries there (see `waiter`); a session kept from an exclusive try goes.
                if let Some((c, _)) = self.candidate.take().await {
                    let _ = sqlx::Connection::close(c).await;
                }
                let tried = self
                    .target
                    .bounded("pg_try_advisory_lock_shared", async {
                        let conn = w.conn().await.map_err(|e| self.target.db_err(e))?;
                        let (got, pid) = attempt_with_pid(&mut *conn, self.key)
                            .await
                            .map_err(|e| self.target.db_err(e))?;
                        if got {
                            return Ok(pid);
                        }
                        Err(Error::Busy(Box::new(self.busy_info(conn).await?)))
                    })
                    .await;
                match tried {
                    Err(Error::Busy(info)) => return Ok(Attempt::Busy(*info)),
                    Ok(pid) => {
                        let Listening::On(w) =
                            std::mem::replace(&mut *listening, Listening::NotYet)
                        else {
                            unreachable!("matched above")
                        };
                        on_listener = self.listener_session(w, pid).await;
                    }
                    // The listening connection failed: a fresh session below.
                    Err(_) => *listening = Listening::NotYet,
                }
            }
        }
        if let Some(session) = on_listener {
            let held = self.hold_shared(holder, session).await?;
            return Ok(Attempt::Acquired(held));
        }
        match self.try_shared(holder).await? {
            Ok(grant) => {
                *self.listening.lock().await = Listening::NotYet;
                Ok(Attempt::Acquired(grant))
            }
            Err((conn, pid)) => self.busy(conn, pid).await,
        }
    }

    async fn shared_holders(&self) -> Result<Vec<HolderInfo>, Error> {
        let mut conn = self.target.connect().await?;
        let h = holders(&mut conn, self.key)
            .await
            .map_err(|e| self.target.db_err(e))?;
        let _ = sqlx::Connection::close(conn).await;
        Ok(h)
    }
}

/// A held shared lock: dropping it closes the session, which frees it.
pub struct PgSharedHeld {
    conn: Option<(PgConnection, i32)>,
    /// Where the session goes after a clean release.
    keep: Kept,
    tables: Tables,
    /// The status row as read right after the shared lock was taken.
    status: Option<StatusRow>,
    beat: Arc<SharedBeat>,
    key: i64,
}

/// Checks from a second connection that the shared session still holds the key.
struct SharedBeat {
    target: Target,
    conn: dbwarden_core::kept::Kept<PgConnection>,
    key: i64,
    pid: i32,
}

#[async_trait]
impl Heartbeat for SharedBeat {
    async fn beat(&self) -> Result<Beat, Error> {
        let b = self;
        let mut conn = b.conn.checkout(b.target.open_aux()).await?;
        let pids: Vec<i32> = holders(&mut conn, b.key)
            .await
            .map_err(|e| b.target.db_err(e))?
            .iter()
            .map(|h| h.pid as i32)
            .collect();
        conn.keep();
        if pids.contains(&b.pid) {
            Ok(Beat::Alive)
        } else {
            Ok(Beat::Gone(format!(
                "the shared lock session (backend {}) no longer holds the lock: it was terminated or disconnected",
                b.pid
            )))
        }
    }
}

#[async_trait]
impl HeldLock for PgSharedHeld {
    async fn read_applied(&mut self) -> Option<Result<Snapshot, Error>> {
        let (conn, _) = self.conn.as_mut()?;
        let (target, tables) = (&self.beat.target, &self.tables);
        let history = target
            .bounded("reading the history", tables::history_if_any(conn, tables))
            .await;
        Some(history.map(|history| Snapshot {
            status: self.status.clone(),
            history,
        }))
    }

    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        if let Some(aux) = self.beat.conn.take().await {
            let _ = aux.close().await;
        }
        let Some((mut conn, pid)) = self.conn.take() else {
            return Ok(());
        };
        let target = &self.beat.target;
        let unlocked = target
            .bounded_db("releasing the shared lock", async {
                // No NOTIFY: it would wake every waiting look to look again at once; a
                // writer waiting for the readers to leave finds out by polling.
                let row = sqlx::query("SELECT pg_advisory_unlock_shared($1)")
                    .bind(self.key)
                    .fetch_one(&mut conn)
                    .await?;
                let unlocked: bool = row.try_get(0)?;
                // The session no longer names a shared holder.
                sqlx::raw_sql("RESET application_name")
                    .execute(&mut conn)
                    .await?;
                Ok(unlocked)
            })
            .await;
        // Kept for this lock's next attempt (the exclusive try after a look), which then
        // needs no new connection; anything but a clean unlock closes it.
        let left = match unlocked {
            Ok(true) => self.keep.offer((conn, pid)).await.map(|(c, _)| c),
            _ => Some(conn),
        };
        if let Some(conn) = left {
            let _ = conn.close().await;
        }
        Ok(())
    }
}
