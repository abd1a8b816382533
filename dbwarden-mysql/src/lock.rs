//! The MySQL/MariaDB lock between runners: the named lock `GET_LOCK(name, timeout)`, taken on one
//! dedicated connection that then runs the migrations and lives exactly as long as the lease.
//! Grade A: the server frees a named lock when the session that holds it ends, so a `kill -9`
//! of the holder (or a `KILL` of its connection) frees the lock without anyone's help, and the
//! status row left RUNNING tells the next run that its predecessor died.
//!
//! A holder also keeps a second, idle connection that holds a liveness lock
//! ([`alive_name`]) for as long as it holds the lock. A process that dies closes both sockets,
//! but the server ends the lock session only once the statement it is running checks for a gone
//! client (MariaDB's `SLEEP` after up to 5 s, an `ALTER` only when it is done), while the idle
//! liveness session ends at once. A waiter that sees the lock session still holding the lock and
//! the liveness lock free knows the holder's process is gone: it `KILL`s the lock session and
//! takes over, within a fraction of a second instead of when the statement ends. A paused
//! holder (SIGSTOP) keeps both sessions open and is never killed.
//!
//! What it cannot prevent: named locks belong to the server, not to a database, and are not
//! replicated. Two servers (a primary and a promoted replica) each hand out their own lock;
//! point every runner at the same primary. A Galera node is recognised (`wsrep_on`) and gets
//! the lease in the status row instead (`lease.rs`). And a holder
//! killed while the server still executes its statement keeps the lock until that statement
//! ends (no overlap, but the lock is held a while longer).

use std::sync::Arc;
use std::time::Duration;

use dbwarden_core::Error;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};

pub use crate::names::{MAX_LOCK_NAME, alive_name, lock_name};

/// The three answers of `GET_LOCK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetLock {
    /// `1`: this session holds the lock now.
    Acquired,
    /// `0`: another session held it for the whole timeout.
    Busy,
    /// `NULL`: an error on the server (the session was killed, out of memory, ...).
    Failed,
}

/// `GET_LOCK(name, timeout)`. The timeout is never negative (MariaDB answers NULL to -1, MySQL
/// waits forever); fractions of a second are passed on (MariaDB honours them).
pub async fn get_lock(
    conn: &mut MySqlConnection,
    name: &str,
    timeout: Duration,
) -> Result<GetLock, sqlx::Error> {
    let secs = (timeout.as_millis() as f64) / 1000.0;
    let r: Option<i64> = sqlx::query_scalar("SELECT CAST(GET_LOCK(?, ?) AS SIGNED)")
        .bind(name)
        .bind(secs)
        .fetch_one(conn)
        .await?;
    Ok(match r {
        Some(1) => GetLock::Acquired,
        Some(_) => GetLock::Busy,
        None => GetLock::Failed,
    })
}

/// `RELEASE_LOCK(name)`, answer ignored: the caller closes the session next, which frees the
/// lock anyway.
pub async fn release_lock(conn: &mut MySqlConnection, name: &str) -> Result<(), sqlx::Error> {
    sqlx::query("DO RELEASE_LOCK(?)")
        .bind(name)
        .execute(conn)
        .await
        .map(|_| ())
}

/// The connection id of the session holding `name`, if any.
pub async fn is_used_lock(
    conn: &mut MySqlConnection,
    name: &str,
) -> Result<Option<u64>, sqlx::Error> {
    let id: Option<i64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
        .bind(name)
        .fetch_one(conn)
        .await?;
    Ok(id.map(|i| i as u64))
}

pub use crate::tables::server_error;

/// `KILL` connection `id`: `Ok(true)` when killed, `Ok(false)` when no such session exists any
/// more (error 1094: it ended on its own), the server's error otherwise (no privilege: 1095).
pub async fn kill_session(conn: &mut MySqlConnection, id: u64) -> Result<bool, sqlx::Error> {
    // KILL takes no placeholder; the id is an integer the server gave us.
    match sqlx::raw_sql(AssertSqlSafe(format!("KILL {id}")))
        .execute(conn)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if server_error(&e) == Some(1094) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Error 1095 (ER_KILL_DENIED_ERROR): not this user's session, and no privilege to kill others'.
pub fn is_kill_denied(e: &sqlx::Error) -> bool {
    server_error(e) == Some(1095)
}

/// This session's connection id.
pub async fn connection_id(conn: &mut MySqlConnection) -> Result<u64, sqlx::Error> {
    let id: i64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
        .fetch_one(conn)
        .await?;
    Ok(id as u64)
}

/// Run `fut`, failing with a database error naming `what` after `limit`.
pub(crate) async fn bounded<T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(Error::database(format!(
            "{what}: the server did not answer within {} (statement_timeout)",
            dbwarden_core::duration::human(limit)
        ))),
    }
}

/// How to reach the server: options plus the bounds every network step keeps.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    pub options: MySqlConnectOptions,
    /// The URL with its password redacted, for messages.
    pub shown: String,
    pub connect_timeout: Duration,
    pub statement_timeout: Duration,
    /// Runs are held inside a lease every runner shares (`--redis-url`): a Galera node's
    /// `GET_LOCK`, which holds on that node only, is then just the inner lock.
    pub outer_lease: bool,
    /// What the server said of `wsrep_on` the first time it was asked (shared by every clone).
    pub galera: Arc<Galera>,
}

/// Whether the server is a Galera node: unknown until a session has asked it.
#[derive(Debug, Default)]
pub(crate) struct Galera(std::sync::atomic::AtomicU8);

impl Galera {
    const NO: u8 = 1;
    const YES: u8 = 2;

    /// `None` until a session has read `wsrep_on`.
    pub fn known(&self) -> Option<bool> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            Self::NO => Some(false),
            Self::YES => Some(true),
            _ => None,
        }
    }

    fn set(&self, yes: bool) {
        let v = if yes { Self::YES } else { Self::NO };
        self.0.store(v, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Endpoint {
    /// A new connection, bounded by `connect_timeout`; failures are "unreachable" (exit 2).
    pub async fn connect(&self) -> Result<MySqlConnection, Error> {
        let mut conn = self.connect_plain().await?;
        if self.galera.known() == Some(true) {
            // Every read waits until this node has applied what the cluster committed before
            // it (causal reads): a lagging node never answers with an older holder or history.
            bounded(self.statement_timeout, "setting wsrep_sync_wait", async {
                sqlx::raw_sql("SET SESSION wsrep_sync_wait = 1")
                    .execute(&mut conn)
                    .await
                    .map_err(crate::tables::db_err)
            })
            .await?;
        }
        Ok(conn)
    }

    async fn connect_plain(&self) -> Result<MySqlConnection, Error> {
        match tokio::time::timeout(self.connect_timeout, self.options.connect()).await {
            Ok(Ok(c)) => Ok(c),
            // 1040 too many connections: the server is up but full (many replicas at once).
            // Worth waiting for, as a busy lock is, not a configuration error.
            Ok(Err(e)) if server_error(&e) == Some(1040) => Err(Error::Busy(Box::new(
                dbwarden_core::error::BusyInfo::server_full(&self.shown, "too many connections"),
            ))),
            Ok(Err(e)) => Err(Error::unreachable_from(
                self.shown.clone(),
                e.to_string(),
                e,
            )),
            Err(_) => Err(Error::unreachable(
                self.shown.clone(),
                format!(
                    "no answer within {} (connect_timeout)",
                    dbwarden_core::duration::human(self.connect_timeout)
                ),
            )),
        }
    }

    /// `f` on a fresh session of its own, bounded by `statement_timeout` (`what` names the
    /// step), closed after it succeeded (dropped after a failure).
    pub async fn once<T>(
        &self,
        what: &str,
        f: impl AsyncFnOnce(&mut MySqlConnection) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut conn = self.connect().await?;
        let r = bounded(self.statement_timeout, what, f(&mut conn)).await?;
        let _ = conn.close().await;
        Ok(r)
    }

    /// The holder's liveness session for lock session `lock_conn_id`: a new connection that takes
    /// [`alive_name`] and then stays idle. `None` when someone else holds that name (a waiter
    /// that took a stale status row naming the same connection id for a dead holder's).
    pub async fn alive_session(&self, lock_conn_id: u64) -> Result<Option<Alive>, Error> {
        let mut conn = self.connect().await?;
        // The session stays idle for as long as the run holds the lock: the server's
        // `wait_timeout` (often minutes in production) must not end it under a long migration,
        // or a waiter would take the live holder for dead. One year is the largest value both
        // servers accept. The name is digits and dots: nothing to quote.
        let sql = format!(
            "SET SESSION wait_timeout = 31536000; SELECT CAST(GET_LOCK('{}', 0) AS SIGNED), CAST(CONNECTION_ID() AS SIGNED)",
            alive_name(lock_conn_id)
        );
        let (got, id) = bounded(self.statement_timeout, "taking the liveness lock", async {
            use sqlx::Row;
            let rows = sqlx::raw_sql(AssertSqlSafe(sql))
                .fetch_all(&mut conn)
                .await
                .map_err(crate::tables::db_err)?;
            let row = rows.last().ok_or_else(|| {
                Error::database("taking the liveness lock: the server returned no row")
            })?;
            let got: Option<i64> = row.try_get(0).map_err(crate::tables::db_err)?;
            let id: i64 = row.try_get(1).map_err(crate::tables::db_err)?;
            Ok((got, id))
        })
        .await?;
        if got != Some(1) {
            let _ = conn.close().await;
            return Ok(None);
        }
        Ok(Some(Alive {
            conn,
            id: id as u64,
            for_session: lock_conn_id,
        }))
    }

    /// Whether the server is a Galera node, asked on a connection of its own when no session
    /// has told yet. Only asks: `lock-status` and `unlock` work on any server they reach.
    pub async fn galera_node(&self) -> Result<bool, Error> {
        if let Some(galera) = self.galera.known() {
            return Ok(galera);
        }
        let galera = self
            .once("checking the server", async |c| {
                let pairs = variables(c, "SHOW GLOBAL VARIABLES LIKE 'wsrep_on'").await?;
                Ok(galera_node(&pairs))
            })
            .await?;
        self.galera.set(galera);
        Ok(galera)
    }

    /// A connection for the lock: refuses a read-only server before anything is taken.
    pub async fn lock_session(&self) -> Result<Session, Error> {
        let mut conn = self.connect().await?;
        let (galera, id) = bounded(self.statement_timeout, "checking the server", async {
            let galera = refuse_unfit(&mut conn, &self.shown, self.outer_lease).await?;
            if galera && self.galera.known().is_none() {
                // Opened before the node was known: causal reads from here on, as every later
                // connection has them.
                sqlx::raw_sql("SET SESSION wsrep_sync_wait = 1")
                    .execute(&mut conn)
                    .await
                    .map_err(crate::tables::db_err)?;
            }
            let id = connection_id(&mut conn)
                .await
                .map_err(crate::tables::db_err)?;
            Ok((galera, id))
        })
        .await?;
        self.galera.set(galera);
        Ok(Session::new(conn, id))
    }
}

/// Refuse a server whose lock would not be one: `read_only` or `super_read_only` on (a
/// replica, or a primary being demoted), and a look-alike whose `GET_LOCK` is not trusted
/// (TiDB, Vitess: `dbwarden_core::lookalike`). Returns whether it is a Galera node
/// (`wsrep_on`), whose `GET_LOCK` holds on that node only (MDEV-31325): the lock there is the
/// lease in the status row ([`crate::lease`]). MariaDB has no `super_read_only`, MySQL no
/// `wsrep_on`: `SHOW ... WHERE` lists only what exists. Nothing has been written yet.
pub(crate) async fn refuse_unfit(
    conn: &mut MySqlConnection,
    shown: &str,
    outer_lease: bool,
) -> Result<bool, Error> {
    let pairs = variables(
        conn,
        "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('read_only', 'super_read_only', 'wsrep_on', 'version')",
    )
    .await?;
    if let Some(on) = read_only_variable(&pairs) {
        return Err(Error::usage(format!(
            "{shown} is read-only ({on} = ON): a replica cannot take the migration lock; point the URL at the primary"
        )));
    }
    if let Some((_, version)) = pairs
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("version"))
    {
        dbwarden_core::lookalike::refuse(shown, version, outer_lease)?;
    }
    Ok(galera_node(&pairs))
}

/// The `(name, value)` pairs a `SHOW VARIABLES` statement returns.
async fn variables(
    conn: &mut MySqlConnection,
    show: &'static str,
) -> Result<Vec<(String, String)>, Error> {
    use sqlx::Row;
    let rows = sqlx::raw_sql(show)
        .fetch_all(conn)
        .await
        .map_err(crate::tables::db_err)?;
    rows.iter()
        .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<String, _>(1)?)))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(crate::tables::db_err)
}

fn is_on(v: &str) -> bool {
    matches!(v.to_ascii_uppercase().as_str(), "ON" | "1")
}

/// The first read-only variable that is on, from `(name, value)` pairs.
pub fn read_only_variable(rows: &[(String, String)]) -> Option<String> {
    rows.iter()
        .filter(|(n, _)| {
            n.eq_ignore_ascii_case("read_only") || n.eq_ignore_ascii_case("super_read_only")
        })
        .find(|(_, v)| is_on(v))
        .map(|(n, _)| n.to_ascii_lowercase())
}

/// `wsrep_on` is on, from `(name, value)` pairs: a Galera (or Percona XtraDB Cluster) node.
pub fn galera_node(rows: &[(String, String)]) -> bool {
    rows.iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("wsrep_on") && is_on(v))
}

/// One connection to the server for the lock, and whether it holds the lock already (a waiter's
/// blocking `GET_LOCK` may have returned 1).
pub(crate) struct Session {
    pub conn: MySqlConnection,
    pub id: u64,
    pub holds: bool,
    /// A waiter's: the holder's lock session, when the status row names it as the active
    /// holder (so its liveness lock was taken before that row was written).
    pub suspect: Option<u64>,
    /// A waiter's: the dead holder's lock session this session `KILL`ed.
    pub killed: Option<u64>,
}

impl Session {
    /// A fresh session `id`, holding nothing.
    pub fn new(conn: MySqlConnection, id: u64) -> Self {
        let (holds, suspect, killed) = (false, None, None);
        Session {
            conn,
            id,
            holds,
            suspect,
            killed,
        }
    }
}

/// A holder's liveness session: idle, holding [`alive_name`] of its lock session.
pub(crate) struct Alive {
    pub conn: MySqlConnection,
    pub id: u64,
    /// The lock session whose liveness lock it holds.
    pub for_session: u64,
}

/// A kept liveness session, if it still holds the liveness lock of `lock_session` (checked on
/// it, within [`dbwarden_core::wait::KEPT_SESSION_CHECK`]); otherwise its connection id, for
/// the caller to end it. Reusing a dead one would leave that lock free while the run holds the
/// lock, and a waiter would take the live run for dead and KILL it.
pub(crate) async fn still_alive(mut a: Alive, lock_session: u64) -> Result<Alive, u64> {
    let sql = format!(
        "SELECT CAST(COALESCE(IS_USED_LOCK('{}') = CONNECTION_ID(), 0) AS SIGNED)",
        alive_name(lock_session)
    );
    let check = tokio::time::timeout(dbwarden_core::wait::KEPT_SESSION_CHECK, async {
        use sqlx::Row;
        let row = sqlx::raw_sql(AssertSqlSafe(sql))
            .fetch_one(&mut a.conn)
            .await?;
        row.try_get::<i64, _>(0)
    })
    .await;
    if a.for_session == lock_session && matches!(check, Ok(Ok(1))) {
        Ok(a)
    } else {
        Err(a.id)
    }
}

/// Where a clean release leaves the lock session and its liveness session for the lock's next
/// acquire (see `MySqlHeld::release`).
pub(crate) type KeptSession = Arc<dbwarden_core::kept::Kept<Session>>;
pub(crate) type KeptAlive = Arc<dbwarden_core::kept::Kept<Alive>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_detection_handles_both_servers() {
        let v = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(read_only_variable(&v(&[("read_only", "OFF")])), None); // MariaDB
        assert_eq!(
            read_only_variable(&v(&[("read_only", "OFF"), ("super_read_only", "ON")])),
            Some("super_read_only".into())
        );
        assert_eq!(
            read_only_variable(&v(&[("READ_ONLY", "ON")])),
            Some("read_only".into())
        );
        assert_eq!(read_only_variable(&[]), None);
        // A Galera node is not read-only; it is a node.
        let galera = v(&[("read_only", "OFF"), ("wsrep_on", "ON")]);
        assert_eq!(read_only_variable(&galera), None);
        assert!(galera_node(&galera));
        assert!(!galera_node(&v(&[
            ("read_only", "OFF"),
            ("wsrep_on", "OFF")
        ])));
        assert!(!galera_node(&v(&[("read_only", "OFF")]))); // MySQL: no such variable
    }
}
