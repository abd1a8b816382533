//! Several hosts in one URL, as libpq reads them:
//! `postgres://user@db-a:5432,db-b:5432/app?target_session_attrs=read-write`. dbwarden writes
//! (its tables, the migrations) and takes an advisory lock, which only the primary has, so a
//! connection goes to the first host that answers as a primary (`pg_is_in_recovery()` false),
//! starting from the one that was the primary last time. After a failover, runners on such a URL
//! find the promoted standby by themselves; the holder that was on the old primary lost its
//! session with it, and so its lock (exit 4, docs/design.md §7.2).

use dbwarden_core::Error;

/// The values of `target_session_attrs` dbwarden accepts: every one that admits a primary.
const WRITABLE: [&str; 3] = ["read-write", "primary", "any"];

/// `url` once per host of its host list (the same URL for a single host), without
/// `target_session_attrs`, which is checked here: dbwarden needs the primary.
pub(crate) fn split(url: &str) -> Result<Vec<String>, String> {
    let Some(parts) = dbwarden_core::url::parts(url) else {
        return Ok(vec![url.to_owned()]);
    };
    let (scheme, path, query) = (parts.scheme, parts.path, parts.query);
    let userinfo = parts.userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    let mut kept = Vec::new();
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        match pair.split_once('=') {
            Some(("target_session_attrs", v)) if !WRITABLE.contains(&v) => {
                return Err(format!(
                    "target_session_attrs={v}: dbwarden writes its tables and takes its lock on the primary; use read-write (or leave it out)"
                ));
            }
            Some(("target_session_attrs", _)) => {}
            _ if !pair.is_empty() => kept.push(pair),
            _ => {}
        }
    }
    let query = match kept.is_empty() {
        true => String::new(),
        false => format!("?{}", kept.join("&")),
    };
    if let [one] = parts.hosts[..] {
        // One host, or none (a Unix socket in `?host=`, libpq's defaults): as written, but
        // without the attribute sqlx does not know.
        return Ok(vec![format!("{scheme}://{userinfo}{one}{path}{query}")]);
    }
    if parts.hosts.iter().any(|h| h.is_empty()) {
        return Err("an empty host in the host list; write host[:port],host[:port]".to_owned());
    }
    Ok(parts
        .hosts
        .iter()
        .map(|h| format!("{scheme}://{userinfo}{h}{path}{query}"))
        .collect())
}

/// Why no host of a list gave a primary connection, as the error a caller sees: a host that
/// answered as a standby makes it a busy attempt (a failover may be under way: a waiter tries
/// again within its wait); hosts that all failed make it unreachable.
pub(crate) fn no_primary(shown: &str, why: &[String], saw_standby: bool, saw_full: bool) -> Error {
    let detail = why.join("; ");
    if saw_full && !saw_standby {
        return Error::Busy(Box::new(dbwarden_core::error::BusyInfo {
            note: Some(format!(
                "no primary among the hosts of {shown} ({detail}): a full server is waited for"
            )),
            server_full: true,
            ..Default::default()
        }));
    }
    if saw_standby {
        return Error::Busy(Box::new(dbwarden_core::error::BusyInfo {
            note: Some(format!(
                "no primary among the hosts of {shown} ({detail}): a failover may be under way"
            )),
            ..Default::default()
        }));
    }
    Error::unreachable(shown.to_owned(), format!("no host answered: {detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_host_gets_the_whole_url_without_the_session_attrs() {
        let urls = split(
            "postgres://app:pw@db-a:5432,db-b:5433/prod?sslmode=disable&target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!(
            urls,
            [
                "postgres://app:pw@db-a:5432/prod?sslmode=disable",
                "postgres://app:pw@db-b:5433/prod?sslmode=disable",
            ]
        );
        assert_eq!(
            split("postgresql://h1,h2").unwrap(),
            ["postgresql://h1", "postgresql://h2"]
        );
        assert_eq!(
            split("postgres://root@127.0.0.1:5432/test").unwrap(),
            ["postgres://root@127.0.0.1:5432/test"]
        );
        assert_eq!(
            split("postgres://root@h/test?target_session_attrs=primary").unwrap(),
            ["postgres://root@h/test"]
        );
        // No host at all: a Unix socket or libpq's defaults, passed through.
        for url in [
            "postgresql:///mydb",
            "postgres:///db?host=/var/run/postgresql",
        ] {
            assert_eq!(split(url).unwrap(), [url]);
        }
    }

    #[test]
    fn a_standby_only_choice_and_an_empty_host_are_refused() {
        let e = split("postgres://h1,h2/db?target_session_attrs=read-only").unwrap_err();
        assert!(e.contains("read-write"), "{e}");
        let e = split("postgres://h1,,h2/db").unwrap_err();
        assert!(e.contains("empty host"), "{e}");
    }
}
