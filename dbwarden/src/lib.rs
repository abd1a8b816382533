//! dbwarden from inside a Rust application: migrations embedded in the binary at compile time,
//! applied at start-up on any engine by URL, under the same lock, fencing, journal and recovery
//! as `dbwarden migrate`, with the same outcomes, and inside the Redis lease when one is
//! configured. Every replica may call it at once: exactly one applies, the others wait for it
//! and find nothing left to do.
//!
//! ```no_run
//! static MIGRATIONS: dbwarden::EmbeddedMigrations =
//!     dbwarden::embed_migrations!("examples/migrations");
//!
//! # async fn start() -> Result<(), dbwarden::Error> {
//! let outcome = dbwarden::Migrator::new(&MIGRATIONS)
//!     .database_url("postgres://app@db/prod")
//!     .run()
//!     .await?;
//! # let _ = outcome; Ok(()) }
//! ```
//!
//! Settings not given to the builder come from the same environment variables as the command
//! (`DATABASE_URL`, `DBWARDEN_NAMESPACE`, `DBWARDEN_WAIT`, `DBWARDEN_REDIS_URL`, ...), then the
//! defaults. An error maps to the command's exit code with [`Error::exit_code`].
//!
//! The macro embeds every `.sql` file of the folder (relative to the crate's `Cargo.toml`);
//! cargo rebuilds when one changes, and — with `println!("cargo:rerun-if-changed=migrations")`
//! in the crate's `build.rs` — when one is added.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

pub use dbwarden_core as core;
pub use dbwarden_core::fleet::{TargetOutcome, TargetReport};
pub use dbwarden_core::runner::{Outcome, Report};
pub use dbwarden_core::{Error, ExitCode};
pub use dbwarden_macros::embed_migrations;

use dbwarden_core::HolderInfo;
use dbwarden_core::config::{self, Layer};
use dbwarden_core::fleet::{self, FleetOptions};
use dbwarden_core::migration::{self, Direction, Migration, MigrationFileError};
use dbwarden_core::registry::{Engine, Registry};
use dbwarden_core::runner::{self, Interrupt, MigrateOptions, Silent};

/// One file of an embedded folder (written by [`embed_migrations!`]).
#[derive(Debug)]
pub struct EmbeddedFile {
    pub name: &'static str,
    pub bytes: &'static [u8],
}

/// A migrations folder compiled into the binary by [`embed_migrations!`].
#[derive(Debug)]
pub struct EmbeddedMigrations {
    dir: &'static str,
    files: &'static [EmbeddedFile],
}

impl EmbeddedMigrations {
    pub const fn new(dir: &'static str, files: &'static [EmbeddedFile]) -> Self {
        EmbeddedMigrations { dir, files }
    }

    /// The files as the command would load them from disk: the same names, checksums and
    /// statements (a file applied by the command is not "changed" here), each with its down
    /// file, ordered by version. A duplicate version is an error, as on disk.
    pub fn load(&self, dialect: migration::Dialect) -> Result<Vec<Migration>, Error> {
        let mut ups: BTreeMap<i64, Migration> = BTreeMap::new();
        let mut downs: BTreeMap<i64, Migration> = BTreeMap::new();
        for f in self.files {
            let path = PathBuf::from(self.dir).join(f.name);
            let lower = f.name.to_ascii_lowercase();
            let down = lower.ends_with(".down.sql");
            let parsed = if down {
                migration::parse_file_name(&format!("{}.sql", &f.name[..f.name.len() - 9]))
            } else {
                migration::parse_file_name(f.name)
            };
            let Some((version, description)) = parsed else {
                if down {
                    continue;
                }
                return Err(MigrationFileError::BadName { path }.into());
            };
            let mut m =
                migration::from_bytes(version, description, path.clone(), f.bytes, dialect)?;
            let slot = if down {
                m.direction = Direction::Down;
                m.description.push_str(migration::REVERT_SUFFIX);
                &mut downs
            } else {
                &mut ups
            };
            if let Some(first) = slot.insert(version, m) {
                return Err(MigrationFileError::DuplicateVersion {
                    version,
                    first: first.path,
                    second: path,
                }
                .into());
            }
        }
        Ok(ups
            .into_values()
            .map(|mut m| {
                m.down = downs.remove(&m.version).map(Box::new);
                m
            })
            .collect())
    }
}

/// The engines this build links (by feature).
// One push per feature: a `vec![]` cannot hold a `#[cfg]` per element.
#[allow(clippy::vec_init_then_push)]
pub fn engines() -> Registry {
    static LIST: OnceLock<&'static [&'static Engine]> = OnceLock::new();
    Registry(LIST.get_or_init(|| {
        let mut v: Vec<&'static Engine> = Vec::new();
        #[cfg(feature = "sqlite")]
        v.push(&dbwarden_sqlite::ENGINE);
        #[cfg(feature = "postgres")]
        v.push(&dbwarden_postgres::ENGINE);
        #[cfg(feature = "mysql")]
        v.push(&dbwarden_mysql::ENGINE);
        #[cfg(feature = "clickhouse")]
        v.push(&dbwarden_clickhouse::ENGINE);
        #[cfg(feature = "redis")]
        v.push(&dbwarden_redis::ENGINE);
        #[cfg(feature = "etcd")]
        v.push(&dbwarden_etcd::ENGINE);
        Vec::leak(v)
    }))
}

/// Applies embedded migrations: the library form of `dbwarden migrate`.
#[derive(Debug, Clone)]
pub struct Migrator {
    migrations: &'static EmbeddedMigrations,
    layer: Layer,
    events: dbwarden_core::events::Events,
}

impl Migrator {
    pub fn new(migrations: &'static EmbeddedMigrations) -> Self {
        Migrator {
            migrations,
            layer: Layer::new(),
            events: Default::default(),
        }
    }

    /// Any setting of the config file by its key (`namespace`, `lock_ttl`, `recovery_policy`,
    /// `history_table`, ...), validated when the migrator runs, like the command's flags.
    pub fn setting(mut self, key: &str, value: impl Into<String>) -> Self {
        self.layer.insert(key.to_owned(), value.into());
        self
    }

    pub fn database_url(self, url: impl Into<String>) -> Self {
        self.setting("database_url", url)
    }

    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        self.setting("namespace", namespace)
    }

    /// Also hold this lock every runner shares around the run (a lock-only engine's URL, e.g.
    /// the Redis lease replicas take at start-up).
    pub fn lock_url(self, url: impl Into<String>) -> Self {
        self.setting("lock_url", url)
    }

    /// The older name of [`Migrator::lock_url`], for a Redis URL.
    pub fn redis_url(self, url: impl Into<String>) -> Self {
        self.setting("redis_url", url)
    }

    /// How long to wait for a busy lock (default 5 minutes; zero: try once).
    pub fn wait(self, wait: Duration) -> Self {
        self.setting("wait", format!("{}ms", wait.as_millis()))
    }

    /// The owner label `lock-status` shows for this run.
    pub fn owner(self, owner: impl Into<String>) -> Self {
        self.setting("owner", owner)
    }

    /// Hear this run's lock events (a lock broken or lost, a halt for review, a failed
    /// migration) in a sink of the application's; the `hook` setting is the command line's.
    pub fn events(mut self, events: dbwarden_core::events::Events) -> Self {
        self.events = events;
        self
    }

    /// Apply every pending migration, as `dbwarden migrate` would with these settings.
    pub async fn run(&self) -> Result<Outcome, Error> {
        let env = config::env_layer(std::env::vars());
        let mut settings = config::resolve(&[&self.layer, &env])?;
        // The outer lock below is held around the whole run.
        settings.outer_lease = settings.lock_url.is_some();
        let registry = engines();
        let lock = registry.open(&settings)?;
        let dialect = lock.dialect().ok_or_else(|| {
            Error::usage(format!(
                "the {} engine is a lock only and keeps no migration tables: give the database as the URL and Redis as lock_url",
                lock.engine()
            ))
        })?;
        let migrations = self.migrations.load(dialect)?;
        let mut opts = MigrateOptions::from_settings(&settings, lock.default_ttl())?;
        opts.events = self.events.clone().database(&settings.database_url);
        let holder = HolderInfo::current(settings.owner.clone(), "embedded migrate");
        let interrupt = Interrupt::never();
        let outer = registry.open_outer(&settings)?;
        runner::migrate_within(
            outer.as_deref(),
            lock.as_ref(),
            &migrations,
            &holder,
            opts,
            &settings,
            &Silent,
            &interrupt,
        )
        .await
    }

    /// Apply every pending migration to each database of `urls` (database-per-tenant, any
    /// engine), as `dbwarden migrate --targets` does: at most `parallel` at once, each under
    /// its own lock with these settings; a target another runner holds is tried again at the
    /// end, waiting then, so replicas migrating the same tenants share the work; a failing or
    /// unreachable target never stops the others. One report per target, in `urls`' order;
    /// [`core::fleet::exit_code`] folds them into the command's exit code. Every URL is checked
    /// before any target starts (a bad one is an error and nothing runs); a Redis lease is
    /// refused (each target has its own lock).
    pub async fn run_targets<I, S>(
        &self,
        urls: I,
        parallel: usize,
    ) -> Result<Vec<TargetReport>, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let env = config::env_layer(std::env::vars());
        let registry = engines();
        let mut targets = Vec::new();
        let mut loaded: BTreeMap<String, std::sync::Arc<Vec<Migration>>> = BTreeMap::new();
        for url in urls {
            let mut layer = self.layer.clone();
            layer.insert("database_url".into(), url.into());
            let settings = config::resolve(&[&layer, &env])?;
            if settings.lock_url.is_some() {
                return Err(Error::usage(
                    "run_targets runs without an outer lock (each target has its own lock): unset lock_url",
                ));
            }
            let lock = registry.open(&settings)?;
            let dialect = lock.dialect().ok_or_else(|| {
                Error::usage(format!(
                    "the {} engine is a lock only and keeps no migration tables",
                    lock.engine()
                ))
            })?;
            let key = format!("{dialect:?}");
            let migrations = match loaded.get(&key) {
                Some(m) => m.clone(),
                None => {
                    let m = std::sync::Arc::new(self.migrations.load(dialect)?);
                    loaded.insert(key, m.clone());
                    m
                }
            };
            targets.push((settings, migrations));
        }
        let names: Vec<String> = targets
            .iter()
            .map(|(s, _)| dbwarden_core::url::redact(&s.database_url))
            .collect();
        let opts = FleetOptions {
            parallel,
            canary: 0,
            max_failures: None,
        };
        let interrupt = Interrupt::never();
        let reports = fleet::run(&names, &opts, &interrupt, &|_, _| {}, |i, wait| {
            let (settings, migrations) = &targets[i];
            async move {
                let lock = registry.open(settings)?;
                let mut opts = MigrateOptions::from_settings(settings, lock.default_ttl())?;
                opts.events = self.events.clone().database(&settings.database_url);
                let holder = HolderInfo::current(settings.owner.clone(), "embedded migrate");
                let interrupt = Interrupt::never();
                fleet::try_target(lock.as_ref(), migrations, &holder, opts, wait, &interrupt).await
            }
        })
        .await;
        Ok(reports)
    }
}
