//! `dbwarden unlock` on the lease: who holds it, and fencing that holder out with an audit row.

use dbwarden_core::unlock::{Broke, Sighting};
use dbwarden_core::{AuditRecord, Error};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgConnection;

use super::{PgLeaseLock, advisory_holder};
use crate::literal::literal;
use crate::tables::{self, db_err};

impl PgLeaseLock {
    /// Who holds the lease, for `dbwarden unlock`: the active row's holder (if its lease
    /// expired, it still names who left it), and whether a backend holds the advisory lock.
    pub(super) async fn sight_on(&self, conn: &mut PgConnection) -> Result<Sighting, Error> {
        let t = &self.pg.tables;
        if !tables::table_exists(conn, &t.lock).await? {
            return Ok(Sighting::default());
        }
        let row = tables::read_status(conn, t, self.ns(), false).await?;
        let now = tables::server_now(conn).await?;
        let pid = advisory_holder(conn, self.pg.key).await?;
        let active = row.as_ref().filter(|s| s.state.is_active());
        Ok(Sighting {
            current: active.and_then(|s| s.execution_id),
            anything: active.is_some() || pid.is_some(),
            holder: active.and_then(|s| tables::lease_holder(s, now)),
            token: row.as_ref().map(|s| s.fencing_token),
            ..Sighting::default()
        })
    }

    /// `dbwarden unlock` on the lease: in one transaction, fence the holder out (token bump,
    /// row AVAILABLE) and audit it. An advisory holder's backend is terminated first, which
    /// frees its session lock and rolls back its open transaction. A row claimed since the
    /// sighting is [`Broke::Changed`].
    pub(super) async fn break_on(
        &self,
        conn: &mut PgConnection,
        seen: &Sighting,
        mut record: AuditRecord,
    ) -> Result<Broke, Error> {
        let t = &self.pg.tables;
        if !tables::table_exists(conn, &t.lock).await? {
            return Ok(Broke::Changed);
        }
        tables::begin_bounded(conn, self.ms())
            .await
            .map_err(db_err)?;
        let r = async {
            let row = tables::read_status(conn, t, self.ns(), true).await?;
            let active = row.as_ref().filter(|s| s.state.is_active());
            // Claimed (a new token) or released since: judged anew.
            if row.as_ref().map(|s| s.fencing_token) != seen.token
                || active.and_then(|s| s.execution_id) != seen.current
            {
                return Ok(Broke::Changed);
            }
            let pid = advisory_holder(conn, self.pg.key).await?;
            // The advisory lock's holder is the target only when the row names its session (a
            // runner on a direct URL); otherwise it is a waiter's momentary try, left alone.
            let pid = pid.filter(|p| {
                active.is_some_and(|s| s.db_connection_id.as_deref() == Some(&p.to_string()))
            });
            if let Some(pid) = pid {
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "SELECT pg_terminate_backend({pid})"
                )))
                .execute(&mut *conn)
                .await
                .map_err(db_err)?;
                record
                    .reason
                    .push_str(&format!("; terminated backend {pid} (it held the advisory lock)"));
            }
            sqlx::raw_sql(AssertSqlSafe(format!(
                "UPDATE {} SET fencing_token = fencing_token + 1, state = 'AVAILABLE', expires_at = NULL WHERE namespace = {}",
                t.lock,
                literal(self.ns())?
            )))
            .execute(&mut *conn)
            .await
            .map_err(db_err)?;
            tables::insert_audit(conn, t, &record).await?;
            Ok(Broke::Unlocked)
        }
        .await;
        tables::finish_tx(conn, r).await
    }
}
