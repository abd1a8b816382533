//! dbwarden-postgres: the PostgreSQL engine. A session advisory lock on one dedicated
//! connection that also runs the migrations (grade A, see [`lock`]); status, history and audit
//! tables in a configurable schema ([`tables`]), every write fenced ([`store`]); a heartbeat
//! from a second connection ([`held`]); waiters woken by `LISTEN/NOTIFY` ([`waiter`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), dbwarden_core::Error> {
//! use dbwarden_core::{HolderInfo, HeartbeatConfig, Namespace, Wait, wait::acquire};
//! let lock = dbwarden_postgres::PgLock::from_url("postgres://app@db/prod", Namespace::default())?;
//! let lease = acquire(&lock, &HolderInfo::current(None, "demo"), Wait::No, HeartbeatConfig::default()).await?;
//! lease.release().await
//! # }
//! ```
#![forbid(unsafe_code)]

mod acquire;
pub mod held;
mod hosts;
mod index_builds;
mod journal;
pub mod lease;
mod literal;
pub mod lock;
mod observe;
mod other_tools;
pub mod shared;
pub mod store;
mod table_locks;
pub mod tables;
mod unlock;
pub mod waiter;

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dbwarden_core::config::Settings;
use dbwarden_core::unlock::{Broke, Sighting};
use dbwarden_core::{
    Attempt, AuditRecord, Error, Grade, HistoryRow, HolderInfo, MigrationLock, Namespace,
    Observation, SharedLock, WakeUp,
};
use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;
use tokio::sync::Mutex;

use crate::lock::Target;
use crate::tables::Tables;
use crate::waiter::Waiter;

/// This engine in the registry (`dbwarden_core::registry`): its name, URL schemes and factory.
pub static ENGINE: dbwarden_core::registry::Engine = dbwarden_core::registry::Engine {
    name: "postgres",
    schemes: &["postgres", "postgresql"],
    open: from_settings,
    lease_lock: true,
};

/// The lock for `settings.database_url` and `settings.namespace`. Validates everything it can
/// without connecting; connections are made when the lock is first used.
pub fn from_settings(settings: &Settings) -> Result<Box<dyn MigrationLock>, Error> {
    let lock = PgLock::from_url(&settings.database_url, settings.namespace.clone())?
        .tables(
            settings.schema.as_deref().unwrap_or("public"),
            &settings.history_table,
        )?
        .connect_timeout(settings.connect_timeout)
        .statement_timeout(settings.statement_timeout)
        .inside_outer_lease(settings.outer_lease);
    if settings.lock == dbwarden_core::config::LockKind::Lease {
        return Ok(Box::new(lease::PgLeaseLock::new(lock)));
    }
    Ok(Box::new(lock))
}

enum Listening {
    NotYet,
    On(Waiter),
    Unavailable,
}

/// A lock (and the migration tables) for one namespace of one PostgreSQL database.
pub struct PgLock {
    target: Target,
    namespace: Namespace,
    key: i64,
    tables: Tables,
    /// A verified session kept between attempts while waiting (one connection per process, not
    /// one per poll); it becomes the lock session when the try-lock succeeds.
    /// A shared holder gives its session back here on release, so the exclusive try after a
    /// look needs no new connection.
    candidate: shared::Kept,
    /// The heartbeat connection a clean release left for the next acquire.
    kept_aux: held::Kept,
    listening: Mutex<Listening>,
    /// Releases heard when the last attempt started.
    seen: AtomicU64,
    /// The holder as last read by a busy attempt (see `dbwarden_core::wait::HOLDER_READ_REUSE`).
    busy_seen: Mutex<Option<(std::time::Instant, dbwarden_core::error::BusyInfo)>>,
}

impl std::fmt::Debug for PgLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLock")
            .field("target", &self.target.shown)
            .field("namespace", &self.namespace)
            .field("key", &self.key)
            .finish()
    }
}

/// Replace the URL's password wherever a driver message might repeat it.
fn scrub(msg: &str, url: &str) -> String {
    let redacted = dbwarden_core::url::redact(url);
    let mut out = msg.replace(url, &redacted);
    if let Some(pw) = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?']).next())
        .and_then(|auth| auth.rsplit_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, pw)| pw)
        .filter(|pw| !pw.is_empty())
    {
        out = out.replace(pw, "***");
    }
    out
}

impl PgLock {
    /// Every step of `dbwarden unlock` is bounded, so the whole is: a link that stops answering
    /// midway ends the unlock as unreachable (the session goes with it: its transaction rolls
    /// back and its advisory lock is freed), never a command that hangs.
    async fn unlock_step<T>(
        &self,
        bound: Duration,
        step: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(bound, step).await {
            Ok(r) => r,
            Err(_) => Err(Error::unreachable(
                self.target.shown.clone(),
                format!(
                    "unlocking: no answer within {}",
                    dbwarden_core::duration::human(bound)
                ),
            )),
        }
    }

    /// The lock for `url` (`postgres://` or `postgresql://`) and `namespace`. Nothing is
    /// opened yet.
    pub fn from_url(url: &str, namespace: Namespace) -> Result<Self, Error> {
        let shown_url = dbwarden_core::url::redact(url);
        let invalid = |e: String| {
            Error::usage(format!(
                "invalid PostgreSQL URL {shown_url:?}: {}; use postgres://user[:password]@host[:port][,host[:port]...]/database",
                scrub(&dbwarden_core::error::one_line(&e), url)
            ))
        };
        let mut hosts = Vec::new();
        for one in hosts::split(url).map_err(invalid)? {
            let options = PgConnectOptions::from_str(&one).map_err(|e| invalid(e.to_string()))?;
            let app = options
                .get_application_name()
                .unwrap_or("dbwarden")
                .to_owned();
            let options = options
                .application_name(&app)
                // PgBouncer rejects unknown startup parameters.
                .extra_float_digits(None)
                .disable_statement_logging();
            let server = match options.get_socket() {
                Some(dir) => dir.display().to_string(),
                None => format!("{}:{}", options.get_host(), options.get_port()),
            };
            hosts.push((options, server));
        }
        let options = hosts[0].0.clone();
        let database = options
            .get_database()
            .unwrap_or(options.get_username())
            .to_owned();
        let server = hosts
            .iter()
            .map(|(_, s)| s.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let shown = format!("{server}/{database}");
        for (_, s) in hosts.iter_mut() {
            *s = format!("{s}/{database}");
        }
        if hosts.len() == 1 {
            hosts.clear();
        }
        let key = lock::advisory_key(namespace.as_str());
        Ok(PgLock {
            target: Target {
                options,
                shown,
                connect_timeout: Duration::from_secs(10),
                statement_timeout: Duration::from_secs(30),
                verified: Arc::default(),
                last_connect_us: Arc::default(),
                set_ups: lock::set_up_gate(&server),
                hosts: Arc::new(hosts),
                current: Arc::default(),
                outer_lease: false,
            },
            namespace,
            key,
            tables: Tables::new("public", "dbwarden_migrations"),
            candidate: shared::Kept::default(),
            kept_aux: held::Kept::default(),
            listening: Mutex::new(Listening::NotYet),
            seen: AtomicU64::new(0),
            busy_seen: Mutex::new(None),
        })
    }

    /// The schema of the three tables and the history table's name (validated identifiers).
    pub fn tables(mut self, schema: &str, history_table: &str) -> Result<Self, Error> {
        dbwarden_core::config::validate_identifier("schema", schema)?;
        dbwarden_core::config::validate_identifier("history_table", history_table)?;
        self.tables = Tables::new(schema, history_table);
        Ok(self)
    }

    /// Bound on each connection set-up (TCP and authentication together).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.target.connect_timeout = d;
        self
    }

    /// Bound on lock operations (never on migration statements).
    pub fn statement_timeout(mut self, d: Duration) -> Self {
        self.target.statement_timeout = d;
        self
    }

    /// Runs are held inside a lease every runner shares (`--redis-url`): a look-alike server
    /// (CockroachDB, YugabyteDB) is then accepted, its advisory lock only the inner lock.
    pub fn inside_outer_lease(mut self, yes: bool) -> Self {
        self.target.outer_lease = yes;
        self
    }

    pub(crate) fn ms(&self) -> u128 {
        self.target.statement_timeout.as_millis().max(1)
    }
}

#[async_trait]
impl MigrationLock for PgLock {
    fn identity(&self) -> dbwarden_core::Identity<'_> {
        dbwarden_core::Identity {
            engine: "postgres",
            grade: Grade::A,
            namespace: &self.namespace,
            reach: Some(dbwarden_core::Reach {
                target: self.target.shown.clone(),
                connect_timeout: self.target.connect_timeout,
            }),
        }
    }

    fn wake_up(&self) -> Option<&dyn WakeUp> {
        Some(self)
    }

    fn shared(&self) -> Option<&dyn SharedLock> {
        Some(self)
    }

    /// One attempt (a full server is `Error::Busy`, which the wait policy retries).
    async fn try_acquire(&self, holder: &HolderInfo) -> Result<Attempt, Error> {
        if let Listening::On(w) = &mut *self.listening.lock().await {
            self.seen.store(w.heard(), Ordering::SeqCst);
        }
        let (mut conn, mut pid, mut spare) = self.session().await?;
        let got = match self.attempt(&mut conn).await {
            Ok(got) => got,
            Err(e) => {
                // A kept session may have died while we waited (server restart): one fresh try.
                tracing::debug!("try-lock failed ({e}); reconnecting once");
                drop(conn);
                (conn, pid, spare) = self.target.open_session_and_spare().await?;
                self.attempt(&mut conn).await?
            }
        };
        if !got {
            // A waiter keeps two connections (this session and its LISTEN one), not three.
            if let Some(s) = spare {
                let _ = sqlx::Connection::close(s).await;
            }
            return self.busy(conn, pid).await;
        }
        // Ours: the listener is no longer needed, and its connection becomes the heartbeat's
        // when the session was a kept one (no spare). On any failure below, dropping `conn`
        // closes the session and frees the lock.
        // A heartbeat connection kept from a try that a lease refused (see `claim`) serves
        // instead: the listener stays, and a waiter behind a lease opens nothing per try.
        let kept_aux = spare.is_none() && self.kept_aux.is_kept().await;
        if !kept_aux {
            let listening = std::mem::replace(&mut *self.listening.lock().await, Listening::NotYet);
            if let (None, Listening::On(w)) = (&spare, listening) {
                spare = w.into_connection(self.target.statement_timeout).await;
            }
        }
        match self.claim(conn, pid, spare, holder).await {
            Ok(grant) => {
                *self.listening.lock().await = Listening::NotYet;
                Ok(Attempt::Acquired(grant))
            }
            Err(Error::Busy(info)) if !info.server_full => Ok(Attempt::Busy(*info)),
            Err(e) => Err(e),
        }
    }

    async fn stop_waiting(&self) {
        *self.listening.lock().await = Listening::NotYet;
        if let Some(aux) = self.kept_aux.take().await {
            let _ =
                tokio::time::timeout(self.target.statement_timeout, sqlx::Connection::close(aux))
                    .await;
        }
        if let Some((conn, _)) = self.candidate.take().await {
            let _ =
                tokio::time::timeout(self.target.statement_timeout, sqlx::Connection::close(conn))
                    .await;
        }
    }

    async fn observe(&self) -> Result<Observation, Error> {
        let mut conn = self.target.connect().await?;
        self.target.check_primary(&mut conn).await?;
        let view = self
            .target
            .bounded("reading the lock", self.read_view(&mut conn))
            .await?;
        let _ = sqlx::Connection::close(conn).await;
        Ok(view.observation(
            self.grade(),
            self.namespace.as_str(),
            self.key,
            &self.tables.lock,
        ))
    }

    async fn sight(&self) -> Result<Sighting, Error> {
        let t = &self.target;
        let bound = t.connect_timeout + t.statement_timeout * 2;
        self.unlock_step(bound, unlock::sight(self)).await
    }

    async fn break_lock(
        &self,
        seen: &Sighting,
        expected: Option<uuid::Uuid>,
        record: AuditRecord,
    ) -> Result<Broke, Error> {
        let t = &self.target;
        let bound =
            t.connect_timeout + unlock::SETTLE + unlock::TAKE_OVER + t.statement_timeout * 4;
        self.unlock_step(bound, unlock::break_lock(self, seen, expected, record))
            .await
    }

    async fn audit(&self, record: &AuditRecord) -> Result<(), Error> {
        let kept = self.candidate.take().await;
        let mut conn = match kept {
            Some((c, _)) => c,
            None => self.target.connect().await?,
        };
        let ms = self.ms();
        self.target
            .bounded("writing an audit row", async {
                tables::ensure_tables(&mut conn, &self.tables, ms).await?;
                tables::insert_audit(&mut conn, &self.tables, record).await
            })
            .await
    }

    async fn blockers(&self, session: &str) -> Result<Vec<String>, Error> {
        let Ok(pid) = session.parse::<i32>() else {
            return Ok(Vec::new());
        };
        let mut conn = self.target.connect().await?;
        self.target
            .bounded_db(
                "reading who blocks the migration",
                table_locks::blockers(&mut conn, pid),
            )
            .await
    }

    async fn invalid_indexes(&self) -> Result<Vec<dbwarden_core::InvalidIndex>, Error> {
        let mut conn = self.target.connect().await?;
        self.target
            .bounded_db(
                "reading invalid indexes",
                index_builds::in_search_path(&mut conn),
            )
            .await
    }

    async fn read_history(&self) -> Result<Vec<HistoryRow>, Error> {
        // A waiter (a `wait` gate between looks) reads on the session it listens on: a new
        // session costs the server a backend process, and 16 gates waking on one NOTIFY would
        // each start one. Busy (another task of this lock waits on it): a session of its own.
        if let Ok(mut listening) = self.listening.try_lock()
            && let Listening::On(w) = &mut *listening
        {
            // This look sees every release heard so far: the next wait sleeps until a new one.
            self.seen.store(w.heard(), Ordering::SeqCst);
            let read = async {
                let conn = w.conn().await.map_err(|e| self.target.db_err(e))?;
                tables::history_if_any(conn, &self.tables).await
            };
            match self.target.bounded("reading the history", read).await {
                Ok(rows) => return Ok(rows),
                // The listening session failed: a fresh one below, and a fresh LISTEN later.
                Err(e) => {
                    tracing::debug!("history read on the listening session failed ({e})");
                    *listening = Listening::NotYet;
                }
            }
        }
        let mut conn = self.target.connect().await?;
        tables::history_if_any(&mut conn, &self.tables).await
    }

    fn dialect(&self) -> Option<dbwarden_core::migration::Dialect> {
        Some(dbwarden_core::migration::Dialect::Postgres)
    }

    fn other_tools(&self) -> Option<&dyn dbwarden_core::adopt::OtherTools> {
        Some(self)
    }
}
