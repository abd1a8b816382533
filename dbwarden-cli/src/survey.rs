//! `status`, `validate` and `wait`: the folder beside the history, read without the lock.

use std::fmt::Write as _;
use std::time::Duration;

use dbwarden_core::config::Settings;
use dbwarden_core::migration::{self, Migration};
use dbwarden_core::survey::{self, Entry, Rules, Standing, WaitOutcome};
use dbwarden_core::{Error, ExitCode, MigrationLock, Verdict, adopt, fleet, verdict};

use crate::cli::{SurveyArgs, ValidateArgs, WaitArgs};
use crate::common::{layer, put, settings};
use crate::engines;

/// What `status` and `validate` print: the migrations, the problems, the lock's verdict.
struct Report {
    entries: Vec<Entry>,
    problems: Vec<String>,
    verdict: Verdict,
    next_step: &'static str,
    fencing_token: Option<u64>,
    held: bool,
    namespace: String,
    engine: &'static str,
    /// Another tool migrated this database and dbwarden has not adopted it.
    unadopted: Option<String>,
}

impl Report {
    /// `validate`'s exit code: NEEDS_REVIEW first (lock-status's code), then any disagreement.
    fn exit_code(&self) -> ExitCode {
        let review = self.verdict == Verdict::NeedsReview
            || self
                .entries
                .iter()
                .any(|e| e.standing == Standing::NeedsReview);
        if review {
            ExitCode::NEEDS_REVIEW
        } else if !self.problems.is_empty() {
            ExitCode::INVALID
        } else {
            ExitCode::OK
        }
    }

    fn json(&self) -> serde_json::Value {
        let mut counts = serde_json::Map::new();
        for s in Standing::ALL {
            let n = self.entries.iter().filter(|e| e.standing == s).count();
            counts.insert(s.as_str().into(), n.into());
        }
        serde_json::json!({
            "namespace": self.namespace,
            "engine": self.engine,
            "valid": self.problems.is_empty() && self.exit_code() == ExitCode::OK,
            "exit_code": self.exit_code().code(),
            "counts": counts,
            "migrations": self.entries,
            "problems": self.problems,
            "unadopted": self.unadopted,
            "lock": {
                "verdict": self.verdict.as_str(),
                "held": self.held,
                "fencing_token": self.fencing_token,
                "next_step": self.next_step,
            },
        })
    }

    fn human(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:>8}  {:<12}  {:<20}  {:>9}  {:>6}  description",
            "version", "standing", "applied at", "duration", "token"
        );
        for e in &self.entries {
            let _ = writeln!(
                s,
                "{:>8}  {:<12}  {:<20}  {:>9}  {:>6}  {}",
                e.version,
                e.standing.as_str(),
                e.finished_at
                    .filter(|_| e.history_state == Some(dbwarden_core::HistoryState::Applied))
                    .map_or("-".into(), |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string()),
                e.duration_ms.map_or("-".into(), |d| {
                    dbwarden_core::duration::human(Duration::from_millis(d.max(0) as u64))
                }),
                e.fencing_token.map_or("-".into(), |t| t.to_string()),
                e.description
            );
        }
        if self.entries.is_empty() {
            s.push_str("(no migration files and no history)\n");
        }
        let _ = writeln!(
            s,
            "lock: {} in namespace {} ({}){}; {}",
            self.verdict.as_str(),
            self.namespace,
            self.engine,
            self.fencing_token
                .map_or(String::new(), |t| format!(", fencing token {t}")),
            self.next_step
        );
        for p in &self.problems {
            let _ = writeln!(s, "problem: {p}");
        }
        s
    }
}

/// `status` / `validate` with `--targets FILE`: every target surveyed (at most `--parallel` at
/// once, no lock taken), one line each in the file's order, then a summary. `status` exits 0
/// once every target was read; `validate` with the most severe target's code (NEEDS_REVIEW,
/// then INVALID); a target that could not be read counts with its own code (2: unreachable).
async fn over_targets(
    a: &SurveyArgs,
    path: &str,
    validating: bool,
    rules: Rules,
) -> Result<ExitCode, Error> {
    let mut flags = layer(&a.common);
    put(&mut flags, "migrations", &a.migrations);
    if rules.allow_out_of_order {
        flags.insert("allow_out_of_order".into(), "true".into());
    }
    let base = settings(&a.common, flags)?;
    let targets = crate::fleet::load(path, &base, true)?;
    let parallel = usize::from(a.parallel.unwrap_or(8));
    let reports = fleet::each(targets.len(), parallel, |i| {
        let t = &targets[i];
        async move {
            let lock = engines::open(&t.settings)?;
            let rules = Rules {
                allow_out_of_order: t.settings.allow_out_of_order,
                ..rules
            };
            report(lock.as_ref(), &t.migrations, &t.settings, rules).await
        }
    })
    .await;
    let codes: Vec<ExitCode> = reports
        .iter()
        .map(|r| match r {
            Ok(r) if validating => r.exit_code(),
            Ok(_) => ExitCode::OK,
            Err(e) => e.exit_code(),
        })
        .collect();
    let code = fleet::worst(&codes, &[ExitCode::NEEDS_REVIEW, ExitCode::INVALID]);
    if a.json {
        crate::fleet::print_json(
            &targets,
            &reports,
            code,
            |r| r.json(),
            serde_json::json!({}),
        );
        return Ok(code);
    }
    let (mut current, mut behind, mut invalid, mut unread) = (0, 0, 0, 0);
    for (t, r) in targets.iter().zip(&reports) {
        let line = match r {
            Ok(r) => {
                let counts: Vec<String> = Standing::ALL
                    .iter()
                    .map(|&s| (s, r.entries.iter().filter(|e| e.standing == s).count()))
                    .filter(|&(s, n)| n > 0 || matches!(s, Standing::Applied | Standing::Pending))
                    .map(|(s, n)| format!("{n} {}", s.as_str()))
                    .collect();
                let pending = r.entries.iter().any(|e| e.standing == Standing::Pending);
                let bad = validating && r.exit_code() != ExitCode::OK;
                match (bad, pending) {
                    (true, _) => invalid += 1,
                    (false, true) => behind += 1,
                    (false, false) => current += 1,
                }
                let mut line = format!("{}; lock {}", counts.join(", "), r.verdict.as_str());
                if validating {
                    line = match r.problems.split_first() {
                        None if !bad => format!("valid: {line}"),
                        None => format!("invalid (exit {}): {line}", r.exit_code().code()),
                        Some((first, rest)) => format!(
                            "invalid (exit {}): {first}{}",
                            r.exit_code().code(),
                            match rest.len() {
                                0 => String::new(),
                                n => format!(" (and {n} more problem(s))"),
                            }
                        ),
                    };
                }
                line
            }
            Err(e) => {
                unread += 1;
                format!(
                    "cannot read it (exit {}): {}",
                    e.exit_code().code(),
                    dbwarden_core::error::one_line(&e.to_string())
                )
            }
        };
        println!("{}: {line}", t.name);
    }
    let invalid = if validating {
        format!("{invalid} invalid, ")
    } else {
        String::new()
    };
    println!(
        "{} target(s): {current} up to date, {behind} with pending migrations, {invalid}{unread} unreadable; exit {}",
        targets.len(),
        code.code()
    );
    Ok(code)
}

/// The settings, the lock and the folder a survey reads.
type Opened = (Settings, Box<dyn MigrationLock>, Vec<Migration>);

fn open(args: &SurveyArgs, allow_out_of_order: bool) -> Result<Opened, Error> {
    let mut flags = layer(&args.common);
    put(&mut flags, "migrations", &args.migrations);
    if allow_out_of_order {
        flags.insert("allow_out_of_order".into(), "true".into());
    }
    let settings = settings(&args.common, flags)?;
    let lock = engines::open(&settings)?;
    let dialect = engines::migration_dialect(lock.as_ref(), &settings)?;
    let files = migration::load_dir(&settings.migrations, dialect)?;
    Ok((settings, lock, files))
}

async fn report(
    lock: &dyn MigrationLock,
    files: &[Migration],
    settings: &Settings,
    rules: Rules,
) -> Result<Report, Error> {
    let history = lock.read_history().await?;
    let obs = lock.observe().await?;
    let ttl = verdict::judged_ttl(&obs, settings.lock_ttl.unwrap_or(lock.default_ttl()));
    let verdict = verdict::decide(&obs, ttl);
    let entries = survey::survey(files, &history, survey::halted_version(&obs));
    let mut problems: Vec<String> = entries
        .iter()
        .filter_map(|e| survey::problem(e, rules))
        .collect();
    for index in lock.invalid_indexes().await? {
        problems.push(survey::invalid_index_problem(&index, files, &history));
    }
    let theirs = adopt::other_tools(lock).await?;
    let unadopted = adopt::unadopted(history.is_empty(), &theirs, None);
    if let Some(h) = unadopted {
        problems.insert(0, adopt::refusal(h).to_string());
    }
    if verdict == Verdict::NeedsReview
        && !entries.iter().any(|e| e.standing == Standing::NeedsReview)
    {
        problems.push(format!("the lock is NEEDS_REVIEW: {}", verdict.next_step()));
    }
    Ok(Report {
        entries,
        problems,
        verdict,
        next_step: verdict.next_step(),
        fencing_token: obs.fencing_token,
        held: obs.held,
        namespace: obs.namespace.clone(),
        engine: obs.engine,
        unadopted: unadopted.map(|h| h.tool.to_string()),
    })
}

/// `dbwarden status`: always exit 0 once read (`validate` is the verdict as an exit code).
pub async fn status(a: SurveyArgs) -> Result<ExitCode, Error> {
    if let Some(path) = &a.targets {
        let rules = Rules {
            allow_out_of_order: false,
            no_pending: false,
        };
        return over_targets(&a, path, false, rules).await;
    }
    let (settings, lock, files) = open(&a, false)?;
    let rules = Rules {
        allow_out_of_order: settings.allow_out_of_order,
        no_pending: false,
    };
    let r = report(lock.as_ref(), &files, &settings, rules).await?;
    if a.json {
        println!("{}", r.json());
    } else {
        print!("{}", r.human());
    }
    Ok(ExitCode::OK)
}

/// `dbwarden validate`: 0 when the folder and the history agree, 5 when not, 12 on review.
pub async fn validate(a: ValidateArgs) -> Result<ExitCode, Error> {
    if let Some(path) = &a.survey.targets {
        let rules = Rules {
            allow_out_of_order: a.allow_out_of_order,
            no_pending: a.no_pending,
        };
        return over_targets(&a.survey, path, true, rules).await;
    }
    let (settings, lock, files) = open(&a.survey, a.allow_out_of_order)?;
    let rules = Rules {
        allow_out_of_order: settings.allow_out_of_order,
        no_pending: a.no_pending,
    };
    let r = report(lock.as_ref(), &files, &settings, rules).await?;
    let code = r.exit_code();
    if a.survey.json {
        println!("{}", r.json());
    } else {
        for p in &r.problems {
            eprintln!("dbwarden: {p}");
        }
    }
    let pending = r
        .entries
        .iter()
        .filter(|e| e.standing == Standing::Pending)
        .count();
    if code == ExitCode::OK {
        eprintln!(
            "dbwarden: valid: {} migration(s) applied as written, {pending} pending",
            r.entries
                .iter()
                .filter(|e| e.standing == Standing::Applied)
                .count()
        );
    } else {
        eprintln!(
            "dbwarden: invalid: {} problem(s); the folder and the history disagree (exit {})",
            r.problems.len(),
            code.code()
        );
    }
    Ok(code)
}

/// `dbwarden wait`: block until the folder is applied, never taking the lock.
pub async fn wait(a: WaitArgs) -> Result<ExitCode, Error> {
    let mut flags = layer(&a.common);
    put(&mut flags, "migrations", &a.migrations);
    put(&mut flags, "lock_url", &a.lock_url);
    if a.allow_out_of_order {
        flags.insert("allow_out_of_order".into(), "true".into());
    }
    let settings = settings(&a.common, flags)?;
    let timeout = match &a.timeout {
        Some(t) => dbwarden_core::duration::parse("--timeout", t)?,
        None => Duration::from_secs(300),
    };
    let lock = engines::open(&settings)?;
    let dialect = engines::migration_dialect(lock.as_ref(), &settings)?;
    let files = migration::load_dir(&settings.migrations, dialect)?;
    let until = match a.until.as_str() {
        "latest" => None,
        v => {
            let v: i64 = v.parse().map_err(|_| {
                Error::usage(format!(
                    "--until {v:?} is neither a migration version nor `latest`"
                ))
            })?;
            if !files.iter().any(|m| m.version == v) {
                return Err(Error::usage(format!(
                    "--until {v}: no migration of {} has that version",
                    settings.migrations.display()
                )));
            }
            Some(v)
        }
    };
    // A guarded migrate announces its release on the outer lock too: listen there as well.
    let outer = engines::engines().open_outer(&settings)?;
    let wake = outer.as_deref();
    let started = tokio::time::Instant::now();
    let outcome = tokio::select! {
        r = survey::wait_until_applied(lock.as_ref(), wake, &files, until, timeout, settings.allow_out_of_order) => r?,
        _ = stop_signal() => {
            eprintln!("dbwarden: signal received: stopped waiting (nothing was held)");
            return Ok(ExitCode::INTERRUPTED);
        }
    };
    match outcome {
        WaitOutcome::Ready { applied } => {
            eprintln!(
                "dbwarden: ready: {applied} migration(s) applied (waited {})",
                dbwarden_core::duration::human(started.elapsed())
            );
            Ok(ExitCode::OK)
        }
        WaitOutcome::TimedOut { waiting_for } => {
            let shown: Vec<String> = waiting_for.iter().take(5).map(i64::to_string).collect();
            eprintln!(
                "dbwarden: timed out after {}: {} migration(s) still not applied ({}{}); `dbwarden status` shows why",
                dbwarden_core::duration::human(timeout),
                waiting_for.len(),
                shown.join(", "),
                if waiting_for.len() > 5 { ", …" } else { "" }
            );
            Ok(ExitCode::BUSY)
        }
    }
}

/// SIGINT or SIGTERM (what Kubernetes sends a pod it stops).
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}
