//! dbwarden-clickhouse: the ClickHouse engine. Not implemented yet (see the open engine issue); the CLI
//! reaches it through [`from_settings`], which says so with a usage error.
#![forbid(unsafe_code)]

use dbwarden_core::config::Settings;
use dbwarden_core::{Error, MigrationLock};

/// The lock for `settings.database_url` and `settings.namespace`. Validates everything it can
/// without connecting; connections are made when the lock is first used.
pub fn from_settings(_settings: &Settings) -> Result<Box<dyn MigrationLock>, Error> {
    Err(Error::usage(
        "the ClickHouse engine is not available in this build yet; use sqlite:// for now",
    ))
}
