//! Reading and breaking the lock without holding it: `lock-status`, `unlock`, `history`, the
//! busy message, and audit rows of runs that declined to start. None of these creates a table,
//! except that an audit row needs the audit table.

use chrono::{NaiveDateTime, Utc};
use dbwarden_core::error::BusyInfo;
use dbwarden_core::unlock::{Broke, Sighting};
use dbwarden_core::{AuditRecord, Error, HistoryRow, HolderInfo, Observation, StatusRow};
use dbwarden_sql::binds;
use sqlx::Connection;
use sqlx::mysql::MySqlConnection;

use crate::MySqlLock;
use crate::lock::{alive_name, bounded, is_used_lock, kill_session};
use crate::tables::{self, AUDIT_TABLE, db_err};

/// The holder a status row describes.
pub(crate) fn holder_of(row: &StatusRow) -> Option<HolderInfo> {
    let execution_id = row.execution_id?;
    let host = row.host.clone().unwrap_or_else(|| "?".into());
    let pid = row.pid.unwrap_or(0);
    Some(HolderInfo {
        owner: row
            .owner_id
            .clone()
            .unwrap_or_else(|| format!("{host}:{pid}")),
        host,
        pid,
        execution_id,
        command: "dbwarden".into(),
        started_at: row.acquired_at.unwrap_or_else(Utc::now),
        lock_ttl_ms: row.lock_ttl_ms,
        heartbeat_interval_ms: row.heartbeat_interval_ms,
    })
}

/// The session that holds the named lock, as the server sees it.
struct Session {
    id: u64,
    /// `information_schema.PROCESSLIST` (needs the PROCESS privilege for other users' sessions).
    client: Option<String>,
    seconds: Option<i64>,
    info: Option<String>,
    /// Nobody holds the liveness lock of this session (see [`crate::lock`]), read together
    /// with this session still holding the lock.
    alive_free: bool,
}

/// Processlist host, seconds and statement, then `IS_FREE_LOCK(liveness)`, `IS_USED_LOCK(lock)`.
type HolderRow = (
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<i64>,
);

/// Everything a reader needs, read on one connection.
struct View {
    session: Option<Session>,
    status: Option<StatusRow>,
    server_now: chrono::DateTime<Utc>,
    /// When the server started (from `Uptime`, whole seconds): connection ids start over then,
    /// so a status row claimed before it names a session of an earlier server life.
    server_started: chrono::DateTime<Utc>,
}

async fn view(conn: &mut MySqlConnection, lock: &MySqlLock) -> Result<View, Error> {
    let id = is_used_lock(conn, &lock.lock_name).await.map_err(db_err)?;
    let status = if binds::table_exists(conn, "dbwarden_lock", db_err).await? {
        tables::read_status(conn, lock.namespace.as_str(), false).await?
    } else {
        None
    };
    let now: NaiveDateTime = sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
        .fetch_one(&mut *conn)
        .await
        .map_err(db_err)?;
    // `SHOW` works on MariaDB and MySQL 8 alike (their status tables live in different schemas).
    let uptime: (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Uptime'")
        .fetch_one(&mut *conn)
        .await
        .map_err(db_err)?;
    let uptime: i64 = uptime
        .1
        .parse()
        .map_err(|_| Error::database(format!("the server reported Uptime {:?}", uptime.1)))?;
    let session = match id {
        Some(id) => {
            // The processlist row is missing without the PROCESS privilege: the join keeps the
            // liveness answer anyway.
            let (client, seconds, info, alive_free, owner): HolderRow = sqlx::query_as(
                "SELECT p.HOST, CAST(p.TIME AS SIGNED), LEFT(p.INFO, 200), CAST(IS_FREE_LOCK(?) AS SIGNED), CAST(IS_USED_LOCK(?) AS SIGNED)
                 FROM (SELECT 1) AS one LEFT JOIN information_schema.PROCESSLIST AS p ON p.ID = ?",
            )
            .bind(alive_name(id))
            .bind(&lock.lock_name)
            .bind(id as i64)
            .fetch_one(&mut *conn)
            .await
            .map_err(db_err)?;
            Some(Session {
                id,
                client,
                seconds,
                info,
                // A holder that released between the reads closes its liveness session after
                // its lock: only a free liveness lock beside a still-held lock counts.
                alive_free: alive_free == Some(1) && owner == Some(id as i64),
            })
        }
        None => None,
    };
    let server_now = now.and_utc();
    Ok(View {
        session,
        status,
        server_now,
        server_started: server_now - chrono::Duration::seconds(uptime),
    })
}

impl View {
    /// The status row, if it describes the session that holds the lock right now: it names
    /// that connection id and was claimed in this server life (ids start over at a restart;
    /// a second of slack for `Uptime`'s rounding).
    fn row_of_holder(&self) -> Option<&StatusRow> {
        let s = self.session.as_ref()?;
        let since = self.server_started - chrono::Duration::seconds(1);
        self.status.as_ref().filter(|r| {
            r.db_connection_id.as_deref() == Some(s.id.to_string().as_str())
                && r.acquired_at.is_some_and(|a| a >= since)
        })
    }
}

pub(crate) async fn observe(lock: &MySqlLock) -> Result<Observation, Error> {
    let v = (lock.endpoint)
        .once("reading the lock", async |c| view(c, lock).await)
        .await?;
    let mut notes = Vec::new();
    let mine = v.row_of_holder();
    let holder_gone = v
        .session
        .as_ref()
        .is_some_and(|s| s.alive_free && mine.is_some_and(|r| r.state.is_active()));
    if let Some(s) = &v.session {
        let mut what = format!("lock {:?} held by connection {}", lock.lock_name, s.id);
        if let Some(c) = &s.client {
            what.push_str(&format!(" from {c}"));
        }
        match (&s.info, s.seconds) {
            (Some(q), Some(t)) => what.push_str(&format!(
                ", running for {t}s: {}",
                dbwarden_core::error::one_line(q)
            )),
            (None, Some(t)) => what.push_str(&format!(", idle for {t}s")),
            _ => {}
        }
        notes.push(what);
        if holder_gone {
            notes.push(format!(
                "the holder's process is gone: its liveness session has ended, but the server still runs connection {}'s statement; the next `dbwarden migrate` KILLs that session and takes over",
                s.id
            ));
        }
        if mine.is_none() {
            notes.push(format!(
                "connection {} is not the one the status row names ({}): another tool holds this lock, or a run is just taking it",
                s.id,
                v.status
                    .as_ref()
                    .and_then(|r| r.db_connection_id.as_deref())
                    .unwrap_or("none")
            ));
        }
    }
    Ok(Observation {
        held: v.session.is_some(),
        holder_gone,
        holder: mine.and_then(holder_of),
        fencing_token: v.status.as_ref().map(|s| s.fencing_token),
        last_heartbeat_at: mine.and_then(|r| r.last_heartbeat_at),
        session_id: v.session.as_ref().map(|s| format!("connection {}", s.id)),
        status: v.status.clone(),
        notes,
        ..Observation::new(
            "mysql",
            dbwarden_core::Grade::A,
            lock.namespace.as_str(),
            v.server_now,
        )
    })
}

/// The holder as a busy error reports it, whether the session answered (a failed read still
/// says "busy", and the caller drops the session), and the holder's lock session when the
/// status row names it as the active holder (a waiter watches its liveness lock), with
/// whether that liveness lock was free.
pub(crate) async fn describe_busy(
    conn: &mut MySqlConnection,
    lock: &MySqlLock,
) -> (BusyInfo, bool, Option<(u64, bool)>) {
    let read = bounded(
        lock.endpoint.statement_timeout,
        "reading the holder",
        view(conn, lock),
    )
    .await;
    let Ok(v) = read else {
        return (BusyInfo::default(), false, None);
    };
    let suspect = v
        .row_of_holder()
        .filter(|r| r.state.is_active())
        .and(v.session.as_ref().map(|s| (s.id, s.alive_free)));
    let info = match v.row_of_holder() {
        Some(row) => BusyInfo {
            holder: holder_of(row),
            fencing_token: Some(row.fencing_token),
            age: row
                .acquired_at
                .and_then(|a| (v.server_now - a).to_std().ok()),
            note: None,
            server_full: false,
        },
        None => BusyInfo {
            note: v.session.map(|s| {
                format!(
                    "held by connection {}{}, which has not written a status row (another tool, or a run just taking it)",
                    s.id,
                    s.client.map(|c| format!(" from {c}")).unwrap_or_default()
                )
            }),
            ..BusyInfo::default()
        },
    };
    (info, true, suspect)
}

/// Who holds the lock, for `dbwarden unlock`: the session holding the named lock, with the
/// status row of its holder, or the row of a dead holder (a session without a row has no
/// execution id).
pub(crate) async fn sight(lock: &MySqlLock) -> Result<Sighting, Error> {
    let mut conn = lock.endpoint.connect().await?;
    let limit = lock.endpoint.statement_timeout;
    let v = bounded(limit, "reading the lock", view(&mut conn, lock)).await?;
    let _ = conn.close().await;
    let holder_row = v.row_of_holder().cloned();
    let active = v.status.as_ref().filter(|s| s.state.is_active());
    Ok(Sighting {
        current: match &v.session {
            Some(_) => holder_row.as_ref().and_then(|r| r.execution_id),
            None => active.and_then(|r| r.execution_id),
        },
        anything: v.session.is_some() || active.is_some(),
        holder: holder_row.as_ref().or(active).and_then(holder_of),
        session: v.session.as_ref().map(|s| s.id.to_string()),
        token: v.status.as_ref().map(|s| s.fencing_token),
        ..Sighting::default()
    })
}

/// `KILL` the sighted session (the server frees its lock and aborts its statement), bump the
/// token so nothing it still sends can write, mark the row AVAILABLE, and audit it, in one
/// transaction. A lock another session holds by now is [`Broke::Changed`]: never KILL a newer
/// holder.
pub(crate) async fn break_lock(
    lock: &MySqlLock,
    seen: &Sighting,
    record: AuditRecord,
) -> Result<Broke, Error> {
    let mut conn = lock.endpoint.connect().await?;
    let limit = lock.endpoint.statement_timeout;
    let now = bounded(limit, "reading the lock", async {
        is_used_lock(&mut conn, &lock.lock_name)
            .await
            .map_err(db_err)
    })
    .await?;
    if now.map(|id| id.to_string()) != seen.session {
        let _ = conn.close().await;
        return Ok(Broke::Changed);
    }
    if let Some(id) = now {
        // Already gone (it ended between the read and the KILL) is fine.
        // Bounded like every other step: a server that stops answering ends the unlock as
        // unreachable instead of hanging it.
        let killed = bounded(limit, "killing the holder's session", async {
            Ok(kill_session(&mut conn, id).await)
        })
        .await?;
        if let Err(e) = killed {
            return Err(Error::database(format!(
                "could not KILL connection {id} (needs the CONNECTION_ADMIN or SUPER privilege, or the same user): {e}"
            )));
        }
    }
    let ns = lock.namespace.as_str().to_owned();
    let has_status = seen.token.is_some();
    bounded(limit, "recording the unlock", async {
        sqlx::raw_sql(AUDIT_TABLE)
            .execute(&mut conn)
            .await
            .map_err(db_err)?;
        dbwarden_sql::transaction(&mut conn, "START TRANSACTION", db_err, db_err, async |conn| {
            if has_status {
                sqlx::query(
                    "UPDATE dbwarden_lock SET fencing_token = fencing_token + 1, state = 'AVAILABLE' WHERE namespace = ?",
                )
                .bind(&ns)
                .execute(&mut *conn)
                .await
                .map_err(db_err)?;
            }
            binds::insert_audit(conn, &record, db_err).await
        })
        .await
    })
    .await?;
    let _ = conn.close().await;
    Ok(Broke::Unlocked)
}

/// An audit row without the lock (a declined run). Creates only the audit table.
pub(crate) async fn audit(lock: &MySqlLock, record: &AuditRecord) -> Result<(), Error> {
    (lock.endpoint)
        .once("writing an audit row", async |c| {
            sqlx::raw_sql(AUDIT_TABLE)
                .execute(&mut *c)
                .await
                .map_err(db_err)?;
            binds::insert_audit(c, record, db_err).await
        })
        .await
}

pub(crate) async fn read_history(lock: &MySqlLock) -> Result<Vec<HistoryRow>, Error> {
    let t = &lock.history_table;
    (lock.endpoint)
        .once(
            "reading the history",
            async |c| match binds::table_exists(&mut *c, t, db_err).await? {
                true => binds::read_history(c, t, db_err).await,
                false => Ok(Vec::new()),
            },
        )
        .await
}
