//! How a migration runs: in one transaction with its history row, or statement by statement
//! with the journal — and why (docs/migrations.md, "How each file runs").
//!
//! A file runs in one transaction where the engine's DDL is transactional (PostgreSQL, SQLite)
//! unless one of these says otherwise, first match wins:
//!
//! 1. its first line is `-- dbwarden:no-transaction` or sqlx's `-- no-transaction`;
//! 2. one of its statements cannot run inside a transaction block (`CREATE INDEX
//!    CONCURRENTLY`, `VACUUM`, `CREATE DATABASE`, `ALTER SYSTEM`, SQLite's `PRAGMA
//!    foreign_keys`, …): golang-migrate folders rely on this, since that tool never wraps;
//! 3. it opens and commits its own transaction (`BEGIN; … COMMIT;`): it runs as written, and
//!    the journal entries of the statements inside that transaction commit with it.
//!
//! MySQL commits DDL on its own and ClickHouse has no transactions: there every file is
//! journaled statement by statement.

use std::fmt;
use std::ops::Range;

use super::dialect::Dialect;
use super::lexer::{Lexeme, Lexer, Region, is_ident_byte};

/// How a migration runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Every statement and the history row in one transaction: all or nothing.
    Transaction,
    /// Statement by statement (or in batches that commit with their journal entry), each
    /// recorded in `statements_done`, so a crash leaves a known place to resume from.
    Journaled(Why),
}

impl Mode {
    /// [`Mode::Transaction`].
    pub fn is_transaction(&self) -> bool {
        *self == Mode::Transaction
    }

    /// `transaction` or `no-transaction`, as `migrate --dry-run` prints it.
    pub fn label(&self) -> &'static str {
        match self {
            Mode::Transaction => "transaction",
            Mode::Journaled(_) => "no-transaction",
        }
    }

    /// One line saying why the file runs this way.
    pub fn reason(&self) -> String {
        match self {
            Mode::Transaction => {
                "the whole file commits with its history row, or nothing does".into()
            }
            Mode::Journaled(why) => why.to_string(),
        }
    }
}

/// Why a migration is journaled rather than run in one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// The first line is this directive.
    Directive(&'static str),
    /// Statement `statement` (1-based) is refused inside a transaction block.
    RefusesTransaction {
        statement: usize,
        what: &'static str,
    },
    /// Statement `statement` (1-based) opens the file's own transaction.
    OwnTransaction { statement: usize },
    /// The engine commits DDL on its own (MySQL) or has no transactions (ClickHouse).
    Engine(Dialect),
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::Directive(d) => write!(f, "its first line is `{d}`"),
            Why::RefusesTransaction { statement, what } => write!(
                f,
                "statement {statement} ({what}) cannot run inside a transaction block"
            ),
            Why::OwnTransaction { statement } => write!(
                f,
                "statement {statement} opens the file's own transaction; the file runs as written"
            ),
            Why::Engine(Dialect::ClickHouse) => {
                f.write_str("ClickHouse has no transactions: every statement is journaled")
            }
            Why::Engine(d) => write!(
                f,
                "{} commits DDL on its own: every statement is journaled",
                d.name()
            ),
        }
    }
}

/// A transaction-control statement at the top level of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxControl {
    /// `BEGIN`, `START TRANSACTION`.
    Begin,
    /// `COMMIT`, `END` (PostgreSQL, SQLite).
    Commit,
    /// `ROLLBACK`, `ABORT` (not `ROLLBACK TO SAVEPOINT`).
    Rollback,
}

/// What the runner needs to know about one statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// Where it is in the migration's text.
    pub span: Range<usize>,
    /// It opens or ends a transaction.
    pub control: Option<TxControl>,
    /// The server refuses it inside a transaction block (what it is).
    pub refuses_transaction: Option<&'static str>,
    /// It may share a batch with its neighbours: a batch runs inside one transaction together
    /// with its journal entry (PostgreSQL and SQLite: anything that may run in a transaction;
    /// MySQL: data changes only, since DDL commits on its own; ClickHouse: nothing).
    pub batchable: bool,
    /// It runs inside a transaction the file itself opened (after the file's `BEGIN`, up to and
    /// including the `COMMIT` or `ROLLBACK` that ends it). Set by [`mark_own_transactions`].
    pub inside_own_transaction: bool,
}

impl Statement {
    /// Classifies `sql[span]` for `dialect`.
    pub fn new(sql: &str, span: Range<usize>, dialect: Dialect) -> Self {
        let text = sql.get(span.clone()).unwrap_or_default();
        // Most statements of a big file are data changes: one word tells.
        let mut words = head_words(text, dialect, 1);
        if !words.first().is_some_and(|w| {
            matches!(
                w.as_str(),
                "INSERT" | "UPDATE" | "DELETE" | "REPLACE" | "SELECT" | "WITH" | "SET"
            )
        }) {
            words = head_words(text, dialect, 6);
        }
        let w = |i: usize| words.get(i).map_or("", String::as_str);
        let control = tx_control(&words, dialect);
        let refuses_transaction = refuses_transaction(text, &words, dialect);
        let batchable = control.is_none()
            && refuses_transaction.is_none()
            && match dialect {
                // A procedure or DO block may commit on its own (PostgreSQL 11+).
                Dialect::Postgres => !matches!(w(0), "CALL" | "DO"),
                Dialect::Sqlite => true,
                // Data changes only, and one statement: a piece between two `DELIMITER`
                // delimiters may hold several, DDL among them.
                Dialect::MySql => {
                    matches!(w(0), "INSERT" | "UPDATE" | "DELETE" | "REPLACE")
                        && !(text.contains(';')
                            && super::split::statement_spans(text, dialect).len() > 1)
                }
                Dialect::ClickHouse => false,
            };
        Statement {
            span,
            control,
            refuses_transaction,
            batchable,
            inside_own_transaction: false,
        }
    }
}

/// Sets [`Statement::inside_own_transaction`] from the file's `BEGIN`/`COMMIT`/`ROLLBACK`s.
pub fn mark_own_transactions(statements: &mut [Statement]) {
    let mut open = false;
    for s in statements {
        s.inside_own_transaction = open;
        match s.control {
            Some(TxControl::Begin) => open = true,
            Some(TxControl::Commit | TxControl::Rollback) => open = false,
            None => {}
        }
    }
}

/// Decides the mode of a file with these statements. `Err` names the statement (1-based) that
/// opens a transaction the file never ends: running it would leave the journal inside an
/// open transaction that the release rolls back.
pub fn decide(
    dialect: Dialect,
    directive: Option<&'static str>,
    statements: &[Statement],
) -> Result<Mode, usize> {
    if let Some(open) = unclosed_transaction(statements) {
        return Err(open + 1);
    }
    if !dialect.transactional_ddl() {
        return Ok(Mode::Journaled(Why::Engine(dialect)));
    }
    if let Some(d) = directive {
        return Ok(Mode::Journaled(Why::Directive(d)));
    }
    if let Some((i, what)) = statements
        .iter()
        .enumerate()
        .find_map(|(i, s)| s.refuses_transaction.map(|w| (i, w)))
    {
        return Ok(Mode::Journaled(Why::RefusesTransaction {
            statement: i + 1,
            what,
        }));
    }
    if let Some(i) = statements.iter().position(|s| s.control.is_some()) {
        return Ok(Mode::Journaled(Why::OwnTransaction { statement: i + 1 }));
    }
    Ok(Mode::Transaction)
}

/// The index of a `BEGIN` the file never commits or rolls back.
fn unclosed_transaction(statements: &[Statement]) -> Option<usize> {
    let mut open = None;
    for (i, s) in statements.iter().enumerate() {
        match s.control {
            Some(TxControl::Begin) => {
                open.get_or_insert(i);
            }
            Some(TxControl::Commit | TxControl::Rollback) => open = None,
            None => {}
        }
    }
    open
}

/// Up to `max` bare words at the head of `stmt`, upper-cased, outside parentheses; a quoted
/// name or literal counts as the word `"` or `'`. Stops early, so a 5 MB `INSERT` costs
/// nothing.
pub fn head_words(stmt: &str, dialect: Dialect, max: usize) -> Vec<String> {
    let mut words = Vec::new();
    let mut word_start = None;
    let mut depth = 0usize;
    for (lexeme, range) in Lexer::new(stmt, dialect) {
        if words.len() >= max {
            return words;
        }
        if let Lexeme::Byte(b) = lexeme
            && is_ident_byte(b)
        {
            word_start.get_or_insert(range.start);
            continue;
        }
        if let Some(start) = word_start.take()
            && depth == 0
        {
            words.push(
                stmt.get(start..range.start)
                    .unwrap_or("")
                    .to_ascii_uppercase(),
            );
        }
        match lexeme {
            Lexeme::Byte(b'(') => depth += 1,
            Lexeme::Byte(b')') => depth = depth.saturating_sub(1),
            Lexeme::Region(Region::QuotedIdent) if depth == 0 => words.push("\"".into()),
            Lexeme::Region(Region::Literal | Region::ExecComment) if depth == 0 => {
                words.push("'".into());
            }
            _ => {}
        }
    }
    if let Some(start) = word_start
        && depth == 0
        && words.len() < max
    {
        words.push(stmt.get(start..).unwrap_or("").to_ascii_uppercase());
    }
    words
}

fn tx_control(words: &[String], dialect: Dialect) -> Option<TxControl> {
    let w = |i: usize| words.get(i).map_or("", String::as_str);
    match (w(0), dialect) {
        (_, Dialect::ClickHouse) => None,
        // MariaDB's `BEGIN NOT ATOMIC … END` is a compound statement, not a transaction.
        ("BEGIN", Dialect::MySql) if w(1) == "NOT" => None,
        ("BEGIN", _) => Some(TxControl::Begin),
        ("START", _) if w(1) == "TRANSACTION" => Some(TxControl::Begin),
        ("COMMIT", _) if w(1) != "PREPARED" => Some(TxControl::Commit),
        ("END", Dialect::Postgres | Dialect::Sqlite) => Some(TxControl::Commit),
        ("ROLLBACK" | "ABORT", _) => {
            let to = (1..=2).any(|i| w(i) == "TO") || w(1) == "PREPARED";
            (!to).then_some(TxControl::Rollback)
        }
        _ => None,
    }
}

/// What the statement is, when the server refuses it inside a transaction block.
fn refuses_transaction(stmt: &str, words: &[String], dialect: Dialect) -> Option<&'static str> {
    let w = |i: usize| words.get(i).map_or("", String::as_str);
    match dialect {
        Dialect::Postgres => match w(0) {
            "CREATE" => {
                let k = usize::from(w(1) == "UNIQUE");
                match (w(1 + k), w(2 + k)) {
                    ("INDEX", "CONCURRENTLY") => Some("CREATE INDEX CONCURRENTLY"),
                    ("DATABASE", _) if k == 0 => Some("CREATE DATABASE"),
                    ("TABLESPACE", _) if k == 0 => Some("CREATE TABLESPACE"),
                    ("SUBSCRIPTION", _) if k == 0 => Some("CREATE SUBSCRIPTION"),
                    _ => None,
                }
            }
            "DROP" => match (w(1), w(2)) {
                ("INDEX", "CONCURRENTLY") => Some("DROP INDEX CONCURRENTLY"),
                ("DATABASE", _) => Some("DROP DATABASE"),
                ("TABLESPACE", _) => Some("DROP TABLESPACE"),
                ("SUBSCRIPTION", _) => Some("DROP SUBSCRIPTION"),
                _ => None,
            },
            "REINDEX" => {
                if words.iter().skip(1).take(3).any(|w| w == "CONCURRENTLY") {
                    Some("REINDEX CONCURRENTLY")
                } else if matches!(w(1), "DATABASE" | "SYSTEM") {
                    Some("REINDEX DATABASE/SYSTEM")
                } else {
                    None
                }
            }
            "VACUUM" => Some("VACUUM"),
            "ALTER" => match w(1) {
                "SYSTEM" => Some("ALTER SYSTEM"),
                "DATABASE"
                    if words
                        .windows(2)
                        .any(|p| p[0] == "SET" && p[1] == "TABLESPACE") =>
                {
                    Some("ALTER DATABASE … SET TABLESPACE")
                }
                "SUBSCRIPTION" if words.iter().any(|w| w == "REFRESH") => {
                    Some("ALTER SUBSCRIPTION … REFRESH PUBLICATION")
                }
                "TABLE" if detaches_concurrently(stmt) => {
                    Some("ALTER TABLE … DETACH PARTITION … CONCURRENTLY")
                }
                _ => None,
            },
            "CLUSTER" if words.len() == 1 || (words.len() == 2 && w(1) == "VERBOSE") => {
                Some("CLUSTER without a table")
            }
            "DISCARD" if w(1) == "ALL" => Some("DISCARD ALL"),
            _ => None,
        },
        Dialect::Sqlite => match (w(0), w(1)) {
            ("VACUUM", _) => Some("VACUUM"),
            ("ATTACH", _) => Some("ATTACH DATABASE"),
            ("DETACH", _) => Some("DETACH DATABASE"),
            // Inside a transaction these are silently ignored (foreign_keys) or refused
            // (journal_mode = WAL): the file meant them to take effect.
            ("PRAGMA", _) if pragma_names(words, "FOREIGN_KEYS") => Some("PRAGMA foreign_keys"),
            ("PRAGMA", _) if pragma_names(words, "JOURNAL_MODE") => Some("PRAGMA journal_mode"),
            _ => None,
        },
        Dialect::MySql | Dialect::ClickHouse => None,
    }
}

/// `PRAGMA foreign_keys` or `PRAGMA main.foreign_keys` (the schema is a word of its own).
fn pragma_names(words: &[String], name: &str) -> bool {
    words.iter().skip(1).take(2).any(|w| w == name)
}

fn detaches_concurrently(stmt: &str) -> bool {
    let words = head_words(stmt, Dialect::Postgres, 64);
    words
        .windows(2)
        .position(|p| p[0] == "DETACH" && p[1] == "PARTITION")
        .is_some_and(|at| words.iter().skip(at + 2).any(|w| w == "CONCURRENTLY"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::split::statement_spans;

    fn statements(sql: &str, dialect: Dialect) -> Vec<Statement> {
        let mut s: Vec<Statement> = statement_spans(sql, dialect)
            .into_iter()
            .map(|span| Statement::new(sql, span, dialect))
            .collect();
        mark_own_transactions(&mut s);
        s
    }

    fn mode(sql: &str, dialect: Dialect) -> Result<Mode, usize> {
        decide(dialect, None, &statements(sql, dialect))
    }

    #[test]
    fn plain_files_run_in_one_transaction_where_ddl_is_transactional() {
        let sql = "CREATE TABLE a (id int); INSERT INTO a VALUES (1);";
        assert_eq!(mode(sql, Dialect::Postgres), Ok(Mode::Transaction));
        assert_eq!(mode(sql, Dialect::Sqlite), Ok(Mode::Transaction));
        assert_eq!(
            mode(sql, Dialect::MySql),
            Ok(Mode::Journaled(Why::Engine(Dialect::MySql)))
        );
        assert_eq!(
            mode(sql, Dialect::ClickHouse),
            Ok(Mode::Journaled(Why::Engine(Dialect::ClickHouse)))
        );
    }

    #[test]
    fn statements_refused_in_a_transaction_block_choose_the_journal() {
        for (sql, what) in [
            (
                "CREATE INDEX CONCURRENTLY i ON t (c)",
                "CREATE INDEX CONCURRENTLY",
            ),
            (
                "create unique index concurrently if not exists i on t (c)",
                "CREATE INDEX CONCURRENTLY",
            ),
            (
                "DROP INDEX CONCURRENTLY IF EXISTS i",
                "DROP INDEX CONCURRENTLY",
            ),
            ("REINDEX INDEX CONCURRENTLY i", "REINDEX CONCURRENTLY"),
            (
                "REINDEX (VERBOSE) TABLE CONCURRENTLY t",
                "REINDEX CONCURRENTLY",
            ),
            ("VACUUM ANALYZE t", "VACUUM"),
            ("CREATE DATABASE d", "CREATE DATABASE"),
            ("ALTER SYSTEM SET work_mem = '8MB'", "ALTER SYSTEM"),
            (
                "ALTER TABLE p DETACH PARTITION p1 CONCURRENTLY",
                "ALTER TABLE … DETACH PARTITION … CONCURRENTLY",
            ),
        ] {
            let file = format!("CREATE TABLE t (c int);\n{sql};\nSELECT 1;");
            assert_eq!(
                mode(&file, Dialect::Postgres),
                Ok(Mode::Journaled(Why::RefusesTransaction {
                    statement: 2,
                    what
                })),
                "{sql}"
            );
        }
        for sql in [
            "CREATE INDEX i ON t (c)",
            "ALTER DATABASE d SET work_mem = '8MB'",
            "CLUSTER t USING i",
            "-- CREATE INDEX CONCURRENTLY i ON t (c)\nSELECT 1",
            "SELECT 'VACUUM'",
        ] {
            assert_eq!(mode(sql, Dialect::Postgres), Ok(Mode::Transaction), "{sql}");
        }
        for (sql, what) in [
            ("VACUUM", "VACUUM"),
            ("PRAGMA foreign_keys = OFF", "PRAGMA foreign_keys"),
            ("pragma journal_mode=wal", "PRAGMA journal_mode"),
            ("ATTACH DATABASE 'x.db' AS x", "ATTACH DATABASE"),
        ] {
            assert_eq!(
                mode(sql, Dialect::Sqlite),
                Ok(Mode::Journaled(Why::RefusesTransaction {
                    statement: 1,
                    what
                })),
                "{sql}"
            );
        }
        assert_eq!(
            mode("PRAGMA user_version = 3", Dialect::Sqlite),
            Ok(Mode::Transaction)
        );
    }

    #[test]
    fn files_with_their_own_transaction_run_as_written() {
        let sql = "BEGIN;\nCREATE TABLE a (id int);\nCOMMIT;\nCREATE TABLE b (id int);";
        assert_eq!(
            mode(sql, Dialect::Postgres),
            Ok(Mode::Journaled(Why::OwnTransaction { statement: 1 }))
        );
        let s = statements(sql, Dialect::Postgres);
        assert_eq!(
            s.iter().map(|s| s.control).collect::<Vec<_>>(),
            vec![Some(TxControl::Begin), None, Some(TxControl::Commit), None]
        );
        let lite = "PRAGMA foreign_keys=off;\nBEGIN TRANSACTION;\nCREATE TABLE n (id int);\nEND TRANSACTION;";
        assert_eq!(
            mode(lite, Dialect::Sqlite),
            Ok(Mode::Journaled(Why::RefusesTransaction {
                statement: 1,
                what: "PRAGMA foreign_keys"
            }))
        );
        // `ROLLBACK TO SAVEPOINT` keeps the transaction open; a COMMIT in a body is no control.
        let s = statements(
            "START TRANSACTION; SAVEPOINT a; ROLLBACK TO SAVEPOINT a; COMMIT",
            Dialect::MySql,
        );
        assert_eq!(
            s.iter().map(|s| s.control).collect::<Vec<_>>(),
            vec![Some(TxControl::Begin), None, None, Some(TxControl::Commit)]
        );
        let f = "CREATE FUNCTION f() RETURNS void AS $$ BEGIN COMMIT; END $$ LANGUAGE plpgsql";
        assert_eq!(mode(f, Dialect::Postgres), Ok(Mode::Transaction));
        assert_eq!(
            statements("BEGIN NOT ATOMIC SELECT 1; END", Dialect::MySql)[0].control,
            None
        );
    }

    #[test]
    fn a_transaction_the_file_never_ends_is_refused() {
        assert_eq!(
            mode(
                "SELECT 1;\nBEGIN;\nCREATE TABLE a (id int);",
                Dialect::Postgres
            ),
            Err(2)
        );
        assert_eq!(
            mode(
                "START TRANSACTION; INSERT INTO t VALUES (1);",
                Dialect::MySql
            ),
            Err(1)
        );
        assert!(
            mode(
                "BEGIN; SELECT 1; ROLLBACK; BEGIN; SELECT 2; END;",
                Dialect::Sqlite
            )
            .is_ok()
        );
    }

    #[test]
    fn directive_wins_over_detection() {
        let s = statements("CREATE TABLE a (id int)", Dialect::Postgres);
        assert_eq!(
            decide(Dialect::Postgres, Some("-- no-transaction"), &s),
            Ok(Mode::Journaled(Why::Directive("-- no-transaction")))
        );
        assert_eq!(
            decide(Dialect::MySql, Some("-- no-transaction"), &s),
            Ok(Mode::Journaled(Why::Engine(Dialect::MySql)))
        );
    }

    #[test]
    fn batchable_statements() {
        let my = statements(
            "INSERT INTO t VALUES (1); update t set a = 1; CREATE TABLE x (id int); DELETE FROM t; BEGIN; REPLACE INTO t VALUES (2); COMMIT",
            Dialect::MySql,
        );
        assert_eq!(
            my.iter().map(|s| s.batchable).collect::<Vec<_>>(),
            vec![true, true, false, true, false, true, false]
        );
        let pg = statements(
            "CREATE TABLE x (id int); CREATE INDEX CONCURRENTLY i ON x (id); BEGIN",
            Dialect::Postgres,
        );
        assert_eq!(
            pg.iter().map(|s| s.batchable).collect::<Vec<_>>(),
            vec![true, false, false]
        );
        assert!(!statements("INSERT INTO t VALUES (1)", Dialect::ClickHouse)[0].batchable);
    }

    #[test]
    fn every_reason_is_one_line() {
        for why in [
            Why::Directive("-- no-transaction"),
            Why::RefusesTransaction {
                statement: 3,
                what: "VACUUM",
            },
            Why::OwnTransaction { statement: 1 },
            Why::Engine(Dialect::MySql),
            Why::Engine(Dialect::ClickHouse),
        ] {
            let line = Mode::Journaled(why).reason();
            assert!(!line.contains('\n') && !line.is_empty(), "{line}");
        }
    }
}
