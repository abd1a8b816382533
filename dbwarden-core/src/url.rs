//! Database URLs: the scheme picks the engine; the password never leaves this module unredacted.

/// Replace the password of `scheme://user:password@host/...` with `***`.
///
/// ```
/// assert_eq!(
///     dbwarden_core::url::redact("postgres://app:s3cret@db:5432/prod"),
///     "postgres://app:***@db:5432/prod"
/// );
/// ```
pub fn redact(url: &str) -> String {
    redact_params(&redact_userinfo(url))
}

/// `user:password@` → `user:***@`. The password may itself contain `/`, `?`, `#` or `@`, so the
/// user info runs to the LAST `@`.
fn redact_userinfo(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let Some(at) = url[start..].rfind('@').map(|i| start + i) else {
        return url.to_owned();
    };
    let userinfo = &url[start..at];
    let Some(colon) = userinfo.find(':') else {
        return url.to_owned();
    };
    format!("{}:***{}", &url[..start + colon], &url[at..])
}

fn secret_key(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    k.contains("pass") || k.contains("pwd") || k.contains("secret") || k.contains("token")
}

/// `password=...` (query parameters, or libpq-style `key=value` words) → `password=***`.
fn redact_params(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(eq) = rest.find('=') {
        let key_start = rest[..eq]
            .rfind(['?', '&', ';', ' ', '\t'])
            .map_or(0, |i| i + 1);
        let value_end = rest[eq + 1..]
            .find(['&', ';', ' ', '\t', '#'])
            .map_or(rest.len(), |i| eq + 1 + i);
        out.push_str(&rest[..eq + 1]);
        if secret_key(&rest[key_start..eq]) {
            out.push_str("***");
        } else {
            out.push_str(&rest[eq + 1..value_end]);
        }
        rest = &rest[value_end..];
    }
    out.push_str(rest);
    out
}

/// The scheme of a URL (`sqlite`, `postgres`, ...), lower-cased, if it has one.
pub fn scheme(url: &str) -> Option<String> {
    let end = url.find(':')?;
    let s = &url[..end];
    let valid = !s.is_empty()
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-' || b == b'.');
    valid.then(|| s.to_ascii_lowercase())
}

/// A URL cut where host lists need it, nothing decoded: `scheme://[userinfo@]host[,host…]
/// [/path][?query]`. The engines that take several hosts (PostgreSQL failover, etcd) read
/// them the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parts<'a> {
    pub scheme: &'a str,
    /// `user[:password]`, without its `@`.
    pub userinfo: Option<&'a str>,
    /// The hosts as written, one entry per comma-separated part (one without a comma).
    pub hosts: Vec<&'a str>,
    /// From the `/` after the hosts up to the query (empty without one).
    pub path: &'a str,
    pub query: Option<&'a str>,
}

/// [`Parts`] of `url`; `None` without `://`. The hosts end at the first `/` or `?`.
pub fn parts(url: &str) -> Option<Parts<'_>> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, list) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (path, query) = match tail.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (tail, None),
    };
    Some(Parts {
        scheme,
        userinfo,
        hosts: list.split(',').collect(),
        path,
        query,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cut_host_lists_without_decoding() {
        let p = parts("etcd://u:p@ss@a:1,b:2/pre/fix?x=1").unwrap();
        assert_eq!(p.scheme, "etcd");
        assert_eq!(p.userinfo, Some("u:p@ss"));
        assert_eq!(p.hosts, ["a:1", "b:2"]);
        assert_eq!((p.path, p.query), ("/pre/fix", Some("x=1")));
        let p = parts("postgres://h?sslmode=require").unwrap();
        assert_eq!((p.userinfo, p.hosts, p.path), (None, vec!["h"], ""));
        assert_eq!(parts("sqlite:x.db"), None);
    }

    #[test]
    fn redacts_only_the_password() {
        assert_eq!(redact("mysql://root@h/db"), "mysql://root@h/db");
        assert_eq!(redact("redis://:pw@h:6379"), "redis://:***@h:6379");
        assert_eq!(redact("sqlite://x.db"), "sqlite://x.db");
        assert_eq!(redact("postgres://u:p@ss@h/d"), "postgres://u:***@h/d");
        assert_eq!(
            redact("postgres://h/d?password=x"),
            "postgres://h/d?password=***"
        );
    }

    #[test]
    fn passwords_with_awkward_characters_never_survive() {
        for url in [
            "oracle://app:hun/ter2@db/x",
            "postgres://app:hun?ter2@db/x",
            "postgres://app:hun#ter2@db/x",
            "postgres://app:hun@ter2@db/x",
            "admin:hunter2@db.example.com/prod",
            "host=db user=app password=hunter2 dbname=x",
            "postgres://h/d?sslpassword=hunter2&x=1",
            "mysql://h/d?user=a&PASSWORD=hunter2",
        ] {
            let r = redact(url);
            assert!(
                !r.contains("hunter2") && !r.contains("ter2"),
                "{url} -> {r}"
            );
        }
        assert_eq!(
            redact("postgres://h/d?sslmode=require"),
            "postgres://h/d?sslmode=require"
        );
    }

    #[test]
    fn scheme_of() {
        assert_eq!(scheme("SQLite://x").as_deref(), Some("sqlite"));
        assert_eq!(scheme("x.db"), None);
        assert_eq!(scheme("://x"), None);
    }
}
