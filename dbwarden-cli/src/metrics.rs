//! `lock-status --format openmetrics`: the lock's state as an OpenMetrics text exposition, for
//! node_exporter's textfile collector (or any scraper that reads a file). Names and units follow
//! the Prometheus conventions (`dbwarden_` prefix, seconds, one series per verdict with 0/1).
//! Labels name the engine, the namespace and the database as `lock-status` shows it, never with
//! a password.

use std::fmt::Write;
use std::time::Duration;

use dbwarden_core::verdict::heartbeat_age;
use dbwarden_core::{Observation, Verdict};

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

fn family(out: &mut String, name: &str, help: &str, unit: Option<&str>) {
    let _ = writeln!(out, "# TYPE {name} gauge");
    if let Some(u) = unit {
        let _ = writeln!(out, "# UNIT {name} {u}");
    }
    let _ = writeln!(out, "# HELP {name} {help}");
}

fn sample(out: &mut String, name: &str, labels: &str, value: f64) {
    let _ = writeln!(out, "{name}{{{labels}}} {value}");
}

/// The exposition for a target that answered.
pub fn exposition(
    target: &Target,
    obs: &Observation,
    verdict: Verdict,
    ttl: Duration,
    took: Duration,
) -> String {
    let mut out = String::new();
    let l = target.labels(None);
    up(&mut out, &l, true, took);
    family(
        &mut out,
        "dbwarden_lock_verdict",
        "The lock-status verdict: 1 for the current one, 0 for the others.",
        None,
    );
    for v in VERDICTS {
        sample(
            &mut out,
            "dbwarden_lock_verdict",
            &target.labels(Some(("verdict", v.as_str()))),
            f64::from(u8::from(v == verdict)),
        );
    }
    family(
        &mut out,
        "dbwarden_lock_held",
        "Whether the lock's primitive is held right now.",
        None,
    );
    sample(
        &mut out,
        "dbwarden_lock_held",
        &l,
        f64::from(u8::from(obs.held)),
    );
    if let Some(token) = obs.fencing_token {
        family(
            &mut out,
            "dbwarden_lock_fencing_token",
            "The fencing token of the last claim (it only grows).",
            None,
        );
        sample(&mut out, "dbwarden_lock_fencing_token", &l, token as f64);
    }
    family(
        &mut out,
        "dbwarden_lock_ttl_seconds",
        "The staleness threshold the holder is judged by.",
        Some("seconds"),
    );
    sample(&mut out, "dbwarden_lock_ttl_seconds", &l, ttl.as_secs_f64());
    if obs.held {
        if let Some(age) = heartbeat_age(obs) {
            family(
                &mut out,
                "dbwarden_lock_heartbeat_age_seconds",
                "Seconds since the holder's last heartbeat, on the server's clock.",
                Some("seconds"),
            );
            sample(
                &mut out,
                "dbwarden_lock_heartbeat_age_seconds",
                &l,
                age.as_secs_f64(),
            );
        }
        if let Some(h) = &obs.holder {
            family(
                &mut out,
                "dbwarden_lock_holder_start_time_seconds",
                "When the current holder started, in seconds since the Unix epoch.",
                Some("seconds"),
            );
            sample(
                &mut out,
                "dbwarden_lock_holder_start_time_seconds",
                &l,
                h.started_at.timestamp_millis() as f64 / 1000.0,
            );
        }
    }
    out.push_str("# EOF\n");
    out
}

/// The exposition for a target that could not be read: `dbwarden_up` 0 and nothing else, so that
/// a stale file never shows an old verdict as current.
pub fn unreachable(target: &Target, took: Duration) -> String {
    let mut out = String::new();
    up(&mut out, &target.labels(None), false, took);
    out.push_str("# EOF\n");
    out
}

fn up(out: &mut String, labels: &str, up: bool, took: Duration) {
    family(
        out,
        "dbwarden_up",
        "Whether the lock's database answered this read (1) or not (0).",
        None,
    );
    sample(out, "dbwarden_up", labels, f64::from(u8::from(up)));
    family(
        out,
        "dbwarden_scrape_duration_seconds",
        "How long reading the lock took.",
        Some("seconds"),
    );
    sample(
        out,
        "dbwarden_scrape_duration_seconds",
        labels,
        took.as_secs_f64(),
    );
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
}
