//! The engine half of the table-lock bounds (`dbwarden_core::table_locks`): the migration
//! session's `lock_timeout` and `statement_timeout`, a lock timeout (SQLSTATE 55P03) reported
//! as [`Error::LockTimeout`], and who blocks a waiting session (`pg_blocking_pids`).

use std::time::Duration;

use sqlx::{AssertSqlSafe, PgConnection, Row};

use dbwarden_core::Error;

use crate::store::PgStore;

/// A setting's value for a bound: milliseconds, `None` = the session's own default.
fn value(d: Option<Duration>) -> Option<u128> {
    d.map(|d| d.as_millis().max(1))
}

impl PgStore {
    /// Bound the migration statements that follow. On a session of its own: session settings
    /// (`RESET` where unbounded, back to the role's or the URL's own). Behind a transaction
    /// pooler a session setting would stay with a backend another client gets next, so there
    /// they are set `LOCAL` at the start of each migration transaction, and statements that
    /// run outside one (`CREATE INDEX CONCURRENTLY`) keep the server's defaults.
    pub(crate) async fn bound(
        &mut self,
        lock_timeout: Option<Duration>,
        statement_timeout: Option<Duration>,
    ) -> Result<(), Error> {
        // One round trip per change, not per migration (300 small files share one setting);
        // a migration whose text may have changed them itself (its own `SET lock_timeout`
        // outlives its COMMIT) forgets what was set (`may_change_bounds`).
        self.touched = true;
        let wanted = Some((lock_timeout, statement_timeout));
        if self.bounds_set == wanted {
            return Ok(());
        }
        let set = |local: &str| {
            [
                ("lock_timeout", value(lock_timeout)),
                ("statement_timeout", value(statement_timeout)),
            ]
            .iter()
            .map(|(name, v)| match v {
                Some(ms) => format!("SET {local}{name} = {ms}; "),
                None if local.is_empty() => format!("RESET {name}; "),
                None => String::new(),
            })
            .collect::<String>()
        };
        if self.pooled {
            self.tx_bounds = set("LOCAL ");
        } else {
            sqlx::raw_sql(AssertSqlSafe(set("")))
                .execute(&mut self.conn)
                .await
                .map_err(|e| self.err(e))?;
        }
        self.bounds_set = wanted;
        Ok(())
    }

    /// Migration text about to be sent: if it may set or reset the session's bounds itself,
    /// what [`Self::bound`] set last is no longer known.
    pub(crate) fn sending(&mut self, text: &str) {
        if may_change_bounds(text) {
            self.bounds_set = None;
        }
    }
}

/// Whether `text` may change `lock_timeout` or `statement_timeout` on the session (`SET`,
/// `set_config`, `RESET`, `DISCARD`): a cheap scan that errs towards "yes".
fn may_change_bounds(text: &str) -> bool {
    const WORDS: [&[u8]; 4] = [b"lock_timeout", b"statement_timeout", b"reset", b"discard"];
    let bytes = text.as_bytes();
    WORDS.iter().any(|w| {
        bytes
            .windows(w.len())
            .any(|window| window.eq_ignore_ascii_case(w))
    })
}

/// The sessions that block backend `pid`, one line each: pid, application name, state and
/// how long its transaction has been open -- never its query text (literals, passwords).
pub(crate) async fn blockers(
    conn: &mut PgConnection,
    pid: i32,
) -> Result<Vec<String>, sqlx::Error> {
    let rows = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT a.pid, coalesce(a.application_name, ''), coalesce(a.state, ''), \
         coalesce(extract(epoch FROM clock_timestamp() - a.xact_start)::float8, -1) \
         FROM pg_stat_activity a WHERE a.pid = ANY (pg_blocking_pids({pid})) ORDER BY a.xact_start"
    )))
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|r| {
            let (pid, app, state, age): (i32, String, String, f64) =
                (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?);
            let app = if app.is_empty() {
                String::new()
            } else {
                format!("application_name {app:?}, ")
            };
            let age = if age < 0.0 {
                "no transaction".to_owned()
            } else {
                format!(
                    "transaction open {}",
                    dbwarden_core::duration::human(Duration::from_secs_f64(age))
                )
            };
            Ok(format!("pid {pid} ({app}{state}, {age})"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::may_change_bounds;

    #[test]
    fn a_migration_that_sets_its_own_bounds_is_noticed() {
        assert!(may_change_bounds(
            "SET lock_timeout = 0;\nALTER TABLE t ADD c int"
        ));
        assert!(may_change_bounds(
            "select set_config('statement_timeout', '1s', false)"
        ));
        assert!(may_change_bounds("RESET ALL"));
        assert!(may_change_bounds("discard all"));
        assert!(!may_change_bounds(
            "ALTER TABLE t ADD COLUMN c int; INSERT INTO t VALUES (1)"
        ));
    }
}
