//! Database URLs for MySQL and MariaDB (`mysql://`, `mariadb://`), checked without connecting.

use std::str::FromStr;

use dbwarden_core::Error;
use sqlx::ConnectOptions;
use sqlx::mysql::MySqlConnectOptions;

/// Parse `mysql://` or `mariadb://user:password@host:port/database?...` into connect options
/// and the database name. The session is set up as sqlx sets it (`PIPES_AS_CONCAT`,
/// `NO_ENGINE_SUBSTITUTION`, `time_zone = '+00:00'`), so a folder sqlx-cli applied gives the
/// same schema here; [`MySqlLock::session`] can leave the server's own instead.
///
/// [`MySqlLock::session`]: crate::MySqlLock::session
pub fn options_from_url(url: &str) -> Result<(MySqlConnectOptions, String), Error> {
    // Without `://` there is no authority to redact a password from: show no URL at all.
    let shown = if url.contains("://") {
        dbwarden_core::url::redact(url)
    } else {
        "<not shown>".to_owned()
    };
    let usage = |why: &str| {
        Error::usage(format!(
            "invalid database URL {shown:?}: {why}; use mysql://user:password@host:3306/database (or mariadb://...)"
        ))
    };
    let rest = match dbwarden_core::url::scheme(url).as_deref() {
        Some(s @ ("mysql" | "mariadb")) => &url[s.len()..],
        _ => return Err(usage("not a mysql:// or mariadb:// URL")),
    };
    if !rest.starts_with("://") {
        return Err(usage("expected :// after the scheme"));
    }
    // sqlx knows only mysql://; the two schemes mean the same server protocol.
    let options = MySqlConnectOptions::from_str(&format!("mysql{rest}"))
        .map_err(|e| usage(&dbwarden_core::error::one_line(&e.to_string())))?;
    let database = options
        .get_database()
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| usage("it names no database (the lock and its tables live in one)"))?;
    if database.chars().count() > 64 {
        return Err(usage("the database name is longer than 64 characters"));
    }
    let options = options.disable_statement_logging();
    Ok((options, database))
}

#[cfg(test)]
mod tests {
    use dbwarden_core::Namespace;

    use super::*;
    use crate::MySqlLock;

    #[test]
    fn mysql_and_mariadb_urls_name_a_database() {
        let (o, db) = options_from_url("mysql://root@127.0.0.1:3306/app").unwrap();
        assert_eq!(
            (o.get_host(), o.get_port(), db.as_str()),
            ("127.0.0.1", 3306, "app")
        );
        let (o, db) =
            options_from_url("mariadb://u:p%40ss@db.internal/shop?ssl-mode=disabled").unwrap();
        assert_eq!(
            (o.get_host(), o.get_username(), db.as_str()),
            ("db.internal", "u", "shop")
        );
        let lock = MySqlLock::from_url("MariaDB://root@h/app", Namespace::default()).unwrap();
        assert_eq!(lock.lock_name(), "dbwarden.app.default");
    }

    #[test]
    fn bad_urls_are_usage_errors_without_the_password() {
        for bad in [
            "mysql://root:hunter2@127.0.0.1:3306",
            "mysql://root:hunter2@127.0.0.1:3306/",
            "mysql://root:hunter2@127.0.0.1:notaport/db",
            "mysql:root:hunter2@127.0.0.1/db",
            "postgres://root:hunter2@127.0.0.1/db",
        ] {
            let e = options_from_url(bad).unwrap_err();
            assert_eq!(e.exit_code().code(), 2, "{bad}");
            let msg = e.to_string();
            assert!(!msg.contains("hunter2"), "{msg}");
            assert!(msg.contains("root:***@") || !bad.contains("://"), "{msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
        let e = options_from_url("mysql://root@h/").unwrap_err();
        assert!(e.to_string().contains("names no database"), "{e}");
    }
}
