//! Servers that speak the PostgreSQL or MySQL protocol but whose lock primitive is not the lock
//! dbwarden relies on (docs/engines.md, "Clusters"). Detected from the version the server
//! reports, in the query each engine already runs before it takes its lock; refused (exit 2,
//! nothing written) unless the run is held inside a lease every runner shares. None of them is
//! installable here: the refusal is what is tested, not support.

use crate::Error;

/// A look-alike server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookAlike {
    CockroachDb,
    YugabyteDb,
    TiDb,
    Vitess,
}

impl LookAlike {
    /// From the server's version text (`SELECT version()`, the `version` variable).
    pub fn detect(version: &str) -> Option<LookAlike> {
        let v = version.to_ascii_lowercase();
        if v.contains("cockroachdb") {
            Some(LookAlike::CockroachDb)
        } else if v.contains("-yb-") || v.contains("yugabyte") {
            Some(LookAlike::YugabyteDb)
        } else if v.contains("tidb") {
            Some(LookAlike::TiDb)
        } else if v.contains("vitess") {
            Some(LookAlike::Vitess)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LookAlike::CockroachDb => "CockroachDB",
            LookAlike::YugabyteDb => "YugabyteDB",
            LookAlike::TiDb => "TiDB",
            LookAlike::Vitess => "Vitess",
        }
    }

    /// Why the engine's lock is not trusted there.
    fn why(self) -> &'static str {
        match self {
            LookAlike::CockroachDb => {
                "its pg_advisory_lock functions do not exclude another session, so two runners would both hold the lock"
            }
            LookAlike::YugabyteDb => {
                "its advisory locks are absent or a preview across tablet servers, and untested with dbwarden"
            }
            LookAlike::TiDb => {
                "its GET_LOCK does nothing before TiDB 5.3 and is untested with dbwarden after"
            }
            LookAlike::Vitess => {
                "vtgate routes GET_LOCK to one reserved connection of its own, untested with dbwarden"
            }
        }
    }
}

/// Refuse a look-alike whose lock would not be one, unless an outer lease every runner shares
/// holds the run (`--redis-url`).
pub fn refuse(shown: &str, version: &str, outer_lease: bool) -> Result<(), Error> {
    match LookAlike::detect(version) {
        Some(l) if !outer_lease => Err(Error::usage(format!(
            "{shown} is {} ({}): {}; nothing was run. Hold the run under a lease every runner shares: add --lock-url redis://HOST:6379 (lock_url; --redis-url is its older name)",
            l.name(),
            crate::text::one_line(version),
            l.why()
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_look_alike_is_known_by_its_version_and_the_real_servers_are_not() {
        let cases = [
            (
                "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27)",
                Some(LookAlike::CockroachDb),
            ),
            (
                "PostgreSQL 11.2-YB-2.20.1.0-b0 on x86_64-pc-linux-gnu",
                Some(LookAlike::YugabyteDb),
            ),
            ("8.0.11-TiDB-v7.5.0", Some(LookAlike::TiDb)),
            ("8.0.30-Vitess", Some(LookAlike::Vitess)),
            (
                "PostgreSQL 15.10 (Debian 15.10-0+deb12u1) on x86_64-pc-linux-gnu",
                None,
            ),
            ("10.11.19-MariaDB-0+deb12u1", None),
            ("8.0.40", None),
        ];
        for (v, want) in cases {
            assert_eq!(LookAlike::detect(v), want, "{v}");
        }
    }

    #[test]
    fn a_look_alike_is_refused_naming_the_outer_lease_unless_one_holds_the_run() {
        let e = refuse("db:26257/app", "CockroachDB CCL v23.1.11", false).unwrap_err();
        assert_eq!(e.exit_code(), crate::ExitCode::USAGE);
        let text = e.to_string();
        assert!(
            text.contains("is CockroachDB") && text.contains("--redis-url"),
            "{text}"
        );
        assert!(refuse("db:26257/app", "CockroachDB CCL v23.1.11", true).is_ok());
        assert!(refuse("db:5432/app", "PostgreSQL 15.10", false).is_ok());
    }
}
