//! Waking waiters: one `LISTEN dbwarden_release` connection per process, started the first time
//! the lock is found busy. A releasing holder NOTIFYs with its namespace as payload, so a waiter
//! retries within milliseconds instead of a backoff interval.
//!
//! A holder that dies sends nothing; the server frees its lock when its session ends, and the
//! waiter finds out by polling the try-lock, at least every [`SILENT_DEATH_POLL`].
//!
//! The listening connection is also a session the waiter can try the lock on ([`Waiter::conn`]):
//! a run that waits only to look again (`migrate` while another run applies) keeps this one
//! connection, not two, so 64 replicas waiting at once hold 64 connections, not 128 (the
//! server's default `max_connections` is 100). Notifications that arrive while a query runs on
//! it are buffered by the driver and counted on the next wait.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use dbwarden_core::wait::SILENT_DEATH_POLL;
use dbwarden_core::{Error, WakeUp};
use sqlx::Acquire;
use sqlx::postgres::{PgConnection, PgListener, PgPool, PgPoolOptions};

use crate::lock::{RELEASE_CHANNEL, Target};
use crate::{Listening, PgLock};

/// How long a LISTEN connection may take to set up: at least this, or four times what the
/// last connection to the server took (a slow link), never more than `connect_timeout`.
/// sqlx's pool retries a connection the server refuses for want of a slot (53300 is
/// "transient" to it) until its acquire timeout, a reconnect storm against a full server; a
/// waiter that cannot listen within this polls instead ([`SILENT_DEATH_POLL`]), which costs the
/// server nothing new.
pub const LISTEN_SET_UP: Duration = Duration::from_secs(1);

fn set_up_bound(target: &Target) -> Duration {
    let last = Duration::from_micros(target.last_connect_us.load(Ordering::Relaxed));
    (last * 4).max(LISTEN_SET_UP).min(target.connect_timeout)
}

/// The listening connection and the releases heard on it.
pub struct Waiter {
    /// `None` only inside [`Waiter::into_connection`].
    listener: Option<PgListener>,
    /// The one-connection pool the listener's connection comes from and goes back to.
    pool: PgPool,
    namespace: String,
    heard: u64,
}

impl Drop for Waiter {
    /// Close the pool: a connection still in it (a shared lock may have been taken on it just
    /// before an error) is closed when the listener gives it back, never left open.
    fn drop(&mut self) {
        let pool = self.pool.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { pool.close().await });
        }
    }
}

impl Waiter {
    /// Connect and LISTEN; returns once the LISTEN is in effect.
    pub async fn start(target: &Target, namespace: &str) -> Result<Waiter, Error> {
        let set_up = set_up_bound(target);
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .test_before_acquire(false)
            .acquire_timeout(set_up)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(target.options_now());
        let pool = tokio::time::timeout(set_up, pool)
            .await
            .map_err(|_| Error::unreachable(target.shown.clone(), "LISTEN connection timed out"))?
            .map_err(|e| Error::unreachable_from(target.shown.clone(), e.to_string(), e))?;
        let mut listener = PgListener::connect_with(&pool)
            .await
            .map_err(|e| target.db_err(e))?;
        // A lost connection is made again on the next use, not inside a wait.
        listener.eager_reconnect(false);
        target
            .bounded_db("LISTEN", listener.listen(RELEASE_CHANNEL))
            .await?;
        Ok(Waiter {
            listener: Some(listener),
            pool,
            namespace: namespace.to_owned(),
            heard: 0,
        })
    }

    /// The listening session, to try the lock on (connected again, and listening again, if the
    /// connection was lost). Its backend pid can change across such a loss.
    pub async fn conn(&mut self) -> Result<&mut PgConnection, sqlx::Error> {
        self.listener_mut().acquire().await
    }

    fn listener_mut(&mut self) -> &mut PgListener {
        self.listener
            .as_mut()
            .expect("taken only by into_connection")
    }

    /// Stop listening and hand the connection over: the waiter that got the lock makes it its
    /// heartbeat connection (or, for a shared lock taken on [`Waiter::conn`], its session)
    /// instead of opening one inside the hand-over. Dropping the listener sends `UNLISTEN *`
    /// and gives the connection back to the pool, from which it is taken for good. `None` if
    /// that does not happen within `limit` (the caller connects anew). The pool replaces a
    /// connection that failed on the way back with a new one: a caller that took a lock on the
    /// old one checks the backend pid.
    pub async fn into_connection(mut self, limit: Duration) -> Option<PgConnection> {
        drop(self.listener.take());
        match tokio::time::timeout(limit, self.pool.acquire()).await {
            Ok(Ok(conn)) => Some(conn.detach()),
            // Dropping `self` closes the pool, and with it the connection when it comes back.
            _ => None,
        }
    }

    fn count(&mut self, n: &sqlx::postgres::PgNotification) {
        if n.payload() == self.namespace {
            self.heard += 1;
        }
    }

    /// Releases heard so far (counting those the driver buffered while a query ran).
    pub fn heard(&mut self) -> u64 {
        while let Some(n) = self.listener_mut().next_buffered() {
            self.count(&n);
        }
        self.heard
    }

    /// Wait until more than `seen` releases were heard, at most `max`.
    pub async fn wait_past(&mut self, seen: u64, max: Duration) {
        let until = tokio::time::Instant::now() + max;
        while self.heard() <= seen {
            // Cancel-safe: the driver keeps a partly read message for the next read.
            match tokio::time::timeout_at(until, self.listener_mut().try_recv()).await {
                Err(_) => return,
                Ok(Ok(Some(n))) => self.count(&n),
                Ok(Ok(None)) | Ok(Err(_)) => {
                    // The connection is gone; polling still finds the release, and the next
                    // use connects again.
                    tracing::debug!("LISTEN connection lost; polling until the next attempt");
                    tokio::time::sleep_until(until).await;
                    return;
                }
            }
        }
    }
}

#[async_trait]
impl WakeUp for PgLock {
    async fn wait_for_release(&self, max: Duration) {
        let max = max.min(SILENT_DEATH_POLL);
        let mut listening = self.listening.lock().await;
        match &mut *listening {
            Listening::On(w) => w.wait_past(self.seen.load(Ordering::SeqCst), max).await,
            Listening::NotYet if !self.room_to_listen().await => {
                // The LISTEN connection would take one more slot of a (nearly) full server, and
                // sqlx's pool retries a refused connect (53300 is "transient" to it) until
                // connect_timeout: a reconnect storm of its own. Poll on the kept session.
                tracing::debug!(
                    "the server has few free connection slots; polling instead of LISTEN"
                );
                *listening = Listening::Unavailable;
                tokio::time::sleep(max).await;
            }
            Listening::NotYet => match Waiter::start(&self.target, self.namespace.as_str()).await {
                // Then wait as usual. A release before the LISTEN took effect went unheard and
                // costs this one pause; returning at once instead let runners that look, find
                // work and fail the exclusive try (other looks hold the shared lock) loop
                // without a pause, keeping the shared lock so busy that no exclusive try got
                // through.
                Ok(mut w) => {
                    self.seen.store(w.heard(), Ordering::SeqCst);
                    w.wait_past(self.seen.load(Ordering::SeqCst), max).await;
                    *listening = Listening::On(w);
                }
                Err(e) => {
                    tracing::info!("cannot LISTEN for releases ({e}); polling instead");
                    *listening = Listening::Unavailable;
                }
            },
            Listening::Unavailable => tokio::time::sleep(max).await,
        }
    }
}
