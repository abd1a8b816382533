//! One error type for the whole tool; its [`ErrorKind`] tells a caller whether to retry, wait or
//! give up, and maps to the exit codes of the contract (docs/design.md §8).

use std::fmt;

use crate::migration::MigrationFileError;

/// The process exit code an error (or an outcome) maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitCode(pub u8);

impl ExitCode {
    pub const OK: ExitCode = ExitCode(0);
    pub const MIGRATION_FAILED: ExitCode = ExitCode(1);
    pub const USAGE: ExitCode = ExitCode(2);
    pub const BUSY: ExitCode = ExitCode(3);
    pub const LOST: ExitCode = ExitCode(4);
    /// `validate`: the folder and the history disagree.
    pub const INVALID: ExitCode = ExitCode(5);
    pub const STUCK: ExitCode = ExitCode(10);
    pub const DEAD: ExitCode = ExitCode(11);
    pub const NEEDS_REVIEW: ExitCode = ExitCode(12);
    pub const INTERRUPTED: ExitCode = ExitCode(75);
    pub const HALTED: ExitCode = ExitCode(78);

    pub fn code(self) -> u8 {
        self.0
    }
}

/// What kind of failure this is, i.e. what the caller should do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad flag, config, URL, namespace or migration file: fix the input. Nothing was touched.
    Usage,
    /// The server could not be reached or refused us: check the server, then retry.
    Unreachable,
    /// Another holder has the lock: wait, or retry later.
    Busy,
    /// A migration statement waited longer than `lock_timeout` for a table lock, every retry:
    /// something holds the table; nothing of the migration was applied.
    LockTimeout,
    /// We held the lock and lost it (or were fenced out): stop writing; a new run may proceed.
    Lost,
    /// A migration's SQL failed: fix the migration.
    MigrationFailed,
    /// Recovery halted: a human must decide (`dbwarden resolve`).
    NeedsReview,
    /// SIGINT/SIGTERM: we stopped between statements and released the lock.
    Interrupted,
    /// The server answered with an unexpected error outside a migration.
    Database,
}

/// A holder as reported in a busy error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BusyInfo {
    pub holder: Option<crate::HolderInfo>,
    pub fencing_token: Option<u64>,
    pub age: Option<std::time::Duration>,
    /// Why the lock cannot be taken, when it is not simply "held" (e.g. a foreign host's lock file).
    pub note: Option<String>,
    /// The server cannot serve this try now, whatever the lock's state: it refused a connection
    /// for want of a free slot (PostgreSQL 53300, MySQL 1040), or no replica confirmed a lease
    /// grant in time (Redis behind Sentinel, [`BusyInfo::not_confirmed`]). The wait policy backs
    /// off longer before trying again and holds nothing meanwhile, because each try costs the
    /// server (a connection set-up, or a grant it must take back).
    pub server_full: bool,
}

impl BusyInfo {
    /// The server at `target` has no free connection slot (the `server_full` field).
    pub fn server_full(target: &str, why: &str) -> Self {
        BusyInfo {
            note: Some(format!(
                "{target} has no free connection slot ({why}); waiting for one"
            )),
            server_full: true,
            ..BusyInfo::default()
        }
    }

    /// The lock was granted but its replicas did not confirm the grant in time, so it was taken
    /// back: a failover now could lose it and grant it twice. Waited out like a full server.
    pub fn not_confirmed(note: String) -> Self {
        BusyInfo {
            note: Some(note),
            server_full: true,
            ..BusyInfo::default()
        }
    }
}

impl fmt::Display for BusyInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.holder {
            Some(h) => {
                write!(
                    f,
                    "held by host={} pid={} owner={} execution={} since {}",
                    h.host,
                    h.pid,
                    h.owner,
                    h.execution_id,
                    h.started_at.format("%Y-%m-%dT%H:%M:%SZ")
                )?;
                if let Some(age) = self.age {
                    write!(f, " ({})", crate::duration::human(age))?;
                }
                if let Some(t) = self.fencing_token {
                    write!(f, ", token {t}")?;
                }
            }
            // A full server says nothing about the lock: the note says what it is.
            None if self.server_full && self.note.is_some() => {
                return f.write_str(self.note.as_deref().unwrap_or_default());
            }
            None => f.write_str("held by another session")?,
        }
        if let Some(note) = &self.note {
            write!(f, "; {note}")?;
        }
        Ok(())
    }
}

/// Every failure of dbwarden. Messages are one line, name the thing that is wrong, say what to
/// do, and never contain a password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    MigrationFile(#[from] MigrationFileError),
    #[error(
        "migration {version} ({file}) changed after it was applied (recorded checksum {recorded:.12}…, file now {current:.12}…): restore the file, or rerun with --allow-changed"
    )]
    ChangedChecksum {
        version: i64,
        file: String,
        recorded: String,
        current: String,
    },
    #[error("cannot reach {target}: {detail}")]
    Unreachable {
        target: String,
        detail: String,
        /// The driver's or network's own error, where there is one (its text is `detail`,
        /// already free of any password).
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    #[error("lock busy: {0}")]
    Busy(Box<BusyInfo>),
    #[error("lock lost: {0}; stopped before the next statement, nothing more was written")]
    Lost(String),
    #[error("migration {version} ({file}) failed at statement {statement} of {total}: {message}")]
    MigrationFailed {
        version: i64,
        file: String,
        statement: usize,
        total: usize,
        message: String,
    },
    /// A statement gave up waiting for a table lock (`lock_timeout`): it did nothing, and its
    /// transaction (if any) rolled back. The runner retries; this is what is left after the
    /// last retry (or what an engine reports for one attempt).
    #[error(
        "migration {version} ({file}): statement {statement} of {total} waited longer than lock_timeout for a table lock{attempts}{blockers}; nothing of it was applied: end or wait for what holds the table, then run migrate again ({message})"
    )]
    LockTimeout {
        version: i64,
        file: String,
        statement: usize,
        total: usize,
        message: String,
        /// ` in N attempts` once the runner gave up retrying; empty for one attempt.
        attempts: String,
        /// `; blocked by …` when the sessions in the way were seen; empty otherwise.
        blockers: String,
    },
    #[error(
        "NEEDS_REVIEW: migration {version}: {reason}; inspect it, then run `dbwarden resolve {version} --retry | --mark-applied | --abandon`"
    )]
    NeedsReview { version: i64, reason: String },
    #[error("interrupted: stopped between statements and released the lock")]
    Interrupted,
    /// `source` is the driver's error where there is one, for a caller that walks the chain
    /// (the message already says what it says, on one line).
    #[error("database error: {message}")]
    Database {
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl Error {
    pub fn usage(msg: impl Into<String>) -> Self {
        Error::Usage(msg.into())
    }

    pub fn database(msg: impl fmt::Display) -> Self {
        Error::Database {
            message: one_line(&msg.to_string()),
            source: None,
        }
    }

    /// A database error described by `message`, keeping the driver's error as its source.
    pub fn database_from(
        message: impl fmt::Display,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Database {
            message: one_line(&message.to_string()),
            source: Some(Box::new(source)),
        }
    }

    pub fn unreachable(target: impl Into<String>, detail: impl fmt::Display) -> Self {
        Error::Unreachable {
            target: target.into(),
            detail: one_line(&detail.to_string()),
            source: None,
        }
    }

    /// Unreachable, keeping the driver's error as the source; `detail` is what the user reads
    /// (the driver's text with any password taken out, or a plainer description).
    pub fn unreachable_from(
        target: impl Into<String>,
        detail: impl fmt::Display,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Unreachable {
            target: target.into(),
            detail: one_line(&detail.to_string()),
            source: Some(Box::new(source)),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Usage(_) | Error::MigrationFile(_) | Error::ChangedChecksum { .. } => {
                ErrorKind::Usage
            }
            Error::Unreachable { .. } => ErrorKind::Unreachable,
            Error::Busy(_) => ErrorKind::Busy,
            Error::Lost(_) => ErrorKind::Lost,
            Error::MigrationFailed { .. } => ErrorKind::MigrationFailed,
            Error::LockTimeout { .. } => ErrorKind::LockTimeout,
            Error::NeedsReview { .. } => ErrorKind::NeedsReview,
            Error::Interrupted => ErrorKind::Interrupted,
            Error::Database { .. } => ErrorKind::Database,
        }
    }

    /// Busy: the same call may succeed later.
    pub fn is_busy(&self) -> bool {
        self.kind() == ErrorKind::Busy
    }

    /// The lock was lost or we were fenced out: stop writing.
    pub fn is_lost(&self) -> bool {
        self.kind() == ErrorKind::Lost
    }

    /// The server could not be reached: retry once it is back.
    pub fn is_unreachable(&self) -> bool {
        self.kind() == ErrorKind::Unreachable
    }

    /// The input is wrong; retrying will not help.
    pub fn is_misconfigured(&self) -> bool {
        self.kind() == ErrorKind::Usage
    }

    pub fn exit_code(&self) -> ExitCode {
        match self.kind() {
            ErrorKind::Usage | ErrorKind::Unreachable => ExitCode::USAGE,
            ErrorKind::Busy | ErrorKind::LockTimeout => ExitCode::BUSY,
            ErrorKind::Lost => ExitCode::LOST,
            ErrorKind::MigrationFailed | ErrorKind::Database => ExitCode::MIGRATION_FAILED,
            ErrorKind::NeedsReview => ExitCode::HALTED,
            ErrorKind::Interrupted => ExitCode::INTERRUPTED,
        }
    }
}

pub use crate::text::one_line;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_failure_keeps_the_drivers_error_as_its_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let e = Error::unreachable_from("db:5432", "connection refused", io);
        assert_eq!(e.to_string(), "cannot reach db:5432: connection refused");
        let source = std::error::Error::source(&e).expect("the io error is kept");
        assert_eq!(source.to_string(), "connection refused");
        assert!(std::error::Error::source(&Error::unreachable("h", "x")).is_none());
    }

    #[test]
    fn exit_codes_follow_the_contract() {
        assert_eq!(Error::usage("x").exit_code().code(), 2);
        assert_eq!(Error::unreachable("h", "refused").exit_code().code(), 2);
        assert_eq!(Error::Busy(Box::default()).exit_code().code(), 3);
        assert_eq!(Error::Lost("x".into()).exit_code().code(), 4);
        assert_eq!(Error::Interrupted.exit_code().code(), 75);
        let nr = Error::NeedsReview {
            version: 3,
            reason: "r".into(),
        };
        assert_eq!(nr.exit_code().code(), 78);
        assert!(Error::Lost("x".into()).is_lost());
    }

    #[test]
    fn a_drivers_error_stays_the_source() {
        use std::error::Error as _;
        let e = Error::database_from(
            "reading the history",
            std::io::Error::other("socket\nreset"),
        );
        assert_eq!(e.to_string(), "database error: reading the history");
        assert_eq!(
            e.source().map(|s| s.to_string()).as_deref(),
            Some("socket\nreset")
        );
        assert!(Error::database("no driver").source().is_none());
    }

    #[test]
    fn database_messages_are_one_line() {
        let e = Error::database("syntax error\n  at line 3\n");
        assert_eq!(e.to_string(), "database error: syntax error at line 3");
    }
}
