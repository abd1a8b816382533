//! The SQL dialects dbwarden reads migration files in.

/// The SQL dialect of an engine: its lexical rules and its compound statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[non_exhaustive]
pub enum Dialect {
    /// PostgreSQL: `''` escapes, `E'\''` strings, nested `/* */`, `$tag$` bodies,
    /// `BEGIN ATOMIC` bodies, parenthesised rule actions.
    #[default]
    Postgres,
    /// SQLite: `[name]` identifiers, non-nesting comments, triggers ending at `; END ;`.
    Sqlite,
    /// MySQL / MariaDB: backslash escapes in `'…'` and `"…"`, `#` comments, `--` a comment
    /// only before whitespace, `/*! */` run by the server, stored-program bodies, `DELIMITER`.
    MySql,
    /// ClickHouse: backslash escapes, non-nesting comments, `$tag$` heredocs.
    ClickHouse,
}

impl Dialect {
    /// Whether DDL commits together with the rest of a transaction, so a whole migration and
    /// its history row can commit at once (PostgreSQL, SQLite). MySQL commits DDL on its own;
    /// ClickHouse has no transactions.
    pub fn transactional_ddl(self) -> bool {
        matches!(self, Dialect::Postgres | Dialect::Sqlite)
    }

    /// The name operators know the dialect by.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Postgres => "PostgreSQL",
            Dialect::Sqlite => "SQLite",
            Dialect::MySql => "MySQL",
            Dialect::ClickHouse => "ClickHouse",
        }
    }
}
