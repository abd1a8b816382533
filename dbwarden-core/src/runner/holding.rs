//! What work under a lease carries besides the store, shared by the steps that apply, retry
//! and repair migrations (docs/design.md §10.3).

use tokio::time::Instant;

use super::interrupt::Interrupt;
use crate::lease::UnsentMark;
use crate::{FencingToken, HolderInfo, LostSignal, MigrationLock};

/// What work under a lease carries besides the store: the holder's token and identity, its
/// lost-signal, the interrupt, where its journal stands, and how its statements meet table
/// locks.
pub(crate) struct Holding<'a> {
    pub token: FencingToken,
    pub holder: &'a HolderInfo,
    pub lock: &'a dyn MigrationLock,
    pub lost: &'a LostSignal,
    pub interrupt: &'a Interrupt,
    /// Which statement has surely not been sent yet (see [`super::apply_one`]).
    pub unsent: UnsentMark,
    /// Table-lock bounds and retries ([`crate::table_locks`]).
    pub retry: crate::table_locks::LockRetry,
    /// No retry pause ends after this (`--wait` from the start of the run).
    pub retry_until: Option<Instant>,
}

impl Holding<'_> {
    pub fn namespace(&self) -> &crate::Namespace {
        self.lock.namespace()
    }
}
