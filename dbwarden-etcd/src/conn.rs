//! Where the cluster is (the URL) and every call to it: bounded, and tried again up to [`TRIES`]
//! times on a member that is down or lost its leader (the client does not route around a dead
//! one). A second try of a call whose answer was lost is harmless: the take knows its lease, an
//! unlock its audit row's key, a release that its key is gone while its lease lives.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::TimeDelta;
use dbwarden_core::Error;
use dbwarden_core::config::Settings;
use etcd_client::{
    Client, ConnectOptions, EventType, GetOptions, GetResponse, Txn, TxnResponse, WatchFilterType,
    WatchOptions,
};
use percent_encoding::percent_decode_str;

/// How many times one call is tried (the pauses between tries add up to 3 s: an election).
const TRIES: u32 = 5;

/// The cluster of an `etcd://` URL.
#[derive(Clone)]
pub(crate) struct Where {
    endpoints: Vec<String>,
    user: Option<(String, String)>,
    pub prefix: String,
    /// The URL without credentials, as messages name it.
    pub target: String,
    pub connect_timeout: Duration,
    statement_timeout: Duration,
}

impl Where {
    /// `etcd://[user:password@]host[:port][,host[:port]…][/prefix]`, checked without connecting.
    pub fn parse(url: &str, settings: &Settings) -> Result<Where, Error> {
        let bad = |why: &str| {
            Error::usage(format!(
                "invalid etcd URL {}: {why} (etcd://[user:password@]host:2379[,host2:2379,…][/prefix])",
                dbwarden_core::url::redact(url)
            ))
        };
        let p = dbwarden_core::url::parts(url).ok_or_else(|| bad("no etcd://"))?;
        if p.query.is_some() || url.contains('#') {
            return Err(bad("it takes no options"));
        }
        let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
        let user = p.userinfo.map(|u| {
            let (name, pass) = u.split_once(':').unwrap_or((u, ""));
            (decode(name), decode(pass))
        });
        let mut endpoints = Vec::new();
        for host in p.hosts {
            endpoints.push(match host.rsplit_once(':') {
                Some((h, port)) if !h.is_empty() && port.parse::<u16>().is_ok() => host.to_owned(),
                None if !host.is_empty() && !host.contains(char::is_whitespace) => {
                    format!("{host}:2379")
                }
                // Not echoed after credentials: an unencoded `/` in a password ends up here.
                _ if p.userinfo.is_some() => return Err(bad("a host is not host:port")),
                _ => return Err(bad(&format!("{host:?} is not host:port"))),
            });
        }
        let prefix = Some(p.path.trim_matches('/')).filter(|p| !p.is_empty());
        let prefix = prefix.unwrap_or("dbwarden");
        if !prefix
            .chars()
            .all(|c| c.is_alphanumeric() || "_-./".contains(c))
        {
            return Err(bad("the prefix takes letters, digits, _ - . and /"));
        }
        Ok(Where {
            target: format!("etcd://{}/{prefix}", endpoints.join(",")),
            endpoints,
            user,
            prefix: prefix.to_owned(),
            connect_timeout: settings.connect_timeout,
            statement_timeout: settings.statement_timeout,
        })
    }
}

/// A client of the cluster, shared by the lock, its holdings and its waiters.
#[derive(Clone)]
pub(crate) struct Conn {
    client: Client,
    place: Where,
    /// How long one try may wait for its answer.
    per_try: Duration,
    /// The newest revision any answer carried: a waiter watches from just after it.
    seen: Arc<AtomicI64>,
}

/// A member that is down, has no leader, or did not answer: another try may reach one that can.
fn transient(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        E::TransportError(_) | E::IoError(_) => true,
        E::GRpcStatus(s) => matches!(
            s.code(),
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown
        ),
        _ => false,
    }
}

impl Conn {
    pub async fn open(place: &Where) -> Result<Conn, Error> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(place.connect_timeout)
            .with_keep_alive(place.connect_timeout, place.connect_timeout)
            .with_require_leader(true)
            // A login token expires unused, and with the member that issued it.
            .with_auto_token_refresh(true);
        if let Some((name, pass)) = &place.user {
            opts = opts.with_user(name.clone(), pass.clone());
        }
        let endpoints: Vec<String> = place
            .endpoints
            .iter()
            .map(|e| format!("http://{e}"))
            .collect();
        let client = tokio::time::timeout(
            place.connect_timeout,
            Client::connect(endpoints, Some(opts)),
        )
        .await
        .map_err(|_| Error::unreachable(&place.target, "no member answered in time"))?
        .map_err(|e| Error::unreachable_from(&place.target, e.to_string(), e))?;
        Ok(Conn {
            client,
            place: place.clone(),
            per_try: place.statement_timeout,
            seen: Arc::new(AtomicI64::new(0)),
        })
    }

    /// This client with each try bounded by `d` (at most the statement timeout): a heartbeat
    /// must get past a member that does not answer at all within its own interval.
    pub fn each_try_within(&self, d: Duration) -> Conn {
        Conn {
            per_try: d.min(self.place.statement_timeout),
            ..self.clone()
        }
    }

    /// `f` on the client, bounded and tried again as the module says.
    async fn call<T, Fut>(&self, what: &str, f: impl Fn(Client) -> Fut) -> Result<T, Error>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut last = String::new();
        for attempt in 0..TRIES {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await; // 0.2 … 1.6 s
            }
            match tokio::time::timeout(self.per_try, f(self.client.clone())).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if !transient(&e) => {
                    return Err(Error::database(format!("etcd: {what}: {e}")));
                }
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => {
                    last = format!(
                        "no answer within {}",
                        dbwarden_core::duration::human(self.per_try)
                    )
                }
            }
            tracing::debug!("etcd: {what}: {last} (try {} of {TRIES})", attempt + 1);
        }
        Err(Error::unreachable(
            &self.place.target,
            format!("{what}: {last}"),
        ))
    }

    fn saw(&self, header: Option<&etcd_client::ResponseHeader>) {
        let revision = header.map_or(0, |h| h.revision());
        self.seen.fetch_max(revision, Ordering::SeqCst);
    }

    pub async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse, Error> {
        let reply = self
            .call(what, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        self.saw(reply.header());
        Ok(reply)
    }

    pub async fn get(
        &self,
        what: &str,
        key: &str,
        opts: Option<GetOptions>,
    ) -> Result<GetResponse, Error> {
        let reply = self
            .call(what, |mut c| {
                let opts = opts.clone();
                async move { c.get(key, opts).await }
            })
            .await?;
        self.saw(reply.header());
        Ok(reply)
    }

    /// A new lease of `ttl` (whole seconds, rounded up); its id.
    pub async fn grant(&self, ttl: Duration) -> Result<i64, Error> {
        let secs = ttl.as_secs_f64().ceil() as i64;
        let grant = |mut c: Client| async move { c.lease_grant(secs, None).await };
        Ok(self.call("grant a lease", grant).await?.id())
    }

    /// End a lease (and delete its keys), best effort: one that stays runs out by its ttl.
    pub async fn revoke(&self, lease: i64) {
        let revoke = |mut c: Client| async move { c.lease_revoke(lease).await };
        if let Err(e) = self.call("revoke a lease", revoke).await {
            tracing::debug!("etcd: {e}");
        }
    }

    /// Renew `lease` once: `false` when etcd no longer has it.
    pub async fn keep_alive(&self, lease: i64) -> Result<bool, Error> {
        self.call("renew the lease", |mut c| async move {
            match c.lease_keep_alive(lease).await {
                Ok(_) => Ok(true),
                Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// `lease`'s granted and remaining ttl (whole seconds).
    pub async fn time_to_live(&self, lease: i64) -> Result<(TimeDelta, TimeDelta), Error> {
        let read = |mut c: Client| async move { c.lease_time_to_live(lease, None).await };
        let reply = self.call("read the lease", read).await?;
        let secs = |s: i64| TimeDelta::seconds(s.max(0));
        Ok((secs(reply.granted_ttl()), secs(reply.ttl())))
    }

    /// Return once a key under `prefix` is deleted (a release, an expiry, an unlock) after the
    /// newest revision this client saw, at the latest after `max`.
    pub async fn wait_for_delete(&self, prefix: &str, max: Duration) {
        if self.seen.load(Ordering::SeqCst) == 0 {
            // Nothing read yet (an outer lock `wait` only watches): from now, not from the
            // first revision, whose deletes long past would end every pause at once.
            let opts = GetOptions::new().with_prefix().with_count_only();
            let _ = self.get("read the revision", prefix, Some(opts)).await;
        }
        let from = self.seen.load(Ordering::SeqCst) + 1;
        let watch = async {
            let opts = WatchOptions::new()
                .with_prefix()
                .with_start_revision(from)
                .with_filters([WatchFilterType::NoPut]);
            // A watch that cannot start or breaks leaves the wait to its end (core's poll).
            if let Ok(mut stream) = self.client.clone().watch(prefix, Some(opts)).await {
                while let Ok(Some(r)) = stream.message().await {
                    let deleted = (r.events().iter())
                        .filter(|e| e.event_type() == EventType::Delete)
                        .filter_map(|e| e.kv().map(|kv| kv.mod_revision()))
                        .max();
                    if let Some(at) = deleted {
                        self.seen.fetch_max(at, Ordering::SeqCst);
                    }
                    if deleted.is_some() || r.canceled() {
                        return;
                    }
                }
            }
            std::future::pending::<()>().await
        };
        let _ = tokio::time::timeout(max, watch).await;
    }
}
