//! The server-wide names of the named locks: the lock of a namespace and a holder's liveness lock.

use md5::{Digest, Md5};

/// Longest lock name MySQL accepts (MariaDB accepts more; we keep to the smaller limit).
pub const MAX_LOCK_NAME: usize = 64;

/// The server-wide lock name of `namespace` in `database`: `dbwarden.<database>.<namespace>`.
///
/// Named locks are server-wide, so the name carries the database: a runner on one database never
/// blocks one on another. A name over 64 characters, or one with upper-case letters (MySQL 8
/// compares lock names case-insensitively, MariaDB does not), becomes a readable lower-case
/// prefix plus `.` and the first 16 hex digits of the MD5 of the full name: at most 64
/// characters, distinct for distinct names, the same on every run.
///
/// ```
/// use dbwarden_mysql::lock::lock_name;
/// assert_eq!(lock_name("app", "default"), "dbwarden.app.default");
/// let long = lock_name("app", &"x".repeat(64));
/// assert_eq!(long.chars().count(), 64);
/// assert!(long.starts_with("dbwarden.app.xxx"));
/// ```
pub fn lock_name(database: &str, namespace: &str) -> String {
    let full = format!("dbwarden.{database}.{namespace}");
    let plain = full.chars().count() <= MAX_LOCK_NAME && !full.chars().any(char::is_uppercase);
    if plain {
        return full;
    }
    let digest = hex::encode(Md5::digest(full.as_bytes()));
    let prefix: String = full
        .to_lowercase()
        .chars()
        .take(MAX_LOCK_NAME - 17)
        .collect();
    format!("{prefix}.{}", &digest[..16])
}

/// The server-wide name of the liveness lock of the holder whose lock session is connection
/// `lock_conn_id` (connection ids are unique on a server while it runs).
///
/// ```
/// assert_eq!(dbwarden_mysql::lock::alive_name(42), "dbwarden.alive.42");
/// ```
pub fn alive_name(lock_conn_id: u64) -> String {
    format!("dbwarden.alive.{lock_conn_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_lower_case_names_are_kept_readable() {
        assert_eq!(lock_name("test", "default"), "dbwarden.test.default");
        assert_eq!(
            lock_name("app_db", "billing.v2"),
            "dbwarden.app_db.billing.v2"
        );
    }

    #[test]
    fn long_names_get_an_md5_suffix_and_stay_within_64() {
        let ns = "n".repeat(64);
        let name = lock_name("dbw_0123456789ab", &ns);
        assert_eq!(name.chars().count(), 64);
        assert!(name.starts_with("dbwarden.dbw_0123456789ab.nnnn"), "{name}");
        // The suffix is the first 16 hex digits of md5 of the full name.
        let full = format!("dbwarden.dbw_0123456789ab.{ns}");
        let md5 = hex::encode(Md5::digest(full.as_bytes()));
        assert!(name.ends_with(&format!(".{}", &md5[..16])), "{name}");
        // Stable: the same inputs give the same name on every run.
        assert_eq!(name, lock_name("dbw_0123456789ab", &ns));
    }

    #[test]
    fn names_are_pinned_so_old_and_new_runners_exclude_each_other() {
        // Changing the derivation would let two dbwarden versions hold "the same" lock at once.
        assert_eq!(
            lock_name("app", &"x".repeat(64)),
            "dbwarden.app.xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx.f7deb57ff7175a73"
        );
        assert_eq!(
            lock_name("app", "Billing"),
            "dbwarden.app.billing.2ee57af98052caa4"
        );
    }

    #[test]
    fn long_namespaces_sharing_a_prefix_get_distinct_names() {
        let a = format!("{}a", "x".repeat(63));
        let b = format!("{}b", "x".repeat(63));
        let (na, nb) = (lock_name("db", &a), lock_name("db", &b));
        assert_ne!(na, nb);
        // The full names share far more than 64 characters: truncation alone would collide.
        assert_eq!(na[..47], nb[..47]);
        for n in [&na, &nb] {
            assert!(n.chars().count() <= MAX_LOCK_NAME, "{n}");
        }
        // Exactly 64 characters stays plain; 65 is hashed.
        let room = MAX_LOCK_NAME - "dbwarden.db.".len();
        assert_eq!(
            lock_name("db", &"y".repeat(room)),
            format!("dbwarden.db.{}", "y".repeat(room))
        );
        assert_ne!(
            lock_name("db", &"y".repeat(room + 1)),
            format!("dbwarden.db.{}", "y".repeat(room + 1))
        );
    }

    #[test]
    fn names_differing_in_case_do_not_share_a_lock() {
        // MySQL 8 compares lock names case-insensitively; the md5 keeps them apart.
        let upper = lock_name("db", "Billing");
        let lower = lock_name("db", "billing");
        assert_ne!(upper.to_lowercase(), lower.to_lowercase());
        assert_eq!(upper, upper.to_lowercase());
        assert!(upper.starts_with("dbwarden.db.billing."), "{upper}");
        assert_ne!(lock_name("App", "x"), lock_name("app", "x"));
    }

    #[test]
    fn the_database_is_part_of_the_name() {
        assert_ne!(lock_name("a", "default"), lock_name("b", "default"));
        let long = "z".repeat(64);
        assert_ne!(lock_name("a", &long), lock_name("b", &long));
    }
}
