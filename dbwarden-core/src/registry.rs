//! Engines by URL scheme. Each engine crate exports one [`Engine`] (its name, its schemes and
//! its factory); a program lists the engines it links and opens a lock by URL through a
//! [`Registry`], with no per-engine `match` of its own. A new engine is one more entry.

use crate::config::Settings;
use crate::{Error, MigrationLock};

/// What an engine crate exports.
#[derive(Debug)]
pub struct Engine {
    /// `postgres`, `sqlite`, ... (as [`MigrationLock::engine`] says it).
    pub name: &'static str,
    /// The URL schemes it opens, lowercase; the first is the one to suggest.
    pub schemes: &'static [&'static str],
    /// The lock for `settings.database_url` and `settings.namespace`, validated without
    /// connecting (connections are made when the lock is first used).
    pub open: fn(&Settings) -> Result<Box<dyn MigrationLock>, Error>,
    /// Whether it offers `lock = "lease"` beside its native primitive.
    pub lease_lock: bool,
}

/// The engines a program links.
#[derive(Debug, Clone, Copy)]
pub struct Registry(pub &'static [&'static Engine]);

impl Registry {
    /// The engine for `url`'s scheme. A URL without a scheme is not echoed: without one there
    /// is no telling which part is a password.
    pub fn engine_for(&self, url: &str) -> Result<&'static Engine, Error> {
        let Some(scheme) = crate::url::scheme(url).filter(|s| url.contains("://") || s == "sqlite")
        else {
            return Err(Error::usage(format!(
                "invalid database URL (not shown): expected scheme://..., e.g. {}",
                self.examples()
            )));
        };
        self.0
            .iter()
            .copied()
            .find(|e| e.schemes.contains(&scheme.as_str()))
            .ok_or_else(|| {
                // An engine a build may leave out (it needs protoc to build).
                let hint = match scheme.as_str() {
                    "etcd" => " (etcd:// needs a build with the `etcd` feature)",
                    _ => "",
                };
                Error::usage(format!(
                    "unknown database URL scheme {scheme:?}: use {}{hint}",
                    self.0
                        .iter()
                        .map(|e| e.schemes[0])
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    /// The lock for the configured database and namespace.
    pub fn open(&self, settings: &Settings) -> Result<Box<dyn MigrationLock>, Error> {
        let engine = self.engine_for(&settings.database_url)?;
        if settings.lock == crate::config::LockKind::Lease && !engine.lease_lock {
            return Err(Error::usage(format!(
                "lock = \"lease\" is for PostgreSQL behind a transaction pooler; {} has one lock of its own: remove the setting",
                engine.name
            )));
        }
        (engine.open)(settings)
    }

    /// The outer lock of `settings.lock_url`, in the same namespace, checked without
    /// connecting: a lock-only engine (Redis), held around the whole run by
    /// [`crate::runner::migrate_within`]. `None` without one.
    pub fn open_outer(&self, settings: &Settings) -> Result<Option<Box<dyn MigrationLock>>, Error> {
        let Some(url) = settings.lock_url.as_deref() else {
            return Ok(None);
        };
        let outer = Settings {
            database_url: url.to_owned(),
            lock: crate::config::LockKind::Native,
            lock_url: None,
            ..settings.clone()
        };
        let lock = self.open(&outer).map_err(|e| match e {
            Error::Usage(m) => Error::usage(format!("--lock-url: {m}")),
            other => other,
        })?;
        if lock.dialect().is_some() {
            return Err(Error::usage(format!(
                "--lock-url {}: the {} engine keeps migration tables of its own; the outer lock is a lock-only engine every runner shares, e.g. redis://HOST:6379",
                crate::url::redact(url),
                lock.engine()
            )));
        }
        Ok(Some(lock))
    }

    fn examples(&self) -> String {
        self.0
            .iter()
            .take(2)
            .map(|e| match e.schemes[0] {
                "sqlite" => "sqlite://dbwarden.db".to_owned(),
                s => format!("{s}://user@host/db"),
            })
            .collect::<Vec<_>>()
            .join(" or ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refuse(_: &Settings) -> Result<Box<dyn MigrationLock>, Error> {
        Err(Error::usage("opened"))
    }

    static A: Engine = Engine {
        name: "sqlite",
        schemes: &["sqlite"],
        open: refuse,
        lease_lock: false,
    };
    static B: Engine = Engine {
        name: "postgres",
        schemes: &["postgres", "postgresql"],
        open: refuse,
        lease_lock: false,
    };
    const R: Registry = Registry(&[&A, &B]);

    #[test]
    fn finds_engines_by_any_of_their_schemes() {
        assert_eq!(R.engine_for("sqlite://x.db").unwrap().name, "sqlite");
        assert_eq!(R.engine_for("sqlite:x.db").unwrap().name, "sqlite");
        assert_eq!(R.engine_for("PostgreSQL://h/d").unwrap().name, "postgres");
    }

    #[test]
    fn refuses_unknown_schemes_naming_the_known_ones_and_never_echoes_a_bare_url() {
        let e = R
            .engine_for("oracle://scott:tiger@h/d")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"oracle\"") && e.contains("sqlite, postgres"),
            "{e}"
        );
        assert!(!e.contains("tiger"), "{e}");
        let e = R.engine_for("scott:tiger@h/d").unwrap_err().to_string();
        assert!(e.contains("not shown") && !e.contains("tiger"), "{e}");
    }
}
