//! Human durations for flags and config: `0`, `250ms`, `5s`, `5m`, `1h30m`, or bare seconds.

use std::time::Duration;

use crate::Error;

/// Parse `what` (named in the error) as a duration.
///
/// ```
/// use std::time::Duration;
/// use dbwarden_core::duration::parse;
/// assert_eq!(parse("--wait", "1m30s").unwrap(), Duration::from_secs(90));
/// assert_eq!(parse("--wait", "0").unwrap(), Duration::ZERO);
/// ```
pub fn parse(what: &str, s: &str) -> Result<Duration, Error> {
    let bad = || {
        Error::usage(format!(
            "invalid duration {s:?} for {what}: use e.g. 0, 500ms, 30s, 5m, 1h"
        ))
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse::<u64>().map(Duration::from_secs).map_err(|_| bad());
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(|b| b.is_ascii_alphabetic()).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
            "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
            _ => return Err(bad()),
        };
        total = total.checked_add(part).ok_or_else(bad)?;
    }
    Ok(total)
}

/// Render a duration compactly for humans: `950ms`, `4m10s`, `2h3m`.
pub fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("x", "250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse("x", "5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse("x", "1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("x", "45").unwrap(), Duration::from_secs(45));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "-1s", "5 m", "m", "1x", "1.5s", "99999999999999999999h"] {
            assert!(parse("--wait", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn renders() {
        assert_eq!(human(Duration::from_secs(250)), "4m10s");
        assert_eq!(human(Duration::from_millis(12)), "12ms");
        assert_eq!(human(Duration::from_secs(7380)), "2h3m");
    }
}
