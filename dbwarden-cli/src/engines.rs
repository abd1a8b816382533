//! URL scheme → engine, through the registry of the engines this binary links. Every check
//! here happens before any connection is made.

use dbwarden_core::config::Settings;
use dbwarden_core::registry::Registry;
use dbwarden_core::{Error, MigrationLock};

/// The engines of the `dbwarden` binary: the library's list, by the features it was built with
/// (etcd with `--features etcd`).
pub fn engines() -> Registry {
    dbwarden::engines()
}

/// The lock for the configured database and namespace.
pub fn open(settings: &Settings) -> Result<Box<dyn MigrationLock>, Error> {
    engines().open(settings)
}

/// `migrate` and `resolve` need the status and history tables, which a Redis URL does not have:
/// the dialect of the engine's tables, or a usage error.
pub fn migration_dialect(
    lock: &dyn MigrationLock,
    settings: &Settings,
) -> Result<dbwarden_core::migration::Dialect, Error> {
    lock.dialect().ok_or_else(|| {
        Error::usage(format!(
            "{}: the {} engine is a lock only and keeps no migration tables; pass the database as -u (postgres://, mysql://, sqlite://, clickhouse://) and this URL as --lock-url",
            dbwarden_core::url::redact(&settings.database_url),
            lock.engine()
        ))
    })
}
