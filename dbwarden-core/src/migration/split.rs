//! Cutting a migration file into statements, dialect by dialect.
//!
//! A plain `split(';')` breaks on the first `;` inside a string, a comment, a function body or
//! a trigger, and the engine then runs half a statement. The cut here follows what each
//! server's own client does:
//!
//! - **PostgreSQL** (as `psql`): no cut inside parentheses (a rule's `DO ALSO (…; …)`), nor
//!   inside the `BEGIN ATOMIC … END` body of `CREATE [OR REPLACE] FUNCTION|PROCEDURE`
//!   (`CASE … END` counted inside it); `$tag$` bodies, `E''` strings and nested comments are
//!   regions of their own.
//! - **SQLite** (as `sqlite3_complete`, which the `sqlite3` shell uses): inside
//!   `CREATE [TEMP] TRIGGER` a statement ends only at `; END ;`, so a body's `CASE … END`
//!   never ends it.
//! - **MySQL / MariaDB** (as the server parses a stored program): inside
//!   `CREATE … PROCEDURE|FUNCTION|TRIGGER|EVENT`, MariaDB's `BEGIN NOT ATOMIC` and its
//!   compound statements outside programs, `;` ends the statement only once every
//!   `BEGIN`, `IF`, `CASE`, `LOOP`, `WHILE`, `REPEAT` and `FOR` is closed by its `END …`
//!   (labels and `DECLARE … HANDLER` bodies included). The `mysql` client's `DELIMITER`
//!   command is honoured: after `DELIMITER $$` only `$$` ends a statement, and the command
//!   line itself is not sent.
//! - **ClickHouse**: every top-level `;`.
//!
//! Where a migration runs in one transaction (PostgreSQL, SQLite), the file is sent to the
//! server as written and these cuts only count statements and find the ones that refuse a
//! transaction; where statements are journaled one by one, these cuts are what runs.
//!
//! The splitter never panics: an unterminated quote, comment or block runs to the end of the
//! input, so the rest of the file becomes one statement and the server reports the error.

use std::ops::Range;

use super::dialect::Dialect;
use super::lexer::{Lexeme, Lexer, Region, is_ident_byte, unicode_space_len};

/// Splits `sql` into statements with the [`Dialect::Postgres`] rules.
///
/// Each statement is trimmed and excludes its terminator; pieces holding only whitespace and
/// comments are dropped. Comments inside a statement (and before it) are kept, since the engine
/// gets the text.
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
    split_statements_in(sql, Dialect::Postgres)
}

/// [`split_statements`] with the rules of `dialect`.
pub fn split_statements_in(sql: &str, dialect: Dialect) -> Vec<String> {
    statement_spans(sql, dialect)
        .into_iter()
        .filter_map(|span| sql.get(span))
        .map(str::to_owned)
        .collect()
}

/// Byte ranges of the statements of `sql` (trimmed, without terminators, each holding code),
/// in order and disjoint; what lies between two of them is whitespace, comments,
/// terminators and `DELIMITER` commands.
pub fn statement_spans(sql: &str, dialect: Dialect) -> Vec<Range<usize>> {
    spans(sql, dialect, true)
}

/// [`statement_spans`], with or without the fast path over runs of plain words and spaces
/// (the property tests check that both cut alike).
pub(crate) fn spans(sql: &str, dialect: Dialect, fast: bool) -> Vec<Range<usize>> {
    let mut splitter = Splitter {
        fast,
        sql,
        bytes: sql.as_bytes(),
        dialect,
        lexer: Lexer::new(sql, dialect),
        tracker: Tracker::new(dialect),
        piece_start: 0,
        first_code: None,
        word: None,
        spaced: true,
        delimiter: None,
        out: Vec::new(),
    };
    splitter.run();
    splitter.out
}

struct Splitter<'a> {
    /// Take runs of ASCII letters, digits, `_` and spaces in one step.
    fast: bool,
    sql: &'a str,
    bytes: &'a [u8],
    dialect: Dialect,
    lexer: Lexer<'a>,
    tracker: Tracker,
    /// Where the current piece starts (after the previous terminator).
    piece_start: usize,
    /// Where the first thing other than whitespace and comments in the current piece starts.
    first_code: Option<usize>,
    /// Start of the bare word being read, and whether whitespace came before it.
    word: Option<(usize, bool)>,
    /// Whitespace or a comment since the last token.
    spaced: bool,
    /// MySQL: the delimiter set by a `DELIMITER` command, when it is not `;`.
    delimiter: Option<String>,
    out: Vec<Range<usize>>,
}

impl Splitter<'_> {
    fn run(&mut self) {
        loop {
            let pos = self.lexer.pos();
            if self.fast && self.delimiter.is_none() && self.plain_run(pos) {
                continue;
            }
            if let Some(d) = &self.delimiter
                && self
                    .bytes
                    .get(pos..)
                    .is_some_and(|rest| rest.starts_with(d.as_bytes()))
            {
                let len = d.len();
                if self.end_word(pos) {
                    continue;
                }
                self.cut(pos, pos + len);
                continue;
            }
            let Some((lexeme, range)) = self.lexer.next() else {
                break;
            };
            if let Lexeme::Byte(b) = lexeme
                && is_ident_byte(b)
            {
                let space = if b >= 0xC0 {
                    unicode_space_len(self.bytes, range.start)
                } else {
                    None
                };
                if let Some(len) = space {
                    if self.end_word(range.start) {
                        continue;
                    }
                    self.spaced = true;
                    self.lexer.skip_to(range.start + len);
                } else {
                    self.first_code.get_or_insert(range.start);
                    self.word.get_or_insert((range.start, self.spaced));
                }
                continue;
            }
            if self.end_word(range.start) {
                continue;
            }
            match lexeme {
                Lexeme::Byte(b) if b.is_ascii_whitespace() => self.spaced = true,
                Lexeme::Byte(b';') if self.delimiter.is_none() => {
                    if self.tracker.semicolon() {
                        self.cut(range.start, range.end);
                    } else {
                        self.first_code.get_or_insert(range.start);
                        self.spaced = false;
                    }
                }
                Lexeme::Byte(b) => {
                    self.first_code.get_or_insert(range.start);
                    self.tracker.punct(b, self.spaced);
                    self.spaced = false;
                }
                Lexeme::Region(Region::Comment) => self.spaced = true,
                Lexeme::Region(_) => {
                    self.first_code.get_or_insert(range.start);
                    self.tracker.other(self.spaced);
                    self.spaced = false;
                }
            }
        }
        self.end_word(self.bytes.len());
        self.cut(self.bytes.len(), self.bytes.len());
    }

    /// Most of a file is words and spaces: a run of ASCII letters, digits and `_` continues
    /// (or starts) a word, a run of spaces and line breaks ends one, each in one step. Whether
    /// it took a step.
    fn plain_run(&mut self, pos: usize) -> bool {
        let Some(rest) = self.bytes.get(pos..) else {
            return false;
        };
        let word_byte = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_';
        let space_byte = |b: &u8| matches!(b, b' ' | b'\n' | b'\t' | b'\r');
        let words = rest.iter().take_while(|b| word_byte(b)).count();
        if words > 0 {
            self.first_code.get_or_insert(pos);
            self.word.get_or_insert((pos, self.spaced));
            self.lexer.advance_in_word(pos + words);
            return true;
        }
        let spaces = rest.iter().take_while(|b| space_byte(b)).count();
        if spaces > 0 {
            if self.end_word(pos) {
                return true;
            }
            self.spaced = true;
            self.lexer.skip_to(pos + spaces);
            return true;
        }
        false
    }

    /// Finishes the bare word that ends at `end`, if one is being read. Returns `true` when it
    /// was a `DELIMITER` command, which moved the lexer past its line.
    fn end_word(&mut self, end: usize) -> bool {
        let Some((start, spaced)) = self.word.take() else {
            return false;
        };
        let word = self.sql.get(start..end).unwrap_or_default();
        if self.dialect == Dialect::MySql
            && word.eq_ignore_ascii_case("DELIMITER")
            && self.delimiter_command(start, end)
        {
            return true;
        }
        self.tracker.word(word, spaced);
        self.spaced = false;
        false
    }

    /// The `mysql` client's `DELIMITER <string>` at the start of a statement and of a line:
    /// sets the delimiter and drops the command's line from the statements.
    fn delimiter_command(&mut self, start: usize, end: usize) -> bool {
        if self.first_code != Some(start) || !matches!(self.bytes.get(end), Some(b' ' | b'\t')) {
            return false;
        }
        let before = self.bytes.get(..start).unwrap_or_default();
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1);
        let at_line_start = before
            .get(line_start..)
            .is_some_and(|indent| indent.iter().all(|&b| b == b' ' || b == b'\t'));
        if self.first_code != Some(start)
            || !at_line_start
            || !matches!(self.bytes.get(end), Some(b' ' | b'\t'))
        {
            return false;
        }
        let line_end = self
            .bytes
            .get(end..)
            .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
            .map_or(self.bytes.len(), |p| end + p);
        let args = self.sql.get(end..line_end).unwrap_or_default();
        let Some(delimiter) = args.split_ascii_whitespace().next() else {
            return false;
        };
        self.delimiter = (delimiter != ";").then(|| delimiter.to_owned());
        self.lexer.skip_to(line_end);
        self.piece_start = line_end;
        self.first_code = None;
        self.spaced = true;
        self.tracker = Tracker::new(self.dialect);
        true
    }

    /// Ends the current piece at `end`; the next one starts at `next`.
    fn cut(&mut self, end: usize, next: usize) {
        if self.first_code.is_some()
            && let Some(piece) = self.sql.get(self.piece_start..end)
        {
            let lead = piece.len() - piece.trim_start().len();
            let trimmed = piece.trim();
            // MySQL's `--` is a comment only before whitespace: `--;` is code, while a
            // statement ending in `--` would be sent as a comment. Such a piece counts only
            // if it holds code on its own.
            let code = !trimmed.ends_with("--") || has_code_alone(trimmed, self.dialect);
            if !trimmed.is_empty() && code {
                let start = self.piece_start + lead;
                self.out.push(start..start + trimmed.len());
            }
        }
        self.piece_start = next;
        self.first_code = None;
        self.spaced = true;
        self.tracker = Tracker::new(self.dialect);
        self.lexer.skip_to(next);
    }
}

/// Whether `text`, lexed on its own, holds anything but whitespace and comments.
fn has_code_alone(text: &str, dialect: Dialect) -> bool {
    Lexer::new(text, dialect).any(|(lexeme, _)| match lexeme {
        Lexeme::Byte(b) => !b.is_ascii_whitespace(),
        Lexeme::Region(region) => region != Region::Comment,
    })
}

/// Follows the statement being read far enough to tell whether a `;` ends it.
enum Tracker {
    Plain,
    Postgres(PgTracker),
    Sqlite(SqliteTracker),
    MySql(Box<MyTracker>),
}

impl Tracker {
    fn new(dialect: Dialect) -> Self {
        match dialect {
            Dialect::Postgres => Tracker::Postgres(PgTracker::default()),
            Dialect::Sqlite => Tracker::Sqlite(SqliteTracker::default()),
            Dialect::MySql => Tracker::MySql(Box::default()),
            Dialect::ClickHouse => Tracker::Plain,
        }
    }

    fn word(&mut self, w: &str, spaced: bool) {
        match self {
            Tracker::Plain => {}
            Tracker::Postgres(t) => t.word(w),
            Tracker::Sqlite(t) => t.word(w),
            Tracker::MySql(t) => t.word(w, spaced),
        }
    }

    fn punct(&mut self, b: u8, spaced: bool) {
        match self {
            Tracker::Plain => {}
            Tracker::Postgres(t) => t.punct(b),
            Tracker::Sqlite(t) => t.other(),
            Tracker::MySql(t) => t.punct(b, spaced),
        }
    }

    /// A quoted name, a literal or an executable comment.
    fn other(&mut self, spaced: bool) {
        match self {
            Tracker::Plain | Tracker::Postgres(_) => {}
            Tracker::Sqlite(t) => t.other(),
            Tracker::MySql(t) => t.other(spaced),
        }
    }

    /// A top-level `;` was read: whether it ends the statement.
    fn semicolon(&mut self) -> bool {
        match self {
            Tracker::Plain => true,
            Tracker::Postgres(t) => t.parens == 0 && t.depth == 0,
            Tracker::Sqlite(t) => t.semicolon(),
            Tracker::MySql(t) => t.semicolon(),
        }
    }
}

fn is(word: &str, keyword: &str) -> bool {
    word.eq_ignore_ascii_case(keyword)
}

fn is_any(word: &str, keywords: &[&str]) -> bool {
    keywords.iter().any(|k| word.eq_ignore_ascii_case(k))
}

/// psql's rule: parentheses, and `BEGIN`/`CASE` … `END` in `CREATE [OR REPLACE]
/// FUNCTION|PROCEDURE` (outside parentheses).
#[derive(Default)]
struct PgTracker {
    /// Words read at the head, up to the point the kind of statement is known.
    head: u8,
    /// `Some(true)`: a function or procedure definition.
    routine: Option<bool>,
    parens: u32,
    depth: u32,
}

impl PgTracker {
    fn word(&mut self, w: &str) {
        if self.routine.is_none() {
            self.routine = match (self.head, w) {
                (0, w) if is(w, "CREATE") => None,
                (1, w) if is(w, "OR") => None,
                (2, w) if is(w, "REPLACE") => None,
                (1 | 3, w) if is_any(w, &["FUNCTION", "PROCEDURE"]) => Some(true),
                _ => Some(false),
            };
            self.head += 1;
            return;
        }
        if self.routine != Some(true) || self.parens > 0 {
            return;
        }
        if is(w, "BEGIN") {
            self.depth += 1;
        } else if is(w, "CASE") {
            if self.depth > 0 {
                self.depth += 1;
            }
        } else if is(w, "END") {
            self.depth = self.depth.saturating_sub(1);
        }
    }

    fn punct(&mut self, b: u8) {
        match b {
            b'(' => self.parens += 1,
            b')' => self.parens = self.parens.saturating_sub(1),
            _ => {}
        }
    }
}

/// `sqlite3_complete`'s rule: a statement that starts `[EXPLAIN [QUERY PLAN]] CREATE
/// [TEMP|TEMPORARY] TRIGGER` ends only at a `;` that follows `END` that follows `;`.
#[derive(Default)]
struct SqliteTracker {
    head: SqliteHead,
    state: TriggerState,
}

#[derive(Default, PartialEq, Eq)]
enum SqliteHead {
    #[default]
    Start,
    Create,
    Trigger,
    Other,
}

#[derive(Default, PartialEq, Eq)]
enum TriggerState {
    #[default]
    Body,
    /// Right after a `;` in the body.
    Semi,
    /// Right after `; END`.
    End,
}

impl SqliteTracker {
    fn word(&mut self, w: &str) {
        self.head = match self.head {
            SqliteHead::Start if is_any(w, &["EXPLAIN", "QUERY", "PLAN"]) => SqliteHead::Start,
            SqliteHead::Start if is(w, "CREATE") => SqliteHead::Create,
            SqliteHead::Create if is_any(w, &["TEMP", "TEMPORARY"]) => SqliteHead::Create,
            SqliteHead::Create if is(w, "TRIGGER") => SqliteHead::Trigger,
            SqliteHead::Trigger => {
                self.state = if self.state == TriggerState::Semi && is(w, "END") {
                    TriggerState::End
                } else {
                    TriggerState::Body
                };
                SqliteHead::Trigger
            }
            _ => SqliteHead::Other,
        };
    }

    fn other(&mut self) {
        match self.head {
            SqliteHead::Trigger => self.state = TriggerState::Body,
            SqliteHead::Other => {}
            _ => self.head = SqliteHead::Other,
        }
    }

    fn semicolon(&mut self) -> bool {
        if self.head != SqliteHead::Trigger || self.state == TriggerState::End {
            return true;
        }
        self.state = TriggerState::Semi;
        false
    }
}

/// A block of a MySQL stored program, closed by `END` (`END IF`, `END LOOP`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Begin,
    If,
    CaseStatement,
    CaseExpression,
    Loop,
    Repeat,
    While,
    For,
}

/// What the head of a MySQL statement says about its body.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum MyHead {
    #[default]
    Start,
    /// `CREATE`, possibly `OR REPLACE`, `DEFINER = …` or `AGGREGATE` after it.
    Create,
    CreateOr,
    /// `DEFINER` read: `=` comes next.
    Definer,
    /// Inside the `DEFINER = user@host` value (ends at whitespace once it started).
    DefinerValue {
        started: bool,
    },
    /// `ALTER`: `ALTER EVENT … DO` has a body.
    Alter,
    /// A top-level `BEGIN` (a transaction, unless `NOT ATOMIC` follows).
    Begin,
    BeginNot,
    /// A stored program or compound statement: blocks are tracked.
    Program(ProgramKind),
    /// Anything else: `;` ends it.
    Plain,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProgramKind {
    Routine,
    Trigger,
    Event,
    Compound,
}

#[derive(Default)]
struct MyTracker {
    head: MyHead,
    stack: Vec<Block>,
    /// The next word starts a statement of a body.
    statement_start: bool,
    /// The last word started a statement and may be a label (`name:`).
    label: bool,
    /// The last word was `END`: a following `IF`/`CASE`/`LOOP`/… only names what it closed.
    after_end: bool,
    /// 1 right after `BEGIN`, 2 after `BEGIN NOT`: MariaDB's `BEGIN NOT ATOMIC`.
    after_begin: u8,
    /// The last token was `.`: the next word is a qualified name (`NEW.end`), never a keyword.
    after_dot: bool,
    /// `DECLARE … HANDLER FOR` was read: the handler's statement (which may open a block) comes
    /// after its conditions.
    handler: u8,
    parens: u32,
}

const OPENERS: &[&str] = &["IF", "CASE", "LOOP", "REPEAT", "WHILE", "FOR"];

impl MyTracker {
    fn word(&mut self, w: &str, spaced: bool) {
        self.label = false;
        match self.head {
            MyHead::Start => {
                self.head = if is(w, "CREATE") {
                    MyHead::Create
                } else if is(w, "ALTER") {
                    MyHead::Alter
                } else if is(w, "BEGIN") {
                    MyHead::Begin
                } else if is_any(w, &["IF", "LOOP", "REPEAT", "WHILE", "FOR"]) {
                    // MariaDB's compound statements outside stored programs.
                    self.statement_start = true;
                    self.head = MyHead::Program(ProgramKind::Compound);
                    self.body_word(w);
                    return;
                } else {
                    MyHead::Plain
                };
            }
            MyHead::Create => {
                self.head = if is(w, "DEFINER") {
                    MyHead::Definer
                } else if is(w, "OR") {
                    MyHead::CreateOr
                } else if is(w, "AGGREGATE") {
                    MyHead::Create
                } else if is_any(w, &["PROCEDURE", "FUNCTION", "PACKAGE"]) {
                    MyHead::Program(ProgramKind::Routine)
                } else if is(w, "TRIGGER") {
                    MyHead::Program(ProgramKind::Trigger)
                } else if is(w, "EVENT") {
                    MyHead::Program(ProgramKind::Event)
                } else {
                    MyHead::Plain
                };
            }
            MyHead::Alter => {
                self.head = if is(w, "EVENT") {
                    MyHead::Program(ProgramKind::Event)
                } else if is(w, "DEFINER") {
                    MyHead::Definer
                } else {
                    MyHead::Plain
                };
            }
            MyHead::CreateOr => {
                self.head = if is(w, "REPLACE") {
                    MyHead::Create
                } else {
                    MyHead::Plain
                };
            }
            MyHead::Definer => self.head = MyHead::Plain,
            MyHead::DefinerValue { started } => {
                if started && spaced {
                    self.head = MyHead::Create;
                    self.word(w, spaced);
                } else {
                    self.head = MyHead::DefinerValue { started: true };
                }
            }
            MyHead::Begin => {
                self.head = if is(w, "NOT") {
                    MyHead::BeginNot
                } else {
                    MyHead::Plain
                };
            }
            MyHead::BeginNot => {
                if is(w, "ATOMIC") {
                    self.head = MyHead::Program(ProgramKind::Compound);
                    self.stack.push(Block::Begin);
                    self.statement_start = true;
                } else {
                    self.head = MyHead::Plain;
                }
            }
            MyHead::Program(kind) => {
                let top_level = self.stack.is_empty() && self.parens == 0;
                if top_level && kind == ProgramKind::Trigger && is(w, "ROW") {
                    // `FOR EACH ROW`: the trigger's body statement comes next.
                    self.statement_start = true;
                    return;
                }
                if top_level && kind == ProgramKind::Event && is(w, "DO") {
                    self.statement_start = true;
                    return;
                }
                self.body_word(w);
            }
            MyHead::Plain => {}
        }
    }

    fn body_word(&mut self, w: &str) {
        if self.parens > 0 || std::mem::take(&mut self.after_dot) {
            // In parentheses, or a qualified name such as `NEW.end`: never a keyword here.
            self.statement_start = false;
            return;
        }
        if std::mem::take(&mut self.after_end) && is_any(w, OPENERS) {
            return;
        }
        match std::mem::take(&mut self.after_begin) {
            1 if is(w, "NOT") => {
                self.after_begin = 2;
                return;
            }
            2 if is(w, "ATOMIC") => return,
            _ => {}
        }
        let start = std::mem::take(&mut self.statement_start);
        // `DECLARE … HANDLER FOR <conditions> <statement>`: the first opener after FOR opens.
        let handler = match self.handler {
            0 if is(w, "HANDLER") => {
                self.handler = 1;
                false
            }
            1 if is(w, "FOR") => {
                self.handler = 2;
                false
            }
            2 => true,
            _ => false,
        };
        let top = self.stack.last().copied();
        if is(w, "BEGIN") && (start || handler || self.stack.is_empty()) {
            // The body of a routine, trigger or event, a nested block, a handler's block.
            self.handler = 0;
            self.stack.push(Block::Begin);
            self.statement_start = true;
            self.after_begin = 1;
        } else if is(w, "END")
            && (start || matches!(top, Some(Block::CaseExpression | Block::Repeat)))
        {
            // A block's END starts a statement (`…; END IF`, `BEGIN END`); only a CASE
            // expression's and a REPEAT's (after `UNTIL cond`) come mid-statement. An `end`
            // anywhere else is a name.
            if self.stack.pop().is_some() {
                self.after_end = true;
            }
        } else if (start || handler) && is_any(w, OPENERS) {
            self.handler = 0;
            let block = match w.to_ascii_uppercase().as_str() {
                "IF" => Block::If,
                "CASE" => Block::CaseStatement,
                "LOOP" => Block::Loop,
                "REPEAT" => Block::Repeat,
                "WHILE" => Block::While,
                _ => Block::For,
            };
            self.stack.push(block);
            self.statement_start = matches!(block, Block::Loop | Block::Repeat);
        } else if is(w, "CASE") && !self.stack.is_empty() {
            self.stack.push(Block::CaseExpression);
        } else if is_any(w, &["THEN", "ELSE"]) {
            self.statement_start = matches!(top, Some(Block::If | Block::CaseStatement));
        } else if is(w, "DO") {
            self.statement_start = matches!(top, Some(Block::While | Block::For));
        } else if start {
            self.label = true;
        }
    }

    fn punct(&mut self, b: u8, spaced: bool) {
        let label = std::mem::take(&mut self.label);
        match self.head {
            MyHead::Definer => {
                self.head = if b == b'=' {
                    MyHead::DefinerValue { started: false }
                } else {
                    MyHead::Plain
                };
            }
            MyHead::DefinerValue { started } => {
                if started && spaced {
                    self.head = MyHead::Plain;
                } else {
                    self.head = MyHead::DefinerValue { started: true };
                }
            }
            MyHead::Program(_) => {
                self.after_end = false;
                self.after_begin = 0;
                self.after_dot = b == b'.';
                match b {
                    b'(' => self.parens += 1,
                    b')' => self.parens = self.parens.saturating_sub(1),
                    // `name:` before `BEGIN`, `LOOP`, …: what follows still starts a statement.
                    b':' if label => self.statement_start = true,
                    _ => {}
                }
                if b != b':' || !label {
                    self.statement_start = false;
                }
            }
            MyHead::Start | MyHead::Create | MyHead::CreateOr | MyHead::Alter => {
                self.head = MyHead::Plain
            }
            _ => {}
        }
    }

    fn other(&mut self, spaced: bool) {
        self.label = false;
        match self.head {
            MyHead::DefinerValue { started } => {
                if started && spaced {
                    self.head = MyHead::Plain;
                } else {
                    self.head = MyHead::DefinerValue { started: true };
                }
            }
            MyHead::Program(_) => {
                self.statement_start = false;
                self.after_end = false;
                self.after_begin = 0;
                self.after_dot = false;
            }
            MyHead::Start | MyHead::Create | MyHead::CreateOr | MyHead::Alter | MyHead::Definer => {
                self.head = MyHead::Plain;
            }
            _ => {}
        }
    }

    fn semicolon(&mut self) -> bool {
        self.label = false;
        self.after_end = false;
        self.after_begin = 0;
        self.after_dot = false;
        self.handler = 0;
        if !matches!(self.head, MyHead::Program(_)) || self.stack.is_empty() {
            return true;
        }
        self.statement_start = true;
        false
    }
}

#[cfg(test)]
mod tests;
