//! `dbwarden unlock`: terminate the holder's backend (which frees its session lock and rolls
//! back its open transaction), then fence it out and audit it, while holding the lock ourselves
//! so that the token bump cannot hit a new holder.

use std::time::Duration;

use dbwarden_core::unlock::{Broke, Sighting};
use dbwarden_core::{AuditRecord, Error};
use sqlx::AssertSqlSafe;
use tokio::time::Instant;

use crate::{PgLock, lock, tables};

/// How long we wait for a terminated backend to go, and then for the lock.
pub(crate) const SETTLE: Duration = Duration::from_secs(10);
/// How long we try for the lock ourselves once the holder is gone.
pub(crate) const TAKE_OVER: Duration = Duration::from_secs(2);

/// Who holds the lock: the backend holding the advisory lock (with the status row of its
/// holder), else an active status row with no backend behind it.
pub(crate) async fn sight(pg: &PgLock) -> Result<Sighting, Error> {
    let target = &pg.target;
    let mut conn = target.connect().await?;
    target.check_primary(&mut conn).await?;
    let view = target
        .bounded("reading the lock", pg.read_view(&mut conn))
        .await;
    let _ = sqlx::Connection::close(conn).await;
    let view = view?;
    let active = view.status.as_ref().filter(|s| s.state.is_active());
    let holder = view.holder();
    let current = match (&holder, view.pid) {
        (Some(h), _) => Some(h.execution_id),
        (None, Some(_)) => None, // a session that wrote no status row
        (None, None) => active.and_then(|s| s.execution_id),
    };
    Ok(Sighting {
        current,
        anything: view.pid.is_some() || active.is_some(),
        row: active.cloned(),
        holder,
        session: view.pid.map(|p| p.to_string()),
        token: view.status.as_ref().map(|s| s.fencing_token),
    })
}

/// Terminate the sighted backend, wait for it to go, take the advisory lock ourselves, and
/// fence and audit while holding it. The lock held by another backend by now, or (with
/// `--holder` on a row with no backend) the row claimed since, is [`Broke::Changed`].
pub(crate) async fn break_lock(
    pg: &PgLock,
    seen: &Sighting,
    _expected: Option<uuid::Uuid>,
    mut record: AuditRecord,
) -> Result<Broke, Error> {
    let target = &pg.target;
    let e = |e| target.db_err(e);
    let mut conn = target.connect().await?;
    target.check_primary(&mut conn).await?;
    let view = target
        .bounded("reading the lock", pg.read_view(&mut conn))
        .await?;
    if view.pid.map(|p| p.to_string()) != seen.session {
        let _ = sqlx::Connection::close(conn).await;
        return Ok(Broke::Changed);
    }
    if let Some(pid) = view.pid {
        record.reason.push_str(&format!(
            "; terminated backend {pid} ({})",
            view.session.as_deref().unwrap_or("?")
        ));
        // Terminate that backend only if it still holds our key (it may have released and
        // another holder taken over since we looked).
        let (hi, lo) = lock::key_parts(pg.key);
        let sql = lock::HOLDER_SQL.replace(
            "SELECT l.pid FROM",
            "SELECT pg_terminate_backend(l.pid) FROM",
        );
        let sql = sql.replace("LIMIT 1", "AND l.pid = $3");
        sqlx::query(AssertSqlSafe(sql))
            .bind(hi)
            .bind(lo)
            .bind(pid)
            .execute(&mut conn)
            .await
            .map_err(e)?;
        let t0 = Instant::now();
        while lock::holder_pid(&mut conn, pg.key).await.map_err(e)? == Some(pid) {
            if t0.elapsed() > SETTLE {
                return Err(Error::database(format!(
                    "backend {pid} was asked to terminate but still holds the lock after {}s; check pg_stat_activity",
                    SETTLE.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Hold the lock ourselves while fencing, so the token bump cannot hit a new holder.
    let t0 = Instant::now();
    let mut ours = false;
    while t0.elapsed() < TAKE_OVER {
        if lock::try_lock(&mut conn, pg.key).await.map_err(e)? {
            ours = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ms = pg.ms();
    tables::ensure_tables(&mut conn, &pg.tables, ms).await?;
    // A holder with no advisory session behind it (a lease runner's row, a dead holder's row):
    // the bump fences out only the token that was sighted. Another runner may have claimed the
    // row since we looked (our advisory lock keeps lease claims out only from now on): then the
    // lock changed hands, and core looks again.
    let guard = match view.pid {
        None => seen.token,
        Some(_) => None,
    };
    // Bounded like a claim: a row another transaction keeps locked (a lease holder paused inside
    // a fenced write, which no backend termination here frees) ends the bump as busy instead of
    // waiting for that holder for ever.
    tables::begin_claim(&mut conn, ms).await.map_err(e)?;
    let written: Result<Option<()>, Error> = async {
        if ours {
            let bumped = sqlx::query(AssertSqlSafe(format!(
                "UPDATE {} SET fencing_token = fencing_token + 1, state = 'AVAILABLE' WHERE namespace = $1 AND ($2::bigint IS NULL OR fencing_token = $2)",
                pg.tables.lock
            )))
            .bind(pg.namespace.as_str())
            .bind(guard.map(|t| t as i64))
            .execute(&mut conn)
            .await
            .map_err(e)?;
            if guard.is_some() && bumped.rows_affected() == 0 {
                return Ok(Some(()));
            }
        } else {
            record.reason.push_str(
                "; a waiting runner took the lock at once (its token bump fenced the old holder out)",
            );
        }
        tables::insert_audit(&mut conn, &pg.tables, &record).await?;
        Ok(None)
    }
    .await;
    let end = if matches!(written, Ok(None)) {
        "COMMIT"
    } else {
        "ROLLBACK"
    };
    sqlx::raw_sql(end).execute(&mut conn).await.map_err(e)?;
    let written = match written {
        Err(err) if tables::row_locked(&err) => {
            return Err(Error::Busy(Box::new(dbwarden_core::error::BusyInfo {
                note: Some(
                    "a holder's write keeps the status row locked (paused inside it, or slow): nothing was unlocked; try again"
                        .to_owned(),
                ),
                ..Default::default()
            })));
        }
        other => other,
    };
    if written?.is_some() {
        // The row changed hands: nothing was bumped or audited.
        if ours {
            lock::unlock_quietly(&mut conn, pg.key).await.map_err(e)?;
        }
        let _ = sqlx::Connection::close(conn).await;
        return Ok(Broke::Changed);
    }
    if ours {
        lock::unlock_and_notify_on_clean_session(&mut conn, pg.key, pg.namespace.as_str())
            .await
            .map_err(e)?;
    }
    let _ = sqlx::Connection::close(conn).await;
    Ok(Broke::Unlocked)
}
