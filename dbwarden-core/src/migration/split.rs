//! Splitting a migration file into statements at top-level `;`.
//!
//! A plain `split(';')` breaks on the first `';'` inside a string, a comment or a function body,
//! and the engine then runs half a statement. This module is a small lexer that knows only what
//! can hide a `;`: quoted strings and identifiers, comments and dollar-quoted bodies. It never
//! panics: an unterminated quote, comment or body simply runs to the end of the input, so the
//! rest of the file becomes one statement and the engine reports the syntax error.
//!
//! Every delimiter is ASCII, so every cut falls on a UTF-8 character boundary.

use std::ops::Range;

/// The lexical rules the splitter follows. Engines differ in what hides a `;`.
///
/// [`split_statements`] uses [`Dialect::Generic`]; an engine whose strings take backslash
/// escapes (MySQL, ClickHouse) should split with its own dialect through
/// [`split_statements_in`], or a `'it\'s; fine'` literal is cut in two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Dialect {
    /// PostgreSQL lexing (`''` escapes, `E'\''` strings, nested `/* */`, `$tag$` bodies) plus
    /// MySQL backtick identifiers. Right for PostgreSQL and SQLite.
    #[default]
    Generic,
    /// MySQL / MariaDB: backslash escapes in `'…'` and `"…"`, `#` comments, `--` starts a
    /// comment only when followed by whitespace, block comments do not nest, no dollar quotes.
    MySql,
    /// ClickHouse: backslash escapes in `'…'` and `"…"`, block comments do not nest,
    /// `$tag$` heredocs.
    ClickHouse,
}

#[derive(Debug, Clone, Copy)]
struct Rules {
    backslash_escapes: bool,
    e_strings: bool,
    nested_comments: bool,
    dollar_quotes: bool,
    hash_comments: bool,
    dash_comment_needs_space: bool,
}

impl Dialect {
    fn rules(self) -> Rules {
        match self {
            Dialect::Generic => Rules {
                backslash_escapes: false,
                e_strings: true,
                nested_comments: true,
                dollar_quotes: true,
                hash_comments: false,
                dash_comment_needs_space: false,
            },
            Dialect::MySql => Rules {
                backslash_escapes: true,
                e_strings: false,
                nested_comments: false,
                dollar_quotes: false,
                hash_comments: true,
                dash_comment_needs_space: true,
            },
            Dialect::ClickHouse => Rules {
                backslash_escapes: true,
                e_strings: false,
                nested_comments: false,
                dollar_quotes: true,
                hash_comments: false,
                dash_comment_needs_space: false,
            },
        }
    }
}

/// Splits `sql` at top-level `;` with the [`Dialect::Generic`] rules.
///
/// Each statement is trimmed and excludes its `;`; pieces holding only whitespace and comments
/// are dropped. Comments inside a statement are kept, since the engine gets the text.
///
/// ```
/// # use dbwarden_core::migration::split_statements;
/// let sql = "CREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql;\n-- done;\n";
/// assert_eq!(
///     split_statements(sql),
///     vec!["CREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql"],
/// );
/// ```
pub fn split_statements(sql: &str) -> Vec<String> {
    split_statements_in(sql, Dialect::Generic)
}

/// [`split_statements`] with the lexical rules of `dialect`.
pub fn split_statements_in(sql: &str, dialect: Dialect) -> Vec<String> {
    split_spans_in(sql, dialect)
        .into_iter()
        .filter_map(|span| sql.get(span))
        .filter(|piece| has_code(piece, dialect))
        .map(|piece| piece.trim().to_owned())
        .filter(|stmt| !stmt.is_empty())
        .collect()
}

/// Byte ranges of the raw pieces between top-level `;` with the [`Dialect::Generic`] rules.
///
/// The pieces are untrimmed and empty ones are kept, so joining them with `;` gives back the
/// input exactly; there is always one more piece than there are top-level semicolons.
pub fn split_spans(sql: &str) -> Vec<Range<usize>> {
    split_spans_in(sql, Dialect::Generic)
}

/// [`split_spans`] with the lexical rules of `dialect`.
pub fn split_spans_in(sql: &str, dialect: Dialect) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let mut start = 0;
    for (lexeme, range) in Lexer::new(sql, dialect) {
        if lexeme == Lexeme::Byte(b';') {
            spans.push(start..range.start);
            start = range.end;
        }
    }
    spans.push(start..sql.len());
    spans
}

/// Whether `piece` holds anything but whitespace and comments. A MySQL executable comment
/// (`/*!40101 SET NAMES utf8 */`) is code: mysqldump files are full of them.
fn has_code(piece: &str, dialect: Dialect) -> bool {
    let mut code_start = 0;
    for (lexeme, range) in Lexer::new(piece, dialect) {
        if lexeme == Lexeme::Region(Region::Comment) {
            let before = piece.get(code_start..range.start).unwrap_or("x");
            if !before.trim().is_empty() {
                return true;
            }
            code_start = range.end;
        }
    }
    !piece.get(code_start..).unwrap_or("x").trim().is_empty()
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
    /// `/*! … */`: MySQL runs what is inside.
    ExecComment,
    /// `'…'`, `E'…'` or a `$tag$…$tag$` body.
    Literal,
    /// `"…"` or `` `…` ``.
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
}

impl Iterator for Lexer<'_> {
    type Item = (Lexeme, Range<usize>);

    fn next(&mut self) -> Option<Self::Item> {
        let start = self.pos;
        let byte = *self.bytes.get(start)?;
        let word = self.bytes.get(self.word_start..start).unwrap_or_default();
        if let Some((region, end)) = region_at(self.bytes, start, word, self.rules) {
            self.pos = end.clamp(start + 1, self.bytes.len());
            self.word_start = self.pos;
            return Some((Lexeme::Region(region), start..self.pos));
        }
        self.pos = start + 1;
        if !is_ident_byte(byte) {
            self.word_start = self.pos;
        } else if let Some(len) = unicode_space_len(self.bytes, start) {
            // Whitespace such as U+00A0 ends a word, as `trim` takes it for whitespace: a
            // statement is trimmed before the engine gets it, so `\u{a0}$$` lexes as `$$` does.
            self.word_start = start + len;
        }
        Some((Lexeme::Byte(byte), start..self.pos))
    }
}

/// Letters, digits, `_`, `$` and any byte of a non-ASCII character continue a bare word (the
/// lexer ends a word at non-ASCII whitespace all the same).
pub(crate) fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

/// Length of the non-ASCII whitespace character (U+0085, U+00A0, U+2003, …) starting at `i`.
fn unicode_space_len(bytes: &[u8], i: usize) -> Option<usize> {
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
            if bytes.get(i + 2) == Some(&b'!') {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn split(sql: &str) -> Vec<String> {
        split_statements(sql)
    }

    #[test]
    fn plain_statements() {
        assert_eq!(
            split("CREATE TABLE a (id int);\nCREATE TABLE b (id int);\n"),
            vec!["CREATE TABLE a (id int)", "CREATE TABLE b (id int)"]
        );
        assert_eq!(split("SELECT 1"), vec!["SELECT 1"]);
        assert_eq!(
            split("  SELECT 1 ;  ;; SELECT 2;"),
            vec!["SELECT 1", "SELECT 2"]
        );
    }

    #[test]
    fn empty_and_comment_only_inputs_give_nothing() {
        for sql in [
            "",
            ";",
            " ;\n; \t",
            "-- just a note",
            "-- a; b\n/* c; d */ ;",
            "/* /* nested; */ still; */",
            "\u{a0};\u{2003}",
        ] {
            assert!(split(sql).is_empty(), "{sql:?} gave {:?}", split(sql));
        }
    }

    #[test]
    fn semicolon_in_single_quotes() {
        assert_eq!(
            split("INSERT INTO t VALUES ('a;b'); SELECT 'x;'"),
            vec!["INSERT INTO t VALUES ('a;b')", "SELECT 'x;'"]
        );
    }

    #[test]
    fn doubled_quote_escape() {
        assert_eq!(
            split("INSERT INTO t VALUES ('it''s; fine'); SELECT 2"),
            vec!["INSERT INTO t VALUES ('it''s; fine')", "SELECT 2"]
        );
        assert_eq!(
            split("SELECT ''; SELECT ''''"),
            vec!["SELECT ''", "SELECT ''''"]
        );
    }

    #[test]
    fn e_string_backslash_escape() {
        assert_eq!(
            split(r"SELECT E'it\'s; fine'; SELECT 2"),
            vec![r"SELECT E'it\'s; fine'", "SELECT 2"]
        );
        assert_eq!(
            split(r"SELECT e'\\'; SELECT 2"),
            vec![r"SELECT e'\\'", "SELECT 2"]
        );
        // Outside E'' a backslash is an ordinary character in standard SQL.
        assert_eq!(
            split(r"SELECT 'C:\'; SELECT 2"),
            vec![r"SELECT 'C:\'", "SELECT 2"]
        );
        // `name'…'` is no E-string just because the word ends in e.
        assert_eq!(
            split(r"SELECT some'\'; SELECT 2"),
            vec![r"SELECT some'\'", "SELECT 2"]
        );
    }

    #[test]
    fn double_quoted_identifiers() {
        assert_eq!(
            split(r#"CREATE TABLE "a;b" ("x"";y" int); SELECT 1"#),
            vec![r#"CREATE TABLE "a;b" ("x"";y" int)"#, "SELECT 1"]
        );
    }

    #[test]
    fn backtick_identifiers() {
        assert_eq!(
            split("CREATE TABLE `a;b` (`c``;` int); SELECT 1"),
            vec!["CREATE TABLE `a;b` (`c``;` int)", "SELECT 1"]
        );
    }

    #[test]
    fn line_comments_hide_semicolons_and_are_kept() {
        assert_eq!(
            split("SELECT 1 -- not here; really\n+ 1; SELECT 2"),
            vec!["SELECT 1 -- not here; really\n+ 1", "SELECT 2"]
        );
        assert_eq!(
            split("-- header; comment\nSELECT 1;"),
            vec!["-- header; comment\nSELECT 1"]
        );
        assert_eq!(
            split("SELECT 1 --;\r; SELECT 2"),
            vec!["SELECT 1 --;", "SELECT 2"]
        );
    }

    #[test]
    fn hash_is_not_a_comment_by_default() {
        assert_eq!(
            split("SELECT 1 # x; SELECT 2"),
            vec!["SELECT 1 # x", "SELECT 2"]
        );
    }

    #[test]
    fn nested_block_comments() {
        assert_eq!(
            split("SELECT /* a /* b; */ c; */ 1; SELECT 2"),
            vec!["SELECT /* a /* b; */ c; */ 1", "SELECT 2"]
        );
        assert_eq!(split("SELECT /*/ ; */ 1;"), vec!["SELECT /*/ ; */ 1"]);
        assert_eq!(
            split("SELECT /**/ 1; SELECT 2"),
            vec!["SELECT /**/ 1", "SELECT 2"]
        );
    }

    #[test]
    fn dollar_quoted_bodies() {
        let f = "CREATE FUNCTION f() RETURNS int AS $$ BEGIN RETURN 1; END; $$ LANGUAGE plpgsql";
        assert_eq!(split(&format!("{f}; SELECT 2;")), vec![f, "SELECT 2"]);

        let g = "CREATE FUNCTION g() RETURNS text AS $fn$ SELECT '$$;'; $$ ; $fn$ LANGUAGE sql";
        assert_eq!(split(&format!("{g};SELECT 3")), vec![g, "SELECT 3"]);

        let h = "DO $body_1$ BEGIN PERFORM 1; END $body_1$";
        assert_eq!(split(&format!("{h};{h}")), vec![h, h]);

        // A different tag does not close the body.
        let k = "SELECT $a$ x; $b$ y; $a$";
        assert_eq!(split(&format!("{k}; SELECT 1")), vec![k, "SELECT 1"]);
    }

    #[test]
    fn positional_parameters_are_not_dollar_quotes() {
        assert_eq!(
            split("PREPARE p AS SELECT $1; EXECUTE p(1); SELECT $2, $3"),
            vec!["PREPARE p AS SELECT $1", "EXECUTE p(1)", "SELECT $2, $3"]
        );
        assert_eq!(
            split("SELECT $1$; SELECT 2"),
            vec!["SELECT $1$", "SELECT 2"]
        );
        // `a$$` continues an identifier in PostgreSQL.
        assert_eq!(
            split("SELECT a$$; SELECT 2"),
            vec!["SELECT a$$", "SELECT 2"]
        );
        assert_eq!(split("SELECT $; SELECT 2"), vec!["SELECT $", "SELECT 2"]);
    }

    #[test]
    fn unterminated_regions_swallow_the_rest() {
        assert_eq!(
            split("SELECT 1; SELECT 'oops; SELECT 2"),
            vec!["SELECT 1", "SELECT 'oops; SELECT 2"]
        );
        assert_eq!(
            split("SELECT 1; SELECT \"x; y"),
            vec!["SELECT 1", "SELECT \"x; y"]
        );
        assert_eq!(
            split("SELECT 1; SELECT `x; y"),
            vec!["SELECT 1", "SELECT `x; y"]
        );
        assert_eq!(split("SELECT 1; /* a; b"), vec!["SELECT 1"]);
        assert_eq!(
            split("SELECT 1; SELECT /* a; b"),
            vec!["SELECT 1", "SELECT /* a; b"]
        );
        assert_eq!(
            split("SELECT 1; DO $x$ a; b"),
            vec!["SELECT 1", "DO $x$ a; b"]
        );
        assert_eq!(split(r"SELECT E'\"), vec![r"SELECT E'\"]);
        assert_eq!(split("SELECT '"), vec!["SELECT '"]);
    }

    #[test]
    fn non_ascii_text_is_never_cut() {
        let sql = "INSERT INTO t VALUES ('héllo; wörld');SELECT '日本;語';SELECT $é$ x;y $é$";
        assert_eq!(
            split(sql),
            vec![
                "INSERT INTO t VALUES ('héllo; wörld')",
                "SELECT '日本;語'",
                "SELECT $é$ x;y $é$"
            ]
        );
    }

    #[test]
    fn unicode_whitespace_is_whitespace_to_the_lexer_as_to_trim() {
        // The statement is trimmed to `$$…$$` before the engine gets it, so the splitter must
        // not take `\u{a0}$$` for one word and cut the body in two.
        let sql = "SELECT 1;\u{a0}$$ a; b $$;\u{2003}E'x\\'; y'";
        let want = vec!["SELECT 1", "$$ a; b $$", "E'x\\'; y'"];
        assert_eq!(split(sql), want);
        assert_eq!(split(&want.join("\n;\n")), want);
        assert_eq!(
            split("SELECT\u{a0}$$ a; b $$"),
            vec!["SELECT\u{a0}$$ a; b $$"]
        );
        // In MySQL `--` then U+0085 is a comment, as the trimmed `--` would be.
        let my = |sql| split_statements_in(sql, Dialect::MySql);
        assert_eq!(
            my("SELECT 1 --\u{85}; x\n; SELECT 2"),
            vec!["SELECT 1 --\u{85}; x", "SELECT 2"]
        );
        assert!(my("--\u{a0};").is_empty());
        // Other non-ASCII text still continues a word.
        assert_eq!(
            split("SELECT é$$; SELECT 2"),
            vec!["SELECT é$$", "SELECT 2"]
        );
    }

    #[test]
    fn mysql_executable_comments_are_statements() {
        assert_eq!(
            split("/*!40101 SET NAMES utf8mb4 */;\n/* plain; */;\nSELECT 1;"),
            vec!["/*!40101 SET NAMES utf8mb4 */", "SELECT 1"]
        );
    }

    #[test]
    fn mysql_dialect() {
        let my = |sql| split_statements_in(sql, Dialect::MySql);
        assert_eq!(
            my(r"INSERT INTO t VALUES ('it\'s; fine', 'a\\'); SELECT 2"),
            vec![r"INSERT INTO t VALUES ('it\'s; fine', 'a\\')", "SELECT 2"]
        );
        assert_eq!(
            my(r#"SELECT "a\"; b"; SELECT 2"#),
            vec![r#"SELECT "a\"; b""#, "SELECT 2"]
        );
        assert_eq!(
            my("SELECT 1 # don't; x\n; SELECT 2"),
            vec!["SELECT 1 # don't; x", "SELECT 2"]
        );
        // `--1` is minus minus one in MySQL, not a comment.
        assert_eq!(my("SELECT 5--1; SELECT 2"), vec!["SELECT 5--1", "SELECT 2"]);
        assert_eq!(
            my("SELECT 5-- 1; x\n; SELECT 2"),
            vec!["SELECT 5-- 1; x", "SELECT 2"]
        );
        assert_eq!(my("SELECT 5--"), vec!["SELECT 5--"]);
        // Not nested: the first `*/` ends the comment.
        assert_eq!(
            my("SELECT /* /* */ 1; SELECT 2"),
            vec!["SELECT /* /* */ 1", "SELECT 2"]
        );
        // No dollar quotes.
        assert_eq!(my("SELECT $$; SELECT $$"), vec!["SELECT $$", "SELECT $$"]);
    }

    #[test]
    fn clickhouse_dialect() {
        let ch = |sql| split_statements_in(sql, Dialect::ClickHouse);
        assert_eq!(
            ch(r"INSERT INTO t VALUES ('it\'s; fine'); SELECT 2"),
            vec![r"INSERT INTO t VALUES ('it\'s; fine')", "SELECT 2"]
        );
        assert_eq!(
            ch("SELECT $h$ a; b $h$; SELECT 2"),
            vec!["SELECT $h$ a; b $h$", "SELECT 2"]
        );
        assert_eq!(
            ch("SELECT 1 # x; SELECT 2"),
            vec!["SELECT 1 # x", "SELECT 2"]
        );
    }

    #[test]
    fn spans_cover_input_with_semicolons() {
        let sql = "a;'b;c';;d";
        let spans = split_spans(sql);
        assert_eq!(spans, vec![0..1, 2..7, 8..8, 9..10]);
        assert_eq!(split_spans(""), vec![0..0]);
        assert_eq!(split_spans(";"), vec![0..0, 1..1]);
    }
}
