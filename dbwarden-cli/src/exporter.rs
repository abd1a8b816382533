//! `dbwarden exporter`: the lock's metrics on `/metrics` for Prometheus, for one target (the
//! usual `-u`, `--namespace`, `--migrations`) or many (`[[exporter.targets]]` in the config
//! file, each database in one or more namespaces). Every scrape reads every target at once,
//! each within `connect_timeout + statement_timeout` and within the scrape's own timeout (the
//! `X-Prometheus-Scrape-Timeout-Seconds` Prometheus sends, 10 s without it, less half a
//! second to write the page): a target that does not answer in time is `dbwarden_up 0` and
//! counts in `dbwarden_exporter_scrape_errors_total`, and the page still arrives in time for
//! every other target. The locks are kept between scrapes (an engine that opens a connection
//! per read still does so at each scrape). Labels carry the redacted URL: a password never
//! reaches a page.
//!
//! The HTTP side is deliberately small: `GET /metrics` (and `/` saying where the metrics are),
//! one request per connection, a bounded request head.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dbwarden_core::config::{self, Settings};
use dbwarden_core::survey::{self, Entry};
use dbwarden_core::{Error, ExitCode, HistoryRow, MigrationLock, Observation, Verdict, migration};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::cli::ExporterArgs;
use crate::common::{LockReading, layer, put, read_lock, settings};
use crate::engines;
use crate::metrics::{Exposition, Target};

/// One database × namespace the exporter reads.
struct Probe {
    settings: Settings,
    lock: Box<dyn MigrationLock>,
    /// The database as labels show it (redacted).
    database: String,
    /// The folder to set beside the history, if one is given (or `./migrations` exists).
    migrations: Option<PathBuf>,
    errors: AtomicU64,
}

/// What one read of a target found.
struct Reading {
    obs: Observation,
    verdict: Verdict,
    ttl: Duration,
    history: Option<Vec<HistoryRow>>,
    entries: Option<Vec<Entry>>,
}

impl Probe {
    fn new(settings: Settings, migrations: Option<PathBuf>) -> Result<Probe, Error> {
        let lock = engines::open(&settings)?;
        Ok(Probe {
            database: dbwarden_core::url::redact(&settings.database_url),
            settings,
            lock,
            migrations,
            errors: AtomicU64::new(0),
        })
    }

    fn target(&self) -> Target<'_> {
        Target {
            engine: self.lock.engine(),
            namespace: self.settings.namespace.as_str(),
            database: &self.database,
        }
    }

    /// One read, bounded: the lock's state, and where the engine keeps a history, the history
    /// and the folder beside it.
    async fn read(&self, within: Duration) -> Result<Reading, Error> {
        let bound = (self.settings.connect_timeout + self.settings.statement_timeout).min(within);
        let read = async {
            let lock = self.lock.as_ref();
            let fallback = self.settings.lock_ttl.unwrap_or(lock.default_ttl());
            let LockReading {
                obs, ttl, verdict, ..
            } = read_lock(lock, fallback).await?;
            let (history, entries) = match lock.dialect() {
                None => (None, None),
                Some(dialect) => {
                    let history = lock.read_history().await?;
                    let entries = match &self.migrations {
                        Some(dir) => {
                            let files = migration::load_dir(dir, dialect)?;
                            Some(survey::survey(
                                &files,
                                &history,
                                survey::halted_version(&obs),
                            ))
                        }
                        None => None,
                    };
                    (Some(history), entries)
                }
            };
            Ok(Reading {
                obs,
                verdict,
                ttl,
                history,
                entries,
            })
        };
        match tokio::time::timeout(bound, read).await {
            Ok(r) => r,
            Err(_) => Err(Error::unreachable(
                self.database.clone(),
                format!(
                    "no answer within {} (connect_timeout + statement_timeout, or the scrape's timeout)",
                    dbwarden_core::duration::human(bound)
                ),
            )),
        }
    }
}

/// The probes: one per configured database × namespace, or the command line's one target.
fn probes(a: &ExporterArgs) -> Result<Vec<Probe>, Error> {
    let mut flags = layer(&a.common);
    put(&mut flags, "migrations", &a.migrations);
    let base = settings(&a.common, flags)?;
    let cwd = std::env::current_dir()
        .map_err(|e| Error::usage(format!("cannot read the current directory: {e}")))?;
    let configured = config::exporter_targets(a.common.config.as_deref(), &cwd)?;
    if configured.is_empty() {
        // The folder is counted when it was asked for, or when the default one is there.
        let migrations =
            (a.migrations.is_some() || base.migrations.is_dir()).then(|| base.migrations.clone());
        return Ok(vec![Probe::new(base, migrations)?]);
    }
    let mut out = Vec::new();
    for t in configured {
        for ns in &t.namespaces {
            let mut s = base.clone();
            s.database_url.clone_from(&t.database_url);
            s.namespace = ns.clone();
            let p = Probe::new(s, t.migrations.clone())?;
            // Two probes with the same labels would give the same series twice, and Prometheus
            // rejects the whole scrape. URLs that differ only in their password count as one.
            if let Some(q) = out.iter().find(|q: &&Probe| {
                let (a, b) = (q.target(), p.target());
                (a.engine, a.namespace, a.database) == (b.engine, b.namespace, b.database)
            }) {
                return Err(Error::usage(format!(
                    "[[exporter.targets]]: {} namespace {:?} is listed twice (its series would collide); list each database and namespace once",
                    q.database,
                    q.settings.namespace.as_str()
                )));
            }
            out.push(p);
        }
    }
    Ok(out)
}

/// Read every target at once, each within `within`, and write the exposition.
async fn scrape(probes: &Arc<Vec<Probe>>, within: Duration) -> String {
    let mut reads = tokio::task::JoinSet::new();
    for i in 0..probes.len() {
        let probes = probes.clone();
        reads.spawn(async move {
            let started = Instant::now();
            let r = probes[i].read(within).await;
            (i, r, started.elapsed())
        });
    }
    let mut results: Vec<Option<(Result<Reading, Error>, Duration)>> =
        (0..probes.len()).map(|_| None).collect();
    while let Some(done) = reads.join_next().await {
        if let Ok((i, r, took)) = done {
            results[i] = Some((r, took));
        }
    }
    let mut e = Exposition::default();
    for (p, result) in probes.iter().zip(results) {
        let t = p.target();
        match result {
            Some((Ok(r), took)) => {
                e.up(&t, true, took);
                e.lock(&t, &r.obs, r.verdict, r.ttl);
                if let Some(entries) = &r.entries {
                    e.migrations(&t, entries);
                }
                if let Some(history) = &r.history {
                    e.last_run(&t, history);
                }
            }
            Some((Err(err), took)) => {
                p.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    target_database = %p.database,
                    namespace = %p.settings.namespace,
                    "scrape failed: {}",
                    dbwarden_core::error::one_line(&err.to_string())
                );
                e.up(&t, false, took);
            }
            None => {
                p.errors.fetch_add(1, Ordering::Relaxed);
                e.up(&t, false, Duration::ZERO);
            }
        }
        e.scrape_errors(&t, p.errors.load(Ordering::Relaxed));
    }
    e.render_text()
}

/// How long a scrape may take when the scraper does not say (Prometheus's default).
const DEFAULT_SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// The head of one HTTP request: its request line, and the scrape timeout Prometheus sent
/// (`X-Prometheus-Scrape-Timeout-Seconds`), read within 5 s, at most 16 KiB.
async fn request_head(sock: &mut TcpStream) -> Option<(String, Option<Duration>)> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let ended =
        |h: &[u8]| h.windows(4).any(|w| w == b"\r\n\r\n") || h.windows(2).any(|w| w == b"\n\n");
    let read = async {
        while !ended(&head) && head.len() < 16 * 1024 {
            let n = sock.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Some(())
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .ok()??;
    let text = String::from_utf8_lossy(&head);
    let line = text.lines().next()?.to_owned();
    let timeout = text.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("x-prometheus-scrape-timeout-seconds")
            .then(|| value.trim().parse::<f64>().ok())
            .flatten()
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(Duration::from_secs_f64)
    });
    Some((line, timeout))
}

async fn handle(mut sock: TcpStream, probes: Arc<Vec<Probe>>) {
    let Some((line, scrape_timeout)) = request_head(&mut sock).await else {
        return;
    };
    // Leave half a second of the scrape's time to write the page.
    let within = scrape_timeout
        .unwrap_or(DEFAULT_SCRAPE_TIMEOUT)
        .saturating_sub(Duration::from_millis(500))
        .max(Duration::from_millis(100));
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, kind, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            scrape(&probes, within).await,
        ),
        ("GET", "/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            "dbwarden exporter: the metrics are at /metrics\n".to_owned(),
        ),
        ("GET", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET\n".to_owned(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ =
        tokio::time::timeout(Duration::from_secs(10), sock.write_all(response.as_bytes())).await;
    let _ = sock.shutdown().await;
}

/// `dbwarden exporter`: serve until SIGINT/SIGTERM (exit 0). A bad target or an address that
/// cannot be bound is a usage error before anything is served (exit 2).
pub async fn serve(a: ExporterArgs) -> Result<ExitCode, Error> {
    let probes = Arc::new(probes(&a)?);
    let listener = TcpListener::bind(&a.listen)
        .await
        .map_err(|e| Error::usage(format!("cannot listen on {}: {e}", a.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::usage(format!("cannot listen on {}: {e}", a.listen)))?;
    eprintln!(
        "dbwarden: exporter serving http://{addr}/metrics for {} target(s)",
        probes.len()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Error::usage(format!("cannot watch for SIGTERM: {e}")))?;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((sock, _)) = accepted {
                    tokio::spawn(handle(sock, probes.clone()));
                }
            }
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::OK),
            _ = term.recv() => return Ok(ExitCode::OK),
        }
    }
}
