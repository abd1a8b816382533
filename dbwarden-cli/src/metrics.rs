//! The lock's state as an OpenMetrics text exposition: `lock-status --format openmetrics` (one
//! target, for node_exporter's textfile collector) and `dbwarden exporter` (`/metrics` for
//! several targets). Names and units follow the Prometheus conventions (`dbwarden_` prefix,
//! seconds, one series per verdict or standing with 0/1 or a count). Labels name the engine, the
//! namespace and the database as `lock-status` shows it, never with a password. Each family is
//! written once, with the samples of every target under it.

use std::fmt::Write;
use std::time::Duration;

use dbwarden_core::survey::{Entry, Standing};
use dbwarden_core::verdict::heartbeat_age;
use dbwarden_core::{HistoryRow, HistoryState, Observation, Verdict};

/// Every verdict, in the order the series are written.
const VERDICTS: [Verdict; 5] = [
    Verdict::Available,
    Verdict::Healthy,
    Verdict::Stuck,
    Verdict::Dead,
    Verdict::NeedsReview,
];

/// The labels every series of one target carries.
pub struct Target<'a> {
    pub engine: &'a str,
    pub namespace: &'a str,
    /// The database as messages show it (a redacted URL: never a password).
    pub database: &'a str,
}

impl Target<'_> {
    fn labels(&self, extra: Option<(&str, &str)>) -> String {
        let mut s = format!(
            "engine=\"{}\",namespace=\"{}\",database=\"{}\"",
            escape(self.engine),
            escape(self.namespace),
            escape(self.database)
        );
        if let Some((k, v)) = extra {
            let _ = write!(s, ",{k}=\"{}\"", escape(v));
        }
        s
    }
}

/// A label value as the exposition format wants it: backslash, double quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One metric family: what `# TYPE`, `# UNIT` and `# HELP` say, and its samples.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    unit: Option<&'static str>,
    samples: Vec<String>,
}

/// An exposition being built: families in the order they were first used.
#[derive(Default)]
pub struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    fn add(
        &mut self,
        (name, kind, help, unit): (
            &'static str,
            &'static str,
            &'static str,
            Option<&'static str>,
        ),
        labels: &str,
        value: f64,
    ) {
        let i = match self.families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.families.push(Family {
                    name,
                    kind,
                    help,
                    unit,
                    samples: Vec::new(),
                });
                self.families.len() - 1
            }
        };
        // A counter's samples carry `_total` (OpenMetrics); a gauge's the family's name.
        let suffix = if kind == "counter" { "_total" } else { "" };
        self.families[i]
            .samples
            .push(format!("{name}{suffix}{{{labels}}} {value}"));
    }

    /// OpenMetrics text (`# UNIT`, counters' families without `_total`, `# EOF`): for
    /// `lock-status --format openmetrics`.
    pub fn render(&self) -> String {
        self.write(true)
    }

    /// The Prometheus text format 0.0.4 (`text/plain; version=0.0.4`), what `/metrics` serves:
    /// every Prometheus and promtool reads it, and a counter's family is named with `_total`.
    pub fn render_text(&self) -> String {
        self.write(false)
    }

    fn write(&self, openmetrics: bool) -> String {
        let mut out = String::new();
        for f in &self.families {
            let name = if f.kind == "counter" && !openmetrics {
                format!("{}_total", f.name)
            } else {
                f.name.to_owned()
            };
            let _ = writeln!(out, "# HELP {name} {}", f.help);
            let _ = writeln!(out, "# TYPE {name} {}", f.kind);
            if let Some(u) = f.unit.filter(|_| openmetrics) {
                let _ = writeln!(out, "# UNIT {name} {u}");
            }
            for s in &f.samples {
                out.push_str(s);
                out.push('\n');
            }
        }
        if openmetrics {
            out.push_str("# EOF\n");
        }
        out
    }

    /// Whether the target answered (`dbwarden_up`), and how long reading it took.
    pub fn up(&mut self, target: &Target, up: bool, took: Duration) {
        let l = target.labels(None);
        self.add(UP, &l, f64::from(u8::from(up)));
        self.add(SCRAPE_DURATION, &l, took.as_secs_f64());
    }

    /// The lock: its verdict (one series per verdict), held, ttl, heartbeat age, token, holder.
    pub fn lock(&mut self, target: &Target, obs: &Observation, verdict: Verdict, ttl: Duration) {
        let l = target.labels(None);
        for v in VERDICTS {
            self.add(
                VERDICT,
                &target.labels(Some(("verdict", v.as_str()))),
                f64::from(u8::from(v == verdict)),
            );
        }
        self.add(HELD, &l, f64::from(u8::from(obs.held)));
        if let Some(token) = obs.fencing_token {
            self.add(FENCING_TOKEN, &l, token as f64);
        }
        self.add(TTL, &l, ttl.as_secs_f64());
        if obs.held {
            if let Some(age) = heartbeat_age(obs) {
                self.add(HEARTBEAT_AGE, &l, age.as_secs_f64());
            }
            if let Some(h) = &obs.holder {
                self.add(
                    HOLDER_START,
                    &l,
                    h.started_at.timestamp_millis() as f64 / 1000.0,
                );
            }
        }
    }

    /// The folder beside the history: how many migrations stand where (one series per
    /// standing, 0 included).
    pub fn migrations(&mut self, target: &Target, entries: &[Entry]) {
        for s in Standing::ALL {
            let n = entries.iter().filter(|e| e.standing == s).count();
            self.add(
                MIGRATIONS,
                &target.labels(Some(("standing", s.as_str()))),
                n as f64,
            );
        }
    }

    /// The last forward run in the history: the rows of the newest execution.
    pub fn last_run(&mut self, target: &Target, history: &[HistoryRow]) {
        let Some(run) = last_run(history) else {
            return;
        };
        let l = target.labels(None);
        self.add(LAST_RUN_SUCCESS, &l, f64::from(u8::from(run.success)));
        self.add(LAST_RUN_DURATION, &l, run.duration.as_secs_f64());
        if let Some(at) = run.finished_at {
            self.add(LAST_RUN_END, &l, at.timestamp_millis() as f64 / 1000.0);
        }
    }

    /// Reads of this target that failed since the exporter started.
    pub fn scrape_errors(&mut self, target: &Target, n: u64) {
        self.add(SCRAPE_ERRORS, &target.labels(None), n as f64);
    }
}

type Def = (
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
);

const UP: Def = (
    "dbwarden_up",
    "gauge",
    "Whether the lock's database answered this read (1) or not (0).",
    None,
);
const SCRAPE_DURATION: Def = (
    "dbwarden_scrape_duration_seconds",
    "gauge",
    "How long reading the lock took.",
    Some("seconds"),
);
const VERDICT: Def = (
    "dbwarden_lock_verdict",
    "gauge",
    "The lock-status verdict: 1 for the current one, 0 for the others.",
    None,
);
const HELD: Def = (
    "dbwarden_lock_held",
    "gauge",
    "Whether the lock's primitive is held right now.",
    None,
);
const FENCING_TOKEN: Def = (
    "dbwarden_lock_fencing_token",
    "gauge",
    "The fencing token of the last claim (it only grows).",
    None,
);
const TTL: Def = (
    "dbwarden_lock_ttl_seconds",
    "gauge",
    "The staleness threshold the holder is judged by.",
    Some("seconds"),
);
const HEARTBEAT_AGE: Def = (
    "dbwarden_lock_heartbeat_age_seconds",
    "gauge",
    "Seconds since the holder's last heartbeat, on the server's clock.",
    Some("seconds"),
);
const HOLDER_START: Def = (
    "dbwarden_lock_holder_start_time_seconds",
    "gauge",
    "When the current holder started, in seconds since the Unix epoch.",
    Some("seconds"),
);
const MIGRATIONS: Def = (
    "dbwarden_migrations",
    "gauge",
    "Migrations of the folder and the history by standing (pending, changed, needs_review, ...).",
    None,
);
const LAST_RUN_SUCCESS: Def = (
    "dbwarden_last_run_success",
    "gauge",
    "Whether every migration of the newest run in the history is applied (1) or not (0).",
    None,
);
const LAST_RUN_DURATION: Def = (
    "dbwarden_last_run_duration_seconds",
    "gauge",
    "How long the migrations of the newest run took, added up.",
    Some("seconds"),
);
const LAST_RUN_END: Def = (
    "dbwarden_last_run_end_time_seconds",
    "gauge",
    "When the newest run's last migration finished, in seconds since the Unix epoch.",
    Some("seconds"),
);
const SCRAPE_ERRORS: Def = (
    "dbwarden_exporter_scrape_errors",
    "counter",
    "Reads of this target that failed since the exporter started.",
    None,
);

struct LastRun {
    success: bool,
    duration: Duration,
    finished_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The newest execution's forward rows (reverts and adoptions without an execution are not runs).
fn last_run(history: &[HistoryRow]) -> Option<LastRun> {
    let newest = history
        .iter()
        .filter(|r| !r.is_revert() && r.execution_id.is_some())
        .max_by_key(|r| (r.started_at, r.fencing_token))?;
    let rows: Vec<&HistoryRow> = history
        .iter()
        .filter(|r| r.execution_id == newest.execution_id && !r.is_revert())
        .collect();
    Some(LastRun {
        success: rows.iter().all(|r| r.state == HistoryState::Applied),
        duration: Duration::from_millis(
            rows.iter()
                .filter_map(|r| r.duration_ms)
                .map(|ms| ms.max(0) as u64)
                .sum(),
        ),
        finished_at: rows.iter().filter_map(|r| r.finished_at).max(),
    })
}

/// `lock-status --format openmetrics` for a target that answered.
pub fn exposition(
    target: &Target,
    obs: &Observation,
    verdict: Verdict,
    ttl: Duration,
    took: Duration,
) -> String {
    let mut e = Exposition::default();
    e.up(target, true, took);
    e.lock(target, obs, verdict, ttl);
    e.render()
}

/// The exposition for a target that could not be read: `dbwarden_up` 0 and nothing else, so that
/// a stale file never shows an old verdict as current.
pub fn unreachable(target: &Target, took: Duration) -> String {
    let mut e = Exposition::default();
    e.up(target, false, took);
    e.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape("a\nb"), "a\\nb");
    }

    #[test]
    fn an_unreachable_target_is_up_0_and_nothing_else() {
        let t = Target {
            engine: "postgres",
            namespace: "default",
            database: "postgres://root@h:5432/db",
        };
        let s = unreachable(&t, Duration::from_millis(1500));
        assert!(s.contains(
            "dbwarden_up{engine=\"postgres\",namespace=\"default\",database=\"postgres://root@h:5432/db\"} 0\n"
        ));
        assert!(!s.contains("dbwarden_lock_verdict"));
        assert!(s.ends_with("# EOF\n"));
    }

    #[test]
    fn two_targets_share_each_family_once_and_counters_end_in_total() {
        let a = Target {
            engine: "postgres",
            namespace: "a",
            database: "postgres://h/db",
        };
        let b = Target {
            namespace: "b",
            ..Target {
                engine: "postgres",
                namespace: "",
                database: "postgres://h/db",
            }
        };
        let mut e = Exposition::default();
        e.up(&a, true, Duration::ZERO);
        e.scrape_errors(&a, 0);
        e.up(&b, false, Duration::ZERO);
        e.scrape_errors(&b, 3);
        let s = e.render();
        assert_eq!(s.matches("# TYPE dbwarden_up gauge").count(), 1, "{s}");
        assert_eq!(s.matches("dbwarden_up{").count(), 2, "{s}");
        assert!(s.contains("# TYPE dbwarden_exporter_scrape_errors counter\n"));
        let text = e.render_text();
        assert!(text.contains("# TYPE dbwarden_exporter_scrape_errors_total counter\n"));
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert!(s.contains("dbwarden_exporter_scrape_errors_total{engine=\"postgres\",namespace=\"b\",database=\"postgres://h/db\"} 3\n"), "{s}");
    }
}
