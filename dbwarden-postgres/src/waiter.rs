//! Waking waiters: one `LISTEN dbwarden_release` connection per process, started the first time
//! the lock is found busy. A releasing holder NOTIFYs with its namespace as payload, so a waiter
//! retries within milliseconds instead of a backoff interval.
//!
//! A holder that dies sends nothing; the server frees its lock when its session ends, and the
//! waiter finds out by polling the try-lock, at least every [`CRASH_POLL`].

use std::time::Duration;

use dbwarden_core::Error;
use sqlx::postgres::{PgConnection, PgListener, PgPool, PgPoolOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::lock::{RELEASE_CHANNEL, Target};

/// The longest a waiter sleeps between try-locks: a crashed holder sends no NOTIFY, and a
/// `pg_try_advisory_lock` costs the server next to nothing.
pub const CRASH_POLL: Duration = Duration::from_millis(200);

/// The listening task; the counter goes up with every release NOTIFY for our namespace.
pub struct Waiter {
    releases: watch::Receiver<u64>,
    /// `None` once [`Waiter::into_connection`] took it.
    task: Option<JoinHandle<()>>,
    /// The one-connection pool the listener's connection comes from and goes back to.
    pool: PgPool,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Waiter {
    /// Connect and LISTEN; returns once the LISTEN is in effect.
    pub async fn start(target: &Target, namespace: &str) -> Result<Waiter, Error> {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .test_before_acquire(false)
            .acquire_timeout(target.connect_timeout)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(target.options.clone());
        let pool = tokio::time::timeout(target.connect_timeout, pool)
            .await
            .map_err(|_| Error::unreachable(target.shown.clone(), "LISTEN connection timed out"))?
            .map_err(|e| Error::unreachable(target.shown.clone(), e))?;
        let mut listener = PgListener::connect_with(&pool)
            .await
            .map_err(|e| target.db_err(e))?;
        target
            .bounded("LISTEN", async {
                listener
                    .listen(RELEASE_CHANNEL)
                    .await
                    .map_err(|e| target.db_err(e))
            })
            .await?;
        let (tx, rx) = watch::channel(0u64);
        let namespace = namespace.to_owned();
        let task = tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    Ok(n) if n.payload() == namespace => {
                        tx.send_modify(|c| *c += 1);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        // Polling still finds the release; try to listen again shortly.
                        tracing::debug!("LISTEN connection failed: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
        Ok(Waiter {
            releases: rx,
            task: Some(task),
            pool,
        })
    }

    /// Stop listening and hand the connection over: the waiter that got the lock makes it its
    /// heartbeat connection instead of opening one inside the hand-over. Dropping the listener
    /// sends `UNLISTEN *` and gives the connection back to the pool, from which it is taken
    /// for good. `None` if that does not happen within `limit` (the caller connects anew).
    pub async fn into_connection(mut self, limit: Duration) -> Option<PgConnection> {
        let task = self.task.take()?;
        task.abort();
        let _ = task.await;
        match tokio::time::timeout(limit, self.pool.acquire()).await {
            Ok(Ok(conn)) => Some(conn.detach()),
            _ => None,
        }
    }

    /// Releases heard so far.
    pub fn heard(&self) -> u64 {
        *self.releases.borrow()
    }

    /// Wait until more than `seen` releases were heard, at most `max`.
    pub async fn wait_past(&self, seen: u64, max: Duration) {
        let mut rx = self.releases.clone();
        let _ = tokio::time::timeout(max, rx.wait_for(|n| *n > seen)).await;
    }
}
