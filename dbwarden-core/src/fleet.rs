//! Fleets: one run over many targets (tenant databases, schemas, namespaces) in one process,
//! at most `parallel` at a time, a canary wave first, a failure budget, and a target another
//! runner holds put back at the end of the queue instead of waited on (docs/operations.md,
//! "Fleets"). Each target is an ordinary `migrate` under its own lock: two fleet runs over the
//! same targets share the work through those locks, and a rerun after a kill finds the targets
//! that are done up to date and recovers the half-done ones by the usual rules.
//!
//! The order of work is decided here once; what one target's run is (which engine, which
//! settings) is the caller's closure, so the CLI and the library share it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use serde::Serialize;

use crate::runner::{Interrupt, Report};
use crate::{Error, ExitCode};

/// How a fleet runs.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Targets in flight at once (at least 1).
    pub parallel: usize,
    /// The first `canary` targets run first, alone; if any of them fails, nothing else starts.
    pub canary: usize,
    /// After this many failed targets no new one starts (those in flight finish).
    pub max_failures: Option<usize>,
}

/// How one target ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum TargetOutcome {
    /// Its run succeeded: `applied` migrations applied now (0: it was up to date).
    Applied {
        applied: usize,
        already_applied: usize,
    },
    /// Its run failed with this exit code and error.
    Failed { exit_code: u8, error: String },
    /// It was never started: the canary wave failed, the failure budget ran out, or the fleet
    /// was interrupted.
    NotStarted { reason: String },
}

/// One target's line of the fleet's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TargetReport {
    pub name: String,
    #[serde(flatten)]
    pub outcome: TargetOutcome,
    pub duration_ms: u64,
}

impl TargetReport {
    /// The exit code of this target alone (0 when it applied).
    pub fn exit_code(&self) -> u8 {
        match &self.outcome {
            TargetOutcome::Applied { .. } => 0,
            TargetOutcome::Failed { exit_code, .. } => *exit_code,
            TargetOutcome::NotStarted { .. } => ExitCode::INTERRUPTED.code(),
        }
    }
}

/// Exit codes of failed targets, most severe first: a migration halted for review, a lost
/// lock, a failed migration, a lock or table lock that stayed busy, bad input or an
/// unreachable server, an interrupt.
const SEVERITY: [ExitCode; 6] = [
    ExitCode::HALTED,
    ExitCode::LOST,
    ExitCode::MIGRATION_FAILED,
    ExitCode::BUSY,
    ExitCode::USAGE,
    ExitCode::INTERRUPTED,
];

/// The fleet's exit code: 0 when every target applied, else the most severe code among the
/// targets ([`SEVERITY`]); targets that never started count as interrupted only when no
/// target failed (the failure is what stopped them).
pub fn exit_code(reports: &[TargetReport]) -> ExitCode {
    let codes: Vec<u8> = reports
        .iter()
        .filter(|r| !matches!(r.outcome, TargetOutcome::Applied { .. }))
        .map(TargetReport::exit_code)
        .collect();
    if codes.is_empty() {
        return ExitCode::OK;
    }
    SEVERITY
        .iter()
        .copied()
        .find(|c| codes.contains(&c.code()))
        .unwrap_or(ExitCode::MIGRATION_FAILED)
}

/// The exit code of a look over many targets (`lock-status`, `status`, `validate` with
/// `--targets`): the most severe target's. The codes of `first` come first, in that order (for
/// lock-status the verdicts that call for someone: NEEDS_REVIEW, DEAD, STUCK; for validate
/// NEEDS_REVIEW, then INVALID), then a target that could not be read (its own code: unreachable
/// is 2), then 0.
pub fn worst(codes: &[ExitCode], first: &[ExitCode]) -> ExitCode {
    first
        .iter()
        .copied()
        .find(|c| codes.contains(c))
        .or_else(|| codes.iter().copied().find(|c| *c != ExitCode::OK))
        .unwrap_or(ExitCode::OK)
}

/// [`worst`] for `lock-status --targets`.
pub fn worst_look(codes: &[ExitCode]) -> ExitCode {
    worst(
        codes,
        &[ExitCode::NEEDS_REVIEW, ExitCode::DEAD, ExitCode::STUCK],
    )
}

/// `f(i)` for every target `i < n`, at most `parallel` at once; the results in target order.
pub async fn each<T, F, Fut>(n: usize, parallel: usize, f: F) -> Vec<T>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    let mut next = 0;
    let mut flight = FuturesUnordered::new();
    loop {
        while next < n && flight.len() < parallel.max(1) {
            let (i, fut) = (next, f(next));
            flight.push(async move { (i, fut.await) });
            next += 1;
        }
        match flight.next().await {
            Some((i, v)) => out[i] = Some(v),
            None => break,
        }
    }
    out.into_iter().flatten().collect()
}

/// What one try at a target returned: `Ok(None)` when, asked not to wait, it found the target
/// held by another runner.
pub type Try = Result<Option<Report>, Error>;

/// One try at a target for [`run`]: `migrate` under its own lock with `opts`. A first try
/// (`wait` false) does not wait for a lock another runner holds: it reports `Ok(None)` and the
/// fleet comes back to the target later, waiting then.
pub async fn try_target(
    lock: &dyn crate::MigrationLock,
    migrations: &[crate::migration::Migration],
    holder: &crate::HolderInfo,
    mut opts: crate::runner::MigrateOptions,
    wait: bool,
    interrupt: &Interrupt,
) -> Try {
    if !wait {
        opts.skip_if_locked = true;
        opts.wait = crate::Wait::No;
    }
    let silent = crate::runner::Silent;
    match crate::runner::migrate(lock, migrations, holder, &opts, &silent, interrupt).await? {
        crate::runner::Outcome::Done(report) => Ok(Some(report)),
        crate::runner::Outcome::Skipped(_) => Ok(None),
    }
}

/// Run `one(index, wait)` for every target of `names` under `opts`, calling `done` as each
/// target ends (with the count of ended ones), and return one report per target in `names`'s
/// order. A target's first try does not wait for a lock another runner holds; it is put back at
/// the end of the queue and tried again later, waiting then.
pub async fn run<F, Fut>(
    names: &[String],
    opts: &FleetOptions,
    interrupt: &Interrupt,
    done: &(dyn Fn(&TargetReport, usize) + Sync),
    one: F,
) -> Vec<TargetReport>
where
    F: Fn(usize, bool) -> Fut,
    Fut: std::future::Future<Output = Try>,
{
    let n = names.len();
    let mut reports: Vec<Option<TargetReport>> = vec![None; n];
    let mut state = State {
        failures: 0,
        ended: 0,
        stop: None,
    };
    let canary = opts.canary.min(n);
    let waves: [std::ops::Range<usize>; 2] = [0..canary, canary..n];
    for (w, wave) in waves.into_iter().enumerate() {
        if state.stop.is_none() && w == 1 && state.failures > 0 {
            state.stop = Some(format!(
                "the canary wave ({canary} target(s)) had {} failure(s)",
                state.failures
            ));
        }
        let mut queue: VecDeque<(usize, bool)> = wave.map(|i| (i, false)).collect();
        let mut flight = FuturesUnordered::new();
        loop {
            if state.stop.is_none() && interrupt.is_set() {
                state.stop = Some("the fleet was interrupted".into());
            }
            while state.stop.is_none() && flight.len() < opts.parallel.max(1) {
                let Some((i, wait)) = queue.pop_front() else {
                    break;
                };
                let fut = one(i, wait);
                flight.push(async move {
                    let t0 = Instant::now();
                    let r = fut.await;
                    (i, wait, r, t0.elapsed())
                });
            }
            let Some((i, wait, r, took)) = flight.next().await else {
                break;
            };
            let outcome = match r {
                Ok(Some(report)) => TargetOutcome::Applied {
                    applied: report.applied.len(),
                    already_applied: report.already_applied,
                },
                Ok(None) if !wait => {
                    // Held by another runner: come back to it once the rest is under way.
                    queue.push_back((i, true));
                    continue;
                }
                Ok(None) => TargetOutcome::Failed {
                    exit_code: ExitCode::BUSY.code(),
                    error: "another runner held its lock".into(),
                },
                Err(e) => TargetOutcome::Failed {
                    exit_code: e.exit_code().code(),
                    error: crate::text::one_line(&e.to_string()),
                },
            };
            state.end(&mut reports, names, i, outcome, took, opts, done);
        }
        for (i, _) in queue {
            let reason = state
                .stop
                .clone()
                .unwrap_or_else(|| "the fleet stopped".into());
            let outcome = TargetOutcome::NotStarted { reason };
            state.end(&mut reports, names, i, outcome, Duration::ZERO, opts, done);
        }
    }
    reports.into_iter().flatten().collect()
}

struct State {
    failures: usize,
    ended: usize,
    /// Why no new target starts, once that is so.
    stop: Option<String>,
}

impl State {
    #[allow(clippy::too_many_arguments)]
    fn end(
        &mut self,
        reports: &mut [Option<TargetReport>],
        names: &[String],
        i: usize,
        outcome: TargetOutcome,
        took: Duration,
        opts: &FleetOptions,
        done: &(dyn Fn(&TargetReport, usize) + Sync),
    ) {
        if matches!(outcome, TargetOutcome::Failed { .. }) {
            self.failures += 1;
            if let Some(max) = opts.max_failures
                && self.failures >= max
                && self.stop.is_none()
            {
                self.stop = Some(format!(
                    "{} target(s) failed (--max-failures {max})",
                    self.failures
                ));
            }
        }
        self.ended += 1;
        let report = TargetReport {
            name: names[i].clone(),
            outcome,
            duration_ms: took.as_millis() as u64,
        };
        done(&report, self.ended);
        reports[i] = Some(report);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn a_look_over_targets_exits_with_the_most_severe() {
        let c = |codes: &[u8]| {
            let codes: Vec<ExitCode> = codes.iter().map(|&c| ExitCode(c)).collect();
            worst_look(&codes).code()
        };
        assert_eq!(c(&[0, 0]), 0);
        assert_eq!(c(&[0, 2, 10]), 10);
        assert_eq!(c(&[11, 12, 10]), 12);
        assert_eq!(c(&[0, 2]), 2);
        assert_eq!(c(&[]), 0);
        let v = |codes: &[u8]| {
            let codes: Vec<ExitCode> = codes.iter().map(|&c| ExitCode(c)).collect();
            worst(&codes, &[ExitCode::NEEDS_REVIEW, ExitCode::INVALID]).code()
        };
        assert_eq!(v(&[0, 2, 5]), 5);
        assert_eq!(v(&[5, 12, 2]), 12);
        assert_eq!(v(&[0, 2]), 2);
    }

    #[tokio::test]
    async fn each_keeps_the_order_and_the_bound() {
        let flight = Mutex::new((0usize, 0usize));
        let out = each(20, 3, |i| {
            let flight = &flight;
            async move {
                {
                    let mut f = flight.lock().unwrap();
                    f.0 += 1;
                    f.1 = f.1.max(f.0);
                }
                tokio::time::sleep(Duration::from_millis((20 - i as u64) % 7)).await;
                flight.lock().unwrap().0 -= 1;
                i * 2
            }
        })
        .await;
        assert_eq!(out, (0..20).map(|i| i * 2).collect::<Vec<_>>());
        assert_eq!(flight.lock().unwrap().1, 3);
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("t{i}")).collect()
    }

    fn report() -> Report {
        Report {
            applied: Vec::new(),
            already_applied: 3,
            fencing_token: 1,
            recovered: Vec::new(),
            elapsed_ms: 0,
            look: None,
        }
    }

    fn opts(parallel: usize, canary: usize, max_failures: Option<usize>) -> FleetOptions {
        FleetOptions {
            parallel,
            canary,
            max_failures,
        }
    }

    /// Run a fleet whose target `i` fails when `fails(i)`, recording the order of starts and
    /// the most targets in flight at once.
    async fn fleet(
        n: usize,
        o: &FleetOptions,
        fails: impl Fn(usize) -> bool,
        busy_first: impl Fn(usize) -> bool,
    ) -> (Vec<TargetReport>, Vec<(usize, bool)>, usize) {
        let started = Mutex::new(Vec::new());
        let flight = Mutex::new((0usize, 0usize));
        let names = names(n);
        let reports = run(&names, o, &Interrupt::never(), &|_, _| {}, |i, wait| {
            started.lock().unwrap().push((i, wait));
            {
                let mut f = flight.lock().unwrap();
                f.0 += 1;
                f.1 = f.1.max(f.0);
            }
            let fail = fails(i);
            let busy = busy_first(i) && !wait;
            let flight = &flight;
            async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                flight.lock().unwrap().0 -= 1;
                if fail {
                    Err(Error::usage("bad"))
                } else if busy {
                    Ok(None)
                } else {
                    Ok(Some(report()))
                }
            }
        })
        .await;
        let most = flight.lock().unwrap().1;
        (reports, started.into_inner().unwrap(), most)
    }

    #[tokio::test]
    async fn never_more_than_parallel_in_flight_and_every_target_reported_in_order() {
        let (reports, _, most) = fleet(20, &opts(4, 0, None), |_| false, |_| false).await;
        assert_eq!(most, 4);
        assert_eq!(reports.len(), 20);
        assert!(
            reports
                .iter()
                .enumerate()
                .all(|(i, r)| r.name == format!("t{i}"))
        );
        assert_eq!(exit_code(&reports), ExitCode::OK);
    }

    #[tokio::test]
    async fn a_failed_canary_starts_nothing_else() {
        let (reports, started, _) = fleet(10, &opts(4, 2, None), |i| i == 0, |_| false).await;
        assert_eq!(started.len(), 2, "{started:?}");
        assert!(
            reports[2..]
                .iter()
                .all(|r| matches!(r.outcome, TargetOutcome::NotStarted { .. }))
        );
        assert_eq!(exit_code(&reports).code(), 2);
    }

    #[tokio::test]
    async fn the_failure_budget_stops_new_starts() {
        let (reports, started, _) = fleet(10, &opts(1, 0, Some(2)), |i| i < 5, |_| false).await;
        assert_eq!(started.len(), 2, "{started:?}");
        assert_eq!(reports.len(), 10);
    }

    #[tokio::test]
    async fn a_held_target_is_tried_again_after_the_rest_waiting_then() {
        let (reports, started, _) = fleet(3, &opts(1, 0, None), |_| false, |i| i == 0).await;
        assert_eq!(started, [(0, false), (1, false), (2, false), (0, true)]);
        assert!(
            reports
                .iter()
                .all(|r| matches!(r.outcome, TargetOutcome::Applied { .. }))
        );
    }

    #[test]
    fn the_most_severe_code_wins() {
        let r = |code: u8| TargetReport {
            name: "x".into(),
            outcome: TargetOutcome::Failed {
                exit_code: code,
                error: String::new(),
            },
            duration_ms: 0,
        };
        assert_eq!(exit_code(&[r(2), r(1), r(3)]).code(), 1);
        assert_eq!(exit_code(&[r(2), r(78)]).code(), 78);
    }
}
