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

pub mod held;
mod hosts;
mod index_builds;
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
use dbwarden_core::adopt::Tool;
use dbwarden_core::config::Settings;
use dbwarden_core::unlock::{Broke, Sighting};
use dbwarden_core::{
    Attempt, AuditRecord, Error, Grade, Grant, HistoryRow, HolderInfo, MigrationLock, Namespace,
    Observation, SharedLock, WakeUp,
};
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use tokio::sync::Mutex;

use crate::held::{PgHeartbeat, PgHeld};
use crate::lock::Target;
use crate::store::PgStore;
use crate::tables::Tables;
use crate::waiter::Waiter;
use dbwarden_core::wait::SILENT_DEATH_POLL;

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

    /// The kept waiting session, else a new one with its spare connection.
    async fn session(&self) -> Result<(PgConnection, i32, Option<PgConnection>), Error> {
        match self.candidate.take().await {
            Some((conn, pid)) => Ok((conn, pid, None)),
            None => self.target.open_session_and_spare().await,
        }
    }

    async fn attempt(&self, conn: &mut PgConnection) -> Result<bool, Error> {
        self.target
            .bounded_db("pg_try_advisory_lock", lock::try_lock(conn, self.key))
            .await
    }

    /// Busy: the holder as read on `conn`, which is kept for the next attempt (shared or
    /// exclusive: a waiter keeps its session).
    async fn busy(&self, mut conn: PgConnection, pid: i32) -> Result<Attempt, Error> {
        let info = self
            .target
            .bounded("reading the holder", self.busy_info(&mut conn))
            .await?;
        self.candidate.put((conn, pid)).await;
        Ok(Attempt::Busy(info))
    }

    /// The listening connection a shared lock was just taken on, as a plain session. `None`
    /// when it did not come back as the same backend (the lock went with the old one).
    async fn listener_session(&self, w: Waiter, pid: i32) -> Option<(PgConnection, i32)> {
        let mut conn = w.into_connection(self.target.statement_timeout).await?;
        match lock::backend_pid(&mut conn).await {
            // Configured as every session is: it may take the exclusive lock next.
            Ok(p) if p == pid => match self.target.configure_session(&mut conn).await {
                Ok(()) => Some((conn, pid)),
                Err(_) => None,
            },
            _ => {
                tracing::debug!("the listening session changed backend; connecting anew");
                None
            }
        }
    }

    /// Whether the server has room for a LISTEN connection: at least a tenth of its slots free
    /// (asked on the kept waiting session; yes when there is none, or it cannot answer). A
    /// LISTEN only makes a waiter hear a release sooner than its poll; under a crowd that fills
    /// the server, a slot is worth more to a runner that has none.
    async fn room_to_listen(&self) -> bool {
        let mut kept = self.candidate.lock().await;
        let Some((conn, _)) = kept.as_mut() else {
            return true;
        };
        let asked = tokio::time::timeout(
            self.target.statement_timeout,
            sqlx::query_as::<_, (i32, i32)>(lock::FREE_SLOTS_SQL).fetch_one(&mut *conn),
        )
        .await;
        match asked {
            Ok(Ok((free, max))) => free >= (max / 10).max(1),
            _ => true,
        }
    }

    /// The session holding the lock now takes the tables, the token and the status row.
    async fn claim(
        &self,
        mut conn: PgConnection,
        pid: i32,
        spare: Option<PgConnection>,
        holder: &HolderInfo,
    ) -> Result<Grant, Error> {
        let ms = self.ms();
        // The heartbeat's connection first: if the server is full, nothing was written yet and
        // the attempt is simply busy (no status row left RUNNING for a run that never started).
        let kept_aux = self.kept_aux.take().await;
        let aux = match (spare, kept_aux) {
            (Some(c), kept) => {
                if let Some(k) = kept {
                    let _ = sqlx::Connection::close(k).await;
                }
                self.target.make_aux(c).await?
            }
            // Configured when it was made. Checked, briefly: an idle connection may have
            // been cut meanwhile (a half-open one would stall the first heartbeats).
            (None, Some(mut k)) => {
                let alive = tokio::time::timeout(
                    dbwarden_core::wait::KEPT_SESSION_CHECK,
                    sqlx::Connection::ping(&mut k),
                )
                .await;
                if matches!(alive, Ok(Ok(()))) {
                    k
                } else {
                    self.target.open_aux().await?
                }
            }
            (None, None) => self.target.open_aux().await?,
        };
        let claimed = self
            .target
            .bounded("claiming the lock", async {
                let settings = tables::ensure_tables(&mut conn, &self.tables, ms).await?;
                tables::bump_and_claim(self, &mut conn, holder, pid, settings).await
            })
            .await;
        let (token, previous, why) = match claimed {
            // A runner on `lock = "lease"` holds the namespace: our advisory lock goes back,
            // and the session and the heartbeat connection wait for the next try.
            Err(Error::Busy(info)) if !info.server_full => {
                let freed = self
                    .target
                    .bounded_db(
                        "releasing the advisory lock",
                        lock::unlock_quietly(&mut conn, self.key),
                    )
                    .await;
                if matches!(freed, Ok(true)) {
                    self.candidate.put((conn, pid)).await;
                    self.kept_aux.put(aux).await;
                }
                return Err(Error::Busy(info));
            }
            other => other?,
        };
        let heartbeat = Arc::new(PgHeartbeat {
            target: self.target.clone(),
            conn: dbwarden_core::kept::Kept::holding(aux),
            lock_table: self.tables.lock.clone(),
            namespace: self.namespace.to_string(),
            key: self.key,
            token,
            session_pid: pid,
        });
        let held = PgHeld {
            store: Some(PgStore {
                conn,
                tables: self.tables.clone(),
                namespace: self.namespace.to_string(),
                pid,
                ms,
                touched: false,
                sqlx: Default::default(),
                pooled: false,
                tx_bounds: String::new(),
                bounds_set: None,
                tx: None,
            }),
            keep: self.candidate.clone(),
            keep_aux: self.kept_aux.clone(),
            heartbeat: heartbeat.clone(),
        };
        Ok(Grant::new(token, previous, heartbeat, held).broke(why, None))
    }
}

#[async_trait]
impl dbwarden_core::adopt::OtherTools for PgLock {
    async fn other_tools(&self) -> Result<Vec<dbwarden_core::adopt::ForeignHistory>, Error> {
        // On the kept waiting session when there is one (`migrate` asks right after its look):
        // a new connection costs the server a process, and a full server refuses it.
        let kept = self.candidate.take().await;
        if let Some((mut conn, pid)) = kept {
            let read = self
                .target
                .bounded(
                    "reading other tools' history",
                    other_tools::read_tools(&mut conn, &self.tables.schema, &Tool::ALL),
                )
                .await;
            match read {
                Ok(theirs) => {
                    self.candidate.put((conn, pid)).await;
                    return Ok(theirs);
                }
                // The kept session may have ended meanwhile: a fresh one below.
                Err(e) => tracing::debug!("reading other tools' history on the kept session: {e}"),
            }
        }
        let mut conn = self.target.connect().await?;
        other_tools::read_tools(&mut conn, &self.tables.schema, &Tool::ALL).await
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
                        let (got, pid) = shared::attempt_with_pid(&mut *conn, self.key)
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
        let h = shared::holders(&mut conn, self.key)
            .await
            .map_err(|e| self.target.db_err(e))?;
        let _ = sqlx::Connection::close(conn).await;
        Ok(h)
    }
}

#[async_trait]
impl WakeUp for PgLock {
    async fn wait_for_release(&self, max: Duration) {
        let max = max.min(SILENT_DEATH_POLL);
        let mut listening = self.listening.lock().await;
        match &mut *listening {
            Listening::On(w) => w.wait_past(self.seen.load(Ordering::SeqCst), max).await,
            Listening::NotYet if !self.room_to_listen().await => {
                // The LISTEN connection would take one more slot of a (nearly) full server, and
                // sqlx's pool retries a refused connect (53300 is "transient" to it) until
                // connect_timeout: a reconnect storm of its own. Poll on the kept session.
                tracing::debug!(
                    "the server has few free connection slots; polling instead of LISTEN"
                );
                *listening = Listening::Unavailable;
                tokio::time::sleep(max).await;
            }
            Listening::NotYet => match Waiter::start(&self.target, self.namespace.as_str()).await {
                // Then wait as usual. A release before the LISTEN took effect went unheard and
                // costs this one pause; returning at once instead let runners that look, find
                // work and fail the exclusive try (other looks hold the shared lock) loop
                // without a pause, keeping the shared lock so busy that no exclusive try got
                // through.
                Ok(mut w) => {
                    self.seen.store(w.heard(), Ordering::SeqCst);
                    w.wait_past(self.seen.load(Ordering::SeqCst), max).await;
                    *listening = Listening::On(w);
                }
                Err(e) => {
                    tracing::info!("cannot LISTEN for releases ({e}); polling instead");
                    *listening = Listening::Unavailable;
                }
            },
            Listening::Unavailable => tokio::time::sleep(max).await,
        }
    }
}

#[async_trait]
impl MigrationLock for PgLock {
    fn wake_up(&self) -> Option<&dyn WakeUp> {
        Some(self)
    }

    fn shared(&self) -> Option<&dyn SharedLock> {
        Some(self)
    }

    fn engine(&self) -> &'static str {
        "postgres"
    }

    fn grade(&self) -> Grade {
        Grade::A
    }

    fn namespace(&self) -> &Namespace {
        &self.namespace
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

    fn reach(&self) -> Option<dbwarden_core::Reach> {
        Some(dbwarden_core::Reach {
            target: self.target.shown.clone(),
            connect_timeout: self.target.connect_timeout,
        })
    }

    fn dialect(&self) -> Option<dbwarden_core::migration::Dialect> {
        Some(dbwarden_core::migration::Dialect::Postgres)
    }

    fn other_tools(&self) -> Option<&dyn dbwarden_core::adopt::OtherTools> {
        Some(self)
    }
}
