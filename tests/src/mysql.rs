//! Helpers for the MySQL / MariaDB tests: a fresh database per test on the server named by
//! `DBWARDEN_TEST_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`), dropped at the end,
//! and queries to look at what `dbwarden` wrote.

use std::time::Duration;

use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, Connection, Row};

/// The server URL for the tests.
pub fn server() -> String {
    crate::server_url(
        "DBWARDEN_TEST_MYSQL_URL",
        "mysql://root@127.0.0.1:3306/test",
    )
}

/// `url` with its database replaced by `db` (query string kept).
pub fn with_database(url: &str, db: &str) -> String {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let (base, query) = match url.find('?') {
        Some(q) => (&url[..q], &url[q..]),
        None => (url, ""),
    };
    let base = match base[after_scheme..].find('/') {
        Some(slash) => &base[..after_scheme + slash],
        None => base,
    };
    format!("{base}/{db}{query}")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

async fn connect(url: &str) -> MySqlConnection {
    let shown = dbwarden_core::url::redact(url);
    let conn = tokio::time::timeout(Duration::from_secs(10), MySqlConnection::connect(url)).await;
    match conn {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => panic!(
            "MySQL/MariaDB at {shown} is not reachable ({e}); start it with `scripts/services.sh mariadb` or set DBWARDEN_TEST_MYSQL_URL"
        ),
        Err(_) => panic!(
            "MySQL/MariaDB at {shown} did not answer within 10 s; start it with `scripts/services.sh mariadb` or set DBWARDEN_TEST_MYSQL_URL"
        ),
    }
}

/// An open connection of the test's own (see [`TestDb::session`]).
pub struct Session {
    rt: tokio::runtime::Runtime,
    conn: MySqlConnection,
}

impl Session {
    /// Run statements (text protocol, several allowed) on this session.
    pub fn exec(&mut self, sql: &str) {
        let conn = &mut self.conn;
        self.rt.block_on(async {
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        });
    }

    /// This session's connection id (`CONNECTION_ID()`), as the server's process list shows it.
    pub fn id(&mut self) -> u64 {
        let conn = &mut self.conn;
        self.rt.block_on(async {
            sqlx::query_scalar::<_, u64>("SELECT CONNECTION_ID()")
                .fetch_one(conn)
                .await
                .unwrap_or_else(|e| panic!("SELECT CONNECTION_ID(): {e}"))
        })
    }
}

/// A database of its own for one test: `dbw_<12 hex>`, created now and dropped on drop.
pub struct TestDb {
    pub name: String,
    /// `mysql://.../<name>` for `dbwarden -u`.
    pub url: String,
}

impl Default for TestDb {
    fn default() -> Self {
        Self::new()
    }
}

/// The Galera node's URL for the tests (`scripts/services.sh galera`).
pub fn galera_server() -> String {
    crate::server_url(
        "DBWARDEN_TEST_GALERA_URL",
        "mysql://root@127.0.0.1:3311/test",
    )
}

/// The three Galera nodes' URLs: the test node's (`DBWARDEN_TEST_GALERA_URL`, node 1 on 3311)
/// and the same with ports 3312 and 3313 (`scripts/services.sh galera`).
pub fn galera_nodes() -> Vec<String> {
    let first = galera_server();
    ["3311", "3312", "3313"]
        .iter()
        .map(|p| first.replacen(":3311", &format!(":{p}"), 1))
        .collect()
}

/// The first column of every row `sql` returns at `url` (`NULL` for NULL).
pub fn try_query_at(url: &str, sql: &str) -> Result<Vec<String>, String> {
    runtime().block_on(async {
        let mut c = connect(url).await;
        let rows = sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .fetch_all(&mut c)
            .await
            .map_err(|e| e.to_string())?;
        let _ = c.close().await;
        rows.iter()
            .map(|r| {
                r.try_get::<Option<String>, _>(0)
                    .map(|v| v.unwrap_or_else(|| "NULL".to_owned()))
                    .or_else(|_| {
                        r.try_get::<Option<i64>, _>(0)
                            .map(|v| v.map_or_else(|| "NULL".to_owned(), |i| i.to_string()))
                    })
                    .map_err(|e| format!("column 0: {e}"))
            })
            .collect()
    })
}

impl TestDb {
    pub fn new() -> Self {
        Self::on(&server())
    }

    /// A database of its own on the server at `server` (another server than the default).
    pub fn on(server: &str) -> Self {
        let name = crate::unique_name("dbw");
        let server = server.to_owned();
        runtime().block_on(async {
            let mut c = connect(&server).await;
            sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
                .execute(&mut c)
                .await
                .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
            let _ = c.close().await;
        });
        TestDb {
            url: with_database(&server, &name),
            name,
        }
    }

    /// The same URL with the `mariadb://` scheme.
    pub fn mariadb_url(&self) -> String {
        self.url.replacen("mysql://", "mariadb://", 1)
    }

    /// Run statements (text protocol, several allowed) in this database.
    pub fn exec(&self, sql: &str) {
        let url = self.url.clone();
        runtime().block_on(async {
            let mut c = connect(&url).await;
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(&mut c)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            let _ = c.close().await;
        });
    }

    /// A connection of the test's own to this database that stays open (to hold a row lock, a
    /// transaction) until it is dropped.
    pub fn session(&self) -> Session {
        let rt = runtime();
        let conn = rt.block_on(connect(&self.url));
        Session { rt, conn }
    }

    /// The first column of every row, as strings (`NULL` for NULL).
    pub fn query(&self, sql: &str) -> Vec<String> {
        self.try_query(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// [`TestDb::query`], with the server's error instead of a panic.
    pub fn try_query(&self, sql: &str) -> Result<Vec<String>, String> {
        try_query_at(&self.url, sql)
    }

    /// A single number (`SELECT COUNT(*) ...`).
    pub fn count(&self, sql: &str) -> i64 {
        let v = self.query(sql);
        v.first()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{sql}: expected a number, got {v:?}"))
    }

    /// Whether `table` exists in this database.
    pub fn has_table(&self, table: &str) -> bool {
        self.count(&format!(
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}'"
        )) > 0
    }

    /// Wait until the server runs a statement starting with `prefix` in this database (a
    /// holder's statement is in flight), at most `limit`.
    pub fn wait_running(&self, prefix: &str, limit: Duration) {
        let sql = format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND INFO LIKE '{}%'",
            prefix.replace('\'', "''")
        );
        self.wait_count(&sql, 1, limit);
    }

    /// Poll `sql` (a number) until it is at least `min`, at most `limit`.
    pub fn wait_count(&self, sql: &str, min: i64, limit: Duration) {
        self.wait_count_every(sql, min, limit, Duration::from_millis(25));
    }

    /// Wait until connection `id` has a transaction open, as `information_schema.INNODB_TRX`
    /// shows it. The server fills that table from a cache it refreshes only when nobody read
    /// it for 100 ms: pollers that read it faster, together (the tests of one binary run side
    /// by side), keep it stale for as long as they poll, and none of them ever sees a
    /// transaction begun after the last refresh. So this polls every 400 ms.
    pub fn wait_for_transaction(&self, id: &str, limit: Duration) {
        self.wait_count_every(
            &format!(
                "SELECT count(*) FROM information_schema.INNODB_TRX \
                 WHERE CAST(trx_mysql_thread_id AS SIGNED) = {id}"
            ),
            1,
            limit,
            Duration::from_millis(400),
        );
    }

    fn wait_count_every(&self, sql: &str, min: i64, limit: Duration, every: Duration) {
        let t0 = std::time::Instant::now();
        loop {
            // The tables may not exist yet: an error counts as "not yet".
            let n = self
                .try_query(sql)
                .ok()
                .and_then(|v| v.first().and_then(|s| s.parse().ok()))
                .unwrap_or(-1);
            if n >= min {
                return;
            }
            assert!(
                t0.elapsed() < limit,
                "timed out after {limit:?} waiting for {sql} >= {min} (last {n})"
            );
            std::thread::sleep(every);
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // On its own server (dropping the database a session is in is allowed).
        let server = self.url.clone();
        let name = self.name.clone();
        let _ = std::panic::catch_unwind(move || {
            runtime().block_on(async {
                let mut c = connect(&server).await;
                let _ = sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS `{name}`")))
                    .execute(&mut c)
                    .await;
                let _ = c.close().await;
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn database_is_replaced_and_query_kept() {
        assert_eq!(
            with_database("mysql://root@127.0.0.1:3306/test", "x"),
            "mysql://root@127.0.0.1:3306/x"
        );
        assert_eq!(
            with_database("mysql://u:p@h/test?ssl-mode=disabled", "x"),
            "mysql://u:p@h/x?ssl-mode=disabled"
        );
        assert_eq!(with_database("mysql://root@h", "x"), "mysql://root@h/x");
    }
}
