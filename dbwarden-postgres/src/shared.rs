//! Shared mode (`dbwarden run --shared`): `pg_try_advisory_lock_shared` on the same key, on a
//! session of its own. Readers share; the exclusive lock of a migration excludes them all (and
//! they exclude it). A shared holder has no store and does not bump the fencing token; its
//! session's `application_name` names its execution so `lock-status` can list it.

use std::sync::Arc;

use async_trait::async_trait;
use dbwarden_core::{
    Beat, Error, FencingToken, Heartbeat, HeldLock, HolderInfo, MigrationStore, StatusRow,
};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection, Row};
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::lock::{self, Target};

const APP_PREFIX: &str = "dbwarden-shared:";

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
            }
        })
        .collect())
}

/// One attempt at the shared lock on a fresh session; `None` when a writer holds it.
pub async fn try_lock(
    target: &Target,
    key: i64,
    namespace: &str,
    holder: &HolderInfo,
    token: FencingToken,
) -> Result<Option<PgSharedHeld>, Error> {
    let (mut conn, pid) = target.open_session().await?;
    let got: bool = target
        .bounded("pg_try_advisory_lock_shared", async {
            sqlx::raw_sql(AssertSqlSafe(format!(
                "SET application_name = '{APP_PREFIX}{}'",
                holder.execution_id
            )))
            .execute(&mut conn)
            .await
            .map_err(|e| target.db_err(e))?;
            sqlx::query_scalar("SELECT pg_try_advisory_lock_shared($1)")
                .bind(key)
                .fetch_one(&mut conn)
                .await
                .map_err(|e| target.db_err(e))
        })
        .await?;
    if !got {
        let _ = conn.close().await;
        return Ok(None);
    }
    Ok(Some(PgSharedHeld {
        conn: Some(conn),
        beat: Arc::new(SharedBeat {
            target: target.clone(),
            conn: Mutex::new(None),
            key,
            pid,
        }),
        key,
        namespace: namespace.to_owned(),
        token,
    }))
}

/// A held shared lock: dropping it closes the session, which frees it.
pub struct PgSharedHeld {
    conn: Option<PgConnection>,
    beat: Arc<SharedBeat>,
    key: i64,
    namespace: String,
    token: FencingToken,
}

/// Checks from a second connection that the shared session still holds the key.
struct SharedBeat {
    target: Target,
    conn: Mutex<Option<PgConnection>>,
    key: i64,
    pid: i32,
}

struct BeatHandle(Arc<SharedBeat>);

#[async_trait]
impl Heartbeat for BeatHandle {
    async fn beat(&self) -> Result<Beat, Error> {
        let b = &self.0;
        let mut slot = b.conn.lock().await;
        let mut conn = match slot.take() {
            Some(c) => c,
            None => b.target.open_aux().await?,
        };
        let pids: Vec<i32> = holders(&mut conn, b.key)
            .await
            .map_err(|e| b.target.db_err(e))?
            .iter()
            .map(|h| h.pid as i32)
            .collect();
        *slot = Some(conn);
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
    fn fencing_token(&self) -> FencingToken {
        self.token
    }

    fn previous(&self) -> Option<&StatusRow> {
        None
    }

    fn heartbeat(&self) -> Box<dyn Heartbeat> {
        Box::new(BeatHandle(self.beat.clone()))
    }

    fn store(&mut self) -> Option<&mut (dyn MigrationStore + 'static)> {
        None
    }

    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        if let Some(aux) = self.beat.conn.lock().await.take() {
            let _ = aux.close().await;
        }
        if let Some(mut conn) = self.conn.take() {
            let _ = sqlx::query("SELECT pg_advisory_unlock_shared($1), pg_notify($2, $3)")
                .bind(self.key)
                .bind(lock::RELEASE_CHANNEL)
                .bind(&self.namespace)
                .fetch_one(&mut conn)
                .await;
            let _ = conn.close().await;
        }
        Ok(())
    }
}
