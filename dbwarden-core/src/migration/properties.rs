//! Properties of the statement splitter and the migration-file parser, in one place for the
//! `cargo fuzz` targets (`fuzz/`) and the stable property test (`properties_tests.rs`).
//!
//! Each check returns the first property that does not hold, as a message naming it; none of
//! them panics on any input, so a panic under the fuzzer is a panic of the code under test.

use super::classify::StatementKind;
use super::dialect::Dialect;
use super::lexer::{Lexeme, Lexer, Region};
use super::split::{split_statements_in, statement_spans};
use super::{MigrationFileError, checksum, from_bytes, parse_file_name};
use std::path::PathBuf;

/// Every dialect the splitter knows.
pub const DIALECTS: [Dialect; 4] = [
    Dialect::Postgres,
    Dialect::Sqlite,
    Dialect::MySql,
    Dialect::ClickHouse,
];

/// Checks the splitter on `sql` with the rules of `dialect`:
///
/// 1. the statement spans are char-boundary ranges, in order and disjoint, each trimmed and
///    holding code; the statements are exactly those texts;
/// 2. what lies between two statements (and before the first, after the last) holds nothing
///    but whitespace, comments and `;` — unless the input has a `DELIMITER` command (MySQL);
/// 3. without a `DELIMITER` command, each statement splits to itself, and the statements
///    joined with `"\n;\n"` split back to the same statements (`"\n;\n"`, not `";\n"`: a
///    statement may end in a `--` comment);
/// 4. input holding none of the characters that open a quote, a comment or a block, nor a
///    letter, splits like `str::split(';')`;
/// 5. without a `DELIMITER` command, `StatementKind::of_in` of the whole input is idempotent
///    exactly when every statement is.
pub fn check_split(sql: &str, dialect: Dialect) -> Result<(), String> {
    let spans = statement_spans(sql, dialect);
    let statements = split_statements_in(sql, dialect);
    let slow = super::split::spans(sql, dialect, false);
    if slow != spans {
        return Err(format!(
            "the fast path cut {spans:?}, byte by byte {slow:?}"
        ));
    }
    let mut gap_start = 0;
    for (span, stmt) in spans.iter().zip(&statements) {
        if span.start < gap_start || span.end < span.start {
            return Err(format!("span {span:?} overlaps or is out of order"));
        }
        let text = sql
            .get(span.clone())
            .ok_or_else(|| format!("span {span:?} is not a char-boundary range"))?;
        if text != stmt || text.trim() != text || text.is_empty() {
            return Err(format!("span {span:?} gives {text:?}, statement {stmt:?}"));
        }
        let gap = sql.get(gap_start..span.start).unwrap_or_default();
        check_gap(gap, sql, dialect)?;
        gap_start = span.end;
    }
    if spans.len() != statements.len() {
        return Err("as many spans as statements".into());
    }
    check_gap(sql.get(gap_start..).unwrap_or_default(), sql, dialect)?;

    let delimiter = dialect == Dialect::MySql && sql.to_ascii_uppercase().contains("DELIMITER");
    if !delimiter {
        for stmt in &statements {
            if split_statements_in(stmt, dialect) != [stmt.as_str()] {
                return Err(format!("statement {stmt:?} does not split to itself"));
            }
        }
        let rejoined = split_statements_in(&statements.join("\n;\n"), dialect);
        if rejoined != statements {
            return Err(format!(
                "statements {statements:?} joined with \"\\n;\\n\" split to {rejoined:?}"
            ));
        }
    }

    if !sql.contains(['\'', '"', '`', '$', '-', '/', '#', '[', '(', ')'])
        && !sql.chars().any(char::is_alphabetic)
    {
        let naive: Vec<&str> = sql
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if statements != naive {
            return Err(format!("plain text split to {statements:?}, not {naive:?}"));
        }
    }

    let whole = StatementKind::of_in(sql, dialect).is_idempotent();
    let each = statements
        .iter()
        .all(|stmt| StatementKind::of_in(stmt, dialect).is_idempotent());
    if whole != each && !delimiter {
        return Err(format!(
            "of_in(input) says idempotent={whole}, the statements one by one {each}"
        ));
    }
    Ok(())
}

/// Text between statements: whitespace, comments and `;` only (anything goes around a
/// `DELIMITER` command, which this does not model).
fn check_gap(gap: &str, sql: &str, dialect: Dialect) -> Result<(), String> {
    if dialect == Dialect::MySql && sql.to_ascii_uppercase().contains("DELIMITER") {
        return Ok(());
    }
    let mut outside = Vec::new();
    for (lexeme, range) in Lexer::new(gap, dialect) {
        match lexeme {
            Lexeme::Region(Region::Comment) => outside.push(b' '),
            Lexeme::Region(_) => {
                return Err(format!("a quoted region between statements: {gap:?}"));
            }
            Lexeme::Byte(_) => {
                outside.extend_from_slice(gap.as_bytes().get(range).unwrap_or_default())
            }
        }
    }
    let mut outside = String::from_utf8_lossy(&outside).into_owned();
    if dialect == Dialect::MySql {
        // MySQL's `--;` is code in place but a comment once cut off: the splitter drops a
        // piece that is only `--` (the server would call it an empty query).
        outside = outside.replace("--;", ";");
        if let Some(rest) = outside.trim_end().strip_suffix("--") {
            outside = rest.to_owned();
        }
    }
    match outside.chars().find(|&c| c != ';' && !c.is_whitespace()) {
        Some(c) => Err(format!("code {c:?} between statements, in {gap:?}")),
        None => Ok(()),
    }
}

/// Checks the file-name parser and [`from_bytes`] on an arbitrary name and body:
///
/// 1. a name that parses has a version of 0 or more, a non-empty description that appears in the
///    name, and ends in `.sql` (any case); `<version>_<description>.up.sql` and, unless the
///    description itself ends in `.up` or `.down`, `<version:04>_<description>.sql` parse back
///    to the same version and description;
/// 2. `from_bytes` fails exactly as documented: not UTF-8, bad directive, a transaction left
///    open; when it succeeds, the checksum is [`checksum`] of the bytes, the statements are
///    `split_statements` of the text and the text is the body less CRs before LFs and a BOM;
/// 3. a body with no CR reads the same, with the same checksum, after its LFs become CRLFs.
pub fn check_file(name: &str, bytes: &[u8]) -> Result<(), String> {
    let parsed = parse_file_name(name);
    let (version, description) = parsed.clone().unwrap_or((1, "fuzz".to_owned()));
    if parsed.is_some() {
        if version < 0 || description.is_empty() || !name.contains(description.as_str()) {
            return Err(format!("{name:?} parsed to ({version}, {description:?})"));
        }
        if !name.to_ascii_lowercase().ends_with(".sql") {
            return Err(format!("{name:?} parsed but does not end in .sql"));
        }
        let up = format!("{version}_{description}.up.sql");
        if parse_file_name(&up) != Some((version, description.clone())) {
            return Err(format!("{name:?} parsed, {up:?} parses to something else"));
        }
        let lower = description.to_ascii_lowercase();
        let plain = format!("{version:04}_{description}.sql");
        if !lower.ends_with(".up")
            && !lower.ends_with(".down")
            && parse_file_name(&plain) != Some((version, description.clone()))
        {
            return Err(format!(
                "{name:?} parsed, {plain:?} parses to something else"
            ));
        }
    }

    let path = PathBuf::from(format!("migrations/{version}_{description}.sql"));
    let result = from_bytes(
        version,
        description.clone(),
        path.clone(),
        bytes,
        Dialect::Postgres,
    );
    // `from_bytes` drops each CR right before an LF (so "\r\r\n" becomes "\r\n", as
    // `replace` does), then a leading byte-order mark.
    let text = std::str::from_utf8(bytes)
        .ok()
        .map(|t| t.replace("\r\n", "\n"));
    let text = text
        .as_deref()
        .map(|t| t.strip_prefix('\u{feff}').unwrap_or(t));
    match (&result, text) {
        (Err(MigrationFileError::NotUtf8 { .. }), None) => {}
        (Err(MigrationFileError::BadDirective { line, text, .. }), Some(_))
            if *line >= 1 && text.starts_with("--") => {}
        (Err(MigrationFileError::UnclosedTransaction { statement, .. }), Some(text))
            if *statement >= 1
                && *statement <= split_statements_in(text, Dialect::Postgres).len() => {}
        (Ok(m), Some(text)) => {
            if m.sql != text {
                return Err(format!("sql {:?} is not the folded body", m.sql));
            }
            if m.checksum != checksum(bytes) {
                return Err("checksum differs from checksum(bytes)".into());
            }
            let statements: Vec<&str> = m.statement_texts().collect();
            if statements != split_statements_in(text, Dialect::Postgres) {
                return Err(format!("statements {statements:?} are not the split text"));
            }
            if (m.version, &m.description, &m.path) != (version, &description, &path) {
                return Err("version, description or path not kept".into());
            }
        }
        (other, _) => return Err(format!("unexpected result {other:?}")),
    }

    if !bytes.contains(&b'\r') && bytes.contains(&b'\n') {
        let mut crlf = Vec::with_capacity(bytes.len() * 2);
        for &b in bytes {
            if b == b'\n' {
                crlf.push(b'\r');
            }
            crlf.push(b);
        }
        if checksum(&crlf) != checksum(bytes) {
            return Err("the CRLF copy has another checksum".into());
        }
        // The CRLF copy remembers it was folded (for sqlx's checksum of the raw file); the rest
        // must be the same.
        let again = from_bytes(version, description, path, crlf, Dialect::Postgres).map(|mut m| {
            m.raw.crlf = false;
            m.raw.sqlx_checksum = None;
            m
        });
        let same = match (&result, &again) {
            (Ok(a), Ok(b)) => a == b,
            (Err(a), Err(b)) => a.to_string() == b.to_string(),
            _ => false,
        };
        if !same {
            return Err(format!("LF gave {result:?}, CRLF gave {again:?}"));
        }
    }
    Ok(())
}

/// xorshift64*: a deterministic pseudo-random sequence from a seed, without a dependency (the
/// property tests replay the same inputs on every run).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}
