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
    redact_query(&redact_userinfo(url))
}

fn redact_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let auth_start = scheme_end + 3;
    let rest = &url[auth_start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &authority[..at];
    let Some(colon) = userinfo.find(':') else {
        return url.to_owned();
    };
    format!(
        "{}{}:***{}",
        &url[..auth_start],
        &userinfo[..colon],
        &url[auth_start + at..]
    )
}

/// Redact `password=` / `pass=` / `pwd=` query parameters.
fn redact_query(url: &str) -> String {
    let Some(q) = url.find('?') else {
        return url.to_owned();
    };
    let (head, query) = url.split_at(q + 1);
    let parts: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _))
                if matches!(k.to_ascii_lowercase().as_str(), "password" | "pass" | "pwd") =>
            {
                format!("{k}=***")
            }
            _ => kv.to_owned(),
        })
        .collect();
    format!("{head}{}", parts.join("&"))
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn scheme_of() {
        assert_eq!(scheme("SQLite://x").as_deref(), Some("sqlite"));
        assert_eq!(scheme("x.db"), None);
        assert_eq!(scheme("://x"), None);
    }
}
