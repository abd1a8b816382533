//! Settings: flag > environment (`DATABASE_URL`, `DBWARDEN_*`) > `dbwarden.toml` > default.
//! Every value is validated here, before any connection is made.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Error, HeartbeatConfig, Namespace, RecoveryPolicy, duration};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Duration,
    /// `true`/`false` in TOML, or one of the words a switch takes.
    Switch,
}

/// Every settable key: (name in dbwarden.toml, environment variable, kind).
pub const KEYS: &[(&str, &str, &str)] = &[
    ("database_url", "DATABASE_URL", "string"),
    ("migrations", "DBWARDEN_MIGRATIONS", "string"),
    ("namespace", "DBWARDEN_NAMESPACE", "string"),
    ("owner", "DBWARDEN_OWNER", "string"),
    ("wait", "DBWARDEN_WAIT", "duration"),
    (
        "heartbeat_interval",
        "DBWARDEN_HEARTBEAT_INTERVAL",
        "duration",
    ),
    ("lock_ttl", "DBWARDEN_LOCK_TTL", "duration"),
    ("connect_timeout", "DBWARDEN_CONNECT_TIMEOUT", "duration"),
    (
        "statement_timeout",
        "DBWARDEN_STATEMENT_TIMEOUT",
        "duration",
    ),
    ("busy_timeout", "DBWARDEN_BUSY_TIMEOUT", "duration"),
    ("recovery_policy", "DBWARDEN_RECOVERY_POLICY", "string"),
    ("history_table", "DBWARDEN_HISTORY_TABLE", "string"),
    ("lock_url", "DBWARDEN_LOCK_URL", "string"),
    ("redis_url", "DBWARDEN_REDIS_URL", "string"),
    ("schema", "DBWARDEN_SCHEMA", "string"),
    ("cluster", "DBWARDEN_CLUSTER", "string"),
    ("sqlx_compat", "DBWARDEN_SQLX_COMPAT", "auto|on|off"),
    ("mysql_session", "DBWARDEN_MYSQL_SESSION", "string"),
    (
        "allow_out_of_order",
        "DBWARDEN_ALLOW_OUT_OF_ORDER",
        "true|false",
    ),
    ("lock", "DBWARDEN_LOCK", "advisory|lease"),
    ("lock_timeout", "DBWARDEN_LOCK_TIMEOUT", "duration"),
    ("lock_retries", "DBWARDEN_LOCK_RETRIES", "string"),
    (
        "migration_statement_timeout",
        "DBWARDEN_MIGRATION_STATEMENT_TIMEOUT",
        "duration",
    ),
    ("hook", "DBWARDEN_HOOK", "string"),
    ("hook_timeout", "DBWARDEN_HOOK_TIMEOUT", "duration"),
];

fn kind_of(key: &str) -> Option<Kind> {
    KEYS.iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, _, t)| match *t {
            "duration" => Kind::Duration,
            "auto|on|off" | "true|false" => Kind::Switch,
            _ => Kind::Str,
        })
}

/// The resolved settings of one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub database_url: String,
    pub migrations: PathBuf,
    pub namespace: Namespace,
    pub owner: Option<String>,
    pub wait: Duration,
    pub heartbeat_interval: Duration,
    /// `None`: the engine's default (45 s; 120 s ClickHouse; 60 s Redis).
    pub lock_ttl: Option<Duration>,
    pub connect_timeout: Duration,
    pub statement_timeout: Duration,
    pub busy_timeout: Duration,
    pub recovery_policy: RecoveryPolicy,
    pub history_table: String,
    /// An outer lock every runner shares, held around the whole run (`lock_url`, or its older
    /// name `redis_url`): the URL of a lock-only engine (Redis).
    pub lock_url: Option<String>,
    pub schema: Option<String>,
    pub cluster: Option<String>,
    /// Interoperate with sqlx's migrator (its lock and `_sqlx_migrations`) during a switch.
    pub sqlx_compat: crate::other_tools::SqlxCompatMode,
    /// The MySQL session the migrations run in.
    pub mysql_session: MySqlSession,
    /// Apply a pending migration below the highest applied version (in version order) instead
    /// of refusing the run.
    pub allow_out_of_order: bool,
    /// A command (run with `sh -c`) that hears lock events as one JSON object on stdin.
    pub hook: Option<String>,
    /// How long one hook may run before it is killed (with everything it started).
    pub hook_timeout: Duration,
    /// The primitive the lock is built on, where an engine offers a choice.
    pub lock: LockKind,
    /// How long one migration statement may wait for a table lock before its attempt is
    /// rolled back and retried (0: wait as long as the server lets it).
    pub lock_timeout: Duration,
    /// How many times an attempt that met `lock_timeout` is retried.
    pub lock_retries: u32,
    /// How long one migration statement may run (`None`: as long as it takes).
    pub migration_statement_timeout: Option<Duration>,
    /// Not a setting a user writes: the caller holds a lease every runner shares (the Redis
    /// lease of `migrate --redis-url`) around every use of the lock it opens from these
    /// settings, so a lock that holds on one node only (a Galera node's `GET_LOCK`) may serve
    /// as the inner lock. Only a caller that really takes that lease sets it.
    pub outer_lease: bool,
}

/// `lock`: the engine's native primitive, or a fenced lease in its status table (PostgreSQL
/// behind a transaction pooler, where a session advisory lock is no lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LockKind {
    /// The engine's own primitive (PostgreSQL: a session advisory lock).
    #[default]
    Native,
    /// A lease row with a TTL, a heartbeat and fencing, needing no session state.
    Lease,
}

impl LockKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LockKind::Native => "advisory",
            LockKind::Lease => "lease",
        }
    }

    pub fn parse(v: &str) -> Result<Self, Error> {
        match v.to_ascii_lowercase().as_str() {
            "advisory" | "native" => Ok(LockKind::Native),
            "lease" => Ok(LockKind::Lease),
            _ => Err(Error::usage(format!(
                "invalid lock {v:?}: use advisory (the engine's own lock) or lease (PostgreSQL behind a transaction pooler)"
            ))),
        }
    }
}

/// `mysql_session`: the `sql_mode` and `time_zone` MySQL/MariaDB migrations run with. They are
/// stored with every trigger, procedure and event, and decide what `||` means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MySqlSession {
    /// As sqlx (and so sqlx-cli) sets it: `PIPES_AS_CONCAT` and `NO_ENGINE_SUBSTITUTION` added
    /// to the server's `sql_mode`, `time_zone = '+00:00'`. A folder sqlx-cli ran gives the same
    /// schema.
    #[default]
    Sqlx,
    /// The server's own `sql_mode` and `time_zone`, as the `mysql` client leaves them.
    Server,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            database_url: "sqlite://dbwarden.db".into(),
            migrations: PathBuf::from("migrations"),
            namespace: Namespace::default(),
            owner: None,
            wait: Duration::from_secs(300),
            heartbeat_interval: Duration::from_secs(15),
            lock_ttl: None,
            connect_timeout: Duration::from_secs(10),
            statement_timeout: Duration::from_secs(30),
            busy_timeout: Duration::from_secs(5),
            recovery_policy: RecoveryPolicy::ResumeIdempotent,
            sqlx_compat: crate::other_tools::SqlxCompatMode::Auto,
            mysql_session: MySqlSession::Sqlx,
            allow_out_of_order: false,
            lock: LockKind::Native,
            history_table: "dbwarden_migrations".into(),
            lock_url: None,
            schema: None,
            cluster: None,
            hook: None,
            hook_timeout: Duration::from_secs(10),
            lock_timeout: crate::table_locks::LockRetry::DEFAULT_TIMEOUT,
            lock_retries: crate::table_locks::LockRetry::DEFAULT_RETRIES,
            migration_statement_timeout: None,
            outer_lease: false,
        }
    }
}

impl Settings {
    /// How migration statements meet table locks (`lock_timeout`, `lock_retries`,
    /// `migration_statement_timeout`).
    pub fn lock_retry(&self) -> crate::table_locks::LockRetry {
        crate::table_locks::LockRetry {
            timeout: self.lock_timeout,
            retries: self.lock_retries,
            statement_timeout: self.migration_statement_timeout,
        }
    }

    /// The heartbeat configuration with the engine's default ttl filled in, validated.
    pub fn heartbeat(&self, engine_default_ttl: Duration) -> Result<HeartbeatConfig, Error> {
        let hb = HeartbeatConfig {
            interval: self.heartbeat_interval,
            ttl: self.lock_ttl.unwrap_or(engine_default_ttl),
        };
        hb.validate()?;
        Ok(hb)
    }
}

/// Raw values from one source, by key.
pub type Layer = BTreeMap<String, String>;

/// Read the environment's settings from `vars` (pass `std::env::vars()`).
pub fn env_layer(vars: impl IntoIterator<Item = (String, String)>) -> Layer {
    let vars: BTreeMap<String, String> = vars.into_iter().collect();
    let mut layer = Layer::new();
    for (key, env, _) in KEYS {
        let value = vars.get(*env).or_else(|| {
            (*key == "database_url")
                .then(|| vars.get("DBWARDEN_DATABASE_URL"))
                .flatten()
        });
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            layer.insert((*key).to_owned(), v.clone());
        }
    }
    layer
}

/// Parse a `dbwarden.toml`; unknown keys and wrong types are errors naming the key.
pub fn file_layer(path: &Path, text: &str) -> Result<Layer, Error> {
    let shown = path.display();
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        Error::usage(format!(
            "{shown}: not valid TOML: {}",
            crate::error::one_line(e.message())
        ))
    })?;
    let mut layer = Layer::new();
    for (key, value) in table {
        if key == "exporter" {
            // `dbwarden exporter`'s targets: read (and checked) by [`exporter_targets`].
            exporter_targets_of(path, Some(&value))?;
            continue;
        }
        let Some(kind) = kind_of(&key) else {
            let known: Vec<&str> = KEYS.iter().map(|(k, _, _)| *k).collect();
            return Err(Error::usage(format!(
                "{shown}: unknown key `{key}` (known keys: {})",
                known.join(", ")
            )));
        };
        let raw = match (kind, value) {
            (_, toml::Value::String(s)) => s,
            (Kind::Switch, toml::Value::Boolean(b)) => b.to_string(),
            (Kind::Switch, other) => {
                return Err(Error::usage(format!(
                    "{shown}: `{key}` must be true, false or \"auto\", not a {}",
                    other.type_str()
                )));
            }
            (Kind::Duration, toml::Value::Integer(n)) if n >= 0 => n.to_string(),
            (Kind::Duration, toml::Value::Integer(n)) => {
                return Err(Error::usage(format!(
                    "{shown}: `{key}` = {n}: a duration must be 0 or more (e.g. \"30s\")"
                )));
            }
            (Kind::Duration, other) => {
                return Err(Error::usage(format!(
                    "{shown}: `{key}` must be a duration string like \"30s\" or whole seconds, not a {}",
                    other.type_str()
                )));
            }
            (Kind::Str, other) => {
                return Err(Error::usage(format!(
                    "{shown}: `{key}` must be a string, not a {}",
                    other.type_str()
                )));
            }
        };
        layer.insert(key, raw);
    }
    Ok(layer)
}

/// One database `dbwarden exporter` reads, in one or more namespaces (`[[exporter.targets]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExporterTarget {
    pub database_url: String,
    pub namespaces: Vec<Namespace>,
    /// The folder whose pending, changed and needing-review migrations are counted.
    pub migrations: Option<PathBuf>,
}

/// The `[[exporter.targets]]` of the config file (`explicit`, or `./dbwarden.toml` if present):
///
/// ```toml
/// [[exporter.targets]]
/// database_url = "postgres://app@db1/app"
/// namespaces = ["default", "billing"]   # default ["default"]
/// migrations = "./migrations"           # optional
/// ```
pub fn exporter_targets(explicit: Option<&Path>, cwd: &Path) -> Result<Vec<ExporterTarget>, Error> {
    let path = explicit.map_or_else(|| cwd.join("dbwarden.toml"), Path::to_path_buf);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => {
            return Ok(Vec::new());
        }
        Err(e) => {
            return Err(Error::usage(format!(
                "cannot read config {}: {e}",
                path.display()
            )));
        }
    };
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        Error::usage(format!(
            "{}: not valid TOML: {}",
            path.display(),
            crate::error::one_line(e.message())
        ))
    })?;
    exporter_targets_of(&path, table.get("exporter"))
}

fn exporter_targets_of(
    path: &Path,
    value: Option<&toml::Value>,
) -> Result<Vec<ExporterTarget>, Error> {
    let shown = path.display();
    let bad = |what: String| Error::usage(format!("{shown}: [exporter] {what}"));
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let toml::Value::Table(exporter) = value else {
        return Err(bad("must be a table".into()));
    };
    let mut out = Vec::new();
    for (key, value) in exporter {
        if key != "targets" {
            return Err(bad(format!("unknown key `{key}` (known: targets)")));
        }
        let toml::Value::Array(targets) = value else {
            return Err(bad(
                "`targets` must be an array of tables ([[exporter.targets]])".into(),
            ));
        };
        for (i, t) in targets.iter().enumerate() {
            let toml::Value::Table(t) = t else {
                return Err(bad(format!("target {i} must be a table")));
            };
            let mut url = None;
            let mut namespaces = vec![Namespace::default()];
            let mut migrations = None;
            for (k, v) in t {
                match (k.as_str(), v) {
                    ("database_url", toml::Value::String(s)) => url = Some(s.clone()),
                    ("migrations", toml::Value::String(s)) => migrations = Some(PathBuf::from(s)),
                    ("namespaces", toml::Value::Array(list)) => {
                        namespaces = list
                            .iter()
                            .map(|n| match n {
                                toml::Value::String(s) => Namespace::new(s),
                                _ => Err(bad(format!("target {i}: namespaces are strings"))),
                            })
                            .collect::<Result<_, _>>()?;
                    }
                    _ => {
                        return Err(bad(format!(
                            "target {i}: unknown or mistyped key `{k}` (known: database_url, namespaces, migrations)"
                        )));
                    }
                }
            }
            let database_url = url.ok_or_else(|| bad(format!("target {i} has no database_url")))?;
            if namespaces.is_empty() {
                return Err(bad(format!("target {i}: namespaces is empty")));
            }
            out.push(ExporterTarget {
                database_url,
                namespaces,
                migrations,
            });
        }
    }
    Ok(out)
}

/// Load the config file: `explicit` (must exist) or `./dbwarden.toml` if present.
pub fn load_file(explicit: Option<&Path>, cwd: &Path) -> Result<Layer, Error> {
    let (path, required) = match explicit {
        Some(p) => (p.to_path_buf(), true),
        None => (cwd.join("dbwarden.toml"), false),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => file_layer(&path, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => Ok(Layer::new()),
        Err(e) => Err(Error::usage(format!(
            "cannot read config {}: {e}",
            path.display()
        ))),
    }
}

/// Merge layers (highest precedence first) over the defaults and validate every value.
pub fn resolve(layers: &[&Layer]) -> Result<Settings, Error> {
    let get = |key: &str| layers.iter().find_map(|l| l.get(key)).cloned();
    let dur = |key: &str| -> Result<Option<Duration>, Error> {
        get(key).map(|v| duration::parse(key, &v)).transpose()
    };
    let mut s = Settings::default();
    if let Some(v) = get("database_url") {
        s.database_url = v;
    }
    if let Some(v) = get("migrations") {
        s.migrations = PathBuf::from(v);
    }
    if let Some(v) = get("namespace") {
        s.namespace = Namespace::new(&v)?;
    }
    if let Some(v) = get("owner") {
        if v.is_empty() || v.len() > 200 || v.chars().any(char::is_control) {
            return Err(Error::usage(
                "invalid owner: use 1-200 printable characters",
            ));
        }
        s.owner = Some(v);
    }
    if let Some(v) = dur("wait")? {
        s.wait = v;
    }
    if let Some(v) = dur("heartbeat_interval")? {
        s.heartbeat_interval = v;
    }
    if let Some(v) = dur("lock_ttl")? {
        s.lock_ttl = Some(v);
    }
    for (key, slot) in [
        ("connect_timeout", &mut s.connect_timeout),
        ("statement_timeout", &mut s.statement_timeout),
        ("busy_timeout", &mut s.busy_timeout),
        ("hook_timeout", &mut s.hook_timeout),
    ] {
        if let Some(v) = dur(key)? {
            if v.is_zero() {
                return Err(Error::usage(format!("{key} must be greater than 0")));
            }
            *slot = v;
        }
    }
    if let Some(v) = get("mysql_session") {
        s.mysql_session = match v.as_str() {
            "sqlx" => MySqlSession::Sqlx,
            "server" => MySqlSession::Server,
            _ => {
                return Err(Error::usage(format!(
                    "invalid mysql_session {v:?}: use sqlx (sqlx's sql_mode and time_zone) or server (the server's own)"
                )));
            }
        };
    }
    if let Some(v) = get("allow_out_of_order") {
        s.allow_out_of_order = match v.to_ascii_lowercase().as_str() {
            "true" | "on" | "1" | "yes" => true,
            "false" | "off" | "0" | "no" => false,
            _ => {
                return Err(Error::usage(format!(
                    "invalid allow_out_of_order {v:?}: use true or false"
                )));
            }
        };
    }
    if let Some(v) = get("lock") {
        s.lock = LockKind::parse(&v)?;
    }
    if let Some(v) = dur("lock_timeout")? {
        s.lock_timeout = v;
    }
    if let Some(v) = get("lock_retries") {
        s.lock_retries = v.trim().parse().map_err(|_| {
            Error::usage(format!(
                "invalid lock_retries {v:?}: use a whole number (0 gives up at the first lock timeout)"
            ))
        })?;
    }
    if let Some(v) = dur("migration_statement_timeout")? {
        s.migration_statement_timeout = (!v.is_zero()).then_some(v);
    }
    if let Some(v) = get("sqlx_compat") {
        s.sqlx_compat = crate::other_tools::SqlxCompatMode::parse(&v)?;
    }
    if let Some(v) = get("recovery_policy") {
        s.recovery_policy = RecoveryPolicy::parse(&v)?;
    }
    match get("history_table") {
        Some(v) => {
            validate_identifier("history_table", &v)?;
            s.history_table = v;
        }
        // Namespaces are independent lock streams; each keeps its own history by default.
        None => s.history_table = history_table_for(&s.namespace),
    }
    if let Some(v) = get("schema") {
        validate_identifier("schema", &v)?;
        s.schema = Some(v);
    }
    if let Some(v) = get("cluster") {
        validate_identifier("cluster", &v)?;
        s.cluster = Some(v);
    }
    // `lock_url` and its older name `redis_url` are one setting: the highest layer that sets
    // either decides (a flag beats the environment whichever name each uses); one layer naming
    // two different locks is refused.
    s.lock_url = match layers
        .iter()
        .map(|l| (l.get("lock_url"), l.get("redis_url")))
        .find(|(a, b)| a.is_some() || b.is_some())
    {
        Some((Some(a), Some(b))) if a != b => {
            return Err(Error::usage(format!(
                "lock_url ({}) and redis_url, its older name ({}), name different locks: set one",
                crate::url::redact(a),
                crate::url::redact(b)
            )));
        }
        Some((a, b)) => a.or(b).cloned(),
        None => None,
    };
    // An empty hook (`DBWARDEN_HOOK=` is already skipped) turns hooks off.
    s.hook = get("hook").filter(|h| !h.trim().is_empty());
    // With an explicit ttl the rule is checked here; otherwise against the engine's default
    // ttl (`Settings::heartbeat`) once the URL has named the engine, still before connecting.
    match s.lock_ttl {
        Some(ttl) => HeartbeatConfig {
            interval: s.heartbeat_interval,
            ttl,
        }
        .validate()?,
        None if s.heartbeat_interval.is_zero() => {
            return Err(Error::usage("heartbeat_interval must be greater than 0"));
        }
        None => {}
    }
    Ok(s)
}

/// The default history table of a namespace: `dbwarden_migrations` for `default`, else
/// `dbwarden_migrations_<ns>` (with `.`/`-` mapped to `_` and a short hash where that mapping
/// or the 63-character limit could make two namespaces collide).
pub fn history_table_for(ns: &Namespace) -> String {
    const BASE: &str = "dbwarden_migrations";
    if ns.as_str() == Namespace::DEFAULT {
        return BASE.to_owned();
    }
    let mapped: String = ns
        .as_str()
        .chars()
        .map(|c| if c == '.' || c == '-' { '_' } else { c })
        .collect();
    let plain = format!("{BASE}_{mapped}");
    if mapped == ns.as_str() && plain.len() <= 63 {
        return plain;
    }
    // FNV-1a: stable across versions and platforms, no dependency.
    let hash = ns.as_str().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let keep = 63 - BASE.len() - 2 - 8;
    let head: String = mapped.chars().take(keep).collect();
    format!("{BASE}_{head}_{:08x}", hash as u32)
}

/// An identifier we interpolate into SQL: `^[A-Za-z_][A-Za-z0-9_]{0,62}$`.
pub fn validate_identifier(what: &str, s: &str) -> Result<(), Error> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::usage(format!(
            "invalid {what} {:?}: use letters, digits and _ (up to 63, not starting with a digit)",
            s.chars().take(80).collect::<String>()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(pairs: &[(&str, &str)]) -> Layer {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn exporter_targets_are_read_beside_the_settings_and_checked() {
        let text = "namespace = \"app\"\n\n[[exporter.targets]]\ndatabase_url = \"postgres://h/db\"\nnamespaces = [\"default\", \"billing\"]\nmigrations = \"m\"\n\n[[exporter.targets]]\ndatabase_url = \"sqlite://x.db\"\n";
        let path = Path::new("dbwarden.toml");
        let layer = file_layer(path, text).unwrap();
        assert_eq!(layer.get("namespace").map(String::as_str), Some("app"));
        let table: toml::Table = text.parse().unwrap();
        let targets = exporter_targets_of(path, table.get("exporter")).unwrap();
        assert_eq!(targets.len(), 2);
        assert_eq!(targets[0].namespaces.len(), 2);
        assert_eq!(targets[0].migrations.as_deref(), Some(Path::new("m")));
        assert_eq!(targets[1].namespaces, vec![Namespace::default()]);
        for bad in [
            "[exporter]\ntarget = []\n",
            "[[exporter.targets]]\nnamespaces = [\"a\"]\n",
            "[[exporter.targets]]\ndatabase_url = \"sqlite://x\"\nnamespaces = [\"bad ns\"]\n",
            "[[exporter.targets]]\ndatabase_url = \"sqlite://x\"\nport = 1\n",
        ] {
            let e = file_layer(path, bad).unwrap_err();
            assert_eq!(e.exit_code().code(), 2, "{bad}: {e}");
        }
    }

    #[test]
    fn lock_url_and_its_older_name_redis_url_are_one_setting() {
        let r = "redis://127.0.0.1:6379";
        let s = resolve(&[&layer(&[("lock_url", r)])]).unwrap();
        assert_eq!(s.lock_url.as_deref(), Some(r));
        let env = env_layer([("DBWARDEN_REDIS_URL".to_string(), r.to_string())]);
        assert_eq!(resolve(&[&env]).unwrap().lock_url.as_deref(), Some(r));
        // The same lock under both names is fine; two different ones are refused.
        assert!(resolve(&[&layer(&[("lock_url", r), ("redis_url", r)])]).is_ok());
        let e = resolve(&[&layer(&[
            ("lock_url", r),
            ("redis_url", "redis://:secret@other:6379"),
        ])])
        .unwrap_err();
        assert_eq!(e.exit_code().code(), 2);
        assert!(!e.to_string().contains("secret"), "{e}");
        // A flag under either name beats the environment under the other.
        let flags = layer(&[("lock_url", "redis://flag:6379")]);
        let env = env_layer([("DBWARDEN_REDIS_URL".to_string(), r.to_string())]);
        assert_eq!(
            resolve(&[&flags, &env]).unwrap().lock_url.as_deref(),
            Some("redis://flag:6379")
        );
    }

    #[test]
    fn defaults_are_the_embedded_sqlite() {
        let s = resolve(&[]).unwrap();
        assert_eq!(s.database_url, "sqlite://dbwarden.db");
        assert_eq!(s.migrations, PathBuf::from("migrations"));
        assert_eq!(s.wait, Duration::from_secs(300));
        assert_eq!(s.namespace.as_str(), "default");
    }

    #[test]
    fn flag_beats_env_beats_file() {
        let flags = layer(&[("namespace", "from_flag")]);
        let env = env_layer([
            ("DBWARDEN_NAMESPACE".to_string(), "from_env".to_string()),
            ("DATABASE_URL".to_string(), "sqlite://env.db".to_string()),
        ]);
        let file = file_layer(
            Path::new("dbwarden.toml"),
            "namespace = \"from_file\"\ndatabase_url = \"sqlite://file.db\"\nwait = 7\n",
        )
        .unwrap();
        let s = resolve(&[&flags, &env, &file]).unwrap();
        assert_eq!(s.namespace.as_str(), "from_flag");
        assert_eq!(s.database_url, "sqlite://env.db");
        assert_eq!(s.wait, Duration::from_secs(7));
    }

    #[test]
    fn a_hook_and_its_bound_come_from_every_layer() {
        let s = resolve(&[]).unwrap();
        assert_eq!(s.hook, None);
        assert_eq!(s.hook_timeout, Duration::from_secs(10));
        let env = env_layer([
            ("DBWARDEN_HOOK".to_string(), "notify --env".to_string()),
            ("DBWARDEN_HOOK_TIMEOUT".to_string(), "3s".to_string()),
        ]);
        let file = file_layer(
            Path::new("dbwarden.toml"),
            "hook = \"notify --file\"\nhook_timeout = 20\n",
        )
        .unwrap();
        let s = resolve(&[&env, &file]).unwrap();
        assert_eq!(s.hook.as_deref(), Some("notify --env"));
        assert_eq!(s.hook_timeout, Duration::from_secs(3));
        let flags = layer(&[("hook", "notify --flag")]);
        let s = resolve(&[&flags, &env, &file]).unwrap();
        assert_eq!(s.hook.as_deref(), Some("notify --flag"));
        let s = resolve(&[&file]).unwrap();
        assert_eq!(s.hook_timeout, Duration::from_secs(20));
        // A blank hook is no hook.
        let s = resolve(&[&layer(&[("hook", "  ")])]).unwrap();
        assert_eq!(s.hook, None);
    }

    #[test]
    fn file_errors_name_the_key() {
        let p = Path::new("dbwarden.toml");
        let e = file_layer(p, "databse_url = \"x\"").unwrap_err();
        assert!(e.to_string().contains("unknown key `databse_url`"), "{e}");
        let e = file_layer(p, "namespace = 5").unwrap_err();
        assert!(
            e.to_string().contains("`namespace` must be a string"),
            "{e}"
        );
        let e = file_layer(p, "lock_ttl = -5").unwrap_err();
        assert!(e.to_string().contains("lock_ttl"), "{e}");
        let e = file_layer(p, "wait = [1]").unwrap_err();
        assert!(e.to_string().contains("`wait`"), "{e}");
        assert!(file_layer(p, "= broken").is_err());
    }

    #[test]
    fn each_namespace_has_its_own_history_table() {
        let t = |ns: &str| history_table_for(&Namespace::new(ns).unwrap());
        assert_eq!(t("default"), "dbwarden_migrations");
        assert_eq!(t("billing"), "dbwarden_migrations_billing");
        assert_ne!(t("a.b"), t("a_b"));
        assert_ne!(t("a-b"), t("a.b"));
        let long = "x".repeat(64);
        assert!(t(&long).len() <= 63);
        assert_ne!(t(&long), t(&format!("{}y", "x".repeat(63))));
        for ns in ["a.b", "a-b", &long] {
            assert!(validate_identifier("t", &t(ns)).is_ok(), "{}", t(ns));
        }
        let s = resolve(&[&layer(&[("namespace", "billing")])]).unwrap();
        assert_eq!(s.history_table, "dbwarden_migrations_billing");
        let s = resolve(&[&layer(&[
            ("namespace", "billing"),
            ("history_table", "mine"),
        ])])
        .unwrap();
        assert_eq!(s.history_table, "mine");
    }

    #[test]
    fn the_heartbeat_rule_uses_the_engines_ttl_when_none_is_set() {
        // 30s is fine against ClickHouse's 120s default, not against SQLite's 45s.
        let s = resolve(&[&layer(&[("heartbeat_interval", "30s")])]).unwrap();
        assert!(s.heartbeat(Duration::from_secs(120)).is_ok());
        assert!(s.heartbeat(Duration::from_secs(45)).is_err());
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for bad in [
            layer(&[("namespace", "a;DROP TABLE x")]),
            layer(&[("lock_ttl", "0")]),
            layer(&[("heartbeat_interval", "20s"), ("lock_ttl", "45s")]),
            layer(&[("recovery_policy", "yolo")]),
            layer(&[("history_table", "x; drop")]),
            layer(&[("wait", "soon")]),
            layer(&[("hook_timeout", "0")]),
            layer(&[("hook_timeout", "forever")]),
        ] {
            let e = resolve(&[&bad]).unwrap_err();
            assert_eq!(e.exit_code().code(), 2, "{bad:?}");
        }
    }
}
