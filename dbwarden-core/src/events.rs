//! Lock events: what an operator wants to hear about as it happens, not only in the audit
//! table afterwards -- a lock broken, a lock lost, a forced unlock, a halt for review, a failed
//! migration (docs/operations.md, "Hooks on lock events").
//!
//! Core decides when an event happened, once per occurrence, at the point where it decides what
//! to do about it; an [`EventSink`] hears it. The CLI's sink runs the `hook` command with the
//! event as one JSON object on stdin; a library user passes a sink of its own. An event never
//! carries a password: the database is shown through [`crate::url::redact`].
//!
//! ```
//! use std::sync::Arc;
//! use dbwarden_core::events::{Event, EventSink, Events};
//!
//! struct Log;
//! impl EventSink for Log {
//!     fn emit(&self, event: Event) {
//!         eprintln!("dbwarden event: {}", event.to_json());
//!     }
//! }
//! let events = Events::new(Arc::new(Log)).database("postgres://app:s3cret@db/prod");
//! # let _ = events;
//! ```

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::lock::Grade;
use crate::migration::Migration;
use crate::{Error, HolderInfo, Lease, LockState, LostSignal, MigrationLock, StatusRow, Verdict};

/// Hears events. `emit` is called at the decision point, on the runner's own task, while the
/// lock may still be held: it must return at once (queue the work, as the CLI's hook runner
/// does), never block or wait for I/O.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: Event);
}

/// A process named in an event: this runner, the holder whose lock was broken, the holder an
/// unlock removed. What a status row did not record is `null`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Party {
    pub host: Option<String>,
    pub pid: Option<u32>,
    pub execution_id: Option<Uuid>,
    pub owner: Option<String>,
}

impl From<&HolderInfo> for Party {
    fn from(h: &HolderInfo) -> Self {
        Party {
            host: Some(h.host.clone()),
            pid: Some(h.pid),
            execution_id: Some(h.execution_id),
            owner: Some(h.owner.clone()),
        }
    }
}

impl From<&StatusRow> for Party {
    fn from(s: &StatusRow) -> Self {
        Party {
            host: s.host.clone(),
            pid: s.pid,
            execution_id: s.execution_id,
            owner: s.owner_id.clone(),
        }
    }
}

/// What happened, with what is particular to it. Serialised with the event's name in `event`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// This runner took the lock over from a holder that ended without releasing it (its status
    /// row still said it was running): killed, crashed, or stopped after it lost its lock.
    LockBroken {
        previous_holder: Party,
        /// The state its status row was left in (`RUNNING`, `INSPECTING`, `DEAD`).
        previous_state: String,
        previous_fencing_token: u64,
        previous_heartbeat_at: Option<DateTime<Utc>>,
        /// The migration it was applying, where the row recorded one.
        previous_migration_version: Option<i64>,
        reason: String,
    },
    /// This runner's lock was lost while it held it (expired lease, `dbwarden unlock`, a write
    /// fenced out); the run stopped (exit 4) and wrote nothing more.
    LockLost { reason: String },
    /// `dbwarden unlock` removed a lock.
    Unlocked {
        /// The holder whose lock was removed, where one was known.
        unlocked_holder: Option<Party>,
        /// The lock-status verdict when the unlock was decided (`STUCK`, `DEAD`, ...).
        verdict: String,
    },
    /// This run halted for review: a human must decide with `dbwarden resolve` (exit 78).
    HaltedForReview { version: i64, reason: String },
    /// A migration's statement failed; the run stopped (exit 1).
    MigrationFailed {
        version: i64,
        description: String,
        error: String,
    },
}

/// One event, as a hook reads it on stdin (docs/events.schema.json).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    #[serde(flatten)]
    pub kind: EventKind,
    pub namespace: String,
    pub engine: &'static str,
    /// The database, its password redacted.
    pub database: Option<String>,
    pub at: DateTime<Utc>,
    /// The process that saw the event (for `unlocked`: the one that unlocked).
    pub runner: Party,
    /// The fencing token of the lock the event is about: the new one for `lock_broken`, the
    /// lost one for `lock_lost`, the removed one for `unlocked`.
    pub fencing_token: Option<u64>,
}

impl Event {
    /// `lock_broken`, `lock_lost`, `unlocked`, `halted_for_review`, `migration_failed`.
    pub fn name(&self) -> &'static str {
        match self.kind {
            EventKind::LockBroken { .. } => "lock_broken",
            EventKind::LockLost { .. } => "lock_lost",
            EventKind::Unlocked { .. } => "unlocked",
            EventKind::HaltedForReview { .. } => "halted_for_review",
            EventKind::MigrationFailed { .. } => "migration_failed",
        }
    }

    /// One line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| {
            // Every field is a string, a number or a timestamp: this cannot fail, but an event
            // is still worth a line that says what it was.
            format!("{{\"event\":\"{}\",\"error\":\"{e}\"}}", self.name())
        })
    }
}

/// Where a runner's events go: a sink, or nowhere (the default).
#[derive(Clone, Default)]
pub struct Events {
    sink: Option<Arc<dyn EventSink>>,
    database: Option<String>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("sink", &self.sink.is_some())
            .field("database", &self.database)
            .finish()
    }
}

impl Events {
    pub fn new(sink: Arc<dyn EventSink>) -> Self {
        Events {
            sink: Some(sink),
            database: None,
        }
    }

    /// Name the database in every event (redacted here: pass the URL as configured). Without
    /// it, an event names what the lock reports of its server (host, port and database).
    pub fn database(mut self, url: &str) -> Self {
        self.database = Some(crate::url::redact(url));
        self
    }

    fn emit(
        &self,
        lock: &dyn MigrationLock,
        runner: &HolderInfo,
        fencing_token: Option<u64>,
        kind: EventKind,
    ) {
        let Some(sink) = &self.sink else { return };
        sink.emit(Event {
            kind,
            namespace: lock.namespace().to_string(),
            engine: lock.engine(),
            database: self
                .database
                .clone()
                .or_else(|| lock.reach().map(|r| r.target)),
            at: Utc::now(),
            runner: Party::from(runner),
            fencing_token,
        });
    }

    /// Right after an exclusive acquire: `lock_broken` if the lock was taken over from a holder
    /// that never released it. Returns what [`Watch::ended`] needs at the end of the run.
    pub fn took<'a>(&'a self, lock: &'a dyn MigrationLock, lease: &Lease) -> Watch<'a> {
        if let Some(prev) = lease.previous().filter(|p| p.state.is_active()) {
            self.emit(
                lock,
                lease.holder(),
                Some(lease.fencing_token().0),
                EventKind::LockBroken {
                    previous_holder: Party::from(prev),
                    previous_state: prev.state.as_str().to_owned(),
                    previous_fencing_token: prev.fencing_token,
                    previous_heartbeat_at: prev.last_heartbeat_at,
                    previous_migration_version: prev.migration_version,
                    reason: broken_reason(lock.grade(), prev.state),
                },
            );
        }
        Watch {
            events: self,
            lock,
            holder: lease.holder().clone(),
            token: lease.fencing_token().0,
            was_halted: lease
                .previous()
                .is_some_and(|p| p.state == LockState::NeedsReview),
            lost: lease.lost_signal(),
        }
    }

    /// `dbwarden unlock` removed `holder`'s lock.
    pub fn unlocked(
        &self,
        lock: &dyn MigrationLock,
        me: &HolderInfo,
        holder: Option<&HolderInfo>,
        fencing_token: Option<u64>,
        verdict: Verdict,
    ) {
        self.emit(
            lock,
            me,
            fencing_token,
            EventKind::Unlocked {
                unlocked_holder: holder.map(Party::from),
                verdict: verdict.as_str().to_owned(),
            },
        );
    }
}

fn broken_reason(grade: Grade, state: LockState) -> String {
    let freed = match grade {
        Grade::A => "the server freed its lock when its session ended",
        Grade::B => "its lock file's flock was free (its process ended or let go)",
        Grade::C => "its lease ran out without a renewal",
    };
    format!(
        "the previous holder ended without releasing: {freed}, and its status row was left {}",
        state.as_str()
    )
}

/// One held lock, watched from its acquire to the end of the run (see [`Events::took`]).
pub struct Watch<'a> {
    events: &'a Events,
    lock: &'a dyn MigrationLock,
    holder: HolderInfo,
    token: u64,
    was_halted: bool,
    lost: LostSignal,
}

impl Watch<'_> {
    /// The run ended with `result`, and releasing ended with `released`: `lock_lost` if the
    /// lock was lost on the way (whatever else went wrong), `halted_for_review` if this run
    /// halted (not when it met an earlier halt nobody resolved), `migration_failed` if a
    /// migration's statement failed.
    pub fn ended<T>(
        self,
        migrations: &[Migration],
        result: &Result<T, Error>,
        released: &Result<(), Error>,
    ) {
        let emit = |kind| {
            self.events
                .emit(self.lock, &self.holder, Some(self.token), kind)
        };
        let lost = [result.as_ref().err(), released.as_ref().err()]
            .into_iter()
            .flatten()
            .find_map(|e| match e {
                Error::Lost(reason) => Some(reason.clone()),
                _ => None,
            })
            .or_else(|| self.lost.reason());
        if let Some(reason) = lost {
            emit(EventKind::LockLost { reason });
        }
        match result {
            Err(Error::NeedsReview { version, reason }) if !self.was_halted => {
                emit(EventKind::HaltedForReview {
                    version: *version,
                    reason: reason.clone(),
                });
            }
            Err(e @ Error::MigrationFailed { version, .. }) => {
                emit(EventKind::MigrationFailed {
                    version: *version,
                    description: migrations
                        .iter()
                        .find(|m| m.version == *version)
                        .map(|m| m.description.clone())
                        .unwrap_or_default(),
                    error: crate::error::one_line(&e.to_string()),
                });
            }
            _ => {}
        }
    }
}
