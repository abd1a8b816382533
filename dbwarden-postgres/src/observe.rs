//! Reading the lock without taking or creating anything: the holder from `pg_locks` joined
//! with `pg_stat_activity` (filtered to the current database: advisory locks are per database),
//! and the status row when its table exists.

use chrono::{DateTime, Utc};
use dbwarden_core::error::BusyInfo;
use dbwarden_core::{Error, HolderInfo, Observation, StatusRow};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgConnection;

use crate::{PgLock, lock, tables};

impl PgLock {
    /// Who holds the lock, as a waiter reports it: read at most every
    /// [`dbwarden_core::wait::HOLDER_READ_REUSE`] (the read joins `pg_locks`, which takes every
    /// lock-manager partition lock on the server).
    pub(crate) async fn busy_info(&self, conn: &mut PgConnection) -> Result<BusyInfo, Error> {
        let now = std::time::Instant::now();
        if let Some((at, info)) = &*self.busy_seen.lock().await
            && now.duration_since(*at) < dbwarden_core::wait::HOLDER_READ_REUSE
        {
            return Ok(info.clone());
        }
        let info = self.read_busy_info(conn).await?;
        *self.busy_seen.lock().await = Some((now, info.clone()));
        Ok(info)
    }

    async fn read_busy_info(&self, conn: &mut PgConnection) -> Result<BusyInfo, Error> {
        let view = self.read_view(conn).await?;
        let holder = view.holder();
        let age = view
            .status
            .as_ref()
            .filter(|_| holder.is_some())
            .and_then(|s| s.acquired_at)
            .and_then(|t| (view.now - t).to_std().ok());
        let shared = crate::shared::holders(conn, self.key)
            .await
            .unwrap_or_default();
        let note = match (view.pid, &holder) {
            (Some(_), None) => view.unclaimed_note(),
            (None, _) if !shared.is_empty() => Some(format!(
                "shared by {} holder(s) (run --shared)",
                shared.len()
            )),
            _ => None,
        };
        let (holder, fencing_token, age) = match view.pid.is_none() && !shared.is_empty() {
            true => (shared.first().cloned(), None, None),
            false => (holder, view.status.as_ref().map(|s| s.fencing_token), age),
        };
        Ok(BusyInfo {
            holder,
            fencing_token,
            age,
            note,
            server_full: false,
        })
    }

    /// The primitive and the status row, read without taking or creating anything.
    pub(crate) async fn read_view(&self, conn: &mut PgConnection) -> Result<View, Error> {
        let e = |e| self.target.db_err(e);
        let (hi, lo) = lock::key_parts(self.key);
        // The simple protocol (the key parts are numbers): the same through a transaction
        // pooler, where `lock = "lease"` observes from.
        let row = sqlx::raw_sql(AssertSqlSafe(format!(
            "SELECT l.pid, a.application_name, host(a.client_addr), a.state \
             FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
               AND l.mode = 'ExclusiveLock' \
               AND l.classid = {hi}::bigint::oid AND l.objid = {lo}::bigint::oid \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             LIMIT 1"
        )))
        .fetch_optional(&mut *conn)
        .await
        .map_err(e)?;
        let session: Option<HolderSession> = row
            .map(|r| sqlx::FromRow::from_row(&r))
            .transpose()
            .map_err(e)?;
        let status = tables::status_if_any(conn, &self.tables, self.namespace.as_str()).await?;
        let now = tables::server_now(conn).await?;
        Ok(View {
            pid: session.as_ref().map(|s| s.0),
            by_dbwarden: session
                .as_ref()
                .and_then(|s| s.1.as_deref())
                .is_some_and(|app| {
                    app.starts_with("dbwarden")
                        || Some(app) == self.target.options.get_application_name()
                }),
            session: session.map(|(pid, app, client, state)| {
                format!(
                    "backend pid {pid} (application {}, client {}, {})",
                    app.filter(|a| !a.is_empty()).unwrap_or_else(|| "-".into()),
                    client.unwrap_or_else(|| "local socket".into()),
                    state.unwrap_or_else(|| "state unknown".into())
                )
            }),
            status,
            now,
        })
    }
}

/// pid, application_name, client address, state of the session holding the lock.
type HolderSession = (i32, Option<String>, Option<String>, Option<String>);

/// What one look at the server found.
pub(crate) struct View {
    pub pid: Option<i32>,
    /// The session holding the lock says it is a dbwarden runner (`application_name`).
    pub by_dbwarden: bool,
    pub session: Option<String>,
    pub status: Option<StatusRow>,
    pub now: DateTime<Utc>,
}

impl View {
    /// Why the lock is held with no status row of its holder's: a dbwarden runner between taking
    /// the lock and writing its row (a moment: it opens its heartbeat connection and bumps the
    /// token), or a session of another tool. The holder is told apart by its
    /// `application_name` (dbwarden's default, or the one this observer was given).
    pub fn unclaimed_note(&self) -> Option<String> {
        let pid = self.pid?;
        Some(if self.by_dbwarden {
            format!(
                "held by a dbwarden runner (backend pid {pid}) that has just taken the lock and not yet written its status row; look again in a moment"
            )
        } else {
            format!(
                "held by backend pid {pid}, which wrote no dbwarden status row (another tool, or the Python dbwarden)"
            )
        })
    }

    /// The status row, when it records a live lease (`lock = "lease"`) and no session holds
    /// the advisory lock: then the lease is what holds the namespace.
    pub fn lease(&self) -> Option<&StatusRow> {
        if self.pid.is_some() {
            return None;
        }
        self.status
            .as_ref()
            .filter(|s| tables::is_lease(s) && s.expires_at.is_some_and(|t| t > self.now))
    }

    /// The holder named by the status row, when that row belongs to the session holding the
    /// lock, or records a live lease.
    pub fn holder(&self) -> Option<HolderInfo> {
        if let Some(row) = self.lease() {
            return tables::lease_holder(row, self.now);
        }
        let pid = self.pid?;
        let s = self.status.as_ref()?;
        if s.db_connection_id.as_deref() != Some(pid.to_string().as_str()) || !s.state.is_active() {
            return None;
        }
        tables::lease_holder(s, self.now)
    }

    /// What `lock-status` shows, for either primitive: a live lease (grade C, with its expiry),
    /// the advisory lock (grade A), or, when neither is held, the observer's own `grade`.
    pub(crate) fn observation(
        self,
        grade: dbwarden_core::Grade,
        namespace: &str,
        key: i64,
        lock_table: &str,
    ) -> Observation {
        let mut notes = Vec::new();
        let holder = self.holder();
        let lease = self.lease().cloned();
        if holder.is_none()
            && let Some(note) = self.unclaimed_note()
        {
            notes.push(format!("the advisory lock (key {key}) is {note}"));
        }
        let (grade, expires_at, session_id) = match &lease {
            Some(row) => {
                notes.push(
                    "held by a runner on the pooler-safe lease (lock = \"lease\"): only its ttl frees it if that runner dies"
                        .to_owned(),
                );
                (
                    dbwarden_core::Grade::C,
                    row.expires_at,
                    Some(format!("lease in {lock_table} (lock = \"lease\")")),
                )
            }
            None if self.pid.is_some() => (dbwarden_core::Grade::A, None, self.session.clone()),
            None => (grade, None, None),
        };
        Observation {
            held: self.pid.is_some() || lease.is_some(),
            holder,
            fencing_token: self.status.as_ref().map(|s| s.fencing_token),
            last_heartbeat_at: self.status.as_ref().and_then(|s| s.last_heartbeat_at),
            expires_at,
            session_id,
            status: self.status,
            notes,
            ..Observation::new("postgres", grade, namespace, self.now)
        }
    }
}
