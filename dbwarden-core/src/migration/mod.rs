//! Migration files (docs/migrations.md): finding them, parsing their names,
//! ordering, checksums, cutting them into statements and choosing how each one runs.
//!
//! Everything here runs before any lock is taken, so a problem with the folder — a bad name, a
//! duplicate version, a non-UTF-8 file — is a [`MigrationFileError`] while nothing has been
//! touched yet (exit 2).

pub mod classify;
mod dialect;
mod goose;
pub mod index_build;
mod lexer;
pub mod mode;
#[doc(hidden)]
/// Test support: the properties the fuzz targets and the property tests check, and the seeded
/// generator the chaos campaigns share. Not part of the library's API (feature `properties`).
#[cfg(any(test, feature = "properties"))]
pub mod properties;
#[cfg(test)]
mod properties_tests;
pub mod split;

pub use classify::{StatementKind, is_idempotent};
pub use dialect::Dialect;
pub use index_build::IndexBuild;
pub use mode::{Mode, Statement, TxControl, Why};
pub use split::{split_statements, split_statements_in, statement_spans};

use sha2::{Digest, Sha256};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest migration file accepted: 1 GiB, the most either server takes in one message
/// (PostgreSQL refuses a query string of 1 GiB or more; MySQL's `max_allowed_packet` stops at
/// 1 GiB). A file is held once in memory (read, folded and checked in place), with its
/// statements as ranges into that one copy.
pub const MAX_FILE_SIZE: u64 = 1024 * 1024 * 1024;

/// First-line directive that makes a migration run outside a transaction.
pub const NO_TRANSACTION_DIRECTIVE: &str = "-- dbwarden:no-transaction";

/// sqlx's spelling of the same directive, honoured so a sqlx folder runs unchanged.
pub const SQLX_NO_TRANSACTION_DIRECTIVE: &str = "-- no-transaction";

/// goose's spelling, anywhere in a goose file.
pub const GOOSE_NO_TRANSACTION_DIRECTIVE: &str = "-- +goose NO TRANSACTION";

/// One migration file, read, checked and cut for one dialect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// Integer from the file name (`0001_create_users.sql` → 1; `0_setup.sql` → 0).
    pub version: i64,
    /// `create_users` from `0001_create_users.sql` (underscores kept).
    pub description: String,
    pub path: PathBuf,
    /// The file's text with CRLF folded to LF and a leading UTF-8 byte-order mark removed.
    pub sql: String,
    /// Lowercase hex SHA-256 of the file's bytes with CRLF folded to LF (see [`checksum`]).
    pub checksum: String,
    /// The first-line directive that asks for no wrapping transaction, as written in the
    /// constants above.
    pub directive: Option<&'static str>,
    /// The dialect the statements were cut for.
    pub dialect: Dialect,
    /// The statements, in order; none for an empty or comment-only file (applied as a no-op).
    pub statements: Vec<Statement>,
    /// How the file runs on an engine of this dialect, and why.
    pub mode: Mode,
    /// A forward migration, or the `.down.sql` that undoes one (`dbwarden revert`).
    pub direction: Direction,
    /// A forward migration's `.down.sql`, where [`load_dir_with_downs`] found one.
    pub down: Option<Box<Migration>>,
    /// What folding changed in the file's bytes, to rebuild sqlx's checksum of the raw file.
    pub(crate) raw: RawShape,
    /// The part of the text that runs: all of it, but for a goose file its Up part.
    pub(crate) body: std::ops::Range<usize>,
    /// `-- dbwarden:lock-timeout D` in the file's header: how long one of its statements may
    /// wait for a table lock before the attempt is rolled back and retried (`lock_timeout`).
    pub lock_timeout: Option<std::time::Duration>,
    /// `-- dbwarden:statement-timeout D` in the file's header: how long one of its statements
    /// may run (`migration_statement_timeout`).
    pub statement_timeout: Option<std::time::Duration>,
}

/// What [`from_bytes`] removed from a file: its byte-order mark, CRs before LFs (and then
/// sqlx's checksum of the bytes as they were, which the folded text cannot give back).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RawShape {
    pub(crate) bom: bool,
    pub(crate) crlf: bool,
    pub(crate) sqlx_checksum: Option<[u8; 48]>,
}

impl Migration {
    /// Builds a migration from its text (no file involved), cut for `dialect`: for tests and
    /// for migrations embedded in a program. The checksum is that of the text.
    pub fn from_sql(
        version: i64,
        description: impl Into<String>,
        sql: impl Into<String>,
        dialect: Dialect,
    ) -> Result<Migration, MigrationFileError> {
        let description = description.into();
        let path = PathBuf::from(format!("{version}_{description}.sql"));
        from_bytes(version, description, path, sql.into().into_bytes(), dialect)
    }

    /// A stand-in for a migration known only by its history row (its file may be gone), so a
    /// status row can still name the version: no text, no statements.
    pub fn stand_in(version: i64, checksum: &str) -> Migration {
        Migration {
            version,
            description: String::new(),
            path: PathBuf::new(),
            sql: String::new(),
            checksum: checksum.to_owned(),
            directive: None,
            dialect: Dialect::default(),
            statements: Vec::new(),
            mode: Mode::Transaction,
            direction: Direction::Up,
            down: None,
            raw: RawShape::default(),
            body: 0..0,
            lock_timeout: None,
            statement_timeout: None,
        }
    }

    /// The history state a completed run of this file records: APPLIED for a forward
    /// migration, REVERTED for a down file.
    pub fn done_state(&self) -> crate::HistoryState {
        match self.direction {
            Direction::Up => crate::HistoryState::Applied,
            Direction::Down => crate::HistoryState::Reverted,
        }
    }

    /// The text that runs (a goose file's Up part; otherwise the whole file).
    pub fn body(&self) -> &str {
        self.sql.get(self.body.clone()).unwrap_or_default()
    }

    /// Where [`Self::body`] starts in the text.
    pub fn body_start(&self) -> usize {
        self.body.start
    }

    /// The description as sqlx records it: underscores become spaces.
    pub fn sqlx_description(&self) -> String {
        self.description.replace('_', " ")
    }

    /// sqlx's checksum of the file: SHA-384 of its bytes exactly as on disk (no CRLF folding, a
    /// byte-order mark included). Rebuilt from the text where nothing was folded; taken when
    /// the file was read where CRs were.
    pub fn sqlx_checksum(&self) -> Result<Vec<u8>, MigrationFileError> {
        use sha2::Sha384;
        if let Some(sum) = self.raw.sqlx_checksum {
            return Ok(sum.to_vec());
        }
        let mut h = Sha384::new();
        if self.raw.bom {
            h.update("\u{feff}".as_bytes());
        }
        h.update(self.sql.as_bytes());
        Ok(h.finalize().to_vec())
    }

    /// The text of statement `index` (empty past the end).
    pub fn statement(&self, index: usize) -> &str {
        self.statements
            .get(index)
            .and_then(|s| self.sql.get(s.span.clone()))
            .unwrap_or_default()
    }

    /// The text of statements `range`, from the start of the first to the end of the last, with
    /// where it starts in the file; `None` for an empty range or one past the end.
    pub fn text_of(&self, range: std::ops::Range<usize>) -> Option<(usize, &str)> {
        if range.is_empty() {
            return None;
        }
        let first = self.statements.get(range.start)?;
        let last = self.statements.get(range.end.checked_sub(1)?)?;
        let text = self.sql.get(first.span.start..last.span.end)?;
        Some((first.span.start, text))
    }

    /// Statement `index` failed with the server's `message`.
    pub fn failure(&self, index: usize, message: &str) -> crate::Error {
        crate::Error::MigrationFailed {
            version: self.version,
            file: self.location(index),
            statement: index + 1,
            total: self.statements.len(),
            message: crate::text::one_line(message),
        }
    }

    /// `path:line` of statement `index`, for error messages: the line where its code starts,
    /// past the comments above it (a commented-out block before a statement would otherwise
    /// send the reader dozens of lines too high).
    pub fn location(&self, index: usize) -> String {
        let at = self.statements.get(index).map_or(0, |s| {
            s.span.start + code_start(self.statement(index), self.dialect == Dialect::MySql)
        });
        self.location_at(at)
    }

    /// `path:line` of byte `offset` of the text.
    pub fn location_at(&self, offset: usize) -> String {
        let before = self.sql.get(..offset).unwrap_or(&self.sql);
        let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
        format!("{}:{line}", self.path.display())
    }

    /// The statement that holds byte `offset` of the text (the last one starting at or
    /// before it).
    pub fn statement_at(&self, offset: usize) -> usize {
        self.statements
            .partition_point(|s| s.span.start <= offset)
            .saturating_sub(1)
    }

    /// The texts of all statements, in order.
    pub fn statement_texts(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.statements.len()).map(|i| self.statement(i))
    }

    /// The same file cut and planned for another dialect.
    pub fn for_dialect(self, dialect: Dialect) -> Result<Migration, MigrationFileError> {
        if dialect == self.dialect {
            return Ok(self);
        }
        let raw = self.raw;
        let mut m = plan(
            self.version,
            self.description,
            self.path,
            self.sql,
            self.checksum,
            self.directive,
            dialect,
        )?;
        m.raw = raw;
        Ok(m)
    }

    /// Whether statement `index` runs inside a transaction the file itself opened (after its
    /// `BEGIN`, up to and including the `COMMIT` or `ROLLBACK` that ends it). The journal
    /// entry of such a statement is written inside that transaction, so it commits with it.
    pub fn inside_own_transaction(&self, index: usize) -> bool {
        self.statements
            .get(index)
            .is_some_and(|s| s.inside_own_transaction)
    }

    /// The session is inside the file's own transaction once statement `index` has run.
    pub fn inside_own_transaction_after(&self, index: usize) -> bool {
        match self.statements.get(index).and_then(|s| s.control) {
            Some(TxControl::Begin) => true,
            Some(TxControl::Commit | TxControl::Rollback) => false,
            None => self.inside_own_transaction(index),
        }
    }

    /// Statement `index` commits the file's own transaction: its journal entry is written
    /// before it, inside that transaction, so a committed transaction is always recorded and
    /// an uncommitted one never is.
    pub fn commits_own_transaction(&self, index: usize) -> bool {
        self.statements.get(index).and_then(|s| s.control) == Some(TxControl::Commit)
            && self.inside_own_transaction(index)
    }
}

/// What is wrong with the migrations folder or one of its files. Each message is one line that
/// names the file or folder and says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrationFileError {
    #[error(
        "migrations directory {} does not exist; create it or point --migrations at the folder that holds the .sql files",
        .dir.display()
    )]
    MissingDir { dir: PathBuf },

    #[error(
        "{} is not a directory; point --migrations at the folder that holds the .sql files",
        .dir.display()
    )]
    NotADir { dir: PathBuf },

    #[error(
        "cannot read {}: {source}; check its permissions, and if it is a symlink, that its target exists and it does not loop",
        .path.display()
    )]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error(
        "bad migration file name {}: expected <VERSION>_<description>.sql, e.g. 0001_create_users.sql, with VERSION an integer from 0 to 9223372036854775807; rename the file or move it out of the folder",
        .path.display()
    )]
    BadName { path: PathBuf },

    #[error(
        "migration version {version} is used twice, by {} and {}; give one of them another version",
        .first.display(),
        .second.display()
    )]
    DuplicateVersion {
        version: i64,
        first: PathBuf,
        second: PathBuf,
    },

    #[error("{} is not valid UTF-8; save it as UTF-8", .path.display())]
    NotUtf8 { path: PathBuf },

    #[error(
        "{} is {size} bytes, over the {limit}-byte limit for one migration file (what a server takes in one message); split it into several migrations",
        .path.display()
    )]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },

    #[error(
        "{} is not a regular file (a FIFO, socket or device?); a migration must be a regular .sql file",
        .path.display()
    )]
    NotAFile { path: PathBuf },

    #[error(
        "{} line {line}: unknown, misplaced or malformed directive `{text}`; the directives are `-- dbwarden:no-transaction` (or sqlx's `-- no-transaction`) on the first line, and `-- dbwarden:lock-timeout 5s` / `-- dbwarden:statement-timeout 2h` in the comment lines at the top",
        .path.display()
    )]
    BadDirective {
        path: PathBuf,
        line: usize,
        text: String,
    },

    #[error(
        "{}: statement {statement} opens a transaction that the file never commits or rolls back; end it with COMMIT, or remove the BEGIN",
        .path.display()
    )]
    UnclosedTransaction { path: PathBuf, statement: usize },

    #[error(
        "{} line {line}: {what}; split the file into <VERSION>_<name>.up.sql and .down.sql, or fix the annotation",
        .path.display()
    )]
    BadGooseAnnotation {
        path: PathBuf,
        line: usize,
        what: String,
    },
}

impl MigrationFileError {
    /// The file or folder the error is about (for a duplicate, the first of the two files).
    pub fn path(&self) -> &Path {
        match self {
            Self::MissingDir { dir } | Self::NotADir { dir } => dir,
            Self::Io { path, .. }
            | Self::BadName { path }
            | Self::NotUtf8 { path }
            | Self::TooLarge { path, .. }
            | Self::NotAFile { path }
            | Self::BadDirective { path, .. }
            | Self::UnclosedTransaction { path, .. }
            | Self::BadGooseAnnotation { path, .. } => path,
            Self::DuplicateVersion { first, .. } => first,
        }
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> MigrationFileError + '_ {
    move |source| MigrationFileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A `.sql` file found in the folder, named correctly, not yet read.
struct Candidate {
    version: i64,
    description: String,
    path: PathBuf,
    size: u64,
}

/// Which way a file goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direction {
    #[default]
    Up,
    /// `<VERSION>_<description>.down.sql`: undoes migration VERSION.
    Down,
}

/// What a down file's history row carries after its description, so a half-done revert is
/// told from a half-done forward run by the row alone (its file may have been edited since).
pub const REVERT_SUFFIX: &str = " (revert)";

/// [`load_dir`], with each migration's `.down.sql` attached where there is one. `strict`: a
/// down file that cannot be loaded is an error (`revert`); otherwise it is skipped with a
/// warning (`migrate`, which never runs one unless a revert was left half-done).
pub fn load_dir_with_downs(
    dir: &Path,
    dialect: Dialect,
    strict: bool,
) -> Result<Vec<Migration>, MigrationFileError> {
    let mut ups = load_dir(dir, dialect)?;
    let mut downs = match load_down_dir(dir, dialect) {
        Ok(d) => d,
        Err(e) if !strict => {
            tracing::warn!("down files not loaded ({e}); only `revert` runs them");
            std::collections::BTreeMap::new()
        }
        Err(e) => return Err(e),
    };
    for m in &mut ups {
        m.down = downs.remove(&m.version).map(Box::new);
    }
    Ok(ups)
}

/// Loads every `<VERSION>_<description>.down.sql` in `dir` by version, cut for `dialect`
/// (`dbwarden revert`). A duplicate version is an error.
pub fn load_down_dir(
    dir: &Path,
    dialect: Dialect,
) -> Result<std::collections::BTreeMap<i64, Migration>, MigrationFileError> {
    let mut out = std::collections::BTreeMap::new();
    for (name, path, size) in listed_files(dir, |n| {
        strip_suffix_ignore_case(n, ".down.sql").is_some() && !n.starts_with('.')
    })? {
        let stem = strip_suffix_ignore_case(&name, ".down.sql").unwrap_or_default();
        // Like `load_dir`, which has always skipped them: a name that does not parse is
        // not a down file (revert then says the down file is missing).
        let Some((version, description)) = parse_file_name(&format!("{stem}.sql")) else {
            continue;
        };
        let mut m = read_candidate(
            Candidate {
                version,
                description,
                path: path.clone(),
                size,
            },
            dialect,
        )?;
        m.direction = Direction::Down;
        m.description.push_str(REVERT_SUFFIX);
        if let Some(first) = out.insert(version, m) {
            return Err(MigrationFileError::DuplicateVersion {
                version,
                first: first.path,
                second: path,
            });
        }
    }
    Ok(out)
}

/// Loads every migration in `dir`, ordered by version as a number, cut for `dialect`.
///
/// Files are `<VERSION>_<description>.sql` or `<VERSION>_<description>.up.sql`; `*.down.sql`,
/// hidden files, subdirectories and files not ending in `.sql` (README.md, .gitkeep) are
/// ignored, but a `.sql` file whose name does not parse is an error, as is a duplicate version.
/// Symlinks are followed; a broken or looping one is an [`MigrationFileError::Io`] naming it.
/// An empty folder gives an empty list.
pub fn load_dir(dir: &Path, dialect: Dialect) -> Result<Vec<Migration>, MigrationFileError> {
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(MigrationFileError::NotADir { dir: dir.into() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(MigrationFileError::MissingDir { dir: dir.into() });
        }
        Err(e) => return Err(io_error(dir)(e)),
    }
    let mut candidates = Vec::new();
    for (_, path, size) in listed_files(dir, looks_like_up_migration)? {
        // A name that is not UTF-8 does not parse (it is not read lossily as another name).
        let name = path.file_name().and_then(|n| n.to_str());
        let Some((version, description)) = name.and_then(parse_file_name) else {
            return Err(MigrationFileError::BadName { path });
        };
        candidates.push(Candidate {
            version,
            description,
            path,
            size,
        });
    }

    candidates.sort_by(|a, b| a.version.cmp(&b.version).then_with(|| a.path.cmp(&b.path)));
    if let Some(pair) = candidates
        .windows(2)
        .find(|pair| pair[0].version == pair[1].version)
    {
        return Err(MigrationFileError::DuplicateVersion {
            version: pair[0].version,
            first: pair[0].path.clone(),
            second: pair[1].path.clone(),
        });
    }
    candidates
        .into_iter()
        .map(|c| read_candidate(c, dialect))
        .collect()
}

fn read_candidate(c: Candidate, dialect: Dialect) -> Result<Migration, MigrationFileError> {
    if c.size > MAX_FILE_SIZE {
        return Err(MigrationFileError::TooLarge {
            path: c.path,
            size: c.size,
            limit: MAX_FILE_SIZE,
        });
    }
    let file = fs::File::open(&c.path).map_err(io_error(&c.path))?;
    let mut bytes = Vec::with_capacity(usize::try_from(c.size).unwrap_or(0));
    // One byte over the limit is enough to tell a file that grew since it was listed.
    file.take(MAX_FILE_SIZE + 1)
        .read_to_end(&mut bytes)
        .map_err(io_error(&c.path))?;
    from_bytes(c.version, c.description, c.path, bytes, dialect)
}

/// The regular files of `dir` whose name (lossily decoded; the path is exact) `keep` accepts,
/// sorted by name (directory order is
/// arbitrary; sorting makes errors -- which bad name, which duplicate first -- the same on every
/// machine), with their sizes. Subdirectories are skipped; anything else that is not a regular
/// file (a FIFO, which would block forever when opened) is an error naming it.
fn listed_files(
    dir: &Path,
    keep: impl Fn(&str) -> bool,
) -> Result<Vec<(String, PathBuf, u64)>, MigrationFileError> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error(dir))? {
        names.push(entry.map_err(io_error(dir))?.file_name());
    }
    names.sort();
    let mut out = Vec::new();
    for os_name in names {
        let name = os_name.to_string_lossy().into_owned();
        if !keep(&name) {
            continue;
        }
        let path = dir.join(&os_name);
        let meta = fs::metadata(&path).map_err(io_error(&path))?;
        if meta.is_dir() {
            continue;
        }
        if !meta.is_file() {
            return Err(MigrationFileError::NotAFile { path });
        }
        out.push((name, path, meta.len()));
    }
    Ok(out)
}

/// Whether `migrate` looks at a directory entry of this name: not hidden, ends in `.sql` (any case),
/// not a `.down.sql`.
fn looks_like_up_migration(name: &str) -> bool {
    !name.starts_with('.')
        && strip_suffix_ignore_case(name, ".sql").is_some()
        && strip_suffix_ignore_case(name, ".down.sql").is_none()
}

fn strip_suffix_ignore_case<'a>(s: &'a str, suffix: &str) -> Option<&'a str> {
    let cut = s.len().checked_sub(suffix.len())?;
    let tail = s.as_bytes().get(cut..)?;
    if tail.eq_ignore_ascii_case(suffix.as_bytes()) {
        s.get(..cut)
    } else {
        None
    }
}

/// Parses `<VERSION>_<description>.sql` or `<VERSION>_<description>.up.sql` into the version
/// and the description; `None` for anything else, `.down.sql` files included.
///
/// VERSION is ASCII digits only, an `i64` from 0 up (leading zeros are fine; sqlx's own test
/// folders start at `0_setup.sql`); the description is whatever follows the first `_` and must
/// not be empty. The `.sql` extension matches in any case.
///
/// ```
/// # use dbwarden_core::migration::parse_file_name;
/// assert_eq!(parse_file_name("0001_create_users.sql"), Some((1, "create_users".to_owned())));
/// assert_eq!(parse_file_name("20240101120000_add_index.up.sql"), Some((20240101120000, "add_index".to_owned())));
/// assert_eq!(parse_file_name("0_setup.sql"), Some((0, "setup".to_owned())));
/// assert_eq!(parse_file_name("0001_create_users.down.sql"), None);
/// ```
pub fn parse_file_name(name: &str) -> Option<(i64, String)> {
    if strip_suffix_ignore_case(name, ".down.sql").is_some() {
        return None;
    }
    let stem = strip_suffix_ignore_case(name, ".up.sql")
        .or_else(|| strip_suffix_ignore_case(name, ".sql"))?;
    let (version, description) = stem.split_once('_')?;
    if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) || description.is_empty()
    {
        return None;
    }
    let version = version.parse::<i64>().ok()?;
    Some((version, description.to_owned()))
}

/// Lowercase hex SHA-256 of `bytes` with every CRLF folded to LF, so a file checked out on
/// Windows has the same checksum as on Linux. A lone CR is kept.
///
/// ```
/// # use dbwarden_core::migration::checksum;
/// assert_eq!(checksum(b"SELECT 1;\r\n"), checksum(b"SELECT 1;\n"));
/// ```
pub fn checksum(bytes: &[u8]) -> String {
    let mut folded = bytes.to_vec();
    fold_crlf(&mut folded);
    hex::encode(Sha256::digest(&folded))
}

/// Drops every CR that comes right before an LF, in place.
fn fold_crlf(bytes: &mut Vec<u8>) {
    if !bytes.contains(&b'\r') {
        return;
    }
    let Some(first) = bytes.windows(2).position(|w| w == b"\r\n") else {
        return;
    };
    let mut write = first;
    for read in first..bytes.len() {
        let b = bytes[read];
        if !(b == b'\r' && bytes.get(read + 1) == Some(&b'\n')) {
            bytes[write] = b;
            write += 1;
        }
    }
    bytes.truncate(write);
}

/// Builds a [`Migration`] from a file's bytes, cut for `dialect`: size limit, UTF-8, checksum,
/// directives, statements, mode. The bytes are folded and checked in place, never copied.
pub fn from_bytes(
    version: i64,
    description: String,
    path: PathBuf,
    bytes: impl Into<Vec<u8>>,
    dialect: Dialect,
) -> Result<Migration, MigrationFileError> {
    let mut bytes = bytes.into();
    let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if size > MAX_FILE_SIZE {
        return Err(MigrationFileError::TooLarge {
            path,
            size,
            limit: MAX_FILE_SIZE,
        });
    }
    let has_crlf = bytes.contains(&b'\r') && bytes.windows(2).any(|w| w == b"\r\n");
    let raw_sqlx_checksum = has_crlf.then(|| {
        let mut sum = [0u8; 48];
        sum.copy_from_slice(&sha2::Sha384::digest(&bytes));
        sum
    });
    fold_crlf(&mut bytes);
    let crlf = has_crlf;
    let checksum = hex::encode(Sha256::digest(&bytes));
    let Ok(mut sql) = String::from_utf8(bytes) else {
        return Err(MigrationFileError::NotUtf8 { path });
    };
    // Editors on Windows add a byte-order mark; the engine would take it for part of a keyword.
    let bom = sql.starts_with('\u{feff}');
    if bom {
        sql.drain(..'\u{feff}'.len_utf8());
    }
    let directives = match read_directives(&sql) {
        Ok(directives) => directives,
        Err((line, text)) => {
            return Err(MigrationFileError::BadDirective { path, line, text });
        }
    };
    let mut m = plan(
        version,
        description,
        path,
        sql,
        checksum,
        directives.transaction,
        dialect,
    )?;
    m.lock_timeout = directives.lock_timeout;
    m.statement_timeout = directives.statement_timeout;
    m.raw = RawShape {
        bom,
        crlf,
        sqlx_checksum: raw_sqlx_checksum,
    };
    Ok(m)
}

/// Cuts `sql` for `dialect` and decides how it runs.
fn plan(
    version: i64,
    description: String,
    path: PathBuf,
    sql: String,
    checksum: String,
    directive: Option<&'static str>,
    dialect: Dialect,
) -> Result<Migration, MigrationFileError> {
    let goose = match goose::layout(&sql) {
        Ok(g) => g,
        Err((line, what)) => {
            return Err(MigrationFileError::BadGooseAnnotation { path, line, what });
        }
    };
    let directive = match &goose {
        Some(g) if g.no_transaction && directive.is_none() => Some(GOOSE_NO_TRANSACTION_DIRECTIVE),
        _ => directive,
    };
    let body = goose.as_ref().map_or(0..sql.len(), |g| g.up.clone());
    let spans = match &goose {
        None => statement_spans(&sql, dialect),
        Some(g) => goose_spans(&sql, g, dialect),
    };
    let mut statements: Vec<Statement> = spans
        .into_iter()
        .map(|span| Statement::new(&sql, span, dialect))
        .collect();
    mode::mark_own_transactions(&mut statements);
    let mode = match mode::decide(dialect, directive, &statements) {
        Ok(mode) => mode,
        Err(statement) => {
            return Err(MigrationFileError::UnclosedTransaction { path, statement });
        }
    };
    Ok(Migration {
        version,
        description,
        path,
        sql,
        checksum,
        directive,
        dialect,
        statements,
        mode,
        direction: Direction::Up,
        down: None,
        raw: RawShape::default(),
        body,
        lock_timeout: None,
        statement_timeout: None,
    })
}

/// The statements of a goose file's Up part: each `StatementBegin` … `StatementEnd` block is
/// one (less its final `;`), the text between blocks is cut as usual.
fn goose_spans(sql: &str, g: &goose::Layout, dialect: Dialect) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let cut = |from: usize, to: usize, out: &mut Vec<std::ops::Range<usize>>| {
        let part = sql.get(from..to).unwrap_or_default();
        out.extend(
            statement_spans(part, dialect)
                .into_iter()
                .map(|r| r.start + from..r.end + from),
        );
    };
    let mut cursor = g.up.start;
    for b in &g.blocks {
        cut(cursor, b.start, &mut out);
        let text = sql.get(b.clone()).unwrap_or_default();
        let lead = text.len() - text.trim_start().len();
        let inner = text.trim();
        let inner = inner.strip_suffix(';').unwrap_or(inner).trim_end();
        if !inner.is_empty() {
            let start = b.start + lead;
            out.push(start..start + inner.len());
        }
        // Go on after the StatementEnd line.
        cursor = sql
            .get(b.end..)
            .and_then(|rest| rest.find('\n'))
            .map_or(g.up.end, |nl| b.end + nl + 1)
            .min(g.up.end);
    }
    cut(cursor, g.up.end, &mut out);
    out
}

/// What a file's directives ask for.
#[derive(Debug, Default)]
struct Directives {
    /// `-- dbwarden:no-transaction` or sqlx's `-- no-transaction`, on the first line.
    transaction: Option<&'static str>,
    lock_timeout: Option<std::time::Duration>,
    statement_timeout: Option<std::time::Duration>,
}

/// The file's directives: `-- dbwarden:no-transaction` or sqlx's `-- no-transaction` on the
/// first line, and `-- dbwarden:lock-timeout D` / `-- dbwarden:statement-timeout D` in the
/// comment lines that open the file (before its first statement). Any other `-- dbwarden:` line
/// — a typo, a bad duration, a directive below the header — is an error (line number, text)
/// rather than silently ignored, because a migration meant to run outside a transaction, or
/// with a bound, would otherwise run without.
fn read_directives(sql: &str) -> Result<Directives, (usize, String)> {
    let mut found = Directives::default();
    let mut header = true;
    for (index, line) in sql.lines().enumerate() {
        let trimmed = line.trim();
        let Some(comment) = trimmed.strip_prefix("--") else {
            header &= trimmed.is_empty();
            continue;
        };
        let body = comment.trim_start();
        if index == 0 && body.eq_ignore_ascii_case("no-transaction") {
            found.transaction = Some(SQLX_NO_TRANSACTION_DIRECTIVE);
            continue;
        }
        let Some(name) = body
            .get(.."dbwarden:".len())
            .filter(|p| p.eq_ignore_ascii_case("dbwarden:"))
            .and_then(|_| body.get("dbwarden:".len()..))
        else {
            continue;
        };
        let bad = || (index + 1, trimmed.to_owned());
        let name = name.trim();
        if index == 0 && name.eq_ignore_ascii_case("no-transaction") {
            found.transaction = Some(NO_TRANSACTION_DIRECTIVE);
            continue;
        }
        let (word, value) = name.split_once(char::is_whitespace).ok_or_else(bad)?;
        let slot = match word.to_ascii_lowercase().as_str() {
            "lock-timeout" => &mut found.lock_timeout,
            "statement-timeout" => &mut found.statement_timeout,
            _ => return Err(bad()),
        };
        if !header || slot.is_some() {
            return Err(bad());
        }
        *slot = Some(crate::duration::parse(word, value.trim()).map_err(|_| bad())?);
    }
    Ok(found)
}

/// Where the code of a statement's `text` starts: past blank space, `--` line comments and
/// `/* */` block comments (not MySQL's `/*! */`, which runs), and `#` comments in MySQL. 0 when
/// `text` holds no code.
fn code_start(text: &str, mysql: bool) -> usize {
    let mut at = 0;
    loop {
        let rest = &text[at..];
        let code = rest.trim_start();
        at += rest.len() - code.len();
        let skip = if code.starts_with("--") || (mysql && code.starts_with('#')) {
            code.find('\n').map(|n| n + 1)
        } else if code.starts_with("/*") && !code.starts_with("/*!") {
            code.find("*/").map(|n| n + 2)
        } else if code.is_empty() {
            None
        } else {
            return at;
        };
        match skip {
            Some(n) => at += n,
            None => return 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, body) in files {
            fs::write(dir.path().join(name), body).expect("write");
        }
        dir
    }

    #[test]
    fn a_failure_names_the_line_of_the_code_not_of_the_comments_above_it() {
        let sql = "CREATE TABLE a (id int);\n\n-- the old view, kept for reference:\n-- SELECT 1;\n/* and\n   more */\nINSERT INTO a VALUES (1);\n";
        for dialect in [Dialect::Postgres, Dialect::Sqlite, Dialect::MySql] {
            let m = Migration::from_sql(1, "x", sql, dialect).unwrap();
            assert_eq!(m.statements.len(), 2, "{dialect:?}");
            assert_eq!(m.location(0), "1_x.sql:1", "{dialect:?}");
            assert_eq!(m.location(1), "1_x.sql:7", "{dialect:?}");
            match m.failure(1, "no such table") {
                crate::Error::MigrationFailed {
                    file, statement, ..
                } => assert_eq!((file.as_str(), statement), ("1_x.sql:7", 2)),
                other => panic!("{other:?}"),
            }
        }
        // MySQL's `#` comments are skipped too, and its `/*! */` comments are code.
        let sql = "# set up\n/*!40101 SET NAMES utf8mb4 */;\n";
        let m = Migration::from_sql(1, "x", sql, Dialect::MySql).unwrap();
        assert_eq!(m.location(0), "1_x.sql:2");
        // Nothing but comments: the statement's own start.
        assert_eq!(code_start("-- only\n-- comments", false), 0);
    }

    fn versions(ms: &[Migration]) -> Vec<i64> {
        ms.iter().map(|m| m.version).collect()
    }

    fn file_name(path: &Path) -> &str {
        path.file_name().and_then(|n| n.to_str()).unwrap_or("")
    }

    fn migration(bytes: &[u8]) -> Result<Migration, MigrationFileError> {
        from_bytes(
            1,
            "m".into(),
            PathBuf::from("migrations/0001_m.sql"),
            bytes,
            Dialect::Postgres,
        )
    }

    fn texts(m: &Migration) -> Vec<&str> {
        m.statement_texts().collect()
    }

    fn load(dir: &Path) -> Result<Vec<Migration>, MigrationFileError> {
        load_dir(dir, Dialect::Postgres)
    }

    #[test]
    fn orders_by_version_as_a_number() {
        let dir = dir_with(&[
            ("10_ten.sql", "SELECT 10;"),
            ("2_two.sql", "SELECT 2;"),
            ("1_one.sql", "SELECT 1;"),
            ("0003_three.sql", "SELECT 3;"),
        ]);
        let ms = load(dir.path()).expect("load");
        assert_eq!(versions(&ms), vec![1, 2, 3, 10]);
        assert_eq!(ms[0].description, "one");
        assert_eq!(ms[0].path, dir.path().join("1_one.sql"));
        assert_eq!(texts(&ms[3]), vec!["SELECT 10"]);
    }

    #[test]
    fn description_keeps_underscores_and_leading_zeros_are_fine() {
        let dir = dir_with(&[("00042_create_users_table.sql", "SELECT 1;")]);
        let ms = load(dir.path()).expect("load");
        assert_eq!(ms[0].version, 42);
        assert_eq!(ms[0].description, "create_users_table");
    }

    #[test]
    fn duplicate_version_is_an_error() {
        let dir = dir_with(&[("0001_a.sql", "SELECT 1;"), ("1_b.sql", "SELECT 2;")]);
        match load(dir.path()) {
            Err(MigrationFileError::DuplicateVersion {
                version,
                first,
                second,
            }) => {
                assert_eq!(version, 1);
                assert_eq!(file_name(&first), "0001_a.sql");
                assert_eq!(file_name(&second), "1_b.sql");
            }
            other => panic!("expected DuplicateVersion, got {other:?}"),
        }
    }

    #[test]
    fn sql_and_up_sql_of_one_version_are_duplicates() {
        let dir = dir_with(&[("1_a.sql", "SELECT 1;"), ("1_a.up.sql", "SELECT 1;")]);
        assert!(matches!(
            load(dir.path()),
            Err(MigrationFileError::DuplicateVersion { version: 1, .. })
        ));
    }

    #[test]
    fn up_sql_is_loaded_and_down_sql_ignored() {
        let dir = dir_with(&[
            ("0001_users.up.sql", "CREATE TABLE users (id int);"),
            ("0001_users.down.sql", "DROP TABLE users;"),
            ("0002_x.DOWN.SQL", "not even sql"),
            ("abc.down.sql", "bad name, but ignored"),
        ]);
        let ms = load(dir.path()).expect("load");
        assert_eq!(versions(&ms), vec![1]);
        assert_eq!(ms[0].description, "users");
        assert_eq!(texts(&ms[0]), vec!["CREATE TABLE users (id int)"]);
    }

    #[test]
    fn other_files_hidden_files_and_subdirectories_are_ignored() {
        let dir = dir_with(&[
            ("README.md", "# migrations"),
            (".gitkeep", ""),
            (".0002_hidden.sql", "garbage"),
            (".#0001_a.sql", "editor lock file"),
            ("0001_a.sql~", "editor backup"),
            ("0001_a.sql.swp", "swap"),
            ("0001_a.sql", "SELECT 1;"),
        ]);
        fs::create_dir(dir.path().join("0003_subdir.sql")).expect("mkdir");
        fs::create_dir(dir.path().join("archive")).expect("mkdir");
        fs::write(dir.path().join("archive/0001_old.sql"), "SELECT 0;").expect("write");
        let ms = load(dir.path()).expect("load");
        assert_eq!(versions(&ms), vec![1]);
    }

    #[test]
    fn empty_folder_gives_no_migrations() {
        let dir = dir_with(&[]);
        assert!(load(dir.path()).expect("load").is_empty());
    }

    #[test]
    fn bad_names_are_errors() {
        for name in [
            "abc.sql",
            "12.sql",
            "12_.sql",
            "12_.up.sql",
            "-1_x.sql",
            "+1_x.sql",
            "_x.sql",
            "1a_x.sql",
            " 1_x.sql",
            "99999999999999999999_x.sql",
            "9223372036854775808_x.sql",
            "0001-create.sql",
        ] {
            let dir = dir_with(&[("0001_ok.sql", "SELECT 1;"), (name, "SELECT 2;")]);
            match load(dir.path()) {
                Err(MigrationFileError::BadName { path }) => assert_eq!(file_name(&path), name),
                other => panic!("{name}: expected BadName, got {other:?}"),
            }
        }
    }

    #[test]
    fn parse_file_name_cases() {
        assert_eq!(parse_file_name("1_a.sql"), Some((1, "a".into())));
        assert_eq!(
            parse_file_name("0001_create_users.sql"),
            Some((1, "create_users".into()))
        );
        assert_eq!(
            parse_file_name("0001_create_users.up.sql"),
            Some((1, "create_users".into()))
        );
        assert_eq!(parse_file_name("0001_x.SQL"), Some((1, "x".into())));
        assert_eq!(parse_file_name("1__a.sql"), Some((1, "_a".into())));
        assert_eq!(parse_file_name("1_a.b.sql"), Some((1, "a.b".into())));
        assert_eq!(parse_file_name("1_é.sql"), Some((1, "é".into())));
        assert_eq!(parse_file_name("0_setup.sql"), Some((0, "setup".into())));
        assert_eq!(parse_file_name("00_x.up.sql"), Some((0, "x".into())));
        assert_eq!(
            parse_file_name("9223372036854775807_max.sql"),
            Some((i64::MAX, "max".into()))
        );
        for name in [
            "0001_x.down.sql",
            "0001_x.Down.Sql",
            "README.md",
            ".gitkeep",
            "",
            ".sql",
            "_.sql",
            "1_.sql",
            "1.up.sql",
            "-1_x.sql",
            "99999999999999999999_x.sql",
            "١_arabic_digit.sql",
            "1_x.sqlx",
            "1_x.sq",
        ] {
            assert_eq!(parse_file_name(name), None, "{name}");
        }
    }

    #[test]
    fn non_utf8_file_is_an_error() {
        let dir = dir_with(&[]);
        fs::write(dir.path().join("0001_latin1.sql"), b"SELECT 'caf\xe9';\n").expect("write");
        match load(dir.path()) {
            Err(MigrationFileError::NotUtf8 { path }) => {
                assert_eq!(file_name(&path), "0001_latin1.sql");
            }
            other => panic!("expected NotUtf8, got {other:?}"),
        }
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_file_name_is_a_bad_name() {
        use std::os::unix::ffi::OsStrExt;
        let dir = dir_with(&[]);
        let name = std::ffi::OsStr::from_bytes(b"0001_caf\xe9.sql");
        fs::write(dir.path().join(name), "SELECT 1;").expect("write");
        assert!(matches!(
            load(dir.path()),
            Err(MigrationFileError::BadName { .. })
        ));
    }

    #[test]
    fn crlf_checksum_equals_lf_checksum() {
        let lf = b"CREATE TABLE t (id int);\nSELECT 1;\n";
        let crlf = b"CREATE TABLE t (id int);\r\nSELECT 1;\r\n";
        assert_eq!(checksum(lf), checksum(crlf));
        let a = migration(lf).expect("lf");
        let b = migration(crlf).expect("crlf");
        assert_eq!(a.checksum, b.checksum);
        assert_eq!(a.sql, b.sql);
        assert!(!b.sql.contains('\r'));
        assert_eq!(texts(&a), texts(&b));
    }

    #[test]
    fn checksum_of_known_bytes() {
        let expected = "b4e0497804e46e0a0b0b8c31975b062152d551bac49c3c2e80932567b4085dcd";
        assert_eq!(checksum(b"SELECT 1;\n"), expected);
        assert_eq!(checksum(b"SELECT 1;\r\n"), expected);
        assert_eq!(migration(b"SELECT 1;\n").expect("ok").checksum, expected);
    }

    #[test]
    fn checksum_changes_with_content_and_keeps_lone_cr() {
        assert_ne!(checksum(b"SELECT 1;\n"), checksum(b"SELECT 2;\n"));
        assert_ne!(checksum(b"SELECT 1;\r"), checksum(b"SELECT 1;\n"));
        assert_ne!(checksum(b"SELECT 1;\n"), checksum(b"SELECT 1;\n\n"));
        // Only the CR right before an LF goes: "a\r\r\n" hashes as the raw bytes "a\r\n".
        assert_eq!(checksum(b"a\r\r\n"), hex::encode(Sha256::digest(b"a\r\n")));
    }

    #[test]
    fn byte_order_mark_is_dropped_from_sql_but_counted_in_checksum() {
        let m = migration("\u{feff}SELECT 1;".as_bytes()).expect("ok");
        assert_eq!(m.sql, "SELECT 1;");
        assert_eq!(texts(&m), vec!["SELECT 1"]);
        assert_ne!(m.checksum, checksum(b"SELECT 1;"));
    }

    #[test]
    fn no_transaction_directives() {
        for text in [
            "-- dbwarden:no-transaction\nCREATE INDEX CONCURRENTLY i ON t (c);",
            "  -- dbwarden:no-transaction  \nCREATE INDEX CONCURRENTLY i ON t (c);",
            "--dbwarden:no-transaction\r\nSELECT 1;",
            "-- DBWarden:No-Transaction\nSELECT 1;",
            "\u{feff}-- dbwarden:no-transaction\nSELECT 1;",
        ] {
            let m = migration(text.as_bytes()).expect(text);
            assert_eq!(m.directive, Some(NO_TRANSACTION_DIRECTIVE), "{text:?}");
            assert!(!m.mode.is_transaction(), "{text:?}");
        }
        // sqlx's spelling.
        for text in [
            "-- no-transaction\nSELECT 1;",
            "--no-transaction\r\nSELECT 1;",
        ] {
            let m = migration(text.as_bytes()).expect(text);
            assert_eq!(m.directive, Some(SQLX_NO_TRANSACTION_DIRECTIVE), "{text:?}");
            assert_eq!(
                m.mode,
                Mode::Journaled(Why::Directive(SQLX_NO_TRANSACTION_DIRECTIVE))
            );
        }
        for text in [
            "SELECT 1;",
            "-- no-transactions\nSELECT 1;",
            "-- dbwarden no-transaction\nSELECT 1;",
            "SELECT '-- dbwarden:no-transaction';",
            "-- header\n-- no-transaction\nSELECT 1;",
        ] {
            let m = migration(text.as_bytes()).expect(text);
            assert_eq!(m.directive, None, "{text:?}");
            assert!(m.mode.is_transaction(), "{text:?}");
        }
        let m = migration(b"-- dbwarden:no-transaction\nSELECT 1;").expect("ok");
        assert_eq!(texts(&m), vec!["-- dbwarden:no-transaction\nSELECT 1"]);
    }

    #[test]
    fn timeout_directives_are_read_from_the_header() {
        use std::time::Duration;
        let m = migration(
            b"-- dbwarden:no-transaction\n-- why: a big table\n\n-- dbwarden:lock-timeout 10s\n--dbwarden:statement-timeout 2h\nCREATE INDEX CONCURRENTLY i ON t (c);",
        )
        .expect("ok");
        assert_eq!(m.directive, Some(NO_TRANSACTION_DIRECTIVE));
        assert_eq!(m.lock_timeout, Some(Duration::from_secs(10)));
        assert_eq!(m.statement_timeout, Some(Duration::from_secs(7200)));
        let m = migration(b"-- dbwarden:lock-timeout 0\nALTER TABLE t ADD c int;").expect("ok");
        assert_eq!(m.lock_timeout, Some(Duration::ZERO));
        let plain = migration(b"ALTER TABLE t ADD c int;").expect("ok");
        assert_eq!((plain.lock_timeout, plain.statement_timeout), (None, None));
        for (text, line) in [
            ("-- dbwarden:lock-timeout soon\nSELECT 1;", 1),
            ("-- dbwarden:lock-timeout\nSELECT 1;", 1),
            ("SELECT 1;\n-- dbwarden:lock-timeout 5s\nSELECT 2;", 2),
            (
                "-- dbwarden:lock-timeout 5s\n-- dbwarden:lock-timeout 6s\nSELECT 1;",
                2,
            ),
        ] {
            match migration(text.as_bytes()) {
                Err(MigrationFileError::BadDirective { line: l, .. }) => {
                    assert_eq!(l, line, "{text:?}")
                }
                other => panic!("{text:?}: expected BadDirective, got {other:?}"),
            }
        }
    }

    #[test]
    fn misplaced_or_unknown_directive_is_an_error() {
        for (text, line) in [
            ("-- header\n-- dbwarden:no-transaction\nSELECT 1;", 2),
            ("-- dbwarden:no-transactions\nSELECT 1;", 1),
            ("-- dbwarden:notransaction\nSELECT 1;", 1),
            ("SELECT 1;\n  -- dbwarden:no-transaction\nSELECT 2;", 2),
            (
                "-- dbwarden:no-transaction\n-- dbwarden:no-transaction\nSELECT 1;",
                2,
            ),
        ] {
            match migration(text.as_bytes()) {
                Err(MigrationFileError::BadDirective {
                    line: l, text: t, ..
                }) => {
                    assert_eq!(l, line, "{text:?}");
                    assert!(t.starts_with("--"), "{t:?}");
                }
                other => panic!("{text:?}: expected BadDirective, got {other:?}"),
            }
        }
    }

    #[test]
    fn files_without_statements_are_no_ops() {
        for text in [
            "",
            "   \n\t\n",
            "-- only a comment\n",
            "/* nothing */ ; ;",
            "-- dbwarden:no-transaction\n",
            "\u{feff}",
        ] {
            let m = migration(text.as_bytes()).expect(text);
            assert!(m.statements.is_empty(), "{text:?}");
        }
        let dir = dir_with(&[("0001_a.sql", "SELECT 1;"), ("0002_empty.sql", "")]);
        let ms = load(dir.path()).expect("load");
        assert_eq!(versions(&ms), vec![1, 2]);
        assert!(ms[1].statements.is_empty());
        assert!(ms[1].mode.is_transaction());
    }

    #[test]
    fn sqlx_checksum_is_sha384_of_the_bytes_on_disk() {
        use sha2::Sha384;
        let plain = b"CREATE TABLE a (id int);\n";
        let m = migration(plain).expect("ok");
        assert_eq!(
            m.sqlx_checksum().expect("sum"),
            Sha384::digest(plain).to_vec()
        );
        let bom = "\u{feff}SELECT 1;\n".as_bytes();
        let m = migration(bom).expect("ok");
        assert_eq!(
            m.sqlx_checksum().expect("sum"),
            Sha384::digest(bom).to_vec()
        );
        // Folded CRLF: read again from the file.
        let dir = dir_with(&[]);
        fs::write(dir.path().join("1_crlf.sql"), b"SELECT 1;\r\nSELECT 2;\r\n").expect("write");
        let ms = load(dir.path()).expect("load");
        assert_eq!(
            ms[0].sqlx_checksum().expect("sum"),
            Sha384::digest(b"SELECT 1;\r\nSELECT 2;\r\n").to_vec()
        );
        assert_eq!(ms[0].sqlx_description(), "crlf");
        let m =
            Migration::from_sql(3, "add_user_email", "SELECT 1", Dialect::Postgres).expect("ok");
        assert_eq!(m.sqlx_description(), "add user email");
    }

    #[test]
    fn goose_files_run_their_up_part_with_statement_blocks_whole() {
        let sql = "-- +goose Up\n-- +goose StatementBegin\nCREATE FUNCTION f() RETURNS trigger AS $$\nBEGIN\n  RETURN NEW;\nEND;\n$$ LANGUAGE plpgsql;\n-- +goose StatementEnd\nCREATE TABLE t (id int);\n\n-- +goose Down\nDROP TABLE t;\nDROP FUNCTION f();\n";
        let m = migration(sql.as_bytes()).expect("goose file");
        assert_eq!(
            texts(&m),
            vec![
                "CREATE FUNCTION f() RETURNS trigger AS $$\nBEGIN\n  RETURN NEW;\nEND;\n$$ LANGUAGE plpgsql",
                "CREATE TABLE t (id int)"
            ]
        );
        assert!(!m.body().contains("DROP TABLE"), "{}", m.body());
        assert!(m.mode.is_transaction());
        assert_eq!(
            m.checksum,
            checksum(sql.as_bytes()),
            "the whole file is checksummed"
        );
        let nt = migration(
            b"-- +goose Up\n-- +goose NO TRANSACTION\nCREATE INDEX CONCURRENTLY i ON t (c);\n",
        )
        .expect("ok");
        assert_eq!(nt.directive, Some(GOOSE_NO_TRANSACTION_DIRECTIVE));
        assert!(!nt.mode.is_transaction());
        match migration(b"-- +goose Up\n-- +goose ENVSUB ON\nSELECT 1;\n") {
            Err(MigrationFileError::BadGooseAnnotation { line: 2, .. }) => {}
            other => panic!("expected BadGooseAnnotation, got {other:?}"),
        }
    }

    #[test]
    fn version_zero_is_a_version() {
        let dir = dir_with(&[("0_setup.sql", "SELECT 0;"), ("1_next.sql", "SELECT 1;")]);
        let ms = load(dir.path()).expect("load");
        assert_eq!(versions(&ms), vec![0, 1]);
        let dup = dir_with(&[("0_a.sql", "SELECT 0;"), ("000_b.sql", "SELECT 0;")]);
        assert!(matches!(
            load(dup.path()),
            Err(MigrationFileError::DuplicateVersion { version: 0, .. })
        ));
    }

    #[test]
    fn an_unclosed_transaction_is_an_error_naming_the_statement() {
        match migration(b"CREATE TABLE a (id int);\nBEGIN;\nINSERT INTO a VALUES (1);\n") {
            Err(e @ MigrationFileError::UnclosedTransaction { statement: 2, .. }) => {
                assert!(e.to_string().contains("statement 2"), "{e}");
            }
            other => panic!("expected UnclosedTransaction, got {other:?}"),
        }
    }

    #[test]
    fn statements_are_split_and_trimmed() {
        let m = migration(
            b"-- users\nCREATE TABLE users (id int, name text DEFAULT 'a;b');\n\n\
              CREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql;\n-- end\n",
        )
        .expect("ok");
        assert_eq!(
            texts(&m),
            vec![
                "-- users\nCREATE TABLE users (id int, name text DEFAULT 'a;b')",
                "CREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql",
            ]
        );
        let mysql = migration(br"INSERT INTO t VALUES ('it\'s; fine'); SELECT 2;").expect("ok");
        assert_eq!(
            texts(&mysql.for_dialect(Dialect::MySql).expect("mysql")),
            vec![r"INSERT INTO t VALUES ('it\'s; fine')", "SELECT 2"]
        );
    }

    #[test]
    fn too_large_is_an_error() {
        // In a folder the size is checked before the file is read.
        let dir = dir_with(&[]);
        let file = fs::File::create(dir.path().join("0001_huge.sql")).expect("create");
        file.set_len(MAX_FILE_SIZE * 4).expect("sparse file");
        assert!(matches!(
            load(dir.path()),
            Err(MigrationFileError::TooLarge { size, .. }) if size == MAX_FILE_SIZE * 4
        ));
    }

    #[test]
    fn missing_dir_and_not_a_dir() {
        let dir = dir_with(&[("0001_a.sql", "SELECT 1;")]);
        let missing = dir.path().join("nope");
        assert!(matches!(
            load(&missing),
            Err(MigrationFileError::MissingDir { dir }) if dir == missing
        ));
        let file = dir.path().join("0001_a.sql");
        assert!(matches!(
            load(&file),
            Err(MigrationFileError::NotADir { dir }) if dir == file
        ));
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_to_files_are_followed() {
        let dir = dir_with(&[]);
        let elsewhere = dir_with(&[("shared.sql", "SELECT 1;")]);
        std::os::unix::fs::symlink(
            elsewhere.path().join("shared.sql"),
            dir.path().join("0001_shared.sql"),
        )
        .expect("symlink");
        let ms = load(dir.path()).expect("load");
        assert_eq!(texts(&ms[0]), vec!["SELECT 1"]);
        assert_eq!(ms[0].path, dir.path().join("0001_shared.sql"));
    }

    #[cfg(unix)]
    #[test]
    fn symlink_loop_is_an_io_error_not_a_hang() {
        let dir = dir_with(&[]);
        let a = dir.path().join("0001_a.sql");
        let b = dir.path().join("0002_b.sql");
        std::os::unix::fs::symlink(&b, &a).expect("symlink");
        std::os::unix::fs::symlink(&a, &b).expect("symlink");
        // A directory loop is harmless: subdirectories are never entered.
        std::os::unix::fs::symlink(".", dir.path().join("loop")).expect("symlink");
        match load(dir.path()) {
            Err(err @ MigrationFileError::Io { .. }) => {
                assert_eq!(err.path(), a);
                assert!(err.to_string().contains("0001_a.sql"), "{err}");
            }
            other => panic!("expected Io, got {other:?}"),
        }
    }

    #[cfg(unix)]
    #[test]
    fn broken_symlink_is_an_io_error_naming_it() {
        let dir = dir_with(&[]);
        let link = dir.path().join("0001_gone.sql");
        std::os::unix::fs::symlink(dir.path().join("missing.sql"), &link).expect("symlink");
        match load(dir.path()) {
            Err(MigrationFileError::Io { path, source }) => {
                assert_eq!(path, link);
                assert_eq!(source.kind(), ErrorKind::NotFound);
            }
            other => panic!("expected Io, got {other:?}"),
        }
        // A broken link that is not a migration is ignored like any other non-.sql file.
        fs::remove_file(&link).expect("rm");
        std::os::unix::fs::symlink(dir.path().join("missing"), dir.path().join("README.md"))
            .expect("symlink");
        assert!(load(dir.path()).expect("load").is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn fifo_is_refused_without_blocking() {
        let dir = dir_with(&[]);
        let fifo = dir.path().join("0001_pipe.sql");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("mkfifo unavailable; skipping");
            return;
        }
        assert!(matches!(
            load(dir.path()),
            Err(MigrationFileError::NotAFile { path }) if path == fifo
        ));
    }

    #[test]
    fn every_message_is_one_line_naming_the_path() {
        let p = || PathBuf::from("migrations/0007_x.sql");
        let errors = [
            MigrationFileError::MissingDir { dir: p() },
            MigrationFileError::NotADir { dir: p() },
            MigrationFileError::Io {
                path: p(),
                source: std::io::Error::from(ErrorKind::PermissionDenied),
            },
            MigrationFileError::BadName { path: p() },
            MigrationFileError::DuplicateVersion {
                version: 7,
                first: p(),
                second: PathBuf::from("migrations/7_y.sql"),
            },
            MigrationFileError::NotUtf8 { path: p() },
            MigrationFileError::TooLarge {
                path: p(),
                size: MAX_FILE_SIZE + 1,
                limit: MAX_FILE_SIZE,
            },
            MigrationFileError::UnclosedTransaction {
                path: p(),
                statement: 2,
            },
            MigrationFileError::BadGooseAnnotation {
                path: p(),
                line: 3,
                what: "a second Up or Down annotation".into(),
            },
            MigrationFileError::NotAFile { path: p() },
            MigrationFileError::BadDirective {
                path: p(),
                line: 2,
                text: "-- dbwarden:nope".into(),
            },
        ];
        for err in errors {
            let msg = err.to_string();
            assert!(!msg.contains('\n'), "{msg}");
            assert!(msg.contains("migrations/0007_x.sql"), "{msg}");
            assert_eq!(err.path(), p());
        }
        let bad = MigrationFileError::BadName { path: p() }.to_string();
        assert!(bad.contains("0001_create_users.sql"), "{bad}");
    }
}
