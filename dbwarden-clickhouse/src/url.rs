//! Database URLs for ClickHouse, checked without connecting.
//!
//! * `clickhouse://[user[:password]@]host[:port][/database][?validation=on]` — the HTTP
//!   interface (port 8123 by default), database `default` when the path is empty;
//! * `http://[user[:password]@]host[:port]/?database=<db>[&user=…&password=…]` — the same
//!   server addressed the way ClickHouse's own HTTP clients do (a `/<db>` path works too).
//!
//! `validation=on` makes the `clickhouse` client ask for `RowBinaryWithNamesAndTypes` and check
//! row types; it is off by default because servers before that format (18.16) refuse it.
//! `https://` is refused: this build has no TLS; reach the server through a TLS tunnel or use
//! `http://` on a trusted network.

use dbwarden_core::Error;
use dbwarden_core::config::validate_identifier;

use crate::server::Endpoint;

const DEFAULT_PORT: u16 = 8123;

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Parse a ClickHouse URL into an [`Endpoint`].
pub fn parse(url: &str) -> Result<Endpoint, Error> {
    let shown = dbwarden_core::url::redact(url);
    let bad = |why: &str| {
        Error::usage(format!(
            "invalid ClickHouse URL {shown:?}: {why}; use clickhouse://user@host:8123/database or http://host:8123/?database=db"
        ))
    };
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
    let scheme = scheme.to_ascii_lowercase();
    match scheme.as_str() {
        "clickhouse" | "http" => {}
        "https" => {
            return Err(Error::usage(format!(
                "{shown:?}: https is not supported by this build (no TLS); use http:// on a trusted network or through a TLS tunnel"
            )));
        }
        _ => return Err(bad("unknown scheme")),
    }
    let (before_query, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest, None),
    };
    let before_query = before_query.split('#').next().unwrap_or_default();
    let (authority, path) = match before_query.split_once('/') {
        Some((a, p)) => (a, p),
        None => (before_query, ""),
    };
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (mut user, mut password) = match userinfo {
        Some(u) => match u.split_once(':') {
            Some((n, p)) => (Some(percent_decode(n)), Some(percent_decode(p))),
            None => (Some(percent_decode(u)), None),
        },
        None => (None, None),
    };
    if hostport.is_empty() {
        return Err(bad("no host"));
    }
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || hostport.starts_with('[') => {
            let port: u16 = p.parse().map_err(|_| bad("the port is not a number"))?;
            (h, port)
        }
        _ => (hostport, DEFAULT_PORT),
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(bad("bad host"));
    }
    let mut database = path.trim_matches('/').to_owned();
    let mut validation = false;
    for kv in query
        .unwrap_or_default()
        .split('&')
        .filter(|s| !s.is_empty())
    {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let v = percent_decode(v);
        match k {
            "database" => database = v,
            "user" => user = Some(v),
            "password" => password = Some(v),
            "validation" => {
                validation = match v.as_str() {
                    "on" | "true" | "1" => true,
                    "off" | "false" | "0" => false,
                    _ => return Err(bad("validation must be on or off")),
                }
            }
            other => {
                return Err(bad(&format!(
                    "unknown parameter `{other}` (known: database, user, password, validation)"
                )));
            }
        }
    }
    if database.is_empty() {
        database = "default".into();
    }
    validate_identifier("database", &database)?;
    Ok(Endpoint {
        http_url: format!("http://{host}:{port}"),
        target: format!("{host}:{port}"),
        database,
        user: user.filter(|u| !u.is_empty()),
        password,
        validation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clickhouse_scheme_maps_to_http() {
        let e = parse("clickhouse://app:s%3Acret@db.internal:8124/analytics").unwrap();
        assert_eq!(e.http_url, "http://db.internal:8124");
        assert_eq!(e.target, "db.internal:8124");
        assert_eq!(e.database, "analytics");
        assert_eq!(e.user.as_deref(), Some("app"));
        assert_eq!(e.password.as_deref(), Some("s:cret"));
        assert!(!e.validation);
        let d = parse("clickhouse://localhost").unwrap();
        assert_eq!(
            (d.http_url.as_str(), d.database.as_str()),
            ("http://localhost:8123", "default")
        );
    }

    #[test]
    fn http_scheme_takes_the_database_parameter() {
        let e = parse("http://127.0.0.1:8123/?database=dbw_x&validation=on").unwrap();
        assert_eq!(e.database, "dbw_x");
        assert!(e.validation);
        let p = parse("http://h:9/dbw_y?user=u&password=p").unwrap();
        assert_eq!(p.database, "dbw_y");
        assert_eq!(
            (p.user.as_deref(), p.password.as_deref()),
            (Some("u"), Some("p"))
        );
    }

    #[test]
    fn bad_urls_are_usage_errors_without_the_password() {
        for bad in [
            "clickhouse://u:hunter2@h/db;drop",
            "clickhouse://u:hunter2@h:port/db",
            "clickhouse://u:hunter2@/db",
            "https://u:hunter2@h/db",
            "clickhouse://u:hunter2@h/db?validation=maybe",
            "clickhouse://u:hunter2@h/db?colour=blue",
            "http://u:hunter2@h/?database=a-b",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit_code().code(), 2, "{bad}");
            assert!(!e.to_string().contains("hunter2"), "{bad}: {e}");
        }
    }
}
