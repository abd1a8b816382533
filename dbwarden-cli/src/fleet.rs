//! `dbwarden migrate --targets FILE`: one run over many databases, schemas or namespaces, in
//! this one process (the order of work is `dbwarden_core::fleet`'s). Every target is checked
//! before any starts: a bad line, URL, folder or duplicate is a usage error with nothing
//! written.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use dbwarden_core::fleet::{self, FleetOptions, TargetOutcome, TargetReport};
use dbwarden_core::migration::{self, Migration};
use dbwarden_core::runner::MigrateOptions;
use dbwarden_core::{Error, ExitCode, HolderInfo, Namespace};

use crate::cli::{MigrateArgs, StatusArgs};
use crate::common::{interrupt_on_signals, read_lock, settings};
use crate::engines;

/// One target as the file names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Spec {
    name: Option<String>,
    database_url: String,
    namespace: Option<String>,
    schema: Option<String>,
    migrations: Option<PathBuf>,
}

/// The targets of `text` (from `source`, for messages): TOML with `[[targets]]` tables
/// (`database_url`, optional `name`, `namespace`, `schema`, `migrations`), or one URL per line
/// (blank lines and `#` comments skipped).
fn parse(source: &str, text: &str) -> Result<Vec<Spec>, Error> {
    let bad = |what: String| Error::usage(format!("--targets {source}: {what}"));
    let toml_shaped = text
        .lines()
        .any(|l| l.trim_start().starts_with("[[targets]]"));
    let specs = if toml_shaped {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            bad(format!(
                "not valid TOML: {}",
                dbwarden_core::error::one_line(e.message())
            ))
        })?;
        let mut specs = Vec::new();
        for (key, value) in &table {
            let toml::Value::Array(list) = value else {
                return Err(bad(format!("`{key}` must be [[targets]] tables")));
            };
            if key != "targets" {
                return Err(bad(format!("unknown key `{key}` (known: targets)")));
            }
            for (i, t) in list.iter().enumerate() {
                let toml::Value::Table(t) = t else {
                    return Err(bad(format!("target {} must be a table", i + 1)));
                };
                let mut s = Spec {
                    name: None,
                    database_url: String::new(),
                    namespace: None,
                    schema: None,
                    migrations: None,
                };
                for (k, v) in t {
                    let toml::Value::String(v) = v else {
                        return Err(bad(format!("target {}: `{k}` must be a string", i + 1)));
                    };
                    match k.as_str() {
                        "database_url" => s.database_url.clone_from(v),
                        "name" => s.name = Some(v.clone()),
                        "namespace" => s.namespace = Some(v.clone()),
                        "schema" => s.schema = Some(v.clone()),
                        "migrations" => s.migrations = Some(PathBuf::from(v)),
                        _ => {
                            return Err(bad(format!(
                                "target {}: unknown key `{k}` (known: database_url, name, namespace, schema, migrations)",
                                i + 1
                            )));
                        }
                    }
                }
                if s.database_url.is_empty() {
                    return Err(bad(format!("target {} has no database_url", i + 1)));
                }
                specs.push(s);
            }
        }
        specs
    } else {
        let mut specs = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let url = line.trim();
            if url.is_empty() || url.starts_with('#') {
                continue;
            }
            if !url.contains(':') || url.contains(char::is_whitespace) {
                return Err(bad(format!(
                    "line {}: not a database URL: {}",
                    n + 1,
                    dbwarden_core::url::redact(url)
                )));
            }
            specs.push(Spec {
                name: None,
                database_url: url.to_owned(),
                namespace: None,
                schema: None,
                migrations: None,
            });
        }
        specs
    };
    if specs.is_empty() {
        return Err(bad("no targets in it".into()));
    }
    Ok(specs)
}

/// A SQLite target whose file name holds `*` (`sqlite://tenants/*.db`): one target per
/// matching file, in name order, named after the file (under the target's `name`, if it has
/// one). SQLite's own files beside a database (`-wal`, `-shm`, `-journal`) and dbwarden's
/// sidecars never match. Any other target is kept as it is.
fn expand(spec: Spec, source: &str) -> Result<Vec<Spec>, Error> {
    let url = spec.database_url.clone();
    let Some((scheme, rest)) = ["sqlite://", "sqlite:"]
        .into_iter()
        .find_map(|p| url.strip_prefix(p).map(|r| (p, r)))
    else {
        return Ok(vec![spec]);
    };
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, format!("?{q}")),
        None => (rest, String::new()),
    };
    if !path.contains('*') {
        return Ok(vec![spec]);
    }
    let bad = |what: String| Error::usage(format!("--targets {source}: {url}: {what}"));
    let (dir, pattern) = match path.rsplit_once('/') {
        Some((d, p)) => (if d.is_empty() { "/" } else { d }, p),
        None => (".", path),
    };
    if dir.contains('*') {
        return Err(bad("only the file name may hold `*`".into()));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| bad(format!("cannot list {dir}: {e}")))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            !n.contains(".dbwarden-")
                && !["-wal", "-shm", "-journal"].iter().any(|x| n.ends_with(x))
        })
        .filter(|n| wildcard(pattern, n))
        .collect();
    names.sort();
    if names.is_empty() {
        return Err(bad("matches no file".into()));
    }
    let sep = if dir.ends_with('/') { "" } else { "/" };
    Ok(names
        .into_iter()
        .map(|n| {
            let file = if path.contains('/') {
                format!("{dir}{sep}{n}")
            } else {
                n.clone()
            };
            Spec {
                name: Some(match &spec.name {
                    Some(prefix) => format!("{prefix}/{n}"),
                    None => file.clone(),
                }),
                database_url: format!("{scheme}{file}{query}"),
                ..spec.clone()
            }
        })
        .collect())
}

/// `name` matches `pattern`, where `*` stands for any run of characters.
fn wildcard(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.len() >= part.len() && rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// Read `--targets`: a file, or standard input for `-`.
fn read(path: &str) -> Result<String, Error> {
    if path == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| Error::usage(format!("--targets -: cannot read standard input: {e}")))?;
        return Ok(text);
    }
    std::fs::read_to_string(path)
        .map_err(|e| Error::usage(format!("--targets {path}: cannot read it: {e}")))
}

/// One target, ready to run.
pub(crate) struct Target {
    pub name: String,
    pub settings: dbwarden_core::config::Settings,
    pub migrations: Arc<Vec<Migration>>,
}

/// Every target of the file at `path`, over the settings `base`, each checked (its URL opened
/// without connecting, its folder read when `with_migrations`) before any runs.
pub(crate) fn load(
    path: &str,
    base: &dbwarden_core::config::Settings,
    with_migrations: bool,
) -> Result<Vec<Target>, Error> {
    let mut specs = Vec::new();
    for spec in parse(path, &read(path)?)? {
        specs.extend(expand(spec, path)?);
    }
    let mut targets = Vec::with_capacity(specs.len());
    let mut loaded: HashMap<(PathBuf, String), Arc<Vec<Migration>>> = HashMap::new();
    let mut seen = HashMap::new();
    for (i, spec) in specs.iter().enumerate() {
        let mut s = base.clone();
        s.database_url.clone_from(&spec.database_url);
        if let Some(ns) = &spec.namespace {
            s.namespace = Namespace::new(ns)
                .map_err(|e| Error::usage(format!("--targets {path}: target {}: {e}", i + 1)))?;
        }
        if spec.schema.is_some() {
            s.schema.clone_from(&spec.schema);
        }
        if let Some(m) = &spec.migrations {
            s.migrations.clone_from(m);
        }
        let shown = dbwarden_core::url::redact(&s.database_url);
        let name = spec.name.clone().unwrap_or_else(|| {
            let mut n = shown.clone();
            if let Some(schema) = &s.schema {
                n.push_str(&format!(" schema {schema}"));
            }
            if s.namespace != Namespace::default() {
                n.push_str(&format!(" namespace {}", s.namespace.as_str()));
            }
            n
        });
        let key = (
            shown.clone(),
            s.schema.clone(),
            s.namespace.as_str().to_owned(),
        );
        if let Some(first) = seen.insert(key, i) {
            return Err(Error::usage(format!(
                "--targets {path}: targets {} and {} are the same database, schema and namespace ({name}); list each once",
                first + 1,
                i + 1
            )));
        }
        // Opening checks the URL and settings without connecting.
        let lock = engines::open(&s)?;
        let dialect = engines::migration_dialect(lock.as_ref(), &s)?;
        let folder_key = (s.migrations.clone(), format!("{dialect:?}"));
        let migrations = match loaded.get(&folder_key) {
            _ if !with_migrations => Arc::default(),
            Some(m) => m.clone(),
            None => {
                let m = Arc::new(migration::load_dir_with_downs(
                    &s.migrations,
                    dialect,
                    false,
                )?);
                loaded.insert(folder_key, m.clone());
                m
            }
        };
        targets.push(Target {
            name,
            settings: s,
            migrations,
        });
    }
    Ok(targets)
}

pub async fn migrate(a: MigrateArgs, path: &str) -> Result<ExitCode, Error> {
    let base = settings(&a.common, crate::common::migrate_flags(&a))?;
    if base.hook.is_some() || base.lock_url.is_some() {
        return Err(Error::usage(
            "--targets runs without hooks and without an outer lock (each target has its own lock): unset hook / lock_url for a fleet run",
        ));
    }
    let targets = load(path, &base, true)?;
    let opts = FleetOptions {
        parallel: usize::from(a.parallel.unwrap_or(8)),
        canary: a.canary.unwrap_or(0),
        max_failures: a.max_failures.map(|f| f as usize),
    };
    let total = targets.len();
    let names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
    let interrupt = interrupt_on_signals();
    let started = std::time::Instant::now();
    let progress = crate::progress::Progress::new(total);
    let ticker = {
        let p = progress.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                p.tick();
            }
        })
    };
    let line = |r: &TargetReport, ended: usize| progress.ended(r, ended);
    let reports = fleet::run(&names, &opts, &interrupt, &line, |i, wait| {
        let t = &targets[i];
        let interrupt = interrupt.clone();
        let running = progress.start();
        async move {
            let _running = running;
            let lock = engines::open(&t.settings)?;
            let mut run = MigrateOptions::from_settings(&t.settings, lock.default_ttl())?;
            run.allow_changed = a.allow_changed;
            run.to = a.to;
            let holder =
                HolderInfo::current(t.settings.owner.clone(), "dbwarden migrate --targets");
            fleet::try_target(lock.as_ref(), &t.migrations, &holder, run, wait, &interrupt).await
        }
    })
    .await;
    ticker.abort();
    progress.finish();
    let count =
        |f: &dyn Fn(&TargetOutcome) -> bool| reports.iter().filter(|r| f(&r.outcome)).count();
    let applied = count(&|o| matches!(o, TargetOutcome::Applied { applied, .. } if *applied > 0));
    let current = count(&|o| matches!(o, TargetOutcome::Applied { applied: 0, .. }));
    let failed: Vec<&TargetReport> = reports
        .iter()
        .filter(|r| matches!(r.outcome, TargetOutcome::Failed { .. }))
        .collect();
    let not_started = count(&|o| matches!(o, TargetOutcome::NotStarted { .. }));
    let code = fleet::exit_code(&reports);
    eprintln!(
        "dbwarden: {total} target(s): {applied} migrated, {current} up to date, {} failed, {not_started} not started, in {}; exit {}",
        failed.len(),
        dbwarden_core::duration::human(started.elapsed()),
        code.code()
    );
    for r in &failed {
        if let TargetOutcome::Failed { exit_code, error } = &r.outcome {
            eprintln!("dbwarden:   failed: {} (exit {exit_code}): {error}", r.name);
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "outcome": "fleet",
                "exit_code": code.code(),
                "targets": reports,
            })
        );
    }
    Ok(code)
}

/// `lock-status --targets FILE`: every target's lock read (at most `--parallel` at once), one
/// line each in the file's order, the verdicts counted, and the most severe as the exit code
/// (`fleet::worst_look`); `--json`, one object with every target's reading.
pub async fn lock_status(a: &StatusArgs, path: &str) -> Result<ExitCode, Error> {
    let json = a.json || a.format.as_deref() == Some("json");
    if a.format.as_deref() == Some("openmetrics") {
        return Err(Error::usage(
            "--targets with --format openmetrics: the exporter serves many targets (`dbwarden exporter`, [[exporter.targets]])",
        ));
    }
    let base = settings(&a.common, crate::common::layer(&a.common))?;
    let targets = load(path, &base, false)?;
    let parallel = usize::from(a.parallel.unwrap_or(8));
    let readings = fleet::each(targets.len(), parallel, |i| {
        let t = &targets[i];
        async move {
            let lock = engines::open(&t.settings)?;
            let fallback = t.settings.lock_ttl.unwrap_or(lock.default_ttl());
            read_lock(lock.as_ref(), fallback).await
        }
    })
    .await;
    let codes: Vec<ExitCode> = readings
        .iter()
        .map(|r| match r {
            Ok(r) => r.verdict.exit_code(),
            Err(e) => e.exit_code(),
        })
        .collect();
    let code = fleet::worst_look(&codes);
    if json {
        let ok = |r: &crate::common::LockReading| {
            let mut v = crate::output::status_json(&r.obs, r.verdict, r.ttl);
            v["shared_holders"] = serde_json::to_value(&r.shared).unwrap_or_default();
            v
        };
        print_json(
            &targets,
            &readings,
            code,
            ok,
            serde_json::json!({"verdict": null}),
        );
        return Ok(code);
    }
    let mut counts: Vec<(String, usize)> = Vec::new();
    let mut steps: Vec<&'static str> = Vec::new();
    for (t, r) in targets.iter().zip(&readings) {
        let (what, line) = match r {
            Ok(r) => {
                let holder = r
                    .obs
                    .holder
                    .as_ref()
                    .map(|h| format!(" (holder host={} pid={} owner={})", h.host, h.pid, h.owner))
                    .unwrap_or_default();
                if r.verdict.exit_code() != ExitCode::OK && !steps.contains(&r.verdict.next_step())
                {
                    steps.push(r.verdict.next_step());
                }
                let v = r.verdict.as_str();
                (v.to_owned(), format!("{v}{holder}"))
            }
            Err(e) => (
                "unreadable".to_owned(),
                format!(
                    "cannot read it (exit {}): {}",
                    e.exit_code().code(),
                    dbwarden_core::error::one_line(&e.to_string())
                ),
            ),
        };
        println!("{}: {line}", t.name);
        match counts.iter_mut().find(|(k, _)| *k == what) {
            Some((_, n)) => *n += 1,
            None => counts.push((what, 1)),
        }
    }
    let counted: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    println!(
        "{} target(s): {}; exit {}",
        targets.len(),
        counted.join(", "),
        code.code()
    );
    for step in steps {
        println!("  next: {step}");
    }
    Ok(code)
}

/// `--json` over targets: one object with the exit code and every target's object in the
/// file's order, named; a target that could not be read is its exit code and error on `failed`.
pub(crate) fn print_json<R>(
    targets: &[Target],
    results: &[Result<R, Error>],
    code: ExitCode,
    ok: impl Fn(&R) -> serde_json::Value,
    failed: serde_json::Value,
) {
    let each: Vec<serde_json::Value> = targets
        .iter()
        .zip(results)
        .map(|(t, r)| {
            let mut v = match r {
                Ok(r) => ok(r),
                Err(e) => {
                    let mut v = failed.clone();
                    v["exit_code"] = e.exit_code().code().into();
                    v["error"] = dbwarden_core::error::one_line(&e.to_string()).into();
                    v
                }
            };
            v["name"] = t.name.clone().into();
            v
        })
        .collect();
    println!(
        "{}",
        serde_json::json!({"exit_code": code.code(), "targets": each})
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_of_urls_and_a_toml_file_give_the_same_shape() {
        let list = parse("f", "# tenants\npostgres://h/a\n\n  postgres://h/b  \n").unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[1].database_url, "postgres://h/b");
        let toml = parse(
            "f",
            "[[targets]]\ndatabase_url = \"postgres://h/a\"\nschema = \"t1\"\nname = \"acme\"\n",
        )
        .unwrap();
        assert_eq!(toml[0].schema.as_deref(), Some("t1"));
        assert_eq!(toml[0].name.as_deref(), Some("acme"));
    }

    #[test]
    fn a_star_matches_any_run_of_characters() {
        for (p, n, want) in [
            ("*.db", "acme.db", true),
            ("*.db", "acme.db-wal", false),
            ("t-*.db", "t-1.db", true),
            ("t-*.db", "x-1.db", false),
            ("*", "anything", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
            ("*.db", ".db", true),
        ] {
            assert_eq!(wildcard(p, n), want, "{p} ~ {n}");
        }
    }

    #[test]
    fn bad_files_are_one_line_usage_errors() {
        for (text, says) in [
            ("", "no targets"),
            ("postgres://h/a\nnot a url\n", "line 2"),
            ("[[targets]]\nname = \"x\"\n", "no database_url"),
            (
                "[[targets]]\ndatabase_url = \"p://h\"\nport = \"1\"\n",
                "unknown key `port`",
            ),
            ("[[targets]]\ndatabase_url = 5\n", "must be a string"),
        ] {
            let e = parse("f", text).unwrap_err();
            assert_eq!(e.exit_code().code(), 2, "{text}");
            assert!(e.to_string().contains(says), "{text}: {e}");
            assert!(!e.to_string().contains('\n'));
        }
    }
}
