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

/// `up` for a forward migration, `down` for a down file.
fn verb(m: &Migration, up: &'static str, down: &'static str) -> &'static str {
    match m.direction {
        dbwarden_core::migration::Direction::Up => up,
        dbwarden_core::migration::Direction::Down => down,
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
                "dbwarden: [{}/{}] {} {} {} ...",
                index + 1,
                total,
                verb(m, "applying", "reverting"),
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
                "dbwarden: {} {} {} in {}",
                verb(m, "applied", "reverted"),
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

/// `migrate --sql`: each pending file's SQL as it would be sent, with its transaction mode. A
/// file that runs in one transaction is sent as written, between dbwarden's BEGIN and COMMIT; a
/// journaled one statement by statement, each recorded on its own.
pub fn plan_sql(pending: &[&Migration]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "-- dbwarden migrate --sql: {} pending migration(s); nothing was run and no lock was taken",
        pending.len()
    );
    for m in pending {
        let _ = writeln!(
            s,
            "\n-- {} (version {}): {}: {}",
            m.path.display(),
            m.version,
            m.mode.label(),
            m.mode.reason()
        );
        if m.mode.is_transaction() {
            s.push_str("BEGIN;\n");
            s.push_str(m.body().trim_end());
            s.push('\n');
            let _ = writeln!(
                s,
                "-- (dbwarden records version {} APPLIED here, in the same transaction)\nCOMMIT;",
                m.version
            );
            continue;
        }
        let n = m.statements.len();
        for i in 0..n {
            let text = m.statement(i).trim_end();
            // A `;` after a trailing `-- comment` would be part of the comment.
            let last_line = text.lines().last().unwrap_or_default();
            let end = if text.ends_with(';') {
                ""
            } else if last_line.contains("--") || last_line.contains('#') {
                "\n;"
            } else {
                ";"
            };
            let _ = writeln!(s, "-- statement {} of {n}, journaled\n{text}{end}", i + 1);
        }
        if n == 0 {
            s.push_str("-- (no statements: recorded as applied)\n");
        }
    }
    s
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

/// `--json`'s one object for a run that finished: its report, what it did (`outcome`) and the
/// run's execution id.
pub fn print_outcome(report: &impl serde::Serialize, outcome: &str, execution_id: uuid::Uuid) {
    let mut v = serde_json::to_value(report).unwrap_or_default();
    v["outcome"] = outcome.into();
    v["execution_id"] = execution_id.to_string().into();
    println!("{v}");
}

/// Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org).
pub fn color_stdout() -> bool {
    use std::io::IsTerminal;
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod snapshots {
    //! The human lock-status view for each verdict, with the holder's timestamps fixed.

    use chrono::{TimeZone, Utc};
    use dbwarden_core::verdict::decide;
    use dbwarden_core::{Grade, HolderInfo, LockState, StatusRow};
    use uuid::Uuid;

    use super::*;

    const TTL: Duration = Duration::from_secs(45);

    fn observation(held: bool, state: Option<LockState>, heartbeat_age_s: i64) -> Observation {
        let now = Utc.with_ymd_and_hms(2026, 11, 30, 3, 25, 18).unwrap();
        let started = Utc.with_ymd_and_hms(2026, 11, 30, 3, 21, 8).unwrap();
        let exec = Uuid::parse_str("3f2a9c4e-0000-4000-8000-000000000017").unwrap();
        let holder = HolderInfo {
            host: "ci-7".into(),
            pid: 4121,
            execution_id: exec,
            owner: "deploy".into(),
            command: "dbwarden migrate".into(),
            started_at: started,
            lock_ttl_ms: None,
            heartbeat_interval_ms: None,
        };
        Observation {
            engine: "sqlite",
            grade: Grade::B,
            namespace: "default".into(),
            held,
            holder_gone: false,
            holder: held.then_some(holder),
            fencing_token: Some(17),
            last_heartbeat_at: Some(now - chrono::Duration::seconds(heartbeat_age_s)),
            server_now: now,
            expires_at: None,
            session_id: held.then(|| "pid 4121".to_owned()),
            status: state.map(|state| StatusRow {
                namespace: "default".into(),
                execution_id: Some(exec),
                owner_id: Some("deploy".into()),
                migration_version: Some(42),
                migration_checksum: None,
                fencing_token: 17,
                host: Some("ci-7".into()),
                pid: Some(4121),
                db_connection_id: None,
                state,
                acquired_at: Some(started),
                last_heartbeat_at: None,
                expires_at: None,
                lock_ttl_ms: None,
                heartbeat_interval_ms: None,
            }),
            notes: vec![],
        }
    }

    fn render(o: &Observation) -> String {
        status_human(o, decide(o, TTL), TTL, false)
    }

    #[test]
    fn available() {
        let o = observation(false, Some(LockState::Complete), 250);
        assert_eq!(
            render(&o),
            "AVAILABLE  namespace=default engine=sqlite (grade B)
  held              no
  state             COMPLETE
  migration         42
  fencing token     17
  heartbeat age     4m10s (ttl 45s)
  next step         nothing to do: the next `dbwarden migrate` takes the lock
"
        );
    }

    #[test]
    fn healthy() {
        let o = observation(true, Some(LockState::Running), 3);
        assert_eq!(
            render(&o),
            "HEALTHY  namespace=default engine=sqlite (grade B)
  held              yes
  holder            host=ci-7 pid=4121 owner=deploy
  execution         3f2a9c4e-0000-4000-8000-000000000017
  command           dbwarden migrate
  acquired          2026-11-30T03:21:08Z
  state             RUNNING
  migration         42
  fencing token     17
  heartbeat age     3s (ttl 45s)
  session           pid 4121
  next step         nothing to do: a holder is running and heartbeating; wait for it
"
        );
    }

    #[test]
    fn stuck() {
        let o = observation(true, Some(LockState::Running), 250);
        let text = render(&o);
        assert!(text.starts_with("STUCK  namespace=default"), "{text}");
        assert!(
            text.contains("  heartbeat age     4m10s (ttl 45s)\n"),
            "{text}"
        );
        assert!(
            text.ends_with("  next step         the holder stopped heartbeating (paused or wedged): check that process; if it is gone for good, run `dbwarden unlock --holder <execution id>`\n"),
            "{text}"
        );
    }

    #[test]
    fn dead() {
        let o = observation(false, Some(LockState::Running), 250);
        assert_eq!(
            render(&o),
            "DEAD  namespace=default engine=sqlite (grade B)
  held              no
  last holder       host=ci-7 pid=4121 owner=deploy
  execution         3f2a9c4e-0000-4000-8000-000000000017
  acquired          2026-11-30T03:21:08Z
  state             RUNNING
  migration         42
  fencing token     17
  heartbeat age     4m10s (ttl 45s)
  discrepancy       the status row says RUNNING but nothing holds the lock
  next step         the holder died mid-run: run `dbwarden migrate`; it inspects the half-done migration and resumes or halts safely
"
        );
    }

    #[test]
    fn needs_review() {
        let o = observation(false, Some(LockState::NeedsReview), 250);
        let text = render(&o);
        assert!(
            text.starts_with("NEEDS_REVIEW  namespace=default"),
            "{text}"
        );
        assert!(text.contains("  migration         42\n"), "{text}");
        assert!(
            text.contains("dbwarden resolve <version> --retry | --mark-applied | --abandon"),
            "{text}"
        );
    }

    #[test]
    fn colour_only_when_asked() {
        assert_eq!(paint(Verdict::Dead, false), "DEAD");
        assert_eq!(paint(Verdict::Dead, true), "\u{1b}[1;31mDEAD\u{1b}[0m");
    }
}
