//! Waking waiters when a holder releases: one subscription to `dbwarden:{<ns>}:released` per
//! [`crate::RedisLock`] (shared by its clones and by every task waiting on it), fanned out to the
//! waiters through a counter. Missing a message only costs a poll interval: core's capped,
//! jittered backoff keeps retrying regardless.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;

use crate::client::RedisClient;

/// The subscription, started on first use and restarted after its connection dropped.
pub(crate) struct ReleaseListener {
    channel: String,
    client: RedisClient,
    connect_timeout: Duration,
    running: Mutex<Option<Running>>,
}

struct Running {
    releases: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl ReleaseListener {
    pub fn new(channel: String, client: RedisClient, connect_timeout: Duration) -> Self {
        ReleaseListener {
            channel,
            client,
            connect_timeout,
            running: Mutex::new(None),
        }
    }

    /// Sleep until a release is announced, at most `max`. Right after (re)subscribing it returns
    /// at once: a release between the caller's last attempt and the subscription would otherwise
    /// go unheard.
    pub async fn wait(&self, max: Duration) {
        let mut rx = {
            let mut running = self.running.lock().await;
            match running.as_ref() {
                Some(r) if !r.task.is_finished() => r.releases.subscribe(),
                _ => {
                    *running = self.subscribe().await;
                    if running.is_none() {
                        drop(running);
                        tokio::time::sleep(max).await;
                    }
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(max, rx.changed()).await;
    }

    async fn subscribe(&self) -> Option<Running> {
        for client in &self.client.pubsub_clients(self.connect_timeout).await {
            let attempt = async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(&self.channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            match tokio::time::timeout(self.connect_timeout, attempt).await {
                Ok(Ok(pubsub)) => {
                    let (tx, _) = watch::channel(0u64);
                    let releases = tx.clone();
                    let task = tokio::spawn(async move {
                        let mut messages = pubsub.into_on_message();
                        while messages.next().await.is_some() {
                            tx.send_modify(|n| *n = n.wrapping_add(1));
                        }
                    });
                    return Some(Running { releases, task });
                }
                Ok(Err(e)) => tracing::debug!("release channel: cannot subscribe: {e}"),
                Err(_) => tracing::debug!("release channel: subscribe timed out"),
            }
        }
        None
    }
}

impl Drop for ReleaseListener {
    fn drop(&mut self) {
        if let Some(r) = self.running.get_mut().take() {
            r.task.abort();
        }
    }
}
