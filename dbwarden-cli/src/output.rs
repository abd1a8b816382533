//! What people read: lock-status (human and JSON), history, per-migration progress lines.

use std::fmt::Write as _;
use std::time::Duration;

use dbwarden_core::duration::human;
use dbwarden_core::migration::Migration;
use dbwarden_core::runner::Progress;
use dbwarden_core::verdict::{discrepancy, heartbeat_age};
use dbwarden_core::{HistoryRow, Observation, Verdict};

/// Migrate progress on stderr: a bar on a terminal, one line per migration with `-v`, notes
/// always.
pub struct LineProgress {
    bar: Option<indicatif::ProgressBar>,
    lines: bool,
}

impl LineProgress {
    pub fn new(terminal: bool, verbose: bool) -> Self {
        let bar = (terminal && !verbose).then(|| {
            let bar = indicatif::ProgressBar::with_draw_target(
                None,
                indicatif::ProgressDrawTarget::stderr(),
            );
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "dbwarden: [{bar:30}] {pos}/{len} {elapsed} {msg}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        });
        LineProgress {
            bar,
            lines: verbose,
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Progress for LineProgress {
    fn started(&self, m: &Migration, index: usize, total: usize) {
        if let Some(bar) = &self.bar {
            bar.set_length(total as u64);
            bar.set_position(index as u64);
            bar.set_message(format!("{} {}", m.version, m.description));
        }
        if self.lines {
            eprintln!(
                "dbwarden: [{}/{}] applying {} {} ...",
                index + 1,
                total,
                m.version,
                m.description
            );
        }
    }

    fn finished(&self, m: &Migration, elapsed: Duration) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
        if self.lines {
            eprintln!(
                "dbwarden: applied {} {} in {}",
                m.version,
                m.description,
                human(elapsed)
            );
        }
    }

    fn note(&self, msg: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("dbwarden: {msg}")),
            None => eprintln!("dbwarden: {msg}"),
        }
    }
}

/// Colour for the verdict word (only on a terminal, never with NO_COLOR).
pub fn paint(verdict: Verdict, color: bool) -> String {
    if !color {
        return verdict.as_str().to_owned();
    }
    let code = match verdict {
        Verdict::Available | Verdict::Healthy => "32",
        Verdict::Stuck => "33",
        Verdict::Dead | Verdict::NeedsReview => "31",
    };
    format!("\x1b[1;{code}m{}\x1b[0m", verdict.as_str())
}

fn ts(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    )
}

/// The human view: verdict first, then the holder, then the next step.
pub fn status_human(obs: &Observation, verdict: Verdict, ttl: Duration, color: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}  namespace={} engine={} (grade {:?})",
        paint(verdict, color),
        obs.namespace,
        obs.engine,
        obs.grade
    );
    let row = |s: &mut String, k: &str, v: String| {
        let _ = writeln!(s, "  {k:<18}{v}");
    };
    row(
        &mut s,
        "held",
        if obs.held { "yes".into() } else { "no".into() },
    );
    let status = obs.status.as_ref();
    if let Some(h) = &obs.holder {
        row(
            &mut s,
            "holder",
            format!("host={} pid={} owner={}", h.host, h.pid, h.owner),
        );
        row(&mut s, "execution", h.execution_id.to_string());
        row(&mut s, "command", h.command.clone());
        row(&mut s, "acquired", ts(Some(h.started_at)));
    } else if let Some(st) =
        status.filter(|st| st.state.is_active() || verdict == Verdict::NeedsReview)
    {
        row(
            &mut s,
            "last holder",
            format!(
                "host={} pid={} owner={}",
                st.host.as_deref().unwrap_or("?"),
                st.pid.map_or("?".into(), |p| p.to_string()),
                st.owner_id.as_deref().unwrap_or("?")
            ),
        );
        row(
            &mut s,
            "execution",
            st.execution_id.map_or("-".into(), |e| e.to_string()),
        );
        row(&mut s, "acquired", ts(st.acquired_at));
    }
    if let Some(st) = status {
        row(&mut s, "state", st.state.as_str().to_owned());
        if let Some(v) = st.migration_version {
            row(&mut s, "migration", v.to_string());
        }
    }
    if let Some(t) = obs.fencing_token {
        row(&mut s, "fencing token", t.to_string());
    }
    if let Some(age) = heartbeat_age(obs) {
        row(
            &mut s,
            "heartbeat age",
            format!("{} (ttl {})", human(age), human(ttl)),
        );
    }
    if obs.expires_at.is_some() {
        row(&mut s, "lease expires", ts(obs.expires_at));
    }
    if let Some(id) = &obs.session_id {
        row(&mut s, "session", id.clone());
    }
    if let Some(d) = discrepancy(obs) {
        row(&mut s, "discrepancy", d);
    }
    for n in &obs.notes {
        row(&mut s, "note", n.clone());
    }
    row(&mut s, "next step", verdict.next_step().to_owned());
    s
}

/// The `--json` object (see docs/lock-status.schema.json).
pub fn status_json(obs: &Observation, verdict: Verdict, ttl: Duration) -> serde_json::Value {
    serde_json::json!({
        "verdict": verdict.as_str(),
        "exit_code": verdict.exit_code().code(),
        "namespace": obs.namespace,
        "engine": obs.engine,
        "grade": format!("{:?}", obs.grade),
        "held": obs.held,
        "holder": obs.holder,
        "fencing_token": obs.fencing_token,
        "heartbeat_age_s": heartbeat_age(obs).map(|d| d.as_secs_f64()),
        "ttl_s": ttl.as_secs_f64(),
        "last_heartbeat_at": obs.last_heartbeat_at,
        "expires_at": obs.expires_at,
        "session_id": obs.session_id,
        "status": obs.status,
        "discrepancy": discrepancy(obs),
        "notes": obs.notes,
        "next_step": verdict.next_step(),
        "server_now": obs.server_now,
    })
}

pub fn history_table(rows: &[HistoryRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>8}  {:<8}  {:<12}  {:>9}  {:>6}  {:<36}  description",
        "version", "state", "checksum", "duration", "token", "execution"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:>8}  {:<8}  {:<12}  {:>9}  {:>6}  {:<36}  {}",
            r.version,
            r.state.as_str(),
            &r.checksum[..r.checksum.len().min(12)],
            r.duration_ms.map_or("-".into(), |d| human(
                Duration::from_millis(d.max(0) as u64)
            )),
            r.fencing_token,
            r.execution_id.map_or("-".into(), |e| e.to_string()),
            r.description
        );
    }
    if rows.is_empty() {
        s.push_str("(no migrations applied yet)\n");
    }
    s
}
