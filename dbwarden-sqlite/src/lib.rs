//! dbwarden-sqlite: the SQLite engine. Between runners, a flock'd sidecar file (grade B, see
//! [`lock`]); within the database, one `BEGIN IMMEDIATE` transaction per migration together with
//! its history row (see [`store`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), dbwarden_core::Error> {
//! use dbwarden_core::{HolderInfo, HeartbeatConfig, Namespace, Wait, wait::acquire};
//! let lock = dbwarden_sqlite::SqliteLock::from_url("sqlite://app.db", Namespace::default())?;
//! let lease = acquire(&lock, &HolderInfo::current(None, "demo"), Wait::No, HeartbeatConfig::default()).await?;
//! lease.release().await
//! # }
//! ```
#![forbid(unsafe_code)]

mod claim;
pub mod lock;
pub mod shared;
pub mod store;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use dbwarden_core::error::BusyInfo;
use dbwarden_core::takeover::{self, Decision, Liveness, Probe, Refusal};
use dbwarden_core::unlock::{Broke, Sighting};
use dbwarden_core::{
    Attempt, AuditRecord, BrokenLock, Error, Grade, Grant, HistoryRow, HolderInfo, MigrationLock,
    Namespace, Observation, SharedLock,
};
use dbwarden_sql::binds;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{ConnectOptions, Connection};

use crate::claim::{SidecarHeartbeat, SqliteHeld, busy};
use crate::lock::{Sidecar, TryLock, pid_alive};
use crate::store::{create_tables, db_err};

/// This engine in the registry (`dbwarden_core::registry`): its name, URL schemes and factory.
pub static ENGINE: dbwarden_core::registry::Engine = dbwarden_core::registry::Engine {
    name: "sqlite",
    schemes: &["sqlite"],
    open: from_settings,
    lease_lock: false,
};

/// The lock for `settings.database_url` and `settings.namespace`, as every engine crate offers
/// it (the CLI and the benchmarks build it this way). Validates without opening anything.
pub fn from_settings(
    settings: &dbwarden_core::config::Settings,
) -> Result<Box<dyn MigrationLock>, Error> {
    let lock = SqliteLock::from_url(&settings.database_url, settings.namespace.clone())?
        .history_table(&settings.history_table)?
        .busy_timeout(settings.busy_timeout);
    Ok(Box::new(lock))
}

/// A lock (and the migration tables) for one namespace of one SQLite database file.
#[derive(Debug, Clone)]
pub struct SqliteLock {
    db_path: PathBuf,
    lock_path: PathBuf,
    spool_path: PathBuf,
    namespace: Namespace,
    history_table: String,
    busy_timeout: Duration,
}

/// Parse `sqlite://path`, `sqlite:path` or `sqlite:///abs/path` into a file path.
pub fn path_from_url(url: &str) -> Result<PathBuf, Error> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| Error::usage("not a sqlite URL: use sqlite://path/to/file.db"))?;
    let path = rest.split('?').next().unwrap_or_default();
    if path.is_empty() {
        return Err(Error::usage(format!(
            "invalid database URL {url:?}: no file name; use e.g. sqlite://dbwarden.db"
        )));
    }
    if path == ":memory:" || path.starts_with(":memory:") {
        return Err(Error::usage(
            "an in-memory SQLite database cannot be shared between runners: use a file, e.g. sqlite://dbwarden.db",
        ));
    }
    Ok(PathBuf::from(path))
}

impl SqliteLock {
    /// The lock for `url` (`sqlite://file.db`) and `namespace`. Nothing is opened yet.
    pub fn from_url(url: &str, namespace: Namespace) -> Result<Self, Error> {
        let db_path = path_from_url(url)?;
        if db_path.is_dir() {
            return Err(Error::usage(format!(
                "{} is a directory, not a SQLite database file",
                db_path.display()
            )));
        }
        let mut lock_name = db_path.as_os_str().to_owned();
        if namespace.as_str() != Namespace::DEFAULT {
            lock_name.push(format!(".{namespace}"));
        }
        lock_name.push(".dbwarden-lock");
        let mut spool_name = db_path.as_os_str().to_owned();
        spool_name.push(".dbwarden-audit-spool");
        Ok(SqliteLock {
            lock_path: PathBuf::from(lock_name),
            spool_path: PathBuf::from(spool_name),
            db_path,
            namespace,
            history_table: "dbwarden_migrations".into(),
            busy_timeout: Duration::from_secs(5),
        })
    }

    /// The history table (a validated identifier).
    pub fn history_table(mut self, table: &str) -> Result<Self, Error> {
        dbwarden_core::config::validate_identifier("history_table", table)?;
        self.history_table = table.to_owned();
        Ok(self)
    }

    /// How long a statement waits for SQLite's own write lock (application writers).
    pub fn busy_timeout(mut self, d: Duration) -> Self {
        self.busy_timeout = d;
        self
    }

    fn options(&self) -> SqliteConnectOptions {
        SqliteConnectOptions::new()
            .filename(&self.db_path)
            .busy_timeout(self.busy_timeout)
            .foreign_keys(false)
            .disable_statement_logging()
    }

    /// A connection that waits at most `busy` for SQLite's write lock; `create` makes a file
    /// that is missing.
    async fn open(&self, busy: Duration, create: bool) -> Result<SqliteConnection, Error> {
        let opts = self.options().busy_timeout(busy).create_if_missing(create);
        SqliteConnection::connect_with(&opts).await.map_err(|e| {
            Error::unreachable_from(self.db_path.display().to_string(), e.to_string(), e)
        })
    }

    /// A connection if the database and our tables exist; never creates a file. It is opened
    /// read-write on purpose: after a `kill -9` mid-transaction the file has a hot journal, and
    /// only a writer may roll it back; a read-only reader would see the half-written pages.
    async fn connect_existing(&self) -> Result<Option<SqliteConnection>, Error> {
        if !self.db_path.exists() {
            return Ok(None);
        }
        let busy = self.busy_timeout.min(Duration::from_secs(1));
        let mut conn = self.open(busy, false).await?;
        let has = binds::table_exists(&mut conn, "dbwarden_lock", db_err).await?;
        Ok(has.then_some(conn))
    }
}

#[async_trait]
impl MigrationLock for SqliteLock {
    fn identity(&self) -> dbwarden_core::Identity<'_> {
        dbwarden_core::Identity {
            engine: "sqlite",
            grade: Grade::B,
            namespace: &self.namespace,
            reach: None,
        }
    }

    fn shared(&self) -> Option<&dyn SharedLock> {
        Some(self)
    }

    fn max_poll_interval(&self) -> Duration {
        Duration::from_millis(100)
    }

    async fn try_acquire(&self, holder: &HolderInfo) -> Result<Attempt, Error> {
        let sidecar = match Sidecar::try_lock(&self.lock_path)? {
            TryLock::Held(body) => {
                let readers = shared::list(&self.lock_path);
                if let Some(first) = readers.first() {
                    return Ok(Attempt::Busy(BusyInfo {
                        age: (Utc::now() - first.started_at).to_std().ok(),
                        fencing_token: None,
                        note: Some(format!(
                            "shared by {} holder(s) (run --shared)",
                            readers.len()
                        )),
                        holder: Some(first.clone()),
                        server_full: false,
                    }));
                }
                return Ok(Attempt::Busy(busy(body.as_ref())));
            }
            TryLock::Locked(s) => s,
        };
        // The kernel freed the flock. What that says of the body's writer -- gone from this
        // host, alive under a reused pid, or on another host whose flock we cannot see -- is
        // reported to core's takeover judge, which decides.
        let mut replaced = None;
        if let Some(prev) = sidecar
            .found_body()
            .filter(|p| p.execution_id != holder.execution_id)
        {
            let process = if prev.host != holder.host {
                Liveness::ForeignHost
            } else if prev.pid != holder.pid && pid_alive(prev.pid) {
                Liveness::Alive
            } else {
                Liveness::Dead
            };
            let decision = takeover::judge(&Probe {
                now: Utc::now(),
                last_seen: prev.heartbeat_at,
                started: Some(prev.start_time),
                ttl: prev
                    .lock_ttl_ms
                    .map_or(self.default_ttl(), Duration::from_millis),
                resolution: Duration::from_millis(1),
                process,
            });
            if decision == Decision::Refuse(Refusal::ForeignHost) {
                sidecar.leave_file();
                return Ok(Attempt::Busy(prev.busy(Some(format!(
                    "the lock file {} was written by host {}, whose lock this host cannot see; a foreign host's lock is never removed automatically: check that host, then run `dbwarden unlock`",
                    self.lock_path.display(),
                    prev.host
                )))));
            }
            if !matches!(decision, Decision::Break { .. }) {
                sidecar.leave_file();
                return Ok(Attempt::Busy(prev.busy(Some(format!(
                    "pid {} named in {} is alive but does not hold the lock (pid reused, or a filesystem without working flock); check it, then run `dbwarden unlock`",
                    prev.pid,
                    self.lock_path.display()
                )))));
            }
            let why = takeover::Freed::ProcessDead {
                pid: prev.pid,
                last_heartbeat: prev.heartbeat_at,
                lock: "flock",
            };
            replaced = Some(BrokenLock {
                why,
                holder: Some(prev.holder()),
            });
        }
        // A database write-locked by someone else is `Error::Busy`: the wait policy retries it.
        let (store, token, previous) = match self.claim(&sidecar, holder).await {
            Ok(claimed) => claimed,
            Err(e) => {
                // The lock file is gone with this attempt, and with it whom we replaced: the
                // row goes to the spool, which the next holder moves into the table.
                if let Some(r) = replaced {
                    let rec = r.record(&self.namespace, holder, None);
                    if let Err(e) = lock::spool::append(&self.spool_path, &rec) {
                        tracing::warn!("audit record lost: {e}");
                    }
                }
                return Err(e);
            }
        };
        let sidecar = Arc::new(sidecar);
        let beat = SidecarHeartbeat(sidecar.clone());
        let held = SqliteHeld {
            sidecar,
            spool_path: self.spool_path.clone(),
            store: Some(store),
            released: false,
        };
        let mut grant = Grant::new(token, previous, beat, held);
        grant.broken = replaced.map(Box::new);
        Ok(Attempt::Acquired(grant))
    }

    async fn observe(&self) -> Result<Observation, Error> {
        if let Some(dir) = self.db_path.parent().filter(|d| !d.as_os_str().is_empty())
            && matches!(std::fs::metadata(dir), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
        {
            // Not a free lock: there is no database there, nor could one be created.
            return Err(Error::usage(format!(
                "no SQLite database at {}: the directory {} does not exist",
                self.db_path.display(),
                dir.display()
            )));
        }
        let view = lock::observe(&self.lock_path)?;
        // The holder's migration may keep the database write-locked (a paused holder, for a
        // long time): then the sidecar alone tells who holds it and how fresh its heartbeat is.
        let mut notes = Vec::new();
        let status = match self.connect_existing().await {
            Ok(Some(mut conn)) => {
                match store::read_status(&mut conn, self.namespace.as_str()).await {
                    Ok(s) => s,
                    Err(e) if view.held => {
                        notes.push(format!(
                            "the status row could not be read ({e}); the lock file shows the holder"
                        ));
                        None
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(None) => None,
            Err(e) if view.held => {
                notes.push(format!(
                    "the database could not be opened ({e}); the lock file shows the holder"
                ));
                None
            }
            Err(e) => return Err(e),
        };
        if let Some(b) = view.body.as_ref().filter(|_| !view.held)
            && b.host != dbwarden_core::holder::hostname()
        {
            notes.push(format!(
                "the lock file {} was left by host {}; it is never removed automatically",
                self.lock_path.display(),
                b.host
            ));
        }
        if !view.held && !self.db_path.exists() {
            // Nothing migrated here yet, or a wrong path: say which file was looked at.
            notes.push(format!(
                "no database file at {} yet: the first `dbwarden migrate` creates it (is the path right?)",
                self.db_path.display()
            ));
        }
        let held_body = view.body.as_ref().filter(|_| view.held);
        Ok(Observation {
            held: view.held,
            holder: held_body.map(|b| b.holder()),
            fencing_token: status
                .as_ref()
                .map(|s| s.fencing_token)
                .or(held_body.map(|b| b.fencing_token)),
            // Not held: the leftover body of the execution the status row names still has its
            // last heartbeat (the status row only has the acquisition time).
            last_heartbeat_at: held_body
                .or(view.body.as_ref().filter(|b| {
                    status.as_ref().and_then(|s| s.execution_id) == Some(b.execution_id)
                }))
                .map(|b| b.heartbeat_at)
                .or(status.as_ref().and_then(|s| s.last_heartbeat_at)),
            session_id: held_body.map(|b| format!("pid {}", b.pid)),
            status,
            notes,
            ..Observation::new(
                self.engine(),
                self.grade(),
                self.namespace.as_str(),
                Utc::now(),
            )
        })
    }

    async fn sight(&self) -> Result<Sighting, Error> {
        let obs = self.observe().await?;
        let body = lock::observe(&self.lock_path)?.body;
        let active = obs.status.as_ref().is_some_and(|s| s.state.is_active());
        let readers = shared::list(&self.lock_path);
        Ok(Sighting {
            current: body
                .as_ref()
                .map(|b| b.execution_id)
                .or(obs.status.as_ref().and_then(|s| s.execution_id)),
            anything: obs.held || body.is_some() || active || !readers.is_empty(),
            holder: body.as_ref().map(|b| b.holder()),
            session: body.as_ref().map(|b| b.execution_id.to_string()),
            token: obs.status.as_ref().map(|s| s.fencing_token),
            ..Sighting::default()
        })
    }

    async fn break_lock(
        &self,
        seen: &Sighting,
        expected: Option<uuid::Uuid>,
        record: AuditRecord,
    ) -> Result<Broke, Error> {
        if seen.token.is_some() {
            // Fence the holder out now if SQLite lets us write. A live holder's migration may
            // hold the write lock for long; then the next acquirer's token bump fences it out,
            // and the removed lock file makes its heartbeat declare the lease lost.
            let fenced = async {
                let busy = self.busy_timeout.min(Duration::from_secs(2));
                let mut conn = self.open(busy, false).await?;
                let begin = "BEGIN IMMEDIATE";
                dbwarden_sql::transaction(&mut conn, begin, db_err, db_err, async |conn| {
                    // Only the named holder's row (with --holder), and a halt for review stays.
                    sqlx::query(
                        "UPDATE dbwarden_lock SET fencing_token = fencing_token + 1,
                           state = CASE WHEN state = 'NEEDS_REVIEW' THEN state ELSE 'AVAILABLE' END
                         WHERE namespace = ?1 AND (?2 IS NULL OR execution_id = ?2)",
                    )
                    .bind(self.namespace.as_str())
                    .bind(expected.map(|u| u.to_string()))
                    .execute(&mut *conn)
                    .await
                    .map_err(db_err)?;
                    binds::insert_audit(conn, &record, db_err).await
                })
                .await?;
                let _ = conn.close().await;
                Ok::<(), Error>(())
            }
            .await;
            if let Err(e) = fenced {
                tracing::info!("could not fence in the database now ({e}); the next holder will");
                lock::spool::append(&self.spool_path, &record)?;
            }
        } else {
            lock::spool::append(&self.spool_path, &record)?;
        }
        // Re-read right before unlinking: with --holder, never remove a newer holder's file.
        let still_same = lock::observe(&self.lock_path)?
            .body
            .map(|b| b.execution_id.to_string())
            == seen.session;
        if still_same {
            match std::fs::remove_file(&self.lock_path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Error::usage(format!(
                        "cannot remove {}: {e}",
                        self.lock_path.display()
                    )));
                }
            }
        }
        // Shared holders (run --shared) are removed too; their heartbeat sees it and stops them.
        if expected.is_none() {
            shared::remove_all(&self.lock_path);
        }
        Ok(Broke::Unlocked)
    }

    async fn audit(&self, record: &AuditRecord) -> Result<(), Error> {
        if !self.db_path.exists() {
            return Ok(());
        }
        // A holder's migration may hold SQLite's write lock for minutes: do not wait for it.
        // What cannot be written now goes to the spool, which the next holder moves in.
        let quick = async {
            let mut conn = self.open(Duration::from_millis(200), false).await?;
            create_tables(&mut conn, &self.history_table).await?;
            binds::insert_audit(&mut conn, record, db_err).await?;
            let _ = conn.close().await;
            Ok::<(), Error>(())
        };
        if quick.await.is_err() {
            lock::spool::append(&self.spool_path, record)?;
        }
        Ok(())
    }

    async fn read_history(&self) -> Result<Vec<HistoryRow>, Error> {
        let Some(mut conn) = self.connect_existing().await? else {
            return Ok(Vec::new());
        };
        if !binds::table_exists(&mut conn, &self.history_table, db_err).await? {
            return Ok(Vec::new());
        }
        binds::read_history(&mut conn, &self.history_table, db_err).await
    }

    fn dialect(&self) -> Option<dbwarden_core::migration::Dialect> {
        Some(dbwarden_core::migration::Dialect::Sqlite)
    }

    fn other_tools(&self) -> Option<&dyn dbwarden_core::adopt::OtherTools> {
        Some(self)
    }
}
