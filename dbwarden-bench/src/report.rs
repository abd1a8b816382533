//! One markdown table per engine: the ratio (or headline number) first, then the goal, whether it
//! was met, and the raw numbers behind it.

use std::fmt::Write as _;

/// How a result compares with its goal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    /// No goal on this engine: reported only.
    Reported,
    /// Nothing was measured (engine not in the build, not applicable, or the run failed).
    NotMeasured,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "**missed**",
            Verdict::Reported => "(report)",
            Verdict::NotMeasured => "—",
        }
    }

    /// `Met` when `ok`, else `Missed`.
    pub fn goal(ok: bool) -> Self {
        if ok { Verdict::Met } else { Verdict::Missed }
    }
}

/// One measurement of one engine.
#[derive(Debug, Clone)]
pub struct Row {
    pub measurement: &'static str,
    /// Ratio or headline number.
    pub result: String,
    pub goal: String,
    pub verdict: Verdict,
    /// The raw numbers behind `result`.
    pub detail: String,
}

impl Row {
    pub fn new(measurement: &'static str) -> Self {
        Row {
            measurement,
            result: String::new(),
            goal: String::new(),
            verdict: Verdict::Reported,
            detail: String::new(),
        }
    }

    pub fn result(mut self, s: impl Into<String>) -> Self {
        self.result = s.into();
        self
    }

    pub fn goal(mut self, s: impl Into<String>, verdict: Verdict) -> Self {
        self.goal = s.into();
        self.verdict = verdict;
        self
    }

    pub fn detail(mut self, s: impl Into<String>) -> Self {
        self.detail = s.into();
        self
    }

    /// A measurement that was not taken, and why.
    pub fn not_measured(measurement: &'static str, why: impl Into<String>) -> Self {
        Row {
            measurement,
            result: format!("not measured: {}", why.into()),
            goal: String::new(),
            verdict: Verdict::NotMeasured,
            detail: String::new(),
        }
    }
}

/// Markdown for one engine's rows.
pub fn table(title: &str, rows: &[Row]) -> String {
    let mut out = format!("### {title}\n\n");
    out.push_str("| measurement | result | goal | | numbers |\n");
    out.push_str("|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            r.measurement,
            cell(&r.result),
            cell(&r.goal),
            r.verdict.label(),
            cell(&r.detail)
        );
    }
    out
}

/// A table cell: one line, pipes escaped.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}
