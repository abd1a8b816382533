//! Concurrent index builds: PostgreSQL's `CREATE INDEX CONCURRENTLY` and `REINDEX …
//! CONCURRENTLY` run outside any transaction, and one that is killed or fails leaves an
//! INVALID index behind -- which `IF NOT EXISTS` then silently keeps, and which the server
//! maintains on every write but never uses. Recovery and the runner ask the engine about the
//! index a statement names (docs/design.md §9, "what a statement leaves behind").

use super::Dialect;
use super::classify::{Tok, Token, tokens};

/// A statement that builds an index concurrently, with the names it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexBuild {
    /// `CREATE [UNIQUE] INDEX CONCURRENTLY [IF NOT EXISTS] index ON [ONLY] table …`: the index
    /// lives in the table's schema.
    Create {
        /// The index's name as the server stores it (unquoted names folded to lower case).
        index: String,
        /// The table as written (possibly schema-qualified and quoted), for `to_regclass`.
        table: String,
    },
    /// `REINDEX [( … )] INDEX|TABLE CONCURRENTLY name`: a killed one leaves the new copies
    /// (`<index>_ccnew`, `_ccnew1`, …) or the old ones (`_ccold…`) INVALID beside the index.
    Reindex {
        /// The index or table as written, for `to_regclass`.
        relation: String,
        /// `REINDEX INDEX`: the index's stored name, whose copies are the leftovers; `None`
        /// for `REINDEX TABLE` (any index of the table).
        index: Option<String>,
    },
}

impl IndexBuild {
    /// The concurrent index build `stmt` is, on PostgreSQL; `None` for anything else, and for a
    /// build whose index is not named (`CREATE INDEX CONCURRENTLY ON t …`: the server picks
    /// the name, so nothing tells which index a killed one left).
    pub fn of(stmt: &str, dialect: Dialect) -> Option<IndexBuild> {
        // Most statements of a big data migration are not even close: no tokenizing for them.
        let named = stmt
            .as_bytes()
            .windows(b"CONCURRENTLY".len())
            .any(|w| w.eq_ignore_ascii_case(b"CONCURRENTLY"));
        if dialect != Dialect::Postgres || !named {
            return None;
        }
        let toks = tokens(stmt, dialect);
        let at = |i: usize| toks.get(i);
        let is = |i: usize, kw: &str| at(i).is_some_and(|t| t.is(kw));
        let mut i = 0;
        if is(0, "CREATE") {
            i = 1;
            if is(i, "UNIQUE") {
                i += 1;
            }
            if !(is(i, "INDEX") && is(i + 1, "CONCURRENTLY")) {
                return None;
            }
            i += 2;
            if is(i, "IF") && is(i + 1, "NOT") && is(i + 2, "EXISTS") {
                i += 3;
            }
            if is(i, "ON") {
                return None; // unnamed
            }
            let index = identifier(stmt, at(i)?)?;
            i += 1;
            if !is(i, "ON") {
                return None;
            }
            i += 1;
            if is(i, "ONLY") {
                i += 1;
            }
            let (table, _) = qualified(stmt, &toks[i.min(toks.len())..])?;
            return Some(IndexBuild::Create { index, table });
        }
        if !is(0, "REINDEX") {
            return None;
        }
        i += 1;
        if at(i).is_some_and(|t| t.token == Token::Punct(b'(')) {
            let close = toks[i..]
                .iter()
                .position(|t| t.token == Token::Punct(b')'))?;
            i += close + 1;
        }
        let on_index = is(i, "INDEX");
        if !(on_index || is(i, "TABLE")) || !is(i + 1, "CONCURRENTLY") {
            return None;
        }
        i += 2;
        let (relation, last) = qualified(stmt, &toks[i.min(toks.len())..])?;
        let index = if on_index {
            Some(identifier(stmt, last)?)
        } else {
            None
        };
        Some(IndexBuild::Reindex { relation, index })
    }

    /// Whether `name`, an index the server marks INVALID, is what this build leaves behind
    /// when it is killed or fails.
    pub fn leaves(&self, name: &str) -> bool {
        match self {
            IndexBuild::Create { index, .. } => name == index,
            IndexBuild::Reindex { index, .. } => {
                let rest = match index {
                    Some(index) => name.strip_prefix(index.as_str()),
                    None => Some(name),
                };
                rest.is_some_and(|rest| {
                    ["_ccnew", "_ccold"].iter().any(|copy| {
                        let tail = match index {
                            Some(_) => rest.strip_prefix(copy),
                            None => rest.rfind(copy).map(|at| &rest[at + copy.len()..]),
                        };
                        tail.is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
                    })
                })
            }
        }
    }

    /// The relation to ask the server about (`to_regclass` reads it as SQL would).
    pub fn relation(&self) -> &str {
        match self {
            IndexBuild::Create { table, .. } => table,
            IndexBuild::Reindex { relation, .. } => relation,
        }
    }
}

/// A name as the server stores it: an unquoted word folded to lower case, a quoted one as
/// written with its doubled quotes undone.
fn identifier(stmt: &str, tok: &Tok) -> Option<String> {
    let text = stmt.get(tok.span.clone())?;
    match tok.token {
        Token::Word(_) => Some(text.to_ascii_lowercase()),
        Token::QuotedIdent => {
            let inner = text.strip_prefix('"')?.strip_suffix('"')?;
            Some(inner.replace("\"\"", "\""))
        }
        _ => None,
    }
}

/// A possibly qualified name at the start of `toks` (`t`, `s.t`, `"S"."t"`): its text as
/// written, and its last part.
fn qualified<'t>(stmt: &str, toks: &'t [Tok]) -> Option<(String, &'t Tok)> {
    fn part(t: Option<&Tok>) -> Option<&Tok> {
        t.filter(|t| matches!(t.token, Token::Word(_) | Token::QuotedIdent))
    }
    let first = part(toks.first())?;
    let mut last = first;
    let mut k = 1;
    while toks.get(k).is_some_and(|t| t.token == Token::Punct(b'.')) {
        last = part(toks.get(k + 1))?;
        k += 2;
    }
    Some((stmt.get(first.span.start..last.span.end)?.to_owned(), last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(sql: &str) -> Option<IndexBuild> {
        IndexBuild::of(sql, Dialect::Postgres)
    }

    fn create(index: &str, table: &str) -> Option<IndexBuild> {
        Some(IndexBuild::Create {
            index: index.into(),
            table: table.into(),
        })
    }

    #[test]
    fn concurrent_creates_name_their_index_and_table() {
        assert_eq!(
            of("CREATE INDEX CONCURRENTLY big_note ON big (note)"),
            create("big_note", "big")
        );
        assert_eq!(
            of(
                "create unique index concurrently if not exists Big_Id on only app.\"Big\" using btree (id)"
            ),
            create("big_id", "app.\"Big\"")
        );
        assert_eq!(
            of("CREATE INDEX CONCURRENTLY \"Odd\"\"Name\" ON t (c)"),
            create("Odd\"Name", "t")
        );
    }

    #[test]
    fn anything_else_is_not_a_concurrent_build() {
        assert_eq!(of("CREATE INDEX i ON t (c)"), None);
        assert_eq!(of("CREATE INDEX CONCURRENTLY ON t (c)"), None, "unnamed");
        assert_eq!(of("DROP INDEX CONCURRENTLY IF EXISTS i"), None);
        assert_eq!(of("REINDEX INDEX i"), None);
        assert_eq!(of("REINDEX SCHEMA CONCURRENTLY s"), None);
        assert_eq!(
            IndexBuild::of("CREATE INDEX CONCURRENTLY i ON t (c)", Dialect::MySql),
            None
        );
    }

    #[test]
    fn reindexes_name_their_relation_and_their_leftovers() {
        let r = of("REINDEX (VERBOSE) INDEX CONCURRENTLY app.big_note").unwrap();
        assert_eq!(
            r,
            IndexBuild::Reindex {
                relation: "app.big_note".into(),
                index: Some("big_note".into())
            }
        );
        assert!(r.leaves("big_note_ccnew"));
        assert!(r.leaves("big_note_ccnew2"));
        assert!(r.leaves("big_note_ccold"));
        assert!(!r.leaves("big_note"));
        assert!(!r.leaves("big_note_ccnewer"));
        assert!(!r.leaves("other_ccnew"));

        let t = of("REINDEX TABLE CONCURRENTLY big").unwrap();
        assert!(t.leaves("big_note_ccnew1") && t.leaves("big_id_ccold"));
        assert!(!t.leaves("big_note"));
    }

    #[test]
    fn a_create_leaves_only_its_own_index() {
        let c = of("CREATE INDEX CONCURRENTLY IF NOT EXISTS i ON t (c)").unwrap();
        assert!(c.leaves("i"));
        assert!(!c.leaves("i_ccnew"));
        assert_eq!(c.relation(), "t");
    }
}
