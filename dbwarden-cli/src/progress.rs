//! What `migrate --targets` shows while it runs. On a terminal, one line redrawn in place: a
//! bar, the counts of migrated / up to date / failed / not started / running targets and an
//! ETA, with each failure printed above it as it happens. Elsewhere (CI logs, pipes), one line
//! per finished target.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dbwarden_core::duration::human;
use dbwarden_core::fleet::{TargetOutcome, TargetReport};

const BAR: usize = 24;

#[derive(Default)]
struct Counts {
    ended: usize,
    migrated: usize,
    current: usize,
    failed: usize,
    not_started: usize,
}

pub(crate) struct Progress {
    total: usize,
    t0: Instant,
    tty: bool,
    running: AtomicUsize,
    counts: Mutex<Counts>,
}

/// A target in flight, counted as running until dropped.
pub(crate) struct Running(Arc<Progress>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Progress {
    pub(crate) fn new(total: usize) -> Arc<Progress> {
        Arc::new(Progress {
            total,
            t0: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            running: AtomicUsize::new(0),
            counts: Mutex::new(Counts::default()),
        })
    }

    /// A target starts (or starts again after its lock was busy).
    pub(crate) fn start(self: &Arc<Self>) -> Running {
        self.running.fetch_add(1, Ordering::SeqCst);
        Running(self.clone())
    }

    /// A target ended.
    pub(crate) fn ended(&self, r: &TargetReport, ended: usize) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.ended = ended;
        match &r.outcome {
            TargetOutcome::Applied { applied: 0, .. } => c.current += 1,
            TargetOutcome::Applied { .. } => c.migrated += 1,
            TargetOutcome::Failed { .. } => c.failed += 1,
            TargetOutcome::NotStarted { .. } => c.not_started += 1,
        }
        let line = format!("dbwarden: [{ended}/{}] {}: {}", self.total, r.name, what(r));
        let mut err = std::io::stderr().lock();
        if !self.tty {
            let _ = writeln!(err, "{line}");
            return;
        }
        // On a terminal only what needs a look stays on screen: failures.
        if matches!(r.outcome, TargetOutcome::Failed { .. }) {
            let _ = writeln!(err, "\r\x1b[2K{line}");
        }
        let _ = write!(err, "\r\x1b[2K{}", self.bar(&c));
        let _ = err.flush();
    }

    /// Redraw the line (the ETA and the running count move between endings).
    pub(crate) fn tick(&self) {
        if !self.tty {
            return;
        }
        let c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{}", self.bar(&c));
        let _ = err.flush();
    }

    /// Clear the line before the summary.
    pub(crate) fn finish(&self) {
        if self.tty {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }

    fn bar(&self, c: &Counts) -> String {
        let filled = (c.ended * BAR).checked_div(self.total).unwrap_or(BAR);
        let eta = match c.ended {
            0 => "ETA ?".to_owned(),
            n if n >= self.total => "done".to_owned(),
            n => {
                let each = self.t0.elapsed().as_secs_f64() / n as f64;
                let left = Duration::from_secs_f64(each * (self.total - n) as f64);
                format!("ETA {}", human(left))
            }
        };
        format!(
            "dbwarden: [{}{}] {}/{} · migrated {} · up to date {} · failed {} · not started {} · running {} · {eta}",
            "#".repeat(filled),
            "-".repeat(BAR - filled),
            c.ended,
            self.total,
            c.migrated,
            c.current,
            c.failed,
            c.not_started,
            self.running.load(Ordering::SeqCst),
        )
    }
}

/// One finished target, as its line says it.
fn what(r: &TargetReport) -> String {
    match &r.outcome {
        TargetOutcome::Applied { applied: 0, .. } => "up to date".to_owned(),
        TargetOutcome::Applied { applied, .. } => format!(
            "applied {applied} migration(s) in {}",
            human(Duration::from_millis(r.duration_ms))
        ),
        TargetOutcome::Failed { exit_code, error } => {
            format!("FAILED (exit {exit_code}): {error}")
        }
        TargetOutcome::NotStarted { reason } => format!("not started: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(name: &str, outcome: TargetOutcome) -> TargetReport {
        TargetReport {
            name: name.into(),
            outcome,
            duration_ms: 1500,
        }
    }

    #[test]
    fn the_bar_counts_each_outcome_and_what_runs() {
        let p = Progress::new(4);
        let _a = p.start();
        let _b = p.start();
        let c = Counts {
            ended: 2,
            migrated: 1,
            current: 0,
            failed: 1,
            not_started: 0,
        };
        let line = p.bar(&c);
        assert!(
            line.starts_with("dbwarden: [############------------] 2/4"),
            "{line}"
        );
        assert!(
            line.contains("migrated 1 · up to date 0 · failed 1 · not started 0 · running 2 · ETA"),
            "{line}"
        );
        drop(_a);
        assert!(p.bar(&c).contains("running 1"));
    }

    #[test]
    fn a_finished_target_is_named_with_what_happened() {
        let ok = report(
            "t1",
            TargetOutcome::Applied {
                applied: 3,
                already_applied: 0,
            },
        );
        assert_eq!(what(&ok), "applied 3 migration(s) in 1s");
        let bad = report(
            "t2",
            TargetOutcome::Failed {
                exit_code: 1,
                error: "syntax error".into(),
            },
        );
        assert_eq!(what(&bad), "FAILED (exit 1): syntax error");
    }
}
