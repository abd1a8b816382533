//! One ClickHouse server over HTTP: the `clickhouse` client, every request bounded by a timeout,
//! server errors read as their `Code: NN` (18.16 sends no `X-ClickHouse-Exception-Code` header,
//! so the code comes from the body), identifiers validated and quoted, `ON CLUSTER` rendered.

use std::time::Duration;

use clickhouse::query::Query;
use clickhouse::{Client, Compression};
use dbwarden_core::Error;
use tokio::sync::OnceCell;

/// Server error codes this crate acts on.
pub mod code {
    pub const TABLE_ALREADY_EXISTS: u32 = 57;
    pub const UNKNOWN_TABLE: u32 = 60;
    pub const UNKNOWN_DATABASE: u32 = 81;
    /// A query met a table that a concurrent DROP is removing.
    pub const TABLE_IS_DROPPED: u32 = 218;
    pub const READONLY: u32 = 164;
    pub const UNKNOWN_USER: u32 = 192;
    pub const WRONG_PASSWORD: u32 = 193;
    pub const REQUIRED_PASSWORD: u32 = 194;
    pub const AUTHENTICATION_FAILED: u32 = 516;
    /// `ON CLUSTER` DDL: not every host ran it within `distributed_ddl_task_timeout` (it stays
    /// queued and runs on the missing host when it returns).
    pub const DDL_TIMEOUT: u32 = 159;
    /// A quorum insert: fewer replicas alive than the quorum (nothing was written).
    pub const TOO_FEW_LIVE_REPLICAS: u32 = 285;
    /// A quorum insert while another one on the same table is still in progress (nothing was
    /// written; retried).
    pub const QUORUM_BUSY: u32 = 286;
    /// A quorum insert the other replicas did not confirm within `insert_quorum_timeout`: the
    /// rows are on this host and may still replicate.
    pub const QUORUM_TIMEOUT: u32 = 319;
}

/// A failed request, before it is given a meaning for the user.
#[derive(Debug, Clone)]
pub enum ChError {
    /// The server answered with an exception.
    Server { code: u32, message: String },
    /// No answer: connection refused, reset, or the timeout ran out; with the client's error
    /// where there is one.
    Unreachable(String, Option<std::sync::Arc<clickhouse::error::Error>>),
    /// Anything else (a row that does not decode, ...), with the client's error where there is
    /// one, kept as the source of the error the user reads.
    Other(String, Option<std::sync::Arc<clickhouse::error::Error>>),
}

impl ChError {
    pub fn is(&self, c: u32) -> bool {
        matches!(self, ChError::Server { code, .. } if *code == c)
    }

    /// The table does not exist, or is being dropped right now.
    pub fn is_gone(&self) -> bool {
        self.is(code::UNKNOWN_TABLE) || self.is(code::TABLE_IS_DROPPED)
    }

    fn from_client(e: clickhouse::error::Error) -> Self {
        use clickhouse::error::Error as E;
        match e {
            E::BadResponse(body) => match parse_code(&body) {
                Some(code) => ChError::Server {
                    code,
                    message: short_message(&body),
                },
                None => ChError::Other(short_message(&body), None),
            },
            e @ E::Network(_) => ChError::Unreachable(e.to_string(), Some(std::sync::Arc::new(e))),
            E::TimedOut => ChError::Unreachable("timed out".into(), None),
            other => ChError::Other(other.to_string(), Some(std::sync::Arc::new(other))),
        }
    }
}

impl std::fmt::Display for ChError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChError::Server { code, message } => write!(f, "code {code}: {message}"),
            ChError::Unreachable(m, _) | ChError::Other(m, _) => f.write_str(m),
        }
    }
}

impl std::error::Error for ChError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ChError::Unreachable(_, Some(e)) | ChError::Other(_, Some(e)) => Some(e.as_ref()),
            _ => None,
        }
    }
}

/// `Code: 57, e.displayText() = …` → 57.
pub fn parse_code(body: &str) -> Option<u32> {
    let at = body.find("Code: ")? + "Code: ".len();
    let digits: String = body[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The useful part of an exception body, on one line and short.
fn short_message(body: &str) -> String {
    let mut text = body.split(", e.what()").next().unwrap_or(body).trim();
    if let Some(code) = parse_code(text) {
        text = text
            .trim_start_matches(&format!("Code: {code}"))
            .trim_start_matches([',', '.', ' ']);
    }
    let text = text
        .trim_start_matches("e.displayText() = ")
        .trim_start_matches("DB::Exception: ");
    let one = dbwarden_core::error::one_line(text);
    if one.chars().count() > 300 {
        format!("{}…", one.chars().take(300).collect::<String>())
    } else {
        one
    }
}

/// `` `name` `` for an identifier already validated to `[A-Za-z0-9_]`.
pub fn quote(ident: &str) -> String {
    format!("`{}`", ident.replace('`', "``"))
}

/// ` ON CLUSTER `name`` when a cluster is configured, else nothing.
pub fn on_cluster(cluster: Option<&str>) -> String {
    cluster.map_or_else(String::new, |c| format!(" ON CLUSTER {}", quote(c)))
}

/// Where migration text asks for the cluster clause (see the crate docs).
pub const ON_CLUSTER_PLACEHOLDER: &str = "{on_cluster}";

/// Replace `{on_cluster}` in a migration statement with ` ON CLUSTER `name`` or nothing.
pub fn render_statement(stmt: &str, cluster: Option<&str>) -> String {
    stmt.replace(ON_CLUSTER_PLACEHOLDER, &on_cluster(cluster))
}

/// Connection settings and the client; cheap to clone (the client pools connections).
#[derive(Clone)]
pub struct Server {
    client: Client,
    /// `host:port`, for messages (never a password).
    pub target: String,
    /// Validated identifier.
    pub database: String,
    /// Validated identifier.
    pub cluster: Option<String>,
    pub connect_timeout: Duration,
    pub statement_timeout: Duration,
    ready: std::sync::Arc<OnceCell<String>>,
    /// With a cluster: how many hosts it has (every one a replica of dbwarden's tables).
    pub(crate) hosts: std::sync::Arc<OnceCell<u64>>,
}

/// How to reach the server (parsed from the URL by `lib.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `http://host:port`.
    pub http_url: String,
    pub target: String,
    pub database: String,
    pub user: Option<String>,
    pub password: Option<String>,
    /// Ask the server for `RowBinaryWithNamesAndTypes` and check row types (needs a server that
    /// has that format; 18.16 does not).
    pub validation: bool,
}

impl Server {
    pub fn new(
        ep: &Endpoint,
        cluster: Option<String>,
        connect_timeout: Duration,
        statement_timeout: Duration,
    ) -> Self {
        let mut client = Client::default()
            .with_url(&ep.http_url)
            .with_database(&ep.database)
            .with_compression(Compression::None)
            .with_validation(ep.validation);
        if let Some(u) = &ep.user {
            client = client.with_user(u);
        }
        if let Some(p) = &ep.password {
            client = client.with_password(p);
        }
        Server {
            client,
            target: ep.target.clone(),
            database: ep.database.clone(),
            cluster,
            connect_timeout,
            statement_timeout,
            ready: std::sync::Arc::new(OnceCell::new()),
            hosts: std::sync::Arc::new(OnceCell::new()),
        }
    }

    /// `` `db`.`table` ``.
    pub fn table(&self, name: &str) -> String {
        format!("{}.{}", quote(&self.database), quote(name))
    }

    pub fn on_cluster(&self) -> String {
        on_cluster(self.cluster.as_deref())
    }

    /// A query with `?` placeholders for `.bind()` (escaped client-side; 18.16 has no
    /// server-side parameters).
    pub fn query(&self, sql: &str) -> Query {
        self.client.query(sql)
    }

    /// A statement sent verbatim (migration text: a `?` in it is not a placeholder).
    pub fn raw(&self, sql: &str) -> Query {
        self.client.query_raw(sql)
    }

    /// The first contact: reach the server within `connect_timeout`, check the database.
    /// Returns the server version; later calls return it at once.
    pub async fn ready(&self) -> Result<&str, Error> {
        let v = self
            .ready
            .get_or_try_init(|| async {
                let q = self.query("SELECT version() AS v, toUInt64(count()) AS n FROM system.databases WHERE name = ?")
                    .bind(&self.database);
                let rows: Vec<(String, u64)> =
                    match tokio::time::timeout(self.connect_timeout, q.fetch_all()).await {
                        Ok(Ok(r)) => r,
                        Ok(Err(e)) => return Err(self.error(ChError::from_client(e))),
                        Err(_) => {
                            return Err(Error::unreachable(
                                &self.target,
                                format!(
                                    "no answer within the connect timeout ({})",
                                    dbwarden_core::duration::human(self.connect_timeout)
                                ),
                            ));
                        }
                    };
                let (version, n) = rows.into_iter().next().unwrap_or_default();
                if n == 0 {
                    return Err(Error::usage(format!(
                        "database `{}` does not exist on {}: create it (CREATE DATABASE {}) or fix the database in the URL",
                        self.database, self.target, self.database
                    )));
                }
                if let Some(c) = &self.cluster {
                    self.check_cluster(c).await?;
                }
                Ok(version)
            })
            .await?;
        Ok(v.as_str())
    }

    /// Run a statement that returns nothing, within the statement timeout.
    pub async fn execute(&self, q: Query) -> Result<(), ChError> {
        self.bounded(q.execute()).await
    }

    /// Run a statement without a client-side time limit (migration statements).
    pub async fn execute_unbounded(&self, q: Query) -> Result<(), ChError> {
        q.execute().await.map_err(ChError::from_client)
    }

    /// Fetch every row, within the statement timeout.
    pub async fn fetch<T>(&self, q: Query) -> Result<Vec<T>, ChError>
    where
        T: clickhouse::RowOwned + clickhouse::RowRead,
    {
        self.bounded(q.fetch_all::<T>()).await
    }

    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = clickhouse::error::Result<T>>,
    ) -> Result<T, ChError> {
        match tokio::time::timeout(self.statement_timeout, fut).await {
            Ok(r) => r.map_err(ChError::from_client),
            Err(_) => Err(ChError::Unreachable(
                format!(
                    "no answer within the statement timeout ({})",
                    dbwarden_core::duration::human(self.statement_timeout)
                ),
                None,
            )),
        }
    }

    /// Turn a request failure into the error a user reads.
    pub fn error(&self, e: ChError) -> Error {
        match e {
            ChError::Unreachable(m, Some(source)) => {
                Error::unreachable_from(&self.target, m, source)
            }
            ChError::Unreachable(m, None) => Error::unreachable(&self.target, m),
            ChError::Server { code, message }
                if matches!(
                    code,
                    code::UNKNOWN_USER
                        | code::WRONG_PASSWORD
                        | code::REQUIRED_PASSWORD
                        | code::AUTHENTICATION_FAILED
                ) =>
            {
                Error::unreachable(
                    &self.target,
                    format!(
                        "the server refused the login (code {code}: {message}); check the user and password in the URL"
                    ),
                )
            }
            ChError::Server { code, message } if code == code::READONLY => Error::usage(format!(
                "the ClickHouse user on {} is read-only (code {code}: {message}); dbwarden needs a user that may create tables",
                self.target
            )),
            ChError::Server { code, message } if code == code::UNKNOWN_DATABASE => {
                Error::usage(format!(
                    "database `{}` does not exist on {} (code {code}: {message}): create it or fix the URL",
                    self.database, self.target
                ))
            }
            ChError::Server { code, message }
                if matches!(
                    code,
                    code::DDL_TIMEOUT | code::TOO_FEW_LIVE_REPLICAS | code::QUORUM_TIMEOUT
                ) =>
            {
                let what = match code {
                    code::DDL_TIMEOUT => "did not run the DDL in time",
                    code::TOO_FEW_LIVE_REPLICAS => {
                        "is down, and dbwarden writes its state to every host"
                    }
                    _ => "did not confirm the write in time",
                };
                let after = match code {
                    code::DDL_TIMEOUT => "; it stays queued and runs when that host is back",
                    code::TOO_FEW_LIVE_REPLICAS => "; nothing was written",
                    _ => "",
                };
                Error::unreachable(
                    &self.target,
                    format!(
                        "a host of cluster `{}` {what} (code {code}: {message}){after}",
                        self.cluster.as_deref().unwrap_or_default()
                    ),
                )
            }
            ChError::Other(m, Some(source)) => {
                Error::database_from(format!("ClickHouse {}: {m}", self.target), source)
            }
            other => Error::database(format!("ClickHouse {}: {other}", self.target)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_error_is_kept_as_the_source() {
        use std::error::Error as _;
        let ep = crate::url::parse("clickhouse://127.0.0.1:8123/db").unwrap();
        let s = Server::new(&ep, None, Duration::from_secs(1), Duration::from_secs(1));
        let raw = clickhouse::error::Error::Custom("a row that does not decode".into());
        let e = s.error(ChError::from_client(raw));
        assert_eq!(e.kind(), dbwarden_core::error::ErrorKind::Database, "{e}");
        let source = e.source().expect("the client's error is kept");
        assert!(source.to_string().contains("does not decode"), "{source}");
    }

    #[test]
    fn codes_come_from_the_body() {
        let body = "Code: 57, e.displayText() = DB::Exception: Table d.x already exists., e.what() = DB::Exception";
        assert_eq!(parse_code(body), Some(57));
        assert_eq!(short_message(body), "Table d.x already exists.");
        assert_eq!(
            parse_code("Code: 60. DB::Exception: Table x doesn't exist"),
            Some(60)
        );
        assert_eq!(parse_code("no code here"), None);
    }

    #[test]
    fn on_cluster_is_rendered_only_when_configured() {
        assert_eq!(on_cluster(None), "");
        assert_eq!(on_cluster(Some("prod")), " ON CLUSTER `prod`");
        let stmt = "CREATE TABLE IF NOT EXISTS t{on_cluster} (x UInt8) ENGINE = Log";
        assert_eq!(
            render_statement(stmt, Some("prod")),
            "CREATE TABLE IF NOT EXISTS t ON CLUSTER `prod` (x UInt8) ENGINE = Log"
        );
        assert_eq!(
            render_statement(stmt, None),
            "CREATE TABLE IF NOT EXISTS t (x UInt8) ENGINE = Log"
        );
        assert_eq!(render_statement("SELECT 1", Some("c")), "SELECT 1");
    }
}
