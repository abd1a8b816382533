//! dbwarden-core: the policy of dbwarden, written once and shared by every engine.
//!
//! An engine crate implements [`MigrationLock`] (take the native primitive once, observe it,
//! break it) and [`MigrationStore`] (status and history tables). Everything else lives here:
//! waiting with backoff ([`wait`]), the heartbeat and lost-lock detection ([`lease`]), fencing,
//! verdicts ([`verdict`]), the recovery state machine ([`recovery`]), migration files
//! ([`migration`]), configuration ([`config`]) and the runner ([`runner`]).
#![forbid(unsafe_code)]

pub mod adopt;
pub mod config;
pub mod duration;
pub mod error;
pub mod events;
pub mod fleet;
pub mod holder;
pub mod journal;
pub mod kept;
pub mod lease;
pub mod lock;
pub mod lookalike;
pub mod migration;
pub mod namespace;
pub mod other_tools;
pub mod recovery;
pub mod registry;
pub mod release;
pub mod revert;
pub mod runner;
pub mod store;
pub mod survey;
pub mod table_locks;
pub mod takeover;
pub mod text;
pub mod unlock;
pub mod url;
pub mod verdict;
pub mod wait;

pub use error::{Error, ErrorKind, ExitCode};
pub use holder::{FencingToken, HolderInfo};
pub use journal::{Entry, Fence, JournalSession, Tx, Within, Write};
pub use lease::{HeartbeatConfig, Lease, LostSignal};
pub use lock::{
    Attempt, Beat, BrokenLock, Grade, Grant, Heartbeat, HeldLock, Identity, MigrationLock,
    Observation, Reach, SharedLock, Snapshot, SnapshotRead, WakeUp,
};
pub use namespace::Namespace;
pub use recovery::{RecoveryDecision, RecoveryPolicy};
pub use store::{
    AuditRecord, HistoryRow, HistoryState, IndexBuilds, IndexState, InvalidIndex, LockState,
    MigrationStore, SqlxCompat, StatusRow,
};
pub use verdict::Verdict;
pub use wait::Wait;
