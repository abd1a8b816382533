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

mod acquire;
mod beat;
mod held;
mod journal;
mod lease;
pub mod lock;
mod names;
mod reads;
mod sqlx_compat;
mod status;
pub mod store;
mod store_lease;
mod table_locks;
mod tables;
mod url;

use std::time::Duration;

use async_trait::async_trait;
use dbwarden_core::config::Settings;
use dbwarden_core::migration::Dialect;
use dbwarden_core::unlock::{Broke, Sighting};
use dbwarden_core::{
    Attempt, AuditRecord, Error, Grade, HistoryRow, HolderInfo, MigrationLock, Namespace,
    Observation, SnapshotRead, WakeUp,
};

use crate::acquire::Holder;
use crate::lock::{Endpoint, GetLock, lock_name};

pub use crate::url::options_from_url;

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

/// How long an attempt that `KILL`ed a dead holder's session waits for the server to end it
/// (a killed statement may have to roll back first) before it reports the lock busy.
const KILLED_SESSION_END: Duration = Duration::from_secs(2);

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
}

#[async_trait]
impl WakeUp for MySqlLock {
    /// Block in `GET_LOCK` for at most a second at a time, so a release hands the lock over at
    /// once; the session keeps the lock if it got it, and the next `try_acquire` claims it.
    /// While the holder is one whose liveness lock can be checked, the block is cut into
    /// [`SILENT_DEATH_POLL`] slices and a dead holder is taken over between them.
    ///
    /// [`SILENT_DEATH_POLL`]: dbwarden_core::wait::SILENT_DEATH_POLL
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
    fn identity(&self) -> dbwarden_core::Identity<'_> {
        dbwarden_core::Identity {
            engine: "mysql",
            grade: match self.known_lease() {
                true => Grade::C,
                false => Grade::A,
            },
            namespace: &self.namespace,
            reach: Some(dbwarden_core::Reach {
                target: self.endpoint.shown.clone(),
                connect_timeout: self.endpoint.connect_timeout,
            }),
        }
    }

    fn wake_up(&self) -> Option<&dyn WakeUp> {
        // The lease has no named lock to block in: a waiter polls.
        (!self.known_lease()).then_some(self as _)
    }

    fn snapshot(&self) -> Option<&dyn SnapshotRead> {
        Some(self)
    }

    fn max_poll_interval(&self) -> Duration {
        match self.known_lease() {
            true => lease::POLL,
            false => Duration::from_secs(1),
        }
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
    fn history_table_is_validated() {
        let lock = MySqlLock::from_url("mysql://root@h/app", Namespace::default()).unwrap();
        assert!(lock.history_table("x`; DROP TABLE y").is_err());
        let lock = MySqlLock::from_url("mysql://root@h/app", Namespace::default()).unwrap();
        assert!(lock.history_table("schema_history").is_ok());
    }
}
