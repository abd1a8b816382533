//! URL scheme → engine. Every check here happens before any connection is made.

use dbwarden_core::config::Settings;
use dbwarden_core::{Error, MigrationLock};

/// The lock for the configured database and namespace.
pub fn open(settings: &Settings) -> Result<Box<dyn MigrationLock>, Error> {
    let url = settings.database_url.as_str();
    let Some(scheme) =
        dbwarden_core::url::scheme(url).filter(|s| url.contains("://") || s == "sqlite")
    else {
        // Not echoed: without a scheme we cannot tell which part is a password.
        return Err(Error::usage(
            "invalid database URL (not shown): expected scheme://..., e.g. sqlite://dbwarden.db or postgres://user@host/db",
        ));
    };
    match scheme.as_str() {
        "sqlite" => dbwarden_sqlite::from_settings(settings),
        "postgres" | "postgresql" => dbwarden_postgres::from_settings(settings),
        "mysql" | "mariadb" => dbwarden_mysql::from_settings(settings),
        "clickhouse" | "http" | "https" => dbwarden_clickhouse::from_settings(settings),
        "redis" | "rediss" | "redis+cluster" => dbwarden_redis::from_settings(settings),
        other => Err(Error::usage(format!(
            "unknown database URL scheme {other:?}: use sqlite, postgres, mysql, mariadb, clickhouse or redis"
        ))),
    }
}

/// `migrate` and `resolve` need the status and history tables, which a Redis URL does not have:
/// the dialect of the engine's tables, or a usage error.
pub fn migration_dialect(
    lock: &dyn MigrationLock,
    settings: &Settings,
) -> Result<dbwarden_core::migration::Dialect, Error> {
    lock.dialect().ok_or_else(|| {
        Error::usage(format!(
            "{}: the {} engine is a lock only and keeps no migration tables; pass the database as -u (postgres://, mysql://, sqlite://, clickhouse://) and the Redis URL as --redis-url",
            dbwarden_core::url::redact(&settings.database_url),
            lock.engine()
        ))
    })
}
