//! An engine that keeps its lock and its tables in this process's memory (`memory://<name>`):
//! what a new engine costs -- a factory, a primitive, a store -- in about 300 lines, and the
//! reference the conformance suite (`conformance.rs`) is checked against. Lock objects opened
//! on the same name share one database, as processes share a server; the lock is freed when
//! its held object is dropped (grade A: "the session" is the held object).
//!
//! Statements are not executed: each one a store runs is appended to [`executed`], so a test
//! can count how often a statement ran.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::Utc;
use dbwarden_core::config::Settings;
use dbwarden_core::error::BusyInfo;
use dbwarden_core::migration::{Dialect, Migration};
use dbwarden_core::unlock::{Broke, Sighting};
use dbwarden_core::{
    Attempt, AuditRecord, Beat, Error, FencingToken, Grade, Grant, Heartbeat, HeldLock, HistoryRow,
    HistoryState, HolderInfo, LockState, LostSignal, MigrationLock, MigrationStore, Namespace,
    Observation, StatusRow,
};
use uuid::Uuid;

/// One in-memory database.
#[derive(Default)]
struct Db {
    /// Namespace → (lease id, holder) of the current holder.
    held: HashMap<String, (u64, HolderInfo)>,
    status: HashMap<String, StatusRow>,
    history: BTreeMap<i64, HistoryRow>,
    audit: Vec<AuditRecord>,
    /// `(version, statement index)` of every statement a store ran, in order.
    executed: Vec<(i64, usize)>,
    next_lease: u64,
    /// Version → what happens to the lease while that migration's `journal_begin` is in
    /// flight (see [`expire_lease_during_begin`]).
    begin_traps: HashMap<i64, BeginTrap>,
}

/// A lease that runs out while a `journal_begin` is in flight.
#[derive(Debug, Clone, Copy)]
struct BeginTrap {
    /// A successor took the lock over meanwhile (its claim bumped the token).
    successor: bool,
}

type Shared = Arc<Mutex<Db>>;

static DATABASES: LazyLock<Mutex<HashMap<String, Shared>>> = LazyLock::new(Default::default);

fn database(name: &str) -> Shared {
    DATABASES
        .lock()
        .unwrap()
        .entry(name.to_owned())
        .or_default()
        .clone()
}

fn lock_db(db: &Shared) -> MutexGuard<'_, Db> {
    db.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every statement the stores of database `name` ran, as `(version, index)`.
pub fn executed(name: &str) -> Vec<(i64, usize)> {
    lock_db(&database(name)).executed.clone()
}

/// The next `journal_begin` of migration `version` in database `name` writes its row, then the
/// holder's lease runs out before the write answers (as a TTL lease does when its server was
/// away): the lock is free, and with `successor` a successor's claim has bumped the token. The
/// write answers only after the holder has seen its lease gone.
pub fn expire_lease_during_begin(name: &str, version: i64, successor: bool) {
    lock_db(&database(name))
        .begin_traps
        .insert(version, BeginTrap { successor });
}

/// The factory: `memory://<name>`.
pub fn from_settings(settings: &Settings) -> Result<Box<dyn MigrationLock>, Error> {
    let name = settings
        .database_url
        .strip_prefix("memory://")
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Error::usage("a memory database URL is memory://<name>"))?;
    Ok(Box::new(MemoryLock {
        db: database(name),
        namespace: settings.namespace.clone(),
    }))
}

pub struct MemoryLock {
    db: Shared,
    namespace: Namespace,
}

impl MemoryLock {
    fn ns(&self) -> String {
        self.namespace.to_string()
    }
}

#[async_trait]
impl MigrationLock for MemoryLock {
    fn identity(&self) -> dbwarden_core::Identity<'_> {
        dbwarden_core::Identity {
            engine: "memory",
            grade: Grade::A,
            namespace: &self.namespace,
            reach: None,
        }
    }

    async fn try_acquire(&self, holder: &HolderInfo) -> Result<Attempt, Error> {
        let ns = self.ns();
        let mut db = lock_db(&self.db);
        if let Some((_, h)) = db.held.get(&ns) {
            let status = db.status.get(&ns);
            return Ok(Attempt::Busy(BusyInfo {
                holder: Some(h.clone()),
                fencing_token: status.map(|s| s.fencing_token),
                age: None,
                note: None,
                server_full: false,
            }));
        }
        db.next_lease += 1;
        let lease = db.next_lease;
        db.held.insert(ns.clone(), (lease, holder.clone()));
        let previous = db.status.get(&ns).cloned();
        let token = previous.as_ref().map_or(0, |s| s.fencing_token) + 1;
        let now = Utc::now();
        db.status.insert(
            ns.clone(),
            StatusRow {
                namespace: ns.clone(),
                execution_id: Some(holder.execution_id),
                owner_id: Some(holder.owner.clone()),
                migration_version: None,
                migration_checksum: None,
                fencing_token: token,
                host: Some(holder.host.clone()),
                pid: Some(holder.pid),
                db_connection_id: Some(format!("lease {lease}")),
                state: LockState::Running,
                acquired_at: Some(now),
                last_heartbeat_at: Some(now),
                expires_at: None,
                lock_ttl_ms: holder.lock_ttl_ms,
                heartbeat_interval_ms: holder.heartbeat_interval_ms,
            },
        );
        let why = previous.as_ref().filter(|p| p.state.is_active()).map(|p| {
            dbwarden_core::takeover::Freed::SessionEnded {
                session: p.db_connection_id.clone().unwrap_or_default(),
                lock: "lock",
                state: p.state,
            }
        });
        let beat = MemoryBeat {
            db: self.db.clone(),
            namespace: ns.clone(),
            lease,
        };
        let held = MemoryHeld {
            store: MemoryStore {
                db: self.db.clone(),
                namespace: ns,
            },
            lease,
        };
        let grant = Grant::new(FencingToken(token), previous, beat, held).broke(why, None);
        Ok(Attempt::Acquired(grant))
    }

    async fn observe(&self) -> Result<Observation, Error> {
        let ns = self.ns();
        let db = lock_db(&self.db);
        let status = db.status.get(&ns).cloned();
        let held = db.held.get(&ns);
        Ok(Observation {
            engine: self.engine(),
            grade: self.grade(),
            namespace: ns.clone(),
            held: held.is_some(),
            holder_gone: false,
            holder: held.map(|(_, h)| h.clone()),
            fencing_token: status.as_ref().map(|s| s.fencing_token),
            last_heartbeat_at: status.as_ref().and_then(|s| s.last_heartbeat_at),
            server_now: Utc::now(),
            expires_at: None,
            session_id: held.map(|(lease, _)| format!("lease {lease}")),
            status,
            notes: Vec::new(),
        })
    }

    async fn break_lock(
        &self,
        seen: &Sighting,
        _expected: Option<Uuid>,
        record: AuditRecord,
    ) -> Result<Broke, Error> {
        let ns = self.ns();
        let mut db = lock_db(&self.db);
        // The handle `observe` reported, which the default `sight` passes on.
        if db.held.get(&ns).map(|(lease, _)| format!("lease {lease}")) != seen.session {
            return Ok(Broke::Changed);
        }
        db.held.remove(&ns);
        if let Some(s) = db.status.get_mut(&ns) {
            s.fencing_token += 1;
            if s.state != LockState::NeedsReview {
                s.state = LockState::Available;
            }
        }
        db.audit.push(record);
        Ok(Broke::Unlocked)
    }

    async fn audit(&self, record: &AuditRecord) -> Result<(), Error> {
        lock_db(&self.db).audit.push(record.clone());
        Ok(())
    }

    async fn read_history(&self) -> Result<Vec<HistoryRow>, Error> {
        Ok(lock_db(&self.db).history.values().cloned().collect())
    }

    fn dialect(&self) -> Option<Dialect> {
        Some(Dialect::Sqlite)
    }
}

struct MemoryHeld {
    store: MemoryStore,
    lease: u64,
}

impl MemoryHeld {
    fn free(&self) {
        let mut db = lock_db(&self.store.db);
        if db.held.get(&self.store.namespace).map(|(l, _)| *l) == Some(self.lease) {
            db.held.remove(&self.store.namespace);
        }
    }
}

impl Drop for MemoryHeld {
    fn drop(&mut self) {
        self.free();
    }
}

#[async_trait]
impl HeldLock for MemoryHeld {
    fn store(&mut self) -> Option<&mut (dyn MigrationStore + 'static)> {
        Some(&mut self.store)
    }
    async fn release(self: Box<Self>) -> Result<(), Error> {
        self.free();
        Ok(())
    }
}

struct MemoryBeat {
    db: Shared,
    namespace: String,
    lease: u64,
}

#[async_trait]
impl Heartbeat for MemoryBeat {
    async fn beat(&self) -> Result<Beat, Error> {
        let mut db = lock_db(&self.db);
        if db.held.get(&self.namespace).map(|(l, _)| *l) != Some(self.lease) {
            return Ok(Beat::Gone("the lock was taken away".into()));
        }
        if let Some(s) = db.status.get_mut(&self.namespace) {
            s.last_heartbeat_at = Some(Utc::now());
        }
        Ok(Beat::Alive)
    }
}

/// A statement takes a moment, as on a server: concurrent runners interleave here, so a
/// missing exclusion shows up as a statement run twice or a run fenced out.
async fn statement_time() {
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
}

struct MemoryStore {
    db: Shared,
    namespace: String,
}

impl MemoryStore {
    /// The database, once the stored token is still `token`: every write goes through here.
    fn fenced(&self, token: FencingToken) -> Result<MutexGuard<'_, Db>, Error> {
        let db = lock_db(&self.db);
        let stored = db.status.get(&self.namespace).map(|s| s.fencing_token);
        if stored != Some(token.0) {
            return Err(Error::Lost(format!(
                "fenced out: the stored token is {stored:?}, this holder's {token}"
            )));
        }
        Ok(db)
    }

    fn row(m: &Migration, state: HistoryState, done: usize, exec: Uuid, t: u64) -> HistoryRow {
        HistoryRow {
            version: m.version,
            description: m.description.clone(),
            checksum: m.checksum.clone(),
            state,
            statements_total: m.statements.len() as i64,
            statements_done: done as i64,
            execution_id: Some(exec),
            fencing_token: t,
            started_at: Some(Utc::now()),
            finished_at: (state == HistoryState::Applied).then(Utc::now),
            duration_ms: (state == HistoryState::Applied).then_some(0),
        }
    }
}

#[async_trait]
impl MigrationStore for MemoryStore {
    fn transactional(&self) -> bool {
        true
    }

    async fn history(&mut self) -> Result<Vec<HistoryRow>, Error> {
        Ok(lock_db(&self.db).history.values().cloned().collect())
    }

    async fn set_state(
        &mut self,
        token: FencingToken,
        state: LockState,
        migration: Option<&Migration>,
    ) -> Result<(), Error> {
        let ns = self.namespace.clone();
        let mut db = self.fenced(token)?;
        let s = db.status.get_mut(&ns).expect("a fenced status row");
        s.state = state;
        if let Some(m) = migration {
            s.migration_version = Some(m.version);
            s.migration_checksum = Some(m.checksum.clone());
        }
        Ok(())
    }

    async fn apply_in_transaction(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        lost.check()?;
        statement_time().await;
        let mut db = self.fenced(token)?;
        db.executed
            .extend((0..m.statements.len()).map(|i| (m.version, i)));
        let done = m.statements.len();
        let row = Self::row(m, m.done_state(), done, execution_id, token.0);
        db.history.insert(m.version, row);
        Ok(())
    }

    async fn journal_begin(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
        from: usize,
    ) -> Result<(), Error> {
        let trapped = {
            let mut db = self.fenced(token)?;
            let row = Self::row(m, HistoryState::Running, from, execution_id, token.0);
            db.history.insert(m.version, row);
            let trap = db.begin_traps.remove(&m.version);
            if let Some(trap) = trap {
                db.held.remove(&self.namespace);
                if trap.successor
                    && let Some(s) = db.status.get_mut(&self.namespace)
                {
                    s.fencing_token += 1;
                }
            }
            trap.is_some()
        };
        if trapped {
            // Long past any heartbeat interval a test sets: the lease is seen lost first.
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        }
        Ok(())
    }

    async fn journal_statement(
        &mut self,
        token: FencingToken,
        m: &Migration,
        index: usize,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        lost.check()?;
        statement_time().await;
        let mut db = self.fenced(token)?;
        db.executed.push((m.version, index));
        let row = db.history.get_mut(&m.version).ok_or_else(|| {
            Error::database(format!("no journal row for migration {}", m.version))
        })?;
        row.statements_done = index as i64 + 1;
        Ok(())
    }

    async fn journal_end(
        &mut self,
        token: FencingToken,
        m: &Migration,
        state: HistoryState,
        duration_ms: i64,
    ) -> Result<(), Error> {
        let mut db = self.fenced(token)?;
        let row = db.history.get_mut(&m.version).ok_or_else(|| {
            Error::database(format!("no journal row for migration {}", m.version))
        })?;
        row.state = state;
        row.finished_at = Some(Utc::now());
        row.duration_ms = Some(duration_ms);
        Ok(())
    }

    async fn mark_applied(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
    ) -> Result<(), Error> {
        let mut db = self.fenced(token)?;
        let done = m.statements.len();
        let row = Self::row(m, HistoryState::Applied, done, execution_id, token.0);
        db.history.insert(m.version, row);
        Ok(())
    }

    async fn forget(&mut self, token: FencingToken, version: i64) -> Result<(), Error> {
        self.fenced(token)?.history.remove(&version);
        Ok(())
    }

    async fn audit(&mut self, record: &AuditRecord) -> Result<(), Error> {
        lock_db(&self.db).audit.push(record.clone());
        Ok(())
    }
}
