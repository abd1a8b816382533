//! Table locks met by migration statements (docs/operations.md, "Locks your migrations take").
//! `lock_wait_timeout` bounds how long a statement waits for a metadata or table lock (an
//! `ALTER` queued behind an application's open transaction would otherwise hold every later
//! query on the table behind it), MariaDB's `max_statement_time` how long it runs. A statement
//! the lock bound stops (error 1205) did nothing: it is reported as [`Error::LockTimeout`], and
//! core pauses and retries it. Who blocks it: the sessions with an open transaction.

use std::time::Duration;

use dbwarden_core::Error;
use dbwarden_core::migration::Migration;
use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, Row};

use crate::lock::server_error;

/// `ER_LOCK_WAIT_TIMEOUT`: a metadata, table or row lock was not granted in time.
const LOCK_WAIT_TIMEOUT: u16 = 1205;

/// The bounds a session has, as last set: `(lock_timeout, statement_timeout)`.
pub(crate) type Bounds = (Option<Duration>, Option<Duration>);

/// The `SET SESSION` that gives the session `want`, or `None` when `had` is the same. The
/// server counts `lock_wait_timeout` in whole seconds: a bound is rounded up, at least 1 s.
/// `max_statement_time` (MariaDB only) is named only once a statement bound was asked for, so
/// a server without it (MySQL) is never asked to set it.
pub(crate) fn bounds_sql(had: Option<Bounds>, want: Bounds) -> Option<String> {
    if had == Some(want) {
        return None;
    }
    let lock = match want.0 {
        Some(d) => (d.as_secs_f64().ceil() as u64).max(1).to_string(),
        None => "DEFAULT".to_owned(),
    };
    let mut sql = format!("SET SESSION lock_wait_timeout = {lock}");
    let statement_before = had.is_none_or(|h| h.1.is_some());
    match want.1 {
        Some(d) => sql.push_str(&format!(
            ", max_statement_time = {:.3}",
            d.as_secs_f64().max(0.001)
        )),
        None if statement_before && had.is_some() => sql.push_str(", max_statement_time = DEFAULT"),
        None => {}
    }
    Some(sql)
}

/// Statements `range` of `m` in one call; a failure names the statement it stopped at, and a
/// lock wait that ran out is a [`Error::LockTimeout`] (the statement did nothing).
pub(crate) async fn run(
    conn: &mut MySqlConnection,
    m: &Migration,
    range: std::ops::Range<usize>,
) -> Result<(), Error> {
    let Some((_, text)) = m.text_of(range.clone()) else {
        return Ok(());
    };
    dbwarden_sql::run_counted(conn, text)
        .await
        .map_err(|(done, e)| {
            let index = (range.start + done).min(range.end - 1);
            if server_error(&e) != Some(LOCK_WAIT_TIMEOUT) {
                return m.failure(index, &e.to_string());
            }
            Error::LockTimeout {
                version: m.version,
                file: m.location(index),
                statement: index + 1,
                total: m.statements.len(),
                message: dbwarden_core::error::one_line(&e.to_string()),
                attempts: String::new(),
                blockers: String::new(),
            }
        })
}

/// The sessions other than `session` with a transaction open, oldest first: whoever holds the
/// metadata lock a migration statement waits for is among them (MariaDB shows no metadata-lock
/// waits without a plugin). One line each: connection id, user, state, transaction age.
pub(crate) async fn blockers(
    conn: &mut MySqlConnection,
    session: u64,
) -> Result<Vec<String>, sqlx::Error> {
    let rows = sqlx::query(AssertSqlSafe(
        "SELECT CAST(p.ID AS SIGNED), COALESCE(p.USER, ''), COALESCE(p.COMMAND, ''), \
         TIMESTAMPDIFF(SECOND, t.trx_started, NOW()) \
         FROM information_schema.INNODB_TRX t \
         JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
         WHERE p.ID <> ? ORDER BY t.trx_started"
            .to_owned(),
    ))
    .bind(session)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|r| {
            let id: i64 = r.try_get(0)?;
            let (user, command): (String, String) = (r.try_get(1)?, r.try_get(2)?);
            let age: i64 = r.try_get::<Option<i64>, _>(3)?.unwrap_or(0);
            let age = dbwarden_core::duration::human(Duration::from_secs(age.max(0) as u64));
            Ok(format!(
                "connection {id} (user {user:?}, {command}, transaction open {age})"
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn bounds_are_set_once_and_reset_to_the_server_default() {
        let lock = Some(Duration::from_millis(1500));
        assert_eq!(
            bounds_sql(None, (lock, None)).as_deref(),
            Some("SET SESSION lock_wait_timeout = 2")
        );
        assert_eq!(bounds_sql(Some((lock, None)), (lock, None)), None);
        assert_eq!(
            bounds_sql(Some((lock, None)), (None, None)).as_deref(),
            Some("SET SESSION lock_wait_timeout = DEFAULT")
        );
        assert_eq!(
            bounds_sql(None, (Some(Duration::from_millis(100)), Some(S))).as_deref(),
            Some("SET SESSION lock_wait_timeout = 1, max_statement_time = 1.000")
        );
        assert_eq!(
            bounds_sql(Some((lock, Some(S))), (lock, None)).as_deref(),
            Some("SET SESSION lock_wait_timeout = 2, max_statement_time = DEFAULT")
        );
    }
}
