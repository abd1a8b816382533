//! The PostgreSQL lock: a session-level `pg_try_advisory_lock(key)` taken on one dedicated
//! connection, the *lock session*, which also runs every migration and lives exactly as long as
//! the lease. Grade A: when the holder's session ends (process killed, connection dropped,
//! `pg_terminate_backend`), the server frees the lock at once; and because migrations run on
//! that same session, a statement the server is still executing for a dead client keeps the
//! lock until it ends, so two runners never overlap. `client_connection_check_interval` (set
//! on the lock session where the server has it, PostgreSQL ≥ 14) makes the server cancel such
//! a statement promptly.
//!
//! What it cannot prevent: a transaction pooler (PgBouncer `pool_mode = transaction`) between
//! us and the server, which would hand the lock session's backend to someone else between
//! transactions; it is detected and refused ([`check_not_pooled`]). Advisory locks live per
//! database, so every lookup in `pg_locks` is filtered to the current database.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dbwarden_core::Error;
use md5::{Digest, Md5};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgDatabaseError};
use sqlx::{Connection, Row};

/// Channel a releasing holder NOTIFYs (payload: the namespace); waiters LISTEN on it.
pub const RELEASE_CHANNEL: &str = "dbwarden_release";

/// How often the server checks that the lock session's client is still there during a long
/// statement, in milliseconds (PostgreSQL ≥ 14).
pub const CLIENT_CHECK_INTERVAL_MS: u64 = 250;

/// The advisory-lock key of a namespace: the first 16 hex digits of
/// `md5("dbwarden:<ns>:primary")` as a u64, masked to a positive i64 (as the Python dbwarden
/// computes it, so a Rust and a Python runner on one database exclude each other).
///
/// ```
/// assert_eq!(dbwarden_postgres::lock::advisory_key("default"), 6544297242513093592);
/// ```
pub fn advisory_key(namespace: &str) -> i64 {
    let digest = Md5::digest(format!("dbwarden:{namespace}:primary").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) & 0x7FFF_FFFF_FFFF_FFFF) as i64
}

/// `pg_locks` shows a bigint advisory key split in two: `classid` = high 32 bits, `objid` = low
/// 32 bits, `objsubid` = 1.
pub fn key_parts(key: i64) -> (i64, i64) {
    (key >> 32, key & 0xFFFF_FFFF)
}

/// The granted advisory lock for key parts `$1`, `$2` in the current database: its holder's
/// backend pid.
pub const HOLDER_SQL: &str = "SELECT l.pid FROM pg_locks l \
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.mode = 'ExclusiveLock' \
       AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid \
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     LIMIT 1";

/// The connection slots free for this user, and `max_connections`. Free: `max_connections`,
/// less the slots reserved for superusers when we are not one, less the client sessions open
/// now; at most what is left of the role's own `CONNECTION LIMIT`, where it has one.
pub const FREE_SLOTS_SQL: &str = "SELECT LEAST( \
       current_setting('max_connections')::int \
         - CASE WHEN r.rolsuper THEN 0 \
                ELSE current_setting('superuser_reserved_connections')::int END \
         - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int, \
       CASE WHEN r.rolconnlimit < 0 THEN 2147483647 \
            ELSE r.rolconnlimit \
              - (SELECT count(*) FROM pg_stat_activity \
                 WHERE backend_type = 'client backend' AND usename = current_user)::int END), \
     current_setting('max_connections')::int \
     FROM pg_roles r WHERE r.rolname = current_user";

/// Where a connection goes, for messages: `host:port/database`, never the password.
#[derive(Debug, Clone)]
pub struct Target {
    pub options: PgConnectOptions,
    pub shown: String,
    pub connect_timeout: Duration,
    pub statement_timeout: Duration,
    /// Set once a session of this target passed the two-connection pooler check. Whether a
    /// transaction pooler sits behind a URL does not change while a process runs, so later
    /// sessions (a waiter's retries, the next run of a library user) connect once, not twice:
    /// with 64 replicas waiting at once, that second connection each is what filled
    /// `max_connections`. Shared by the clones of one lock's target.
    pub verified: Arc<AtomicBool>,
    /// How long the last connection of this target took to set up, in microseconds (0: none
    /// yet): what a LISTEN connection may be expected to take (see `waiter::LISTEN_SET_UP`).
    pub last_connect_us: Arc<AtomicU64>,
    /// This process's connection set-ups to the server in progress (see [`SET_UPS_AT_ONCE`]).
    pub set_ups: Arc<tokio::sync::Semaphore>,
    /// Every host of a URL with a host list, each with its `host:port` (empty for one host):
    /// a connection goes to the first that is a primary (see [`crate::hosts`]).
    pub hosts: Arc<Vec<(PgConnectOptions, String)>>,
    /// The host of `hosts` that was the primary last time: tried first.
    pub current: Arc<std::sync::atomic::AtomicUsize>,
    /// Runs are held inside a lease every runner shares (`--redis-url`): a look-alike's
    /// advisory lock is then only the inner lock.
    pub outer_lease: bool,
}

/// How many connections one process sets up to one server at the same time. A library user
/// with many locks (1000 runners as tasks, benchmark 9c) would otherwise start a thousand
/// TLS handshakes in one moment: the server forks and handshakes them one after another, the
/// kernel drops connection requests past its accept queue (retried after 1 s, 3 s, 7 s), and
/// set-ups at the back of that queue ran out of `connect_timeout` and ended the run as
/// unreachable. A set-up waits for its turn here before its `connect_timeout` starts; a wait
/// for the lock stays bounded by `--wait` plus one `connect_timeout` as a whole.
pub const SET_UPS_AT_ONCE: usize = 16;

/// The set-up gate of `host:port`, shared by every lock of this process on that server.
pub fn set_up_gate(server: &str) -> Arc<tokio::sync::Semaphore> {
    static GATES: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Semaphore>>>,
    > = std::sync::OnceLock::new();
    let gates = GATES.get_or_init(Default::default);
    let mut gates = gates.lock().unwrap_or_else(|e| e.into_inner());
    gates
        .entry(server.to_owned())
        .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(SET_UPS_AT_ONCE)))
        .clone()
}

/// A driver error as one line for people: the server's message with its detail, hint and
/// SQLSTATE (not the server's source line that the driver appends).
pub fn describe(e: &sqlx::Error) -> String {
    let text = match e {
        sqlx::Error::Database(db) => match db.try_downcast_ref::<PgDatabaseError>() {
            Some(pg) => {
                let mut s = pg.message().to_owned();
                if let Some(d) = pg.detail() {
                    s.push_str(&format!(" ({d})"));
                }
                if let Some(h) = pg.hint() {
                    s.push_str(&format!("; hint: {h}"));
                }
                s.push_str(&format!(" [SQLSTATE {}]", pg.code()));
                s
            }
            None => db.message().to_owned(),
        },
        other => other.to_string(),
    };
    dbwarden_core::error::one_line(&text)
}

/// Errors that mean the session itself is gone (so a session lock on it is gone too).
pub fn session_ended(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("57P") || c.starts_with("08")),
        _ => false,
    }
}

/// 53300 too_many_connections: the server refused a new session for want of a slot.
pub fn server_full(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("53300"))
}

impl Target {
    /// Open one connection, bounded by `connect_timeout`; any failure is "unreachable" (exit 2).
    /// With a host list, a connection to the first host that is a primary.
    pub async fn connect(&self) -> Result<PgConnection, Error> {
        if self.hosts.len() < 2 {
            return self.connect_to(&self.options, &self.shown).await;
        }
        let n = self.hosts.len();
        let first = self.current.load(Ordering::Relaxed) % n;
        let (mut why, mut saw_standby, mut saw_full) = (Vec::new(), false, false);
        for k in 0..n {
            let i = (first + k) % n;
            let (options, server) = &self.hosts[i];
            let mut conn = match self.connect_to(options, server).await {
                Ok(c) => c,
                Err(e) => {
                    saw_full |= matches!(&e, Error::Busy(_));
                    why.push(dbwarden_core::error::one_line(&e.to_string()));
                    continue;
                }
            };
            let standby = self
                .bounded_db("checking the server", async {
                    sqlx::raw_sql("SELECT pg_is_in_recovery()")
                        .fetch_one(&mut conn)
                        .await?
                        .try_get::<bool, _>(0)
                })
                .await;
            match standby {
                Ok(false) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(conn);
                }
                Ok(true) => {
                    saw_standby = true;
                    why.push(format!("{server}: a standby"));
                }
                Err(e) => why.push(format!("{server}: {e}")),
            }
            let _ = conn.close().await;
        }
        Err(crate::hosts::no_primary(
            &self.shown,
            &why,
            saw_standby,
            saw_full,
        ))
    }

    /// The options of the host connections go to now (the one that was the primary last).
    pub fn options_now(&self) -> PgConnectOptions {
        match self.hosts.len() {
            0 | 1 => self.options.clone(),
            n => self.hosts[self.current.load(Ordering::Relaxed) % n]
                .0
                .clone(),
        }
    }

    /// One connection to one host, bounded by `connect_timeout`.
    async fn connect_to(
        &self,
        options: &PgConnectOptions,
        shown: &str,
    ) -> Result<PgConnection, Error> {
        // Never closed, so acquiring cannot fail; without a permit, connect all the same.
        let _turn = self.set_ups.acquire().await.ok();
        let started = std::time::Instant::now();
        match tokio::time::timeout(self.connect_timeout, PgConnection::connect_with(options)).await
        {
            Ok(Ok(c)) => {
                let took = started.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
                self.last_connect_us.store(took, Ordering::Relaxed);
                Ok(c)
            }
            // 53300 too_many_connections: the server is up but full, e.g. many replicas waiting
            // at once. That is worth waiting for (busy), not a configuration error.
            Ok(Err(e)) if server_full(&e) => Err(Error::Busy(Box::new(
                dbwarden_core::error::BusyInfo::server_full(shown, "too many clients"),
            ))),
            Ok(Err(e)) => {
                let detail = match &e {
                    sqlx::Error::Database(_) => format!("the server said: {}", describe(&e)),
                    other => other.to_string(),
                };
                Err(Error::unreachable_from(
                    shown.to_owned(),
                    format!(
                        "{detail}; check that PostgreSQL runs there and the URL's host, port, database and user"
                    ),
                    e,
                ))
            }
            Err(_) => Err(Error::unreachable(
                shown.to_owned(),
                format!(
                    "no answer within {} (connect_timeout)",
                    dbwarden_core::duration::human(self.connect_timeout)
                ),
            )),
        }
    }

    /// Run `f` bounded by `statement_timeout` (for lock operations only, never migrations). A
    /// timed-out future leaves its connection in an unknown state: the caller drops it.
    pub async fn bounded<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.statement_timeout, f).await {
            Ok(r) => r,
            Err(_) => Err(Error::unreachable(
                self.shown.clone(),
                format!(
                    "{what}: no answer within {} (statement_timeout)",
                    dbwarden_core::duration::human(self.statement_timeout)
                ),
            )),
        }
    }

    /// [`Target::bounded`] for a driver call, its error mapped by [`Target::db_err`].
    pub async fn bounded_db<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, Error> {
        self.bounded(what, async { f.await.map_err(|e| self.db_err(e)) })
            .await
    }

    pub fn db_err(&self, e: sqlx::Error) -> Error {
        if session_ended(&e) {
            Error::unreachable_from(self.shown.clone(), describe(&e), e)
        } else {
            Error::database_from(describe(&e), e)
        }
    }

    /// Refuse a server in recovery (advisory locks and DDL there do not exclude the primary),
    /// and a look-alike whose advisory lock is not one (`dbwarden_core::lookalike`), in one
    /// round trip.
    pub async fn check_primary(&self, conn: &mut PgConnection) -> Result<(), Error> {
        let row = sqlx::raw_sql("SELECT pg_is_in_recovery(), version()")
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| self.db_err(e))?;
        let version: String = row.try_get(1).map_err(|e| self.db_err(e))?;
        dbwarden_core::lookalike::refuse(&self.shown, &version, self.outer_lease)?;
        refuse_replica(&self.shown, row.try_get(0).map_err(|e| self.db_err(e))?)
    }

    /// A verified lock session: connected, on a primary, not behind a transaction pooler, with
    /// the client check interval set. Returns the connection and its backend pid.
    pub async fn open_session(&self) -> Result<(PgConnection, i32), Error> {
        let (conn, pid, other) = self.open_session_and_spare().await?;
        if let Some(other) = other {
            let _ = other.close().await;
        }
        Ok((conn, pid))
    }

    /// [`Target::open_session`], also returning the second connection the pooler check needed,
    /// still open: a run that gets the lock at once makes it its heartbeat connection
    /// ([`Target::make_aux`]) instead of connecting a third time (with TLS each connection
    /// costs milliseconds). `None` once this target was verified: then one connection is made.
    pub async fn open_session_and_spare(
        &self,
    ) -> Result<(PgConnection, i32, Option<PgConnection>), Error> {
        let mut conn = self.connect().await?;
        let verified = self.verified.load(Ordering::SeqCst);
        self.bounded("checking the server", async {
            self.check_primary(&mut conn).await?;
            let (pid, other) = if verified {
                (
                    backend_pid(&mut conn).await.map_err(|e| self.db_err(e))?,
                    None,
                )
            } else {
                let mut other = self.connect().await?;
                let pid = check_not_pooled(&mut conn, &mut other)
                    .await
                    .map_err(|e| self.db_err(e))?;
                let pid = pid.map_err(|(a, b)| pooler_error(&self.shown, a, b))?;
                self.verified.store(true, Ordering::SeqCst);
                (pid, Some(other))
            };
            self.configure_session(&mut conn).await?;
            Ok((pid, other))
        })
        .await
        .map(|(pid, other)| (conn, pid, other))
    }

    /// What every lock session gets: the server checks for a vanished client during long
    /// statements (PostgreSQL ≥ 14).
    pub async fn configure_session(&self, conn: &mut PgConnection) -> Result<(), Error> {
        if conn.server_version_num().is_some_and(|v| v >= 140_000) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "SET client_connection_check_interval = {CLIENT_CHECK_INTERVAL_MS}"
            )))
            .execute(&mut *conn)
            .await
            .map_err(|e| self.db_err(e))?;
        }
        Ok(())
    }

    /// A helper connection for heartbeats and reads: lock operations on it are bounded by
    /// `statement_timeout` and `lock_timeout` for the whole session.
    pub async fn open_aux(&self) -> Result<PgConnection, Error> {
        let conn = self.connect().await?;
        self.make_aux(conn).await
    }

    /// Make an open connection a helper connection (see [`Target::open_aux`]).
    pub async fn make_aux(&self, mut conn: PgConnection) -> Result<PgConnection, Error> {
        let ms = self.statement_timeout.as_millis();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SET statement_timeout = {ms}; SET lock_timeout = {ms}"
        )))
        .execute(&mut conn)
        .await
        .map_err(|e| self.db_err(e))?;
        Ok(conn)
    }
}

pub fn refuse_replica(shown: &str, in_recovery: bool) -> Result<(), Error> {
    if in_recovery {
        return Err(Error::usage(format!(
            "{shown} is a read replica (pg_is_in_recovery() is true): its advisory locks do not exclude runners on the primary and it cannot run DDL; point --database-url at the primary"
        )));
    }
    Ok(())
}

fn pooler_error(shown: &str, first: i32, second: i32) -> Error {
    Error::usage(format!(
        "{shown} is behind a transaction pooler (one connection was served by backend {first}, then by {second}): a session advisory lock cannot survive transaction pooling; use a direct URL to PostgreSQL, a session-pooling port (e.g. PgBouncer pool_mode = session), or the pooler-safe lease: lock = \"lease\" (--lock lease)"
    ))
}

pub async fn backend_pid(conn: &mut PgConnection) -> Result<i32, sqlx::Error> {
    // The simple query protocol: a transaction pooler may not keep prepared statements.
    let row = sqlx::raw_sql("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await?;
    row.try_get(0)
}

/// The two-connection check of docs/design.md §6. One idle connection keeps its backend even behind
/// PgBouncer in transaction mode, so: open a transaction on A and read its pid, read B's pid
/// meanwhile, commit A, open a transaction on B, read A's pid again. A pooler hands A another
/// backend (A's first one is now B's); a direct server (or session pooling) gives the same pid.
/// `Ok(Ok(pid))`: not pooled; `Ok(Err((first, second)))`: transaction pooling.
pub async fn check_not_pooled(
    a: &mut PgConnection,
    b: &mut PgConnection,
) -> Result<Result<i32, (i32, i32)>, sqlx::Error> {
    sqlx::raw_sql("BEGIN").execute(&mut *a).await?;
    let a1 = backend_pid(a).await?;
    let _b1 = backend_pid(b).await?;
    sqlx::raw_sql("COMMIT").execute(&mut *a).await?;
    sqlx::raw_sql("BEGIN").execute(&mut *b).await?;
    let _b2 = backend_pid(b).await?;
    let a2 = backend_pid(a).await?;
    sqlx::raw_sql("COMMIT").execute(&mut *b).await?;
    Ok(if a1 == a2 { Ok(a1) } else { Err((a1, a2)) })
}

/// One non-blocking attempt at the session lock.
pub async fn try_lock(conn: &mut PgConnection, key: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(conn)
        .await
}

/// Release the session lock and wake waiters (the notification is delivered when this
/// statement commits, i.e. after the unlock). Returns whether we held it, and whether the
/// session is outside any transaction block, so that it can be kept. Sent as a simple query: then the statement outside a block is its
/// own transaction and `now()` equals `statement_timestamp()` exactly; inside an open block
/// `now()` is that block's older start.
pub async fn unlock_and_notify_on_clean_session(
    conn: &mut PgConnection,
    key: i64,
    namespace: &str,
) -> Result<(bool, bool), sqlx::Error> {
    let ns =
        crate::literal::literal(namespace).map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
    let row = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SELECT pg_advisory_unlock({key}), pg_notify('{RELEASE_CHANNEL}', {ns})::text, now() = statement_timestamp()"
    )))
    .fetch_one(conn)
    .await?;
    Ok((row.try_get(0)?, row.try_get(2)?))
}

/// Give the session lock back without waking anyone (nothing was released that a waiter could
/// take: a lease holds the namespace). Returns whether the session is outside any transaction
/// block, so that it can be kept.
pub async fn unlock_quietly(conn: &mut PgConnection, key: i64) -> Result<bool, sqlx::Error> {
    let row = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SELECT pg_advisory_unlock({key}), now() = statement_timestamp()"
    )))
    .fetch_one(conn)
    .await?;
    Ok(row.try_get::<bool, _>(0)? && row.try_get::<bool, _>(1)?)
}

/// The backend pid holding `key` in the current database, if any.
pub async fn holder_pid(conn: &mut PgConnection, key: i64) -> Result<Option<i32>, sqlx::Error> {
    let (hi, lo) = key_parts(key);
    sqlx::query_scalar(HOLDER_SQL)
        .bind(hi)
        .bind(lo)
        .fetch_optional(conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_the_python_dbwarden() {
        // Computed independently:
        //   python3 -c "import hashlib; h = hashlib.md5(b'dbwarden:default:primary').hexdigest();
        //               print(int(h[:16], 16) & 0x7FFFFFFFFFFFFFFF)"
        // and, for "default", on the server:
        //   SELECT ('x'||substr(md5('dbwarden:default:primary'),1,16))::bit(64)::bigint
        //          & 9223372036854775807;
        assert_eq!(advisory_key("default"), 6_544_297_242_513_093_592);
        assert_eq!(advisory_key("billing"), 3_215_595_141_490_753_274);
        assert_eq!(advisory_key("app.v2-x"), 5_750_032_686_029_932_059);
    }

    #[test]
    fn keys_are_positive_and_split_for_pg_locks() {
        let k = advisory_key("default");
        assert!(k > 0);
        let (hi, lo) = key_parts(k);
        assert_eq!((hi << 32) | lo, k);
        assert!((0..=0xFFFF_FFFF).contains(&lo));
    }

    #[test]
    fn a_replica_is_refused_with_the_fix() {
        assert!(refuse_replica("h:5432/db", false).is_ok());
        let e = refuse_replica("h:5432/db", true).unwrap_err();
        assert_eq!(e.exit_code().code(), 2);
        let msg = e.to_string();
        assert!(
            msg.contains("read replica") && msg.contains("primary"),
            "{msg}"
        );
    }

    #[test]
    fn a_pooler_is_refused_with_the_fix() {
        let msg = pooler_error("h:6432/db", 10, 11).to_string();
        assert!(msg.contains("transaction pooler"), "{msg}");
        assert!(msg.contains("direct URL"), "{msg}");
    }
}
