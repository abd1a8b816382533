//! Whether a statement may safely run a second time (docs/design.md §9).
//!
//! A resumed run on a non-transactional engine (MySQL DDL, ClickHouse, a no-transaction file)
//! re-executes the statement that was in flight when the previous holder died. That is only safe
//! when running it again neither fails nor changes anything more: `CREATE … IF NOT EXISTS`,
//! `DROP … IF EXISTS`, `CREATE OR REPLACE`, `ALTER TABLE … ADD COLUMN IF NOT EXISTS`, … .
//! Whatever this module does not recognise is non-idempotent on purpose: a wrong "no" costs a
//! human look (NEEDS_REVIEW), a wrong "yes" can apply a change twice.

use super::dialect::Dialect;
use super::lexer::{Lexeme, Lexer, Region, is_ident_byte};
use super::split::split_statements_in;

/// Whether a statement can be re-executed in a resumed run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatementKind {
    /// Running it again neither fails nor changes anything more.
    Idempotent,
    /// Running it again may fail or apply the change twice.
    NonIdempotent,
}

impl StatementKind {
    /// Classifies `sql` with the [`Dialect::Postgres`] lexical rules. Text holding several
    /// statements is idempotent only if every one of them is; text holding none (only
    /// whitespace and comments) is idempotent.
    ///
    /// ```
    /// # use dbwarden_core::migration::StatementKind;
    /// assert_eq!(
    ///     StatementKind::of("ALTER TABLE t ADD COLUMN IF NOT EXISTS c int"),
    ///     StatementKind::Idempotent,
    /// );
    /// assert_eq!(StatementKind::of("ALTER TABLE t ADD COLUMN c int"), StatementKind::NonIdempotent);
    /// ```
    pub fn of(sql: &str) -> Self {
        Self::of_in(sql, Dialect::Postgres)
    }

    /// [`StatementKind::of`] with the lexical rules of `dialect` (where string literals take
    /// backslash escapes, for instance).
    pub fn of_in(sql: &str, dialect: Dialect) -> Self {
        let every_one = split_statements_in(sql, dialect)
            .iter()
            .all(|stmt| statement_is_idempotent(&tokens(stmt, dialect)));
        if every_one {
            StatementKind::Idempotent
        } else {
            StatementKind::NonIdempotent
        }
    }

    /// `true` for [`StatementKind::Idempotent`].
    pub fn is_idempotent(self) -> bool {
        self == StatementKind::Idempotent
    }
}

/// Whether `stmt` may run again in a resumed run: `StatementKind::of(stmt).is_idempotent()`.
pub fn is_idempotent(stmt: &str) -> bool {
    StatementKind::of(stmt).is_idempotent()
}

/// Object words that may stand between `CREATE` and `IF NOT EXISTS`. `CONCURRENTLY` is left out
/// on purpose: a killed `CREATE INDEX CONCURRENTLY` leaves an INVALID index behind, which a
/// re-run with `IF NOT EXISTS` silently keeps.
const CREATE_OBJECTS: &[&str] = &[
    "AGGREGATE",
    "COLLECTION",
    "DATABASE",
    "DICTIONARY",
    "EVENT",
    "EXTENSION",
    "FOREIGN",
    "FULLTEXT",
    "FUNCTION",
    "GLOBAL",
    "INDEX",
    "LIVE",
    "LOCAL",
    "MAPPING",
    "MATERIALIZED",
    "NAMED",
    "POLICY",
    "PROCEDURE",
    "PROFILE",
    "QUOTA",
    "ROLE",
    "ROW",
    "SCHEMA",
    "SEQUENCE",
    "SERVER",
    "SETTINGS",
    "SPATIAL",
    "STATISTICS",
    "TABLE",
    "TEMP",
    "TEMPORARY",
    "TRIGGER",
    "UNIQUE",
    "UNLOGGED",
    "USER",
    "VIEW",
    "VIRTUAL",
    "WINDOW",
];

/// Object words that may stand between `DROP` and `IF EXISTS`.
const DROP_OBJECTS: &[&str] = &[
    "ACCESS",
    "AGGREGATE",
    "CAST",
    "CLASS",
    "COLLATION",
    "COLLECTION",
    "CONCURRENTLY",
    "CONFIGURATION",
    "CONVERSION",
    "DATABASE",
    "DICTIONARY",
    "DOMAIN",
    "EVENT",
    "EXTENSION",
    "FAMILY",
    "FOREIGN",
    "FUNCTION",
    "GROUP",
    "INDEX",
    "LANGUAGE",
    "LIVE",
    "MAPPING",
    "MATERIALIZED",
    "METHOD",
    "NAMED",
    "OPERATOR",
    "PARSER",
    "POLICY",
    "PROCEDURAL",
    "PROCEDURE",
    "PROFILE",
    "PUBLICATION",
    "QUOTA",
    "ROLE",
    "ROUTINE",
    "ROW",
    "RULE",
    "SCHEMA",
    "SEARCH",
    "SEQUENCE",
    "SERVER",
    "SETTINGS",
    "STATISTICS",
    "SUBSCRIPTION",
    "TABLE",
    "TABLESPACE",
    "TEMPLATE",
    "TEMPORARY",
    "TEXT",
    "TRANSFORM",
    "TRIGGER",
    "TYPE",
    "USER",
    "VIEW",
    "WINDOW",
];

/// What an `ALTER TABLE … ADD`/`DROP` clause may name before `IF [NOT] EXISTS`.
const ALTER_OBJECTS: &[&str] = &[
    "COLUMN",
    "CONSTRAINT",
    "FOREIGN",
    "FULLTEXT",
    "INDEX",
    "KEY",
    "PARTITION",
    "PROJECTION",
    "SPATIAL",
    "STATISTICS",
    "UNIQUE",
];

fn statement_is_idempotent(toks: &[Tok]) -> bool {
    let Some(first) = toks.first() else {
        return true; // only comments
    };
    let rest = tail(toks, 1);
    match first.word() {
        // `SELECT … INTO` creates a table (PostgreSQL) or a file (MySQL).
        Some("SELECT") => !toks.iter().any(|t| t.depth == 0 && t.is("INTO")),
        Some("SET") => true,
        // Maintenance that changes no schema and no rows: running it twice is running it once.
        Some("VACUUM" | "ANALYZE" | "ANALYSE" | "PRAGMA") => true,
        // A killed REINDEX … CONCURRENTLY leaves an invalid `_ccnew` index behind.
        Some("REINDEX") => !toks.iter().any(|t| t.is("CONCURRENTLY")),
        Some("COMMENT") => is_kw(rest.first(), "ON"),
        Some("CREATE") => {
            starts_with(rest, &["OR", "REPLACE"])
                || words_then(rest, CREATE_OBJECTS, 4, &["IF", "NOT", "EXISTS"])
        }
        Some("DROP") => words_then(rest, DROP_OBJECTS, 4, &["IF", "EXISTS"]),
        Some("ALTER") => alter_is_idempotent(rest),
        _ => false,
    }
}

/// `ALTER [ONLINE|IGNORE] TABLE …` whose every clause is idempotent, or PostgreSQL's
/// `ALTER TYPE … ADD VALUE IF NOT EXISTS`.
fn alter_is_idempotent(toks: &[Tok]) -> bool {
    let k = toks
        .iter()
        .take_while(|t| t.is("ONLINE") || t.is("IGNORE"))
        .count();
    match toks.get(k).and_then(Tok::word) {
        Some("TABLE") => alter_table_is_idempotent(tail(toks, k + 1)),
        Some("TYPE") => skip_name(tail(toks, k + 1))
            .is_some_and(|t| starts_with(t, &["ADD", "VALUE", "IF", "NOT", "EXISTS"])),
        _ => false,
    }
}

fn alter_table_is_idempotent(toks: &[Tok]) -> bool {
    let mut toks = toks;
    if starts_with(toks, &["IF", "EXISTS"]) {
        toks = tail(toks, 2);
    }
    if is_kw(toks.first(), "ONLY") {
        toks = tail(toks, 1);
    }
    let Some(mut toks) = skip_name(toks) else {
        return false;
    };
    if toks.first().is_some_and(|t| t.token == Token::Punct(b'*')) {
        toks = tail(toks, 1);
    }
    if starts_with(toks, &["ON", "CLUSTER"]) {
        let cluster = toks.get(2).map(|t| &t.token);
        if !matches!(
            cluster,
            Some(Token::Word(_) | Token::QuotedIdent | Token::Literal)
        ) {
            return false;
        }
        toks = tail(toks, 3);
    }
    !toks.is_empty()
        && toks
            .split(|t| t.depth == 0 && t.token == Token::Punct(b','))
            .all(alter_clause_is_idempotent)
}

fn alter_clause_is_idempotent(clause: &[Tok]) -> bool {
    let rest = tail(clause, 1);
    match clause.first().and_then(Tok::word) {
        Some("ADD") => words_then(rest, ALTER_OBJECTS, 2, &["IF", "NOT", "EXISTS"]),
        Some("DROP") => words_then(rest, ALTER_OBJECTS, 2, &["IF", "EXISTS"]),
        // Setting the same comment twice changes nothing (ClickHouse `COMMENT COLUMN`,
        // `MODIFY COMMENT`, MySQL `COMMENT = '…'`).
        Some("COMMENT") => true,
        Some("MODIFY") => is_kw(rest.first(), "COMMENT"),
        // MySQL online-DDL options, not changes.
        Some("ALGORITHM" | "LOCK") => true,
        _ => false,
    }
}

/// After a possibly qualified name (`t`, `db.t`, `"s"."t"`), the tokens that follow it.
fn skip_name(toks: &[Tok]) -> Option<&[Tok]> {
    let is_part = |t: Option<&Tok>| {
        matches!(
            t.map(|t| &t.token),
            Some(Token::Word(_) | Token::QuotedIdent)
        )
    };
    if !is_part(toks.first()) {
        return None;
    }
    let mut k = 1;
    while toks.get(k).is_some_and(|t| t.token == Token::Punct(b'.')) && is_part(toks.get(k + 1)) {
        k += 2;
    }
    Some(tail(toks, k))
}

/// At most `max` words out of `allowed`, then exactly the keywords `then`.
fn words_then(toks: &[Tok], allowed: &[&str], max: usize, then: &[&str]) -> bool {
    let n = toks
        .iter()
        .take(max)
        .take_while(|t| t.word().is_some_and(|w| allowed.contains(&w)))
        .count();
    starts_with(tail(toks, n), then)
}

fn starts_with(toks: &[Tok], keywords: &[&str]) -> bool {
    toks.len() >= keywords.len() && keywords.iter().zip(toks).all(|(k, t)| t.is(k))
}

fn is_kw(tok: Option<&Tok>, keyword: &str) -> bool {
    tok.is_some_and(|t| t.is(keyword))
}

fn tail(toks: &[Tok], from: usize) -> &[Tok] {
    toks.get(from..).unwrap_or_default()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Token {
    /// A bare word, upper-cased: keyword, name or number.
    Word(String),
    /// `"…"` or `` `…` ``: always a name, never a keyword.
    QuotedIdent,
    /// A string or dollar-quoted body: never a keyword.
    Literal,
    Punct(u8),
}

#[derive(Debug, Clone)]
pub(super) struct Tok {
    pub(super) token: Token,
    /// Parenthesis depth the token sits at.
    depth: usize,
    /// Where the token stands in the text (for a token inside a MySQL executable comment:
    /// the whole comment).
    pub(super) span: std::ops::Range<usize>,
}

impl Tok {
    pub(super) fn word(&self) -> Option<&str> {
        match &self.token {
            Token::Word(w) => Some(w),
            _ => None,
        }
    }

    pub(super) fn is(&self, keyword: &str) -> bool {
        self.word() == Some(keyword)
    }
}

/// How deep MySQL executable comments are unwrapped before their text counts as opaque.
const MAX_EXEC_COMMENT_NESTING: usize = 4;

pub(super) fn tokens(sql: &str, dialect: Dialect) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut depth = 0;
    push_tokens(sql, dialect, 0, &mut depth, &mut out);
    out
}

fn push_tokens(sql: &str, dialect: Dialect, nesting: usize, depth: &mut usize, out: &mut Vec<Tok>) {
    let mut word_start = None;
    let mut push = |token: Token, depth: usize, span: std::ops::Range<usize>| {
        out.push(Tok { token, depth, span })
    };
    for (lexeme, range) in Lexer::new(sql, dialect) {
        if matches!(lexeme, Lexeme::Byte(b) if is_ident_byte(b)) {
            word_start.get_or_insert(range.start);
            continue;
        }
        if let Some(start) = word_start.take() {
            let word = sql.get(start..range.start).unwrap_or_default();
            push(
                Token::Word(word.to_ascii_uppercase()),
                *depth,
                start..range.start,
            );
        }
        let span = range.clone();
        match lexeme {
            Lexeme::Byte(b) if b.is_ascii_whitespace() => {}
            Lexeme::Byte(b'(') => {
                push(Token::Punct(b'('), *depth, span);
                *depth += 1;
            }
            Lexeme::Byte(b')') => {
                *depth = depth.saturating_sub(1);
                push(Token::Punct(b')'), *depth, span);
            }
            Lexeme::Byte(b) => push(Token::Punct(b), *depth, span),
            Lexeme::Region(Region::Comment) => {}
            // MySQL runs the text of `/*!40101 SET NAMES utf8 */`, so classify that text.
            Lexeme::Region(Region::ExecComment) if nesting < MAX_EXEC_COMMENT_NESTING => {
                let text = sql.get(range).unwrap_or_default();
                let inner = text.strip_prefix("/*M!").unwrap_or(text);
                let inner = inner.strip_prefix("/*!").unwrap_or(inner);
                let inner = inner.trim_start_matches(|c: char| c.is_ascii_digit());
                let inner = inner.strip_suffix("*/").unwrap_or(inner);
                let mut nested = Vec::new();
                push_tokens(inner, dialect, nesting + 1, depth, &mut nested);
                for tok in nested {
                    push(tok.token, tok.depth, span.clone());
                }
            }
            Lexeme::Region(Region::ExecComment | Region::Literal) => {
                push(Token::Literal, *depth, span)
            }
            Lexeme::Region(Region::QuotedIdent) => push(Token::QuotedIdent, *depth, span),
        }
    }
    if let Some(start) = word_start {
        let word = sql.get(start..).unwrap_or_default();
        push(
            Token::Word(word.to_ascii_uppercase()),
            *depth,
            start..sql.len(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yes(sql: &str) {
        assert!(is_idempotent(sql), "expected idempotent: {sql}");
    }

    fn no(sql: &str) {
        assert!(!is_idempotent(sql), "expected NOT idempotent: {sql}");
    }

    #[test]
    fn create_if_not_exists() {
        yes("CREATE TABLE IF NOT EXISTS t (id int)");
        yes("create table if not exists t (id int)");
        yes("CREATE TEMPORARY TABLE IF NOT EXISTS t (id int)");
        yes("CREATE UNLOGGED TABLE IF NOT EXISTS t (id int)");
        yes("CREATE INDEX IF NOT EXISTS i ON t (c)");
        yes("CREATE UNIQUE INDEX IF NOT EXISTS i ON t (c)");
        yes("CREATE DATABASE IF NOT EXISTS d");
        yes("CREATE SCHEMA IF NOT EXISTS s");
        yes("CREATE VIEW IF NOT EXISTS v AS SELECT 1");
        yes("CREATE MATERIALIZED VIEW IF NOT EXISTS v AS SELECT 1");
        yes("CREATE EXTENSION IF NOT EXISTS pgcrypto");
        yes("CREATE SEQUENCE IF NOT EXISTS s");
        yes("CREATE TABLE IF NOT EXISTS db.t ON CLUSTER c (x UInt8) ENGINE = MergeTree ORDER BY x");
        yes("CREATE TABLE IF NOT EXISTS t AS SELECT * FROM u");
    }

    #[test]
    fn maintenance_is_idempotent() {
        yes("VACUUM");
        yes("VACUUM (ANALYZE) t");
        yes("ANALYZE t");
        yes("PRAGMA foreign_keys = OFF");
        yes("REINDEX TABLE t");
        no("REINDEX TABLE CONCURRENTLY t");
    }

    #[test]
    fn create_or_replace() {
        yes("CREATE OR REPLACE VIEW v AS SELECT 1");
        yes("CREATE OR REPLACE FUNCTION f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql");
        yes("create or replace table t (x int)");
    }

    #[test]
    fn plain_create_is_not_idempotent() {
        no("CREATE TABLE t (id int)");
        no("CREATE INDEX i ON t (c)");
        no("CREATE VIEW v AS SELECT 1");
        no("CREATE TABLE t AS SELECT * FROM u WHERE NOT EXISTS (SELECT 1)");
        no("CREATE TABLE t (note text DEFAULT 'IF NOT EXISTS')");
        no("CREATE TABLE \"IF\" (x int)");
    }

    #[test]
    fn if_not_exists_inside_a_body_does_not_count() {
        no(
            "CREATE PROCEDURE p() BEGIN IF NOT EXISTS (SELECT 1 FROM t) THEN INSERT INTO t VALUES (1); END IF; END",
        );
        no(
            "CREATE TRIGGER trg BEFORE INSERT ON t FOR EACH ROW IF NOT EXISTS (SELECT 1) THEN SET x = 1; END IF",
        );
        no(
            "CREATE FUNCTION f() RETURNS void AS $$ CREATE TABLE IF NOT EXISTS t (x int) $$ LANGUAGE sql",
        );
    }

    #[test]
    fn create_index_concurrently_is_not_idempotent() {
        // A killed CREATE INDEX CONCURRENTLY leaves an INVALID index that IF NOT EXISTS keeps.
        no("CREATE INDEX CONCURRENTLY IF NOT EXISTS i ON t (c)");
        no("CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS i ON t (c)");
    }

    #[test]
    fn drop_if_exists() {
        yes("DROP TABLE IF EXISTS t");
        yes("DROP TABLE IF EXISTS a, b CASCADE");
        yes("DROP INDEX IF EXISTS i");
        yes("DROP INDEX CONCURRENTLY IF EXISTS i");
        yes("DROP VIEW IF EXISTS v");
        yes("DROP MATERIALIZED VIEW IF EXISTS v");
        yes("DROP DATABASE IF EXISTS d");
        yes("DROP SCHEMA IF EXISTS s CASCADE");
        yes("DROP FUNCTION IF EXISTS f(int)");
        yes("DROP TEXT SEARCH CONFIGURATION IF EXISTS c");
        yes("DROP TABLE IF EXISTS db.t ON CLUSTER c SYNC");
        yes("DROP TEMPORARY TABLE IF EXISTS t");
        no("DROP TABLE t");
        no("DROP INDEX i ON t");
        no("DROP TABLE t IF EXISTS");
    }

    #[test]
    fn alter_table_clauses() {
        yes("ALTER TABLE t ADD COLUMN IF NOT EXISTS c int");
        yes("ALTER TABLE t ADD IF NOT EXISTS c int");
        yes("ALTER TABLE t DROP COLUMN IF EXISTS c");
        yes("ALTER TABLE t DROP IF EXISTS c");
        yes("ALTER TABLE IF EXISTS ONLY public.t ADD COLUMN IF NOT EXISTS c int DEFAULT 0");
        yes(
            "ALTER TABLE \"s\".\"t\" ADD COLUMN IF NOT EXISTS c numeric(10, 2), DROP COLUMN IF EXISTS d",
        );
        yes(
            "ALTER TABLE db.t ON CLUSTER c ADD COLUMN IF NOT EXISTS x UInt8 AFTER y, DROP COLUMN IF EXISTS z",
        );
        yes("ALTER TABLE t ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS x UInt8");
        yes("ALTER TABLE t ADD INDEX IF NOT EXISTS i (c)");
        yes("ALTER TABLE t DROP INDEX IF EXISTS i");
        yes("ALTER TABLE t ADD UNIQUE KEY IF NOT EXISTS k (c)");
        yes("ALTER TABLE t DROP CONSTRAINT IF EXISTS c");
        yes("ALTER TABLE t ADD COLUMN IF NOT EXISTS c int, ALGORITHM=INPLACE, LOCK=NONE");
        yes("ALTER TABLE t COMMENT COLUMN IF EXISTS c 'hello'");
        yes("ALTER TABLE t MODIFY COMMENT 'hello'");
        yes("ALTER ONLINE TABLE t ADD COLUMN IF NOT EXISTS c int");
        yes("ALTER TABLE t ADD COLUMN IF NOT EXISTS (a int, b int)");
    }

    #[test]
    fn alter_table_with_any_unsafe_clause_is_not_idempotent() {
        no("ALTER TABLE t ADD COLUMN c int");
        no("ALTER TABLE t DROP COLUMN c");
        no("ALTER TABLE t ADD COLUMN IF NOT EXISTS c int, ADD COLUMN d int");
        no("ALTER TABLE t DROP COLUMN IF EXISTS c, RENAME COLUMN a TO b");
        no("ALTER TABLE t RENAME TO u");
        no("ALTER TABLE t MODIFY COLUMN c String");
        no("ALTER TABLE t ALTER COLUMN c TYPE bigint");
        no("ALTER TABLE t ADD CONSTRAINT c CHECK (x > 0)");
        no("ALTER TABLE t UPDATE x = 1 WHERE 1");
        no("ALTER TABLE t DELETE WHERE x = 1");
        no("ALTER TABLE t ADD COLUMN c text DEFAULT 'IF NOT EXISTS'");
        no("ALTER TABLE t");
        no("ALTER TABLE");
        no("ALTER TABLE t ON CLUSTER");
        no("ALTER INDEX i RENAME TO j");
    }

    #[test]
    fn alter_type_add_value_if_not_exists() {
        yes("ALTER TYPE mood ADD VALUE IF NOT EXISTS 'happy'");
        yes("ALTER TYPE public.mood ADD VALUE IF NOT EXISTS 'happy' BEFORE 'sad'");
        no("ALTER TYPE mood ADD VALUE 'happy'");
        no("ALTER TYPE mood RENAME TO feeling");
    }

    #[test]
    fn comment_set_select_and_comment_only() {
        yes("COMMENT ON TABLE t IS 'users; all of them'");
        yes("COMMENT ON COLUMN t.c IS NULL");
        yes("SET lock_timeout = '5s'");
        yes("SET NAMES utf8mb4");
        yes("SELECT 1");
        yes("select count(*) from t where x in (select y into z from u)");
        yes("-- nothing to do");
        yes("/* nothing; to do */");
        yes("");
        yes("   \n");
        no("SELECT * INTO new_table FROM t");
        no("COMMENT t");
    }

    #[test]
    fn data_changes_and_others_are_not_idempotent() {
        no("INSERT INTO t VALUES (1)");
        no("INSERT INTO t VALUES ('IF NOT EXISTS')");
        no("INSERT INTO t SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM t)");
        no("UPDATE t SET x = 1");
        no("DELETE FROM t");
        no("TRUNCATE TABLE t");
        no("RENAME TABLE a TO b");
        no("GRANT SELECT ON t TO u");
        no("WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x");
        no("OPTIMIZE TABLE t FINAL");
        no("(SELECT 1)");
        no("'CREATE TABLE IF NOT EXISTS t'");
        no("\"DROP\" TABLE IF EXISTS t");
    }

    #[test]
    fn comments_and_whitespace_are_tolerated() {
        yes("-- add the column\n/* safe to repeat */\n  DROP\n\tTABLE /* x */ IF -- y\n EXISTS t");
        yes("CREATE/**/TABLE/**/IF/**/NOT/**/EXISTS/**/t(x int)");
        no("-- CREATE TABLE IF NOT EXISTS t\nCREATE TABLE t (x int)");
        no("/* DROP TABLE IF EXISTS t; */ DROP TABLE t");
    }

    #[test]
    fn keywords_are_whole_words() {
        no("CREATEX TABLE IF NOT EXISTS t (x int)");
        no("CREATE TABLEX IF NOT EXISTS t (x int)");
        no("DROP TABLE IFX EXISTS t");
        no("DROP TABLE IF EXISTSX t");
        no("SETTINGS x = 1");
        no("SELECTED 1");
    }

    #[test]
    fn several_statements_must_all_be_idempotent() {
        yes("DROP TABLE IF EXISTS a; CREATE TABLE IF NOT EXISTS a (x int);");
        no("DROP TABLE IF EXISTS a; CREATE TABLE a (x int);");
    }

    #[test]
    fn mysql_executable_comments_are_classified_by_their_text() {
        yes("/*!40101 SET NAMES utf8mb4 */");
        yes("/*!40014 SET @OLD_FOREIGN_KEY_CHECKS=@@FOREIGN_KEY_CHECKS, FOREIGN_KEY_CHECKS=0 */");
        no("/*!50001 CREATE ALGORITHM=UNDEFINED */ /*!50001 VIEW v AS select 1 */");
        yes("/*!50001 DROP VIEW IF EXISTS v */");
        no("/*! /*! /*! /*! /*! /*! CREATE TABLE t (x int)");
    }

    #[test]
    fn dialects_change_how_literals_end() {
        let sql = r"ALTER TABLE t ADD COLUMN IF NOT EXISTS c String DEFAULT 'a\', DROP COLUMN x'";
        // ClickHouse: one literal, one clause.
        assert_eq!(
            StatementKind::of_in(sql, Dialect::ClickHouse),
            StatementKind::Idempotent
        );
        // Standard SQL: the literal ends at `\'`, exposing a second, unsafe clause.
        assert_eq!(StatementKind::of(sql), StatementKind::NonIdempotent);
    }

    #[test]
    fn never_panics_on_odd_input() {
        for sql in [
            "(",
            ")))",
            "ALTER",
            "ALTER TABLE .",
            "ALTER TABLE t.",
            "ALTER TABLE t *",
            "CREATE",
            "CREATE OR",
            "DROP IF",
            "'",
            "$$",
            "/*!",
            "/*!*/",
            "é",
            "ALTER TYPE",
            "\u{feff}",
        ] {
            let _ = StatementKind::of(sql);
            let _ = StatementKind::of_in(sql, Dialect::MySql);
        }
    }
}
