//! dbwarden-mysql: the MySQL / MariaDB engine. Between runners, the server's named lock
//! `GET_LOCK` on one dedicated connection (grade A, see [`lock`]); on a Galera node, where that
//! lock is node-local, a lease in the status row settled by certification (grade C, see
//! `lease.rs`); within the database, the status, history and audit tables with a per-statement
//! journal, because DDL autocommits (see [`store`]). Tested on MariaDB 10.11 (one server, and
//! three Galera nodes); written to MySQL 8's SQL.
//!
//! ```no_run
//! # async fn demo() -> Result<(), dbwarden_core::Error> {
//! use dbwarden_core::{HolderInfo, HeartbeatConfig, Namespace, Wait, wait::acquire};
//! let lock = dbwarden_mysql::MySqlLock::from_url("mysql://app:secret@db:3306/app", Namespace::default())?;
//! let lease = acquire(&lock, &HolderInfo::current(None, "demo"), Wait::No, HeartbeatConfig::default()).await?;
//! lease.release().await
//! # }
//! ```
#![forbid(unsafe_code)]

mod held;
mod lease;
pub mod lock;
mod status;
pub mod store;
mod table_locks;
mod tables;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dbwarden_core::adopt::Tool;
use dbwarden_core::config::Settings;
use dbwarden_core::error::BusyInfo;
use dbwarden_core::migration::Dialect;
use dbwarden_core::takeover::{Decision, Freed, Liveness, Probe, judge};
use dbwarden_core::unlock::{Broke, Sighting};
use dbwarden_core::wait::SILENT_DEATH_POLL;
use dbwarden_core::{
    Attempt, AuditRecord, Error, Grade, Grant, HistoryRow, HolderInfo, MigrationLock, Namespace,
    Observation, Snapshot, SnapshotRead, WakeUp,
};
use dbwarden_sql::binds;
use sqlx::ConnectOptions;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};

use crate::held::MySqlHeld;
use crate::lock::{Endpoint, GetLock, LockBeat, Session, bounded, get_lock, lock_name};
use crate::store::MySqlStore;
use crate::tables::{bump_and_claim, create_tables};

/// This engine in the registry (`dbwarden_core::registry`): its name, URL schemes and factory.
pub static ENGINE: dbwarden_core::registry::Engine = dbwarden_core::registry::Engine {
    name: "mysql",
    schemes: &["mysql", "mariadb"],
    open: from_settings,
    lease_lock: false,
};

/// The lock for `settings.database_url` and `settings.namespace`. Validates everything it can
/// without connecting; connections are made when the lock is first used.
pub fn from_settings(settings: &Settings) -> Result<Box<dyn MigrationLock>, Error> {
    let lock = MySqlLock::from_url(&settings.database_url, settings.namespace.clone())?
        .session(settings.mysql_session)
        .history_table(&settings.history_table)?
        .connect_timeout(settings.connect_timeout)
        .statement_timeout(settings.statement_timeout)
        .inside_outer_lease(settings.outer_lease);
    Ok(Box::new(lock))
}

/// Parse `mysql://` or `mariadb://user:password@host:port/database?...` into connect options
/// and the database name. The session is set up as sqlx sets it (`PIPES_AS_CONCAT`,
/// `NO_ENGINE_SUBSTITUTION`, `time_zone = '+00:00'`), so a folder sqlx-cli applied gives the
/// same schema here; [`MySqlLock::session`] can leave the server's own instead.
pub fn options_from_url(url: &str) -> Result<(MySqlConnectOptions, String), Error> {
    // Without `://` there is no authority to redact a password from: show no URL at all.
    let shown = if url.contains("://") {
        dbwarden_core::url::redact(url)
    } else {
        "<not shown>".to_owned()
    };
    let usage = |why: &str| {
        Error::usage(format!(
            "invalid database URL {shown:?}: {why}; use mysql://user:password@host:3306/database (or mariadb://...)"
        ))
    };
    let rest = match dbwarden_core::url::scheme(url).as_deref() {
        Some(s @ ("mysql" | "mariadb")) => &url[s.len()..],
        _ => return Err(usage("not a mysql:// or mariadb:// URL")),
    };
    if !rest.starts_with("://") {
        return Err(usage("expected :// after the scheme"));
    }
    // sqlx knows only mysql://; the two schemes mean the same server protocol.
    let options = MySqlConnectOptions::from_str(&format!("mysql{rest}"))
        .map_err(|e| usage(&dbwarden_core::error::one_line(&e.to_string())))?;
    let database = options
        .get_database()
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| usage("it names no database (the lock and its tables live in one)"))?;
    if database.chars().count() > 64 {
        return Err(usage("the database name is longer than 64 characters"));
    }
    let options = options.disable_statement_logging();
    Ok((options, database))
}

/// How long an attempt that `KILL`ed a dead holder's session waits for the server to end it
/// (a killed statement may have to roll back first) before it reports the lock busy.
const KILLED_SESSION_END: Duration = Duration::from_secs(2);

/// What [`MySqlLock::check_holder`] found.
enum Holder {
    /// Its liveness session is open: the process lives (or is paused).
    Alive,
    /// Its process was gone; its lock session has been `KILL`ed.
    Killed,
    /// Someone else holds the lock now, the session ended on its own, or it cannot be killed.
    Changed,
}

/// A lock (and the migration tables) for one namespace of one MySQL / MariaDB database.
pub struct MySqlLock {
    endpoint: Endpoint,
    namespace: Namespace,
    lock_name: String,
    history_table: String,
    /// A waiter's session, kept between attempts; it may already hold the lock when a blocking
    /// `GET_LOCK` in [`WakeUp::wait_for_release`] succeeded.
    waiting: lock::KeptSession,
    /// The liveness session kept with a session a clean release left in `waiting`.
    kept_alive: lock::KeptAlive,
    /// The server refused to `KILL` a dead holder's session for this user: do not ask again.
    kill_denied: std::sync::atomic::AtomicBool,
    /// The status table has the holder-settings columns (checked once per lock object).
    status_upgraded: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for MySqlLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlLock")
            .field("url", &self.endpoint.shown)
            .field("namespace", &self.namespace)
            .field("lock_name", &self.lock_name)
            .finish()
    }
}

impl MySqlLock {
    /// The lock for `url` and `namespace`. Nothing is connected yet.
    pub fn from_url(url: &str, namespace: Namespace) -> Result<Self, Error> {
        let (options, database) = options_from_url(url)?;
        Ok(MySqlLock {
            endpoint: Endpoint {
                options,
                shown: dbwarden_core::url::redact(url),
                connect_timeout: Duration::from_secs(10),
                statement_timeout: Duration::from_secs(30),
                outer_lease: false,
                galera: Default::default(),
            },
            lock_name: lock_name(&database, namespace.as_str()),
            namespace,
            history_table: "dbwarden_migrations".into(),
            waiting: lock::KeptSession::default(),
            kept_alive: lock::KeptAlive::default(),
            kill_denied: std::sync::atomic::AtomicBool::new(false),
            status_upgraded: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The `sql_mode` and `time_zone` the migrations run with (see
    /// [`dbwarden_core::config::MySqlSession`]); sqlx's by default.
    pub fn session(mut self, session: dbwarden_core::config::MySqlSession) -> Self {
        if session == dbwarden_core::config::MySqlSession::Server {
            self.endpoint.options = self
                .endpoint
                .options
                .clone()
                .pipes_as_concat(false)
                .no_engine_substitution(false)
                .timezone(None);
        }
        self
    }

    /// The history table (a validated identifier).
    pub fn history_table(mut self, table: &str) -> Result<Self, Error> {
        dbwarden_core::config::validate_identifier("history_table", table)?;
        self.history_table = table.to_owned();
        Ok(self)
    }

    /// Bound on each connection set-up (TCP and authentication together).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.endpoint.connect_timeout = d;
        self
    }

    /// Bound on each lock operation and bookkeeping write (never on a migration's statements).
    pub fn statement_timeout(mut self, d: Duration) -> Self {
        self.endpoint.statement_timeout = d;
        self
    }

    /// Every run is held inside a lease all runners share (`--lock-url`): on a Galera node the
    /// node-local `GET_LOCK` is then the inner lock; otherwise the lock there is the lease in
    /// the status row.
    pub fn inside_outer_lease(mut self, yes: bool) -> Self {
        self.endpoint.outer_lease = yes;
        self
    }

    /// The server-wide name passed to `GET_LOCK`.
    pub fn lock_name(&self) -> &str {
        &self.lock_name
    }

    /// The lock is the lease in the status row ([`lease`]): the server is a Galera node, and
    /// no outer lease holds the run. Known after the first session; otherwise one is opened
    /// to ask, and kept for the named lock's first attempt.
    async fn on_lease(&self) -> Result<bool, Error> {
        if self.endpoint.outer_lease {
            return Ok(false);
        }
        if let Some(galera) = self.endpoint.galera.known() {
            return Ok(galera);
        }
        let s = self.endpoint.lock_session().await?;
        let galera = self.endpoint.galera.known() == Some(true);
        if galera {
            let _ = sqlx::Connection::close(s.conn).await;
        } else if let Some(s) = self.waiting.offer(s).await {
            let _ = sqlx::Connection::close(s.conn).await;
        }
        Ok(galera)
    }

    /// [`Self::on_lease`] for a command that only reads or breaks the lock (`lock-status`,
    /// `unlock`): asks without the checks a run makes (a replica may be looked at).
    async fn read_on_lease(&self) -> Result<bool, Error> {
        if self.endpoint.outer_lease {
            return Ok(false);
        }
        self.endpoint.galera_node().await
    }

    /// Known to be on the lease (see [`Self::on_lease`]), without asking the server.
    fn known_lease(&self) -> bool {
        !self.endpoint.outer_lease && self.endpoint.galera.known() == Some(true)
    }

    /// `GET_LOCK(name, 0)`: one try that never waits.
    async fn get_lock_now(&self, s: &mut Session) -> Result<GetLock, Error> {
        let got = bounded(self.endpoint.statement_timeout, "GET_LOCK", async {
            get_lock(&mut s.conn, &self.lock_name, Duration::ZERO)
                .await
                .map_err(crate::tables::db_err)
        })
        .await?;
        s.holds = got == GetLock::Acquired;
        Ok(got)
    }

    /// A waiter's blocking `GET_LOCK` until `deadline`: `Some(true)` once `s` holds the lock,
    /// `Some(false)` at the deadline, `None` when the session failed (NULL, error, no answer).
    async fn block_in_get_lock(
        &self,
        s: &mut Session,
        deadline: tokio::time::Instant,
    ) -> Option<bool> {
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let slice = if s.suspect.is_some() {
                left.min(SILENT_DEATH_POLL)
            } else {
                left
            };
            if slice.is_zero() {
                return Some(false);
            }
            let limit = slice + self.endpoint.statement_timeout;
            match tokio::time::timeout(limit, get_lock(&mut s.conn, &self.lock_name, slice)).await {
                Ok(Ok(GetLock::Acquired)) => {
                    s.holds = true;
                    return Some(true);
                }
                Ok(Ok(GetLock::Busy)) => {}
                _ => return None,
            }
            if let Some(x) = s.suspect {
                match self.check_holder(&mut s.conn, x).await.ok()? {
                    Holder::Alive => {}
                    Holder::Changed => s.suspect = None,
                    Holder::Killed => {
                        s.suspect = None;
                        s.killed = Some(x);
                    }
                }
            }
        }
    }

    /// Whether the holder whose lock session is `x` still lives, and if its process is gone
    /// while the server still runs that session's statement, `KILL` the session: the server
    /// ends it and frees the lock for the next `GET_LOCK` of `conn`.
    async fn check_holder(&self, conn: &mut MySqlConnection, x: u64) -> Result<Holder, Error> {
        let limit = self.endpoint.statement_timeout;
        let (owner, alive_free) = bounded(limit, "checking the holder", async {
            sqlx::query_as::<_, (Option<i64>, Option<i64>)>(
                "SELECT CAST(IS_USED_LOCK(?) AS SIGNED), CAST(IS_FREE_LOCK(?) AS SIGNED)",
            )
            .bind(&self.lock_name)
            .bind(lock::alive_name(x))
            .fetch_one(&mut *conn)
            .await
            .map_err(crate::tables::db_err)
        })
        .await?;
        if owner.map(|o| o as u64) != Some(x) {
            return Ok(Holder::Changed);
        }
        // The fact: the liveness lock is free exactly when the holder's process is gone. Core
        // decides what that means.
        let process = match alive_free {
            Some(1) => Liveness::Dead,
            _ => Liveness::Alive,
        };
        if !matches!(
            judge(&Probe::session_holder(process)),
            Decision::Break { .. }
        ) {
            return Ok(Holder::Alive);
        }
        if self.kill_denied.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(Holder::Changed);
        }
        tracing::warn!(
            connection = x,
            "the lock holder's process is gone (its liveness session ended) but the server still runs its session's statement: killing connection {x} to take over"
        );
        let kill = tokio::time::timeout(limit, lock::kill_session(conn, x)).await;
        Ok(match kill {
            Ok(Ok(true)) => Holder::Killed,
            // It ended on its own meanwhile.
            Ok(Ok(false)) => Holder::Changed,
            Ok(Err(e)) => {
                let why = if lock::is_kill_denied(&e) {
                    self.kill_denied
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    "this user may not KILL it (that needs the same user, or CONNECTION_ADMIN or SUPER)".to_owned()
                } else {
                    format!("KILL failed: {e}")
                };
                tracing::warn!(
                    connection = x,
                    "the dead holder's session (connection {x}) keeps the lock until its statement ends: {why}"
                );
                Holder::Changed
            }
            Err(_) => {
                return Err(Error::database(format!(
                    "KILL {x}: the server did not answer within {} (statement_timeout)",
                    dbwarden_core::duration::human(limit)
                )));
            }
        })
    }

    async fn fresh_attempt(&self) -> Result<(Session, GetLock), Error> {
        let mut s = self.endpoint.lock_session().await?;
        let got = self.get_lock_now(&mut s).await?;
        Ok((s, got))
    }

    /// We hold the named lock on `s`: create the tables, bump the token, write the status row.
    async fn claim(&self, mut s: Session, holder: &HolderInfo) -> Result<Attempt, Error> {
        let ns = self.namespace.as_str();
        let limit = self.endpoint.statement_timeout;
        // The liveness lock is taken before the status row names this session: a waiter that
        // reads the row may rely on it. Its connection is opened while the tables are checked.
        let kept = self.kept_alive.take().await;
        let (kept, stale) = match kept {
            Some(a) if a.for_session == s.id => (Some(a), None),
            other => (None, other),
        };
        if let Some(a) = stale {
            let _ = sqlx::Connection::close(a.conn).await;
        }
        let lock_id = s.id;
        let (alive, tables) = tokio::join!(
            async {
                match kept {
                    Some(a) => match lock::still_alive(a, lock_id).await {
                        Ok(a) => Ok(Some(a)),
                        Err(gone) => {
                            // Ended, cut or stuck: make sure it holds nothing, then anew.
                            if let Ok(mut c) = self.endpoint.connect().await {
                                let _ =
                                    tokio::time::timeout(limit, lock::kill_session(&mut c, gone))
                                        .await;
                                let _ = sqlx::Connection::close(c).await;
                            }
                            self.endpoint.alive_session(lock_id).await
                        }
                    },
                    None => self.endpoint.alive_session(lock_id).await,
                }
            },
            bounded(
                limit,
                "creating the tables",
                create_tables(&mut s.conn, &self.history_table, &self.status_upgraded)
            ),
        );
        let settings = tables?;
        // On every early return `s` is dropped: its session ends and frees the lock. A full
        // server is `Error::Busy`, as for the lock session itself.
        let Some(alive) = alive? else {
            return Ok(Attempt::Busy(BusyInfo {
                note: Some(format!(
                    "another session holds {:?}, the liveness lock of this run's lock session",
                    lock::alive_name(s.id)
                )),
                ..BusyInfo::default()
            }));
        };
        let killed = s.killed;
        let (token, previous) = bounded(limit, "claiming the lock", async {
            bump_and_claim(&mut s.conn, ns, holder, s.id, settings).await
        })
        .await?;
        // An active row left by a holder whose session is gone (the server freed its lock, or
        // this run KILLed it).
        let why = previous.as_ref().filter(|p| p.state.is_active()).map(|p| {
            let conn = p.db_connection_id.as_deref().unwrap_or("?");
            let session = format!("connection {conn}");
            match killed {
                Some(k) if k.to_string() == conn => Freed::SessionKilled {
                    session,
                    state: p.state,
                },
                _ => Freed::SessionEnded {
                    session,
                    lock: "lock",
                    state: p.state,
                },
            }
        });
        let took_from = previous.as_ref().and_then(status::holder_of);
        let beat = Arc::new(LockBeat {
            endpoint: self.endpoint.clone(),
            lock_name: self.lock_name.clone(),
            lock_conn_id: s.id,
            alive_conn_id: alive.id,
            namespace: ns.to_owned(),
            token,
            conn: Default::default(),
        });
        let store = MySqlStore::new(s.conn, s.id, self, None);
        let held = MySqlHeld {
            store: Some(store),
            alive: Some(alive),
            keep: self.waiting.clone(),
            keep_alive: self.kept_alive.clone(),
            beat: beat.clone(),
        };
        let grant = Grant::new(token, previous, beat, held).broke(why, took_from);
        Ok(Attempt::Acquired(grant))
    }
}

#[async_trait]
impl dbwarden_core::adopt::OtherTools for MySqlLock {
    async fn other_tools(&self) -> Result<Vec<dbwarden_core::adopt::ForeignHistory>, Error> {
        // On the kept waiting session when there is one (`migrate` asks right after its look):
        // a full server refuses a new connection.
        let kept = self.waiting.take().await;
        if let Some(mut s) = kept {
            let read = lock::bounded(
                self.endpoint.statement_timeout,
                "reading other tools' history",
                binds::read_tools(&mut s.conn, &Tool::ALL, tables::db_err),
            )
            .await;
            match read {
                Ok(theirs) => {
                    self.waiting.put(s).await;
                    return Ok(theirs);
                }
                // The kept session may have ended meanwhile: a fresh one below (dropping this
                // one frees any lock it took while waiting).
                Err(e) => tracing::debug!("reading other tools' history on the kept session: {e}"),
            }
        }
        (self.endpoint)
            .once("reading other tools' history", async |c| {
                binds::read_tools(c, &Tool::ALL, tables::db_err).await
            })
            .await
    }
}

#[async_trait]
impl SnapshotRead for MySqlLock {
    /// On the kept waiting session (or a new one, kept afterwards for the exclusive try), so a
    /// look costs no connection of its own. A lock the session took while waiting is kept
    /// through the look: if something is pending, the next `try_acquire` claims it on this
    /// session (given back, another blocked waiter would take it to look, and so on, with
    /// nobody claiming); if nothing is, [`MigrationLock::stop_waiting`] gives it back.
    async fn read_snapshot(&self) -> Result<Snapshot, Error> {
        let kept = self.waiting.take().await;
        let was_kept = kept.is_some();
        let mut s = match kept {
            Some(s) => s,
            None => self.endpoint.lock_session().await?,
        };
        let read = async |s: &mut Session| {
            bounded(
                self.endpoint.statement_timeout,
                "reading the applied set",
                tables::read_snapshot(&mut s.conn, self.namespace.as_str(), &self.history_table),
            )
            .await
        };
        let mut r = read(&mut s).await;
        if r.is_err() && was_kept {
            // A kept session may have ended since (a server restart, a KILL, between a library
            // user's runs): one try on a fresh session, as an attempt does.
            tracing::debug!("the kept session could not read; reading on a fresh one");
            drop(s);
            s = self.endpoint.lock_session().await?;
            r = read(&mut s).await;
        }
        // On an error the session is dropped (it may be mid-transaction), freeing any lock.
        if r.is_ok() {
            self.waiting.put(s).await;
        }
        r
    }
}

#[async_trait]
impl WakeUp for MySqlLock {
    /// Block in `GET_LOCK` for at most a second at a time, so a release hands the lock over at
    /// once; the session keeps the lock if it got it, and the next `try_acquire` claims it.
    /// While the holder is one whose liveness lock can be checked, the block is cut into
    /// [`SILENT_DEATH_POLL`] slices and a dead holder is taken over between them.
    async fn wait_for_release(&self, max: Duration) {
        let t0 = tokio::time::Instant::now();
        let taken = self.waiting.take().await;
        if let Some(mut s) = taken {
            let block = max.min(Duration::from_secs(1));
            if s.holds || block.is_zero() {
                self.waiting.put(s).await;
            } else if let Some(holds) = self.block_in_get_lock(&mut s, t0 + block).await {
                self.waiting.put(s).await;
                if holds {
                    return;
                }
            }
            // Otherwise (NULL, an error or no answer) the session is dropped; the next attempt
            // opens one.
        }
        // A server that rounds fractional timeouts down answers at once: keep the pause anyway.
        let spent = t0.elapsed();
        if spent < max {
            tokio::time::sleep(max - spent).await;
        }
    }
}

#[async_trait]
impl MigrationLock for MySqlLock {
    fn wake_up(&self) -> Option<&dyn WakeUp> {
        // The lease has no named lock to block in: a waiter polls.
        (!self.known_lease()).then_some(self as _)
    }

    fn snapshot(&self) -> Option<&dyn SnapshotRead> {
        Some(self)
    }

    fn engine(&self) -> &'static str {
        "mysql"
    }

    fn grade(&self) -> Grade {
        match self.known_lease() {
            true => Grade::C,
            false => Grade::A,
        }
    }

    fn max_poll_interval(&self) -> Duration {
        match self.known_lease() {
            true => lease::POLL,
            false => Duration::from_secs(1),
        }
    }

    fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    async fn try_acquire(&self, holder: &HolderInfo) -> Result<Attempt, Error> {
        if self.on_lease().await? {
            return lease::try_acquire(self, holder).await;
        }
        let kept = self.waiting.take().await;
        let (mut s, got) = match kept {
            // A blocking GET_LOCK in wait_for_release already took it.
            Some(s) if s.holds => return self.claim(s, holder).await,
            Some(mut s) => match self.get_lock_now(&mut s).await {
                Ok(got) => (s, got),
                // The kept session may have died while we waited: one fresh session.
                Err(_) => self.fresh_attempt().await?,
            },
            None => self.fresh_attempt().await?,
        };
        match got {
            // On any error in claim, `s` is dropped: its session ends and the lock is freed.
            GetLock::Acquired => self.claim(s, holder).await,
            GetLock::Busy => {
                let (info, healthy, suspect) = status::describe_busy(&mut s.conn, self).await;
                if !healthy {
                    return Ok(Attempt::Busy(info));
                }
                s.suspect = suspect.map(|(x, _)| x);
                // The holder's process is gone: take over now rather than after a wait.
                if let Some((x, true)) = suspect
                    && let Ok(Holder::Killed) = self.check_holder(&mut s.conn, x).await
                {
                    s.suspect = None;
                    s.killed = Some(x);
                    let end = tokio::time::Instant::now() + KILLED_SESSION_END;
                    match self.block_in_get_lock(&mut s, end).await {
                        Some(true) => return self.claim(s, holder).await,
                        Some(false) => {}
                        None => return Ok(Attempt::Busy(info)),
                    }
                }
                self.waiting.put(s).await;
                Ok(Attempt::Busy(info))
            }
            GetLock::Failed => Err(Error::database(format!(
                "GET_LOCK({:?}) returned NULL: the server failed to take the lock (session killed, or out of memory); retry",
                self.lock_name
            ))),
        }
    }

    async fn stop_waiting(&self) {
        if let Some(a) = self.kept_alive.take().await {
            let _ = tokio::time::timeout(
                self.endpoint.statement_timeout,
                sqlx::Connection::close(a.conn),
            )
            .await;
        }
        let Some(mut s) = self.waiting.take().await else {
            return;
        };
        if s.holds {
            // Closing the session frees the lock too, should this fail.
            let _ = tokio::time::timeout(
                self.endpoint.statement_timeout,
                lock::release_lock(&mut s.conn, &self.lock_name),
            )
            .await;
        }
        let _ = tokio::time::timeout(
            self.endpoint.statement_timeout,
            sqlx::Connection::close(s.conn),
        )
        .await;
    }

    async fn observe(&self) -> Result<Observation, Error> {
        if self.read_on_lease().await? {
            return lease::observe(self).await;
        }
        status::observe(self).await
    }

    async fn sight(&self) -> Result<Sighting, Error> {
        if self.read_on_lease().await? {
            return lease::sight(self).await;
        }
        status::sight(self).await
    }

    async fn break_lock(
        &self,
        seen: &Sighting,
        _expected: Option<uuid::Uuid>,
        record: AuditRecord,
    ) -> Result<Broke, Error> {
        if self.read_on_lease().await? {
            return lease::break_lock(self, seen, record).await;
        }
        status::break_lock(self, seen, record).await
    }

    async fn audit(&self, record: &AuditRecord) -> Result<(), Error> {
        status::audit(self, record).await
    }

    async fn read_history(&self) -> Result<Vec<HistoryRow>, Error> {
        status::read_history(self).await
    }

    async fn blockers(&self, session: &str) -> Result<Vec<String>, Error> {
        let Ok(id) = session.parse::<u64>() else {
            return Ok(Vec::new());
        };
        self.endpoint
            .once("reading who blocks the migration", async |c| {
                table_locks::blockers(c, id)
                    .await
                    .map_err(crate::tables::db_err)
            })
            .await
    }

    fn reach(&self) -> Option<dbwarden_core::Reach> {
        Some(dbwarden_core::Reach {
            target: self.endpoint.shown.clone(),
            connect_timeout: self.endpoint.connect_timeout,
        })
    }

    fn dialect(&self) -> Option<Dialect> {
        Some(Dialect::MySql)
    }

    fn other_tools(&self) -> Option<&dyn dbwarden_core::adopt::OtherTools> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mysql_and_mariadb_urls_name_a_database() {
        let (o, db) = options_from_url("mysql://root@127.0.0.1:3306/app").unwrap();
        assert_eq!(
            (o.get_host(), o.get_port(), db.as_str()),
            ("127.0.0.1", 3306, "app")
        );
        let (o, db) =
            options_from_url("mariadb://u:p%40ss@db.internal/shop?ssl-mode=disabled").unwrap();
        assert_eq!(
            (o.get_host(), o.get_username(), db.as_str()),
            ("db.internal", "u", "shop")
        );
        let lock = MySqlLock::from_url("MariaDB://root@h/app", Namespace::default()).unwrap();
        assert_eq!(lock.lock_name(), "dbwarden.app.default");
    }

    #[test]
    fn bad_urls_are_usage_errors_without_the_password() {
        for bad in [
            "mysql://root:hunter2@127.0.0.1:3306",
            "mysql://root:hunter2@127.0.0.1:3306/",
            "mysql://root:hunter2@127.0.0.1:notaport/db",
            "mysql:root:hunter2@127.0.0.1/db",
            "postgres://root:hunter2@127.0.0.1/db",
        ] {
            let e = options_from_url(bad).unwrap_err();
            assert_eq!(e.exit_code().code(), 2, "{bad}");
            let msg = e.to_string();
            assert!(!msg.contains("hunter2"), "{msg}");
            assert!(msg.contains("root:***@") || !bad.contains("://"), "{msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
        let e = options_from_url("mysql://root@h/").unwrap_err();
        assert!(e.to_string().contains("names no database"), "{e}");
    }

    #[test]
    fn history_table_is_validated() {
        let lock = MySqlLock::from_url("mysql://root@h/app", Namespace::default()).unwrap();
        assert!(lock.history_table("x`; DROP TABLE y").is_err());
        let lock = MySqlLock::from_url("mysql://root@h/app", Namespace::default()).unwrap();
        assert!(lock.history_table("schema_history").is_ok());
    }
}
