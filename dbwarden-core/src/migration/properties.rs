//! Properties of the statement splitter and the migration-file parser, in one place for the
//! `cargo fuzz` targets (`fuzz/`) and the stable property test (`tests/fuzz_properties.rs`).
//!
//! Each check returns the first property that does not hold, as a message naming it; none of
//! them panics on any input, so a panic under the fuzzer is a panic of the code under test.

use super::classify::StatementKind;
use super::split::{Dialect, split_spans_in, split_statements_in};
use super::{MigrationFileError, checksum, from_bytes, parse_file_name};
use std::path::PathBuf;

/// Every dialect the splitter knows.
pub const DIALECTS: [Dialect; 3] = [Dialect::Generic, Dialect::MySql, Dialect::ClickHouse];

/// Checks the splitter on `sql` with the rules of `dialect`:
///
/// 1. the spans are char-boundary ranges that tile the input in order, one `;` between two
///    neighbours, so joining the pieces with `;` gives back `sql`;
/// 2. the statements are the trimmed pieces in order, leaving out only pieces that hold
///    nothing but whitespace and comments;
/// 3. each statement splits to itself, and the statements joined with `"\n;\n"` split back to
///    the same statements (`"\n;\n"`, not `";\n"`: a statement may end in a `--` comment);
/// 4. input holding none of the characters that open a quote or a comment splits like
///    `str::split(';')`;
/// 5. `StatementKind::of_in` of the whole input is idempotent exactly when every statement is.
pub fn check_split(sql: &str, dialect: Dialect) -> Result<(), String> {
    let spans = split_spans_in(sql, dialect);
    let mut pieces = Vec::with_capacity(spans.len());
    let mut expected_start = 0;
    for span in &spans {
        if span.start != expected_start {
            return Err(format!("span {span:?} should start at {expected_start}"));
        }
        let piece = sql
            .get(span.clone())
            .ok_or_else(|| format!("span {span:?} is not a char-boundary range"))?;
        pieces.push(piece);
        if span.end < sql.len() {
            if sql.as_bytes().get(span.end) != Some(&b';') {
                return Err(format!("span {span:?} is not followed by `;`"));
            }
            expected_start = span.end + 1;
        } else {
            expected_start = usize::MAX;
        }
    }
    if spans.last().map(|s| s.end) != Some(sql.len()) {
        return Err(format!("spans {spans:?} do not end at {}", sql.len()));
    }
    if pieces.join(";") != sql {
        return Err("the pieces joined with `;` are not the input".into());
    }

    let statements = split_statements_in(sql, dialect);
    let mut next = statements.iter().peekable();
    for piece in &pieces {
        let trimmed = piece.trim();
        if next.peek().is_some_and(|stmt| stmt.as_str() == trimmed) {
            next.next();
        } else if !is_comment_only(trimmed, dialect) {
            return Err(format!("piece {trimmed:?} holds code but is no statement"));
        }
    }
    if let Some(stmt) = next.next() {
        return Err(format!(
            "statement {stmt:?} is no trimmed piece, or out of order"
        ));
    }

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

    if !sql.contains(['\'', '"', '`', '$', '-', '/', '#']) {
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
    if whole != each {
        return Err(format!(
            "of_in(input) says idempotent={whole}, the statements one by one {each}"
        ));
    }
    Ok(())
}

/// Whether a trimmed piece the splitter dropped is plausibly empty or comment-only: it is
/// empty, or opens with a comment (and not MySQL's executable `/*!`), and splits to nothing.
fn is_comment_only(trimmed: &str, dialect: Dialect) -> bool {
    if trimmed.is_empty() {
        return true;
    }
    let opens_comment = trimmed.starts_with("--")
        || (trimmed.starts_with("/*") && !trimmed.starts_with("/*!"))
        || (dialect == Dialect::MySql && trimmed.starts_with('#'));
    opens_comment && split_statements_in(trimmed, dialect).is_empty()
}

/// Checks the file-name parser and [`from_bytes`] on an arbitrary name and body:
///
/// 1. a name that parses has a positive version, a non-empty description that appears in the
///    name, and ends in `.sql` (any case); `<version>_<description>.up.sql` and, unless the
///    description itself ends in `.up` or `.down`, `<version:04>_<description>.sql` parse back
///    to the same version and description;
/// 2. `from_bytes` fails exactly as documented: not UTF-8, bad directive, no statement; when
///    it succeeds, the checksum is [`checksum`] of the bytes, the statements are
///    `split_statements` of the text and the text is the body less CRs before LFs and a BOM;
/// 3. a body with no CR reads the same, with the same checksum, after its LFs become CRLFs.
pub fn check_file(name: &str, bytes: &[u8]) -> Result<(), String> {
    let parsed = parse_file_name(name);
    let (version, description) = parsed.clone().unwrap_or((1, "fuzz".to_owned()));
    if parsed.is_some() {
        if version <= 0 || description.is_empty() || !name.contains(description.as_str()) {
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
    let result = from_bytes(version, description.clone(), path.clone(), bytes);
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
        (Err(MigrationFileError::Empty { .. }), Some(text))
            if split_statements_in(text, Dialect::Generic).is_empty() => {}
        (Ok(m), Some(text)) => {
            if m.sql != text {
                return Err(format!("sql {:?} is not the folded body", m.sql));
            }
            if m.checksum != checksum(bytes) {
                return Err("checksum differs from checksum(bytes)".into());
            }
            if m.statements.is_empty()
                || m.statements != split_statements_in(text, Dialect::Generic)
            {
                let statements = &m.statements;
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
        let again = from_bytes(version, description, path, &crlf);
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
