//! What concurrent index builds leave behind, as the catalog shows it: the engine half of
//! [`IndexBuilds`] (core decides what a state means and what to drop; docs/design.md §9). Every
//! name arrives as text and is sent as a literal or a quoted identifier, never spliced raw.

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, PgConnection, Row};

use dbwarden_core::{Error, FencingToken, IndexBuilds, IndexState, InvalidIndex};

use crate::literal::literal;
use crate::store::PgStore;

/// The table a relation names: itself, or the table of the index it names.
fn table_of(relation: &str) -> Result<String, Error> {
    let r = literal(relation)?;
    Ok(format!(
        "coalesce((SELECT indrelid FROM pg_index WHERE indexrelid = to_regclass({r})), to_regclass({r}))"
    ))
}

/// INVALID indexes matching `filter`, but not one a build is making right now (an index being
/// built concurrently is INVALID until the build ends).
async fn invalid(conn: &mut PgConnection, filter: &str) -> Result<Vec<InvalidIndex>, sqlx::Error> {
    let sql = format!(
        "SELECT n.nspname::text, c.relname::text, t.relname::text \
         FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE NOT i.indisvalid AND {filter} \
         AND NOT EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.index_relid = i.indexrelid) \
         ORDER BY 1, 2"
    );
    let rows = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(conn).await?;
    rows.iter()
        .map(|r| {
            Ok(InvalidIndex {
                schema: r.try_get(0)?,
                name: r.try_get(1)?,
                table: r.try_get(2)?,
            })
        })
        .collect()
}

/// Every INVALID index in the schemas of the session's search path (`status`, `validate`).
pub(crate) async fn in_search_path(
    conn: &mut PgConnection,
) -> Result<Vec<InvalidIndex>, sqlx::Error> {
    invalid(conn, "n.nspname = ANY (current_schemas(false))").await
}

/// `"name"` with its quotes doubled: an identifier as PostgreSQL reads it.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[async_trait]
impl IndexBuilds for PgStore {
    async fn index_state(&mut self, relation: &str, index: &str) -> Result<IndexState, Error> {
        let sql = format!(
            "SELECT i.indisvalid, EXISTS (SELECT 1 FROM pg_stat_progress_create_index p \
             WHERE p.index_relid = i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
             WHERE c.relname = {} AND i.indrelid = {}",
            literal(index)?,
            table_of(relation)?
        );
        let row = sqlx::raw_sql(AssertSqlSafe(sql))
            .fetch_optional(&mut self.conn)
            .await
            .map_err(|e| self.err(e))?;
        let Some(row) = row else {
            return Ok(IndexState::Missing);
        };
        let (valid, building): (bool, bool) = (
            row.try_get(0).map_err(|e| self.err(e))?,
            row.try_get(1).map_err(|e| self.err(e))?,
        );
        Ok(match (valid, building) {
            (true, _) => IndexState::Valid,
            (false, true) => IndexState::Building,
            (false, false) => IndexState::Invalid,
        })
    }

    async fn invalid_indexes(&mut self, relation: &str) -> Result<Vec<InvalidIndex>, Error> {
        let filter = format!("i.indrelid = {}", table_of(relation)?);
        let r = invalid(&mut self.conn, &filter).await;
        r.map_err(|e| self.err(e))
    }

    async fn drop_index(&mut self, token: FencingToken, index: &InvalidIndex) -> Result<(), Error> {
        self.touched = true;
        // Outside a transaction (DROP INDEX CONCURRENTLY refuses one), after a fresh proof.
        self.check_fence(token, false).await?;
        let sql = format!(
            "DROP INDEX CONCURRENTLY IF EXISTS {}.{}",
            quoted(&index.schema),
            quoted(&index.name)
        );
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut self.conn)
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_and_literals_escaped() {
        assert_eq!(quoted("a\"b"), "\"a\"\"b\"");
        assert!(table_of("s.t'x").unwrap().contains("to_regclass('s.t''x')"));
    }
}
