//! Table names derived from a namespace or a stale holder: plain `[A-Za-z0-9_]` identifiers
//! (quoted with backticks all the same), with an md5 suffix wherever the mapping could collide.

use dbwarden_core::Namespace;
use md5::{Digest, Md5};

fn md5_hex8(s: &str) -> String {
    let digest = Md5::digest(s.as_bytes());
    digest.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// `dbwarden_lock_<ns>`: `.` and `-` become `_`; when that mapping could collide (the namespace
/// had `.`/`-`, or names the audit table, or looks like a stale lock's name) the first 8 hex
/// digits of md5(namespace) are appended. At most 14 + 64 + 9 characters.
pub fn lock_table_name(ns: &Namespace) -> String {
    let raw = ns.as_str();
    let mapped: String = raw
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let ambiguous = mapped != raw
        || mapped.eq_ignore_ascii_case("audit")
        || mapped.to_ascii_lowercase().contains("_stale_")
        || mapped.to_ascii_lowercase().contains("_released_");
    if ambiguous {
        format!("dbwarden_lock_{mapped}_{}", md5_hex8(raw))
    } else {
        format!("dbwarden_lock_{mapped}")
    }
}

/// Who a stale lock table belonged to, as its new name records it.
#[derive(Debug, Clone, Copy)]
pub struct StaleHolder<'a> {
    pub host: &'a str,
    /// Unix seconds by the holder's clock.
    pub started_at: u32,
    pub pid: u32,
    pub execution_id: &'a str,
}

/// `<lock>_stale_<host>_<unix>_<pid>_<id>` of the stale holder (its host reduced to
/// `[A-Za-z0-9_]`, at most 24 characters, with an md5 suffix when changed; its start time; its
/// pid; the first 8 hex digits of its execution id). Every contender that judged the same lock
/// stale renames it to the same name, so exactly one RENAME succeeds; the others find the
/// target taken (code 57) or the source gone (code 60).
///
/// `holder` is `None` for a lock table without a holder row; its creation time stands in.
pub fn stale_table_name(
    lock: &str,
    holder: Option<StaleHolder<'_>>,
    created: Option<u32>,
) -> String {
    let (host, unix, pid, id) = match holder {
        Some(h) => (
            h.host,
            h.started_at,
            h.pid,
            h.execution_id
                .chars()
                .filter(char::is_ascii_hexdigit)
                .take(8)
                .collect(),
        ),
        None => ("nohost", created.unwrap_or(0), 0, "empty".to_owned()),
    };
    let mapped: String = host
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(24)
        .collect();
    let host_id = if mapped == host {
        mapped
    } else {
        format!("{mapped}_{}", md5_hex8(host))
    };
    format!("{lock}_stale_{host_id}_{unix}_{pid}_{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(s: &str) -> Namespace {
        Namespace::new(s).unwrap()
    }

    #[test]
    fn lock_table_names_are_identifiers_and_never_collide() {
        assert_eq!(lock_table_name(&ns("default")), "dbwarden_lock_default");
        let dotted = lock_table_name(&ns("billing.v2"));
        let dashed = lock_table_name(&ns("billing-v2"));
        let plain = lock_table_name(&ns("billing_v2"));
        assert!(dotted.starts_with("dbwarden_lock_billing_v2_"), "{dotted}");
        assert_ne!(dotted, dashed);
        assert_ne!(dotted, plain);
        assert_ne!(dashed, plain);
        assert_ne!(lock_table_name(&ns("audit")), "dbwarden_lock_audit");
        assert_ne!(
            lock_table_name(&ns("x_stale_h_1_2")),
            "dbwarden_lock_x_stale_h_1_2"
        );
        let long = lock_table_name(&ns(&format!("a.{}", "b".repeat(62))));
        assert!(long.len() <= 14 + 64 + 9, "{}", long.len());
        for n in [dotted, dashed, long] {
            dbwarden_core::config::validate_identifier("t", &n[..n.len().min(63)]).unwrap();
            assert!(n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        }
    }

    #[test]
    fn stale_names_name_the_stale_holder_and_sanitise_its_host() {
        let holder = |host| StaleHolder {
            host,
            started_at: 1_700_000_000,
            pid: 42,
            execution_id: "3f2a9c1e-0000-4000-8000-000000000000",
        };
        assert_eq!(
            stale_table_name("dbwarden_lock_default", Some(holder("ci7")), None),
            "dbwarden_lock_default_stale_ci7_1700000000_42_3f2a9c1e"
        );
        let n = stale_table_name(
            "dbwarden_lock_x",
            Some(holder("web-1.prod.example.com")),
            None,
        );
        assert!(
            n.starts_with("dbwarden_lock_x_stale_web_1_prod_example_com_"),
            "{n}"
        );
        assert!(n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        let other = stale_table_name(
            "dbwarden_lock_x",
            Some(holder("web_1.prod.example.com")),
            None,
        );
        assert_ne!(other, n);
        assert_eq!(
            stale_table_name("l", None, Some(4)),
            "l_stale_nohost_4_0_empty"
        );
    }
}
