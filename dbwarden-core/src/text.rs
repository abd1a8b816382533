//! Text as dbwarden prints it: every message is one line.

/// Fold a multi-line server message into one line.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
