//! The status and history tables (docs/design.md §4) as the runner sees them. Each engine implements
//! [`MigrationStore`] on the session that holds its lock; every write is fenced.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{Error, FencingToken, HolderInfo, LostSignal, migration::Migration};

/// `dbwarden_lock.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LockState {
    Available,
    Running,
    Complete,
    Failed,
    Dead,
    Inspecting,
    NeedsReview,
}

impl LockState {
    pub fn as_str(self) -> &'static str {
        match self {
            LockState::Available => "AVAILABLE",
            LockState::Running => "RUNNING",
            LockState::Complete => "COMPLETE",
            LockState::Failed => "FAILED",
            LockState::Dead => "DEAD",
            LockState::Inspecting => "INSPECTING",
            LockState::NeedsReview => "NEEDS_REVIEW",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "AVAILABLE" => LockState::Available,
            "RUNNING" => LockState::Running,
            "COMPLETE" => LockState::Complete,
            "FAILED" => LockState::Failed,
            "DEAD" => LockState::Dead,
            "INSPECTING" => LockState::Inspecting,
            "NEEDS_REVIEW" => LockState::NeedsReview,
            _ => return None,
        })
    }

    /// The state of the status row of `namespace` as stored: a value dbwarden never writes
    /// (a hand edit, a corrupt row) is an error naming the row, never read as a free lock.
    pub fn read(namespace: &str, s: &str) -> Result<Self, Error> {
        Self::parse(s).ok_or_else(|| {
            Error::usage(format!(
                "the status row of namespace {namespace:?} has an unknown state {s:?} (one of AVAILABLE, RUNNING, COMPLETE, FAILED, DEAD, INSPECTING, NEEDS_REVIEW is expected; was the row edited by hand?); nothing was run, and neither lock-status nor unlock can judge the row: set its state by hand (FAILED if unsure)"
            ))
        })
    }

    /// A holder was active in this state: if the primitive is free, it died.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            LockState::Running | LockState::Inspecting | LockState::Dead
        )
    }
}

/// One row of `dbwarden_lock`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusRow {
    pub namespace: String,
    pub execution_id: Option<Uuid>,
    pub owner_id: Option<String>,
    pub migration_version: Option<i64>,
    pub migration_checksum: Option<String>,
    pub fencing_token: u64,
    pub host: Option<String>,
    pub pid: Option<u32>,
    pub db_connection_id: Option<String>,
    pub state: LockState,
    pub acquired_at: Option<DateTime<Utc>>,
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    /// The holder's own `lock_ttl` and `heartbeat_interval` (`None`: not recorded, e.g. a row
    /// written by an older version).
    pub lock_ttl_ms: Option<u64>,
    pub heartbeat_interval_ms: Option<u64>,
}

impl StatusRow {
    /// The row a lock-only engine (Redis, etcd) shows for its live holder: it keeps no status
    /// table, so its holder record stands in for one, RUNNING while the lease is held.
    pub fn of_lease(
        namespace: &str,
        holder: &HolderInfo,
        fencing_token: u64,
        acquired_at: DateTime<Utc>,
        last_heartbeat_at: Option<DateTime<Utc>>,
        expires_at: Option<DateTime<Utc>>,
    ) -> Self {
        StatusRow {
            namespace: namespace.to_owned(),
            execution_id: Some(holder.execution_id),
            owner_id: Some(holder.owner.clone()),
            migration_version: None,
            migration_checksum: None,
            fencing_token,
            host: Some(holder.host.clone()),
            pid: Some(holder.pid),
            db_connection_id: None,
            state: LockState::Running,
            acquired_at: Some(acquired_at),
            last_heartbeat_at,
            expires_at,
            lock_ttl_ms: holder.lock_ttl_ms,
            heartbeat_interval_ms: holder.heartbeat_interval_ms,
        }
    }
}

/// `dbwarden_migrations.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HistoryState {
    Applied,
    Running,
    Failed,
    /// Undone by `dbwarden revert` (its down file ran): pending again. The row stays for audit
    /// until the migration is applied again.
    Reverted,
}

impl HistoryState {
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryState::Applied => "APPLIED",
            HistoryState::Running => "RUNNING",
            HistoryState::Failed => "FAILED",
            HistoryState::Reverted => "REVERTED",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "APPLIED" => HistoryState::Applied,
            "RUNNING" => HistoryState::Running,
            "FAILED" => HistoryState::Failed,
            "REVERTED" => HistoryState::Reverted,
            _ => return None,
        })
    }

    /// The state of history row `version` of `table` as stored: a value dbwarden never
    /// writes is an error naming the row, never read as FAILED (which would run it again).
    pub fn read(table: &str, version: i64, s: &str) -> Result<Self, Error> {
        Self::parse(s).ok_or_else(|| {
            Error::usage(format!(
                "{table}: the row of migration {version} has an unknown state {s:?} (APPLIED, RUNNING, FAILED or REVERTED is expected; was the row edited by hand?); nothing was run"
            ))
        })
    }

    /// A run left it half-done (RUNNING: a statement may have been in flight; FAILED: stopped
    /// before a statement): recovery decides what happens to it.
    pub fn is_unfinished(self) -> bool {
        matches!(self, HistoryState::Running | HistoryState::Failed)
    }
}

/// One row of the history table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HistoryRow {
    pub version: i64,
    pub description: String,
    pub checksum: String,
    pub state: HistoryState,
    pub statements_total: i64,
    pub statements_done: i64,
    pub execution_id: Option<Uuid>,
    pub fencing_token: u64,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub duration_ms: Option<i64>,
}

impl HistoryRow {
    /// Written by a down file (`dbwarden revert`), not by a forward run.
    pub fn is_revert(&self) -> bool {
        self.description.ends_with(crate::migration::REVERT_SUFFIX)
    }

    /// A half-done row left by a revert, whatever its files say today: a forward run must
    /// never go over it.
    pub fn is_interrupted_revert(&self) -> bool {
        self.state.is_unfinished() && self.is_revert()
    }
}

/// One row of `dbwarden_lock_audit`: a forced unlock, a broken stale lock, a declined run, a
/// human's `resolve`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub namespace: String,
    /// `forced_unlock`, `broken_stale_lock`, `lock_conflict`, `resolve_retry`, ...
    pub action: String,
    /// Who did it (owner label, host, pid).
    pub actor: String,
    /// The holder it concerned, if any.
    pub holder_execution_id: Option<Uuid>,
    pub holder_desc: Option<String>,
    pub reason: String,
}

impl AuditRecord {
    pub fn new(
        namespace: &crate::Namespace,
        action: &str,
        actor: &HolderInfo,
        reason: impl Into<String>,
    ) -> Self {
        AuditRecord {
            namespace: namespace.to_string(),
            action: action.to_owned(),
            actor: format!("{} (host={} pid={})", actor.owner, actor.host, actor.pid),
            holder_execution_id: None,
            holder_desc: None,
            reason: reason.into(),
        }
    }

    /// The holder as a status row recorded it (one that wrote no other description).
    pub fn about_row(mut self, row: &StatusRow) -> Self {
        self.holder_execution_id = row.execution_id;
        self.holder_desc = Some(format!(
            "host={} pid={} owner={}",
            row.host.as_deref().unwrap_or("?"),
            row.pid.map_or("?".into(), |p| p.to_string()),
            row.owner_id.as_deref().unwrap_or("?")
        ));
        self
    }

    pub fn about(mut self, holder: Option<&HolderInfo>) -> Self {
        if let Some(h) = holder {
            self.holder_execution_id = Some(h.execution_id);
            self.holder_desc = Some(format!("host={} pid={} owner={}", h.host, h.pid, h.owner));
        }
        self
    }
}

/// Interoperating with sqlx's migrator during a rolling switch (`sqlx_compat`): an optional
/// capability of a store whose engine sqlx supports (PostgreSQL, MySQL, SQLite).
#[async_trait]
pub trait SqlxCompat: Send {
    /// Whether `_sqlx_migrations` exists.
    async fn sqlx_table_exists(&mut self) -> Result<bool, Error>;

    /// Take the lock sqlx's migrator takes (PostgreSQL: its advisory lock; MySQL: its
    /// `GET_LOCK` name), on the lock session, without waiting: `true` once held, until the
    /// lease ends. SQLite's sqlx takes none: `true`.
    async fn try_lock_sqlx(&mut self) -> Result<bool, Error>;

    /// The rows of `_sqlx_migrations`.
    async fn sqlx_rows(&mut self) -> Result<Vec<crate::other_tools::ForeignRow>, Error>;

    /// From now on, every migration this store records APPLIED after running it (and every
    /// one `mark_applied` records) also gets its `_sqlx_migrations` row, as sqlx writes it, in
    /// the same transaction; the table is created as sqlx creates it if it is missing.
    async fn mirror_to_sqlx(&mut self) -> Result<(), Error>;
}

/// An index as the server has it (see [`IndexBuilds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexState {
    Missing,
    /// Built by a concurrent build that was killed or failed: maintained, never used.
    Invalid,
    /// A build is making it right now (a predecessor's statement still running on the server).
    Building,
    Valid,
}

/// An index the server marks INVALID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InvalidIndex {
    pub schema: String,
    pub name: String,
    pub table: String,
}

impl std::fmt::Display for InvalidIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{} (on {})", self.schema, self.name, self.table)
    }
}

/// What concurrent index builds (`CREATE INDEX CONCURRENTLY`, `REINDEX … CONCURRENTLY`) leave
/// behind: an optional capability of a store whose engine builds indexes outside any
/// transaction (PostgreSQL). The engine only looks and drops; what to drop, and what a valid
/// index says about a statement that was in flight, core decides (docs/design.md §9).
#[async_trait]
pub trait IndexBuilds: Send {
    /// The state of the index named `index` on the table of `relation` (a table, or an index
    /// of it, as SQL would read the name).
    async fn index_state(&mut self, relation: &str, index: &str) -> Result<IndexState, Error>;

    /// Every INVALID index on the table of `relation`.
    async fn invalid_indexes(&mut self, relation: &str) -> Result<Vec<InvalidIndex>, Error>;

    /// Drop `index` (concurrently, if it still exists), after a fresh check of `token`.
    async fn drop_index(&mut self, token: FencingToken, index: &InvalidIndex) -> Result<(), Error>;
}

/// The status and history tables, on the session that holds the lock. Every write checks that
/// the stored fencing token for the namespace still equals `token` (in the same transaction or
/// as a conditional write) and fails with [`Error::Lost`] when it does not.
#[async_trait]
pub trait MigrationStore: Send {
    /// True when a migration's statements and its history row commit or roll back together.
    fn transactional(&self) -> bool;

    /// sqlx interoperation, where the engine has it.
    fn sqlx_compat(&mut self) -> Option<&mut dyn SqlxCompat> {
        None
    }

    /// What concurrent index builds leave behind, where the engine has them.
    fn index_builds(&mut self) -> Option<&mut dyn IndexBuilds> {
        None
    }

    /// Bound the migration statements that follow on this session: how long one may wait for
    /// a table lock (failing with [`Error::LockTimeout`], having done nothing) and how long one
    /// may run; `None` = unbounded. Engines without such settings keep this default, which
    /// bounds nothing. Never applies to dbwarden's own bookkeeping, which has its own bounds.
    async fn bound_statements(
        &mut self,
        _lock_timeout: Option<std::time::Duration>,
        _statement_timeout: Option<std::time::Duration>,
    ) -> Result<(), Error> {
        Ok(())
    }

    /// Whether a schema change outside any transaction (a single `CREATE`, `ALTER`, `DROP`,
    /// `RENAME` or `TRUNCATE`) that the lock timeout stopped has done nothing, so that core
    /// bounds and retries it like a statement in a transaction. MySQL/MariaDB: yes, the
    /// metadata lock is waited for before any work, and a failed `ALTER` leaves the table as it
    /// was. The default says no: PostgreSQL's statements outside a transaction (a concurrent
    /// index build) may stop half-way, and wait as long as the server lets them.
    fn ddl_undone_on_lock_timeout(&self) -> bool {
        false
    }

    /// The engine's name for the session the migration statements run on (PostgreSQL's
    /// backend pid), for [`crate::MigrationLock::blockers`].
    fn session(&self) -> Option<String> {
        None
    }

    /// Every row of the history table, ordered by version.
    async fn history(&mut self) -> Result<Vec<HistoryRow>, Error>;

    /// Set `dbwarden_lock.state` (and the migration being worked on, if any).
    async fn set_state(
        &mut self,
        token: FencingToken,
        state: LockState,
        migration: Option<&Migration>,
    ) -> Result<(), Error>;

    /// Run all of `m`'s statements and record it APPLIED in one transaction. Checks `lost`
    /// before every statement; on any error the transaction rolls back and nothing of `m` stays.
    /// Called only when [`transactional`](Self::transactional) is true: a store that is not
    /// keeps this default, which refuses.
    async fn apply_in_transaction(
        &mut self,
        _token: FencingToken,
        _execution_id: Uuid,
        m: &Migration,
        _lost: &LostSignal,
    ) -> Result<(), Error> {
        Err(Error::usage(format!(
            "migration {}: this engine cannot run a migration in one transaction; the runner journals it statement by statement instead",
            m.version
        )))
    }

    /// Write (insert or replace) the history row of `m` as RUNNING with `statements_done = from`.
    async fn journal_begin(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
        from: usize,
    ) -> Result<(), Error>;

    /// Execute statement `index` of `m` outside a transaction of dbwarden's, then record
    /// `statements_done = index + 1` -- unless `lost` has fired meanwhile (a holder paused
    /// during the statement, resumed after its lease ran out): then record nothing (where the
    /// statement and its record share a transaction, roll both back) and return the loss, so
    /// the successor sees the statement as in flight and decides by its idempotency.
    ///
    /// Inside a transaction the file itself opened ([`Migration::inside_own_transaction`]),
    /// the record is written in that transaction, without opening or committing one; for the
    /// statement that commits it ([`Migration::commits_own_transaction`]) the record comes
    /// first. A statement that fails there rolls the file's transaction back before
    /// returning, so nothing of it is left open on the session.
    async fn journal_statement(
        &mut self,
        token: FencingToken,
        m: &Migration,
        index: usize,
        lost: &LostSignal,
    ) -> Result<(), Error>;

    /// How many statements one [`Self::journal_batch`] call may hold. Where each statement
    /// costs its own round trip and commit (MySQL's per-statement journal), batching runs of
    /// data changes is what makes a big data migration fast; elsewhere batches of one keep an
    /// interrupt and the journal at statement granularity.
    fn batch_limit(&self) -> usize {
        1
    }

    /// Execute statements `range` of `m` (all [`batchable`](crate::migration::Statement), none
    /// inside a transaction the file opened) and record `statements_done = range.end`, in one
    /// transaction where the engine can, so the batch commits with its journal entry or not at
    /// all. A failed statement is a [`Error::MigrationFailed`] naming it; nothing of the batch
    /// is then recorded. The default runs the statements one by one through
    /// [`Self::journal_statement`], which keeps the same promise statement by statement.
    async fn journal_batch(
        &mut self,
        token: FencingToken,
        m: &Migration,
        range: std::ops::Range<usize>,
        lost: &LostSignal,
    ) -> Result<(), Error> {
        for index in range {
            self.journal_statement(token, m, index, lost).await?;
        }
        Ok(())
    }

    /// Close the history row of `m` with its final state.
    async fn journal_end(
        &mut self,
        token: FencingToken,
        m: &Migration,
        state: HistoryState,
        duration_ms: i64,
    ) -> Result<(), Error>;

    /// Record a migration as APPLIED without running it (`resolve --mark-applied`).
    async fn mark_applied(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        m: &Migration,
    ) -> Result<(), Error>;

    /// Record `applied` APPLIED without running them and, with `halted`, that migration's row
    /// RUNNING with nothing done and the status row NEEDS_REVIEW naming it (`adopt`,
    /// `baseline`): in one transaction where the engine has them, so an adoption is recorded
    /// whole or not at all. The default writes them one by one.
    async fn record_adopted(
        &mut self,
        token: FencingToken,
        execution_id: Uuid,
        applied: &[&Migration],
        halted: Option<&Migration>,
    ) -> Result<(), Error> {
        if let Some(m) = halted {
            self.journal_begin(token, execution_id, m, 0).await?;
            self.set_state(token, LockState::NeedsReview, Some(m))
                .await?;
        }
        for m in applied {
            self.mark_applied(token, execution_id, m).await?;
        }
        Ok(())
    }

    /// Remove the history row of `version` (`resolve --abandon`).
    async fn forget(&mut self, token: FencingToken, version: i64) -> Result<(), Error>;

    /// Append an audit row.
    async fn audit(&mut self, record: &AuditRecord) -> Result<(), Error>;
}
