//! The lexical layer under the splitter and the classifier: it knows only what can hide a `;`
//! or a keyword — quoted strings and identifiers, comments, dollar-quoted bodies — for each
//! dialect. It never panics: an unterminated quote, comment or body runs to the end of the
//! input, so the rest of the file becomes one statement and the engine reports the error.
//!
//! Every delimiter is ASCII, so every region boundary falls on a UTF-8 character boundary.

use std::ops::Range;

use super::dialect::Dialect;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    backslash_escapes: bool,
    e_strings: bool,
    nested_comments: bool,
    dollar_quotes: bool,
    hash_comments: bool,
    dash_comment_needs_space: bool,
    /// `[name]` is a quoted identifier (SQLite, after SQL Server).
    bracket_idents: bool,
    /// `/*M! … */` is run by the server like `/*! … */` (MariaDB).
    mariadb_exec_comments: bool,
}

impl Dialect {
    pub(crate) fn rules(self) -> Rules {
        match self {
            Dialect::Postgres => Rules {
                backslash_escapes: false,
                e_strings: true,
                nested_comments: true,
                dollar_quotes: true,
                hash_comments: false,
                dash_comment_needs_space: false,
                bracket_idents: false,
                mariadb_exec_comments: false,
            },
            Dialect::Sqlite => Rules {
                backslash_escapes: false,
                e_strings: false,
                nested_comments: false,
                dollar_quotes: false,
                hash_comments: false,
                dash_comment_needs_space: false,
                bracket_idents: true,
                mariadb_exec_comments: false,
            },
            Dialect::MySql => Rules {
                backslash_escapes: true,
                e_strings: false,
                nested_comments: false,
                dollar_quotes: false,
                hash_comments: true,
                dash_comment_needs_space: true,
                bracket_idents: false,
                mariadb_exec_comments: true,
            },
            Dialect::ClickHouse => Rules {
                backslash_escapes: true,
                e_strings: false,
                nested_comments: false,
                dollar_quotes: true,
                hash_comments: false,
                dash_comment_needs_space: false,
                bracket_idents: false,
                mariadb_exec_comments: false,
            },
        }
    }
}

/// What the lexer found at a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lexeme {
    /// One byte of ordinary text (a byte of a multi-byte character is its own lexeme).
    Byte(u8),
    Region(Region),
}

/// A stretch of input inside which `;` means nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Region {
    /// `-- …`, `# …` (MySQL) or `/* … */`.
    Comment,
    /// `/*! … */` (and MariaDB's `/*M! … */`): the server runs what is inside.
    ExecComment,
    /// `'…'`, `E'…'` or a `$tag$…$tag$` body.
    Literal,
    /// `"…"`, `` `…` `` or (SQLite) `[…]`.
    QuotedIdent,
}

/// Walks the input once, yielding ordinary bytes one at a time and quoted/commented regions
/// whole. Ranges are clamped to the input and every region advances at least one byte.
pub(crate) struct Lexer<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Start of the bare word ending at `pos` (`>= pos` when the previous byte ends no word).
    word_start: usize,
    rules: Rules,
}

impl<'a> Lexer<'a> {
    pub(crate) fn new(sql: &'a str, dialect: Dialect) -> Self {
        Lexer {
            bytes: sql.as_bytes(),
            pos: 0,
            word_start: 0,
            rules: dialect.rules(),
        }
    }

    /// Where the next lexeme starts.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Goes on lexing at `pos` past bytes that all continue the current bare word (ASCII
    /// letters, digits, `_`), keeping the word: an `E'…'` or `$tag$` after it lexes as it would
    /// one byte at a time.
    pub(crate) fn advance_in_word(&mut self, pos: usize) {
        if self.word_start > self.pos {
            self.word_start = self.pos;
        }
        self.pos = pos.clamp(self.pos, self.bytes.len());
    }

    /// Goes on lexing at `pos` (a char boundary at or after the current position), as if the
    /// text before it ended a word.
    pub(crate) fn skip_to(&mut self, pos: usize) {
        self.pos = pos.clamp(self.pos, self.bytes.len());
        self.word_start = self.pos;
    }
}

impl Iterator for Lexer<'_> {
    type Item = (Lexeme, Range<usize>);

    fn next(&mut self) -> Option<Self::Item> {
        let start = self.pos;
        let byte = *self.bytes.get(start)?;
        if opens_region(byte) {
            let word = self.bytes.get(self.word_start..start).unwrap_or_default();
            if let Some((region, end)) = region_at(self.bytes, start, word, self.rules) {
                self.pos = end.clamp(start + 1, self.bytes.len());
                self.word_start = self.pos;
                return Some((Lexeme::Region(region), start..self.pos));
            }
        }
        self.pos = start + 1;
        if !is_ident_byte(byte) {
            self.word_start = self.pos;
        } else if byte >= 0xC0
            && let Some(len) = unicode_space_len(self.bytes, start)
        {
            // Whitespace such as U+00A0 ends a word, as `trim` takes it for whitespace: a
            // statement is trimmed before the engine gets it, so `\u{a0}$$` lexes as `$$` does.
            self.word_start = start + len;
        }
        Some((Lexeme::Byte(byte), start..self.pos))
    }
}

/// Whether a region may start at this byte (most bytes of a file are not: the lexer skips
/// [`region_at`] for them).
fn opens_region(b: u8) -> bool {
    matches!(b, b'-' | b'#' | b'/' | b'\'' | b'"' | b'`' | b'[' | b'$')
}

/// Letters, digits, `_`, `$` and any byte of a non-ASCII character continue a bare word (the
/// lexer ends a word at non-ASCII whitespace all the same).
pub(crate) fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

/// Length of the non-ASCII whitespace character (U+0085, U+00A0, U+2003, …) starting at `i`.
pub(crate) fn unicode_space_len(bytes: &[u8], i: usize) -> Option<usize> {
    let len = match *bytes.get(i)? {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0.. => 4,
        _ => return None,
    };
    let c = std::str::from_utf8(bytes.get(i..i + len)?)
        .ok()?
        .chars()
        .next()?;
    c.is_whitespace().then_some(len)
}

/// If a region starts at `i`, its kind and end (exclusive; the input length when unterminated).
/// `word` is the bare word that ends right before `i`.
fn region_at(bytes: &[u8], i: usize, word: &[u8], rules: Rules) -> Option<(Region, usize)> {
    let next = bytes.get(i + 1).copied();
    match bytes.get(i).copied()? {
        b'-' if next == Some(b'-') => {
            // Trimming a statement drops a trailing U+00A0 too, so `--\u{a0}` is a comment
            // here as it is once trimmed to `--`.
            let after = bytes.get(i + 2).copied();
            if rules.dash_comment_needs_space
                && after.is_some_and(|c| c > b' ')
                && unicode_space_len(bytes, i + 2).is_none()
            {
                return None;
            }
            Some((Region::Comment, line_end(bytes, i + 2)))
        }
        b'#' if rules.hash_comments => Some((Region::Comment, line_end(bytes, i + 1))),
        b'/' if next == Some(b'*') => {
            let exec = bytes.get(i + 2) == Some(&b'!')
                || (rules.mariadb_exec_comments
                    && bytes.get(i + 2) == Some(&b'M')
                    && bytes.get(i + 3) == Some(&b'!'));
            if exec {
                Some((Region::ExecComment, block_comment_end(bytes, i, false)))
            } else {
                let end = block_comment_end(bytes, i, rules.nested_comments);
                Some((Region::Comment, end))
            }
        }
        b'\'' => {
            let e_string = rules.e_strings && word.eq_ignore_ascii_case(b"e");
            let end = quoted_end(bytes, i, b'\'', rules.backslash_escapes || e_string);
            Some((Region::Literal, end))
        }
        b'"' => Some((
            Region::QuotedIdent,
            quoted_end(bytes, i, b'"', rules.backslash_escapes),
        )),
        b'`' => Some((Region::QuotedIdent, quoted_end(bytes, i, b'`', false))),
        b'[' if rules.bracket_idents => Some((Region::QuotedIdent, bracket_end(bytes, i))),
        // `a$$b` is one identifier in PostgreSQL, so a dollar quote never continues a word.
        b'$' if rules.dollar_quotes && word.is_empty() => {
            dollar_body_end(bytes, i).map(|end| (Region::Literal, end))
        }
        _ => None,
    }
}

/// Position of the next line break at or after `from` (the break itself is not part of the
/// comment), or the input length.
fn line_end(bytes: &[u8], from: usize) -> usize {
    bytes
        .get(from..)
        .and_then(|rest| rest.iter().position(|&b| b == b'\n' || b == b'\r'))
        .map_or(bytes.len(), |p| from + p)
}

/// End of the `/*` comment opening at `i`; PostgreSQL nests them, MySQL and ClickHouse do not.
fn block_comment_end(bytes: &[u8], i: usize, nested: bool) -> usize {
    let mut depth = 1usize;
    let mut j = i + 2;
    while let Some(&b) = bytes.get(j) {
        let next = bytes.get(j + 1).copied();
        if nested && b == b'/' && next == Some(b'*') {
            depth += 1;
            j += 2;
        } else if b == b'*' && next == Some(b'/') {
            depth -= 1;
            j += 2;
            if depth == 0 {
                return j;
            }
        } else {
            j += 1;
        }
    }
    bytes.len()
}

/// End of the quoted run opening with `quote` at `i`; a doubled quote is an escaped quote, and so
/// is a backslash-escaped one where the dialect says so.
fn quoted_end(bytes: &[u8], i: usize, quote: u8, backslash_escapes: bool) -> usize {
    let mut j = i + 1;
    while let Some(&b) = bytes.get(j) {
        if backslash_escapes && b == b'\\' {
            j += 2;
        } else if b == quote {
            if bytes.get(j + 1) == Some(&quote) {
                j += 2;
            } else {
                return j + 1;
            }
        } else {
            j += 1;
        }
    }
    bytes.len()
}

/// End of the `[…]` identifier opening at `i` (no escapes: the first `]` closes it).
fn bracket_end(bytes: &[u8], i: usize) -> usize {
    bytes
        .get(i + 1..)
        .and_then(|rest| rest.iter().position(|&b| b == b']'))
        .map_or(bytes.len(), |p| i + 1 + p + 1)
}

/// End of the `$tag$ … $tag$` body opening at `i`, or `None` when the `$` opens no body
/// (`$1`, `$`, `$a`). The tag follows identifier rules without `$` and may be empty.
fn dollar_body_end(bytes: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    let first = *bytes.get(j)?;
    if first != b'$' {
        if !(first.is_ascii_alphabetic() || first == b'_' || first >= 0x80) {
            return None;
        }
        while bytes
            .get(j)
            .is_some_and(|&b| b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80)
        {
            j += 1;
        }
        if bytes.get(j) != Some(&b'$') {
            return None;
        }
    }
    let tag = bytes.get(i..=j)?;
    let body = bytes.get(j + 1..)?;
    let end = body
        .windows(tag.len())
        .position(|w| w == tag)
        .map_or(bytes.len(), |p| j + 1 + p + tag.len());
    Some(end)
}
