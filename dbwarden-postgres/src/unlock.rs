//! `dbwarden unlock`: terminate the holder's backend (which frees its session lock and rolls
//! back its open transaction), then fence it out and audit it, while holding the lock ourselves
//! so that the token bump cannot hit a new holder.

use std::time::Duration;

use dbwarden_core::lock::UnlockOutcome;
use dbwarden_core::{AuditRecord, Error};
use sqlx::AssertSqlSafe;
use tokio::time::Instant;

use crate::{PgLock, lock, tables};

/// How long we wait for a terminated backend to go, and then for the lock.
pub(crate) const SETTLE: Duration = Duration::from_secs(10);
/// How long we try for the lock ourselves once the holder is gone.
pub(crate) const TAKE_OVER: Duration = Duration::from_secs(2);

pub(crate) async fn force_unlock(
    pg: &PgLock,
    expected: Option<uuid::Uuid>,
    audit: &AuditRecord,
) -> Result<UnlockOutcome, Error> {
    let target = &pg.target;
    let e = |e| target.db_err(e);
    let mut conn = target.connect().await?;
    target.check_primary(&mut conn).await?;
    let view = target
        .bounded("reading the lock", pg.read_view(&mut conn))
        .await?;
    let active = view.status.as_ref().is_some_and(|s| s.state.is_active());
    let holder = view.holder();
    let current = match (&holder, view.pid) {
        (Some(h), _) => Some(h.execution_id),
        (None, Some(_)) => None, // a session that wrote no status row
        (None, None) => view
            .status
            .as_ref()
            .filter(|_| active)
            .and_then(|s| s.execution_id),
    };
    if let Some(want) = expected
        && current != Some(want)
    {
        return Ok(UnlockOutcome::HolderMismatch { actual: current });
    }
    if view.pid.is_none() && !active {
        return Ok(UnlockOutcome::NothingToUnlock);
    }
    let mut record = audit.clone().about(holder.as_ref());
    if let (None, Some(st)) = (&holder, view.status.as_ref().filter(|_| active)) {
        record = record.about_row(st);
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
    // `--holder` names a holder with no advisory session behind it (a lease runner's row): the
    // bump fences out only the token it was checked against. Another runner may have claimed
    // the row since we looked (our advisory lock keeps lease claims out only from now on).
    let guard = match (expected, view.pid, view.status.as_ref()) {
        (Some(_), None, Some(st)) => Some(st.fencing_token),
        _ => None,
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
        let now = pg.read_view(&mut conn).await?;
        let actual = now
            .holder()
            .map(|h| h.execution_id)
            .or_else(|| now.status.as_ref().and_then(|s| s.execution_id));
        let _ = sqlx::Connection::close(conn).await;
        return Ok(UnlockOutcome::HolderMismatch { actual });
    }
    if ours {
        lock::unlock_and_notify_on_clean_session(&mut conn, pg.key, pg.namespace.as_str())
            .await
            .map_err(e)?;
    }
    let _ = sqlx::Connection::close(conn).await;
    Ok(UnlockOutcome::Unlocked { holder })
}
