//! The MySQL status, history and audit tables (docs/design.md §4): their DDL, reading them, and the
//! token bump under the named lock. Timestamps are the server's `UTC_TIMESTAMP(6)`, stored in
//! `DATETIME(6)` columns as UTC whatever the session's `time_zone`.

use dbwarden_core::{Error, FencingToken, HolderInfo, Snapshot, StatusRow};
use dbwarden_sql::binds;
use sqlx::AssertSqlSafe;
use sqlx::mysql::MySqlConnection;

/// A connection that dropped (server restart, network) is not a failed statement: it is
/// "unreachable" (exit 2) outside a run; inside one, the store's `settle` turns it into a lost
/// lock (exit 4), because the server freed the named lock with the session.
pub(crate) fn db_err(e: sqlx::Error) -> Error {
    if is_disconnect(&e) {
        let detail = format!("the connection dropped ({e}); retry once the server is back");
        return Error::unreachable_from("the MySQL/MariaDB server", detail, e);
    }
    Error::database_from(e.to_string(), e)
}

/// A write refused by certification (another node's write to the same row came first) or an
/// InnoDB deadlock (1213): the same answer for a claim, someone else got there.
pub(crate) fn refused(e: &Error) -> bool {
    let Error::Database {
        source: Some(source),
        ..
    } = e
    else {
        return false;
    };
    source
        .downcast_ref::<sqlx::Error>()
        .is_some_and(|e| server_error(e) == Some(1213))
}

/// The server's error number (`1040`, `1094`, ...), if `e` is an error the server sent.
pub fn server_error(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(d) => d
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|m| m.number()),
        _ => None,
    }
}

pub(crate) fn is_disconnect(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::WorkerCrashed | sqlx::Error::PoolClosed => true,
        sqlx::Error::Protocol(m) => m.contains("expected to read") || m.contains("EOF"),
        _ => false,
    }
}

/// Create the three tables if they are missing. Runs under the lock (and `CREATE TABLE IF NOT
/// EXISTS` is atomic in MySQL, so concurrent first runs cannot fail here either). Returns
/// whether the status table has the holder-settings columns (`upgraded` remembers a yes).
pub(crate) async fn create_tables(
    conn: &mut MySqlConnection,
    history: &str,
    upgraded: &std::sync::atomic::AtomicBool,
) -> Result<bool, Error> {
    let statements = [
        "CREATE TABLE IF NOT EXISTS dbwarden_lock (
            namespace VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
            execution_id CHAR(36) NULL, owner_id VARCHAR(255) NULL,
            migration_version BIGINT NULL, migration_checksum CHAR(64) NULL,
            fencing_token BIGINT NOT NULL DEFAULT 0,
            host VARCHAR(255) NULL, pid BIGINT NULL, db_connection_id VARCHAR(32) NULL,
            state VARCHAR(16) NOT NULL DEFAULT 'AVAILABLE',
            acquired_at DATETIME(6) NULL, last_heartbeat_at DATETIME(6) NULL, expires_at DATETIME(6) NULL,
            lock_ttl_ms BIGINT NULL, heartbeat_interval_ms BIGINT NULL
        ) ENGINE=InnoDB"
            .to_owned(),
        format!(
            "CREATE TABLE IF NOT EXISTS `{history}` (
            version BIGINT NOT NULL PRIMARY KEY,
            description TEXT NOT NULL, checksum CHAR(64) NOT NULL, state VARCHAR(16) NOT NULL,
            statements_total BIGINT NOT NULL, statements_done BIGINT NOT NULL,
            execution_id CHAR(36) NULL, fencing_token BIGINT NOT NULL,
            started_at DATETIME(6) NULL, finished_at DATETIME(6) NULL, duration_ms BIGINT NULL
        ) ENGINE=InnoDB"
        ),
        AUDIT_TABLE.to_owned(),
    ];
    // One round trip: sqlx sends a raw query as one COM_QUERY with multi-statements on.
    sqlx::raw_sql(AssertSqlSafe(statements.join(";\n")))
        .execute(&mut *conn)
        .await
        .map_err(db_err)?;
    if upgraded.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(true);
    }
    let has = upgrade_status_table(conn).await?;
    upgraded.store(has, std::sync::atomic::Ordering::Relaxed);
    Ok(has)
}

/// A status table an older version created lacks the holder-settings columns: add them, without
/// making the claim depend on it. Checked first, because an `ALTER TABLE` waits for every
/// transaction that touched the table (here at most 2 s: `lock_wait_timeout`, restored after);
/// a concurrent upgrader that got there first (duplicate column, 1060) is success. A user
/// without the ALTER privilege, or a table lock not granted in time, leaves the table as it is:
/// the claim then records no settings, and lock-status judges by its own ttl.
pub(crate) async fn upgrade_status_table(conn: &mut MySqlConnection) -> Result<bool, Error> {
    let n: i64 = sqlx::query_scalar(
        "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'dbwarden_lock' AND COLUMN_NAME IN ('lock_ttl_ms', 'heartbeat_interval_ms')",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db_err)?;
    if n == 2 {
        return Ok(true);
    }
    sqlx::raw_sql("SET SESSION lock_wait_timeout = 2")
        .execute(&mut *conn)
        .await
        .map_err(db_err)?;
    let mut added = true;
    for column in ["lock_ttl_ms", "heartbeat_interval_ms"] {
        let r = sqlx::raw_sql(AssertSqlSafe(format!(
            "ALTER TABLE dbwarden_lock ADD COLUMN {column} BIGINT NULL"
        )))
        .execute(&mut *conn)
        .await;
        match r {
            Ok(_) => {}
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42S21") => {}
            Err(e) if is_disconnect(&e) => return Err(db_err(e)),
            Err(e) => {
                tracing::warn!(
                    "cannot add {column} to dbwarden_lock ({e}); this run records no lock_ttl there"
                );
                added = false;
                break;
            }
        }
    }
    sqlx::raw_sql("SET SESSION lock_wait_timeout = DEFAULT")
        .execute(&mut *conn)
        .await
        .map_err(db_err)?;
    Ok(added)
}

pub(crate) const AUDIT_TABLE: &str = "CREATE TABLE IF NOT EXISTS dbwarden_lock_audit (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at DATETIME(6) NOT NULL,
    namespace VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    action VARCHAR(64) NOT NULL, actor VARCHAR(512) NOT NULL,
    holder_execution_id CHAR(36) NULL, holder VARCHAR(512) NULL, reason TEXT NOT NULL
) ENGINE=InnoDB";

pub(crate) async fn read_status(
    conn: &mut MySqlConnection,
    namespace: &str,
    for_update: bool,
) -> Result<Option<StatusRow>, Error> {
    let lock = if for_update { " FOR UPDATE" } else { "" };
    let status = binds::read_status(conn, namespace, lock, db_err).await?;
    // A placeholder row inserted by a first acquire that never got further is no status at all.
    Ok(status.filter(|s| s.fencing_token > 0 || s.execution_id.is_some()))
}

/// The status row and the history in one consistent read (a read-only REPEATABLE READ
/// transaction with its snapshot taken at the start); missing tables read as empty.
pub(crate) async fn read_snapshot(
    conn: &mut MySqlConnection,
    namespace: &str,
    history: &str,
) -> Result<Snapshot, Error> {
    let begin = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY";
    dbwarden_sql::transaction(conn, begin, db_err, db_err, async |conn| {
        let present: Vec<String> = sqlx::query_scalar(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ('dbwarden_lock', ?)",
        )
        .bind(history)
        .fetch_all(&mut *conn)
        .await
        .map_err(db_err)?;
        let status = match present.iter().any(|t| t == "dbwarden_lock") {
            true => read_status(conn, namespace, false).await?,
            false => None,
        };
        let history = match present.iter().any(|t| t == history) {
            true => binds::read_history(conn, history, db_err).await?,
            false => Vec::new(),
        };
        Ok(Snapshot { status, history })
    })
    .await
}

/// Under the named lock: bump the fencing token and write our status row in one transaction,
/// with `audits`. Returns the new token and the row as it was before.
pub(crate) async fn bump_and_claim(
    conn: &mut MySqlConnection,
    namespace: &str,
    holder: &HolderInfo,
    conn_id: u64,
    settings: bool,
) -> Result<(FencingToken, Option<StatusRow>), Error> {
    // The row exists before the transaction, so `FOR UPDATE` takes a record lock, never a gap
    // lock (two namespaces' first runs would otherwise deadlock on their inserts).
    sqlx::query("INSERT IGNORE INTO dbwarden_lock (namespace, fencing_token, state) VALUES (?, 0, 'AVAILABLE')")
        .bind(namespace)
        .execute(&mut *conn)
        .await
        .map_err(db_err)?;
    dbwarden_sql::transaction(conn, "START TRANSACTION", db_err, db_err, async |conn| {
        let previous = read_status(conn, namespace, true).await?;
        // Without the holder-settings columns (an older table this user may not alter), the
        // same claim without them.
        let set = if settings {
            ", lock_ttl_ms = ?, heartbeat_interval_ms = ?"
        } else {
            ""
        };
        let mut q = sqlx::query(AssertSqlSafe(format!(
            "UPDATE dbwarden_lock SET execution_id = ?, owner_id = ?, fencing_token = fencing_token + 1,
               host = ?, pid = ?, db_connection_id = ?, state = 'RUNNING', acquired_at = UTC_TIMESTAMP(6),
               last_heartbeat_at = UTC_TIMESTAMP(6), expires_at = NULL, migration_version = NULL,
               migration_checksum = NULL{set}
             WHERE namespace = ?"
        )))
        .bind(holder.execution_id.to_string())
        .bind(&holder.owner)
        .bind(&holder.host)
        .bind(i64::from(holder.pid))
        .bind(conn_id.to_string());
        if settings {
            q = q
                .bind(holder.lock_ttl_ms.map(|ms| ms as i64))
                .bind(holder.heartbeat_interval_ms.map(|ms| ms as i64));
        }
        q.bind(namespace)
        .execute(&mut *conn)
        .await
        .map_err(db_err)?;
        let token = binds::stored_token(conn, namespace, "", db_err).await?;
        let token = token.ok_or_else(|| Error::database("the status row vanished"))?;
        Ok((FencingToken(token as u64), previous))
    })
    .await
}
