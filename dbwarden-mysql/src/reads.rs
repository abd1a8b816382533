//! Reads without the lock, on the kept waiting session: the applied set and other tools' history.

use async_trait::async_trait;
use dbwarden_core::adopt::Tool;
use dbwarden_core::{Error, Snapshot, SnapshotRead};
use dbwarden_sql::binds;

use crate::lock::{self, Session, bounded};
use crate::{MySqlLock, tables};

#[async_trait]
impl dbwarden_core::adopt::OtherTools for MySqlLock {
    async fn other_tools(&self) -> Result<Vec<dbwarden_core::adopt::ForeignHistory>, Error> {
        // On the kept waiting session when there is one (`migrate` asks right after its look):
        // a full server refuses a new connection.
        let kept = self.waiting.take().await;
        if let Some(mut s) = kept {
            let read = lock::bounded(
                self.endpoint.statement_timeout,
                "reading other tools' history",
                binds::read_tools(&mut s.conn, &Tool::ALL, tables::db_err),
            )
            .await;
            match read {
                Ok(theirs) => {
                    self.waiting.put(s).await;
                    return Ok(theirs);
                }
                // The kept session may have ended meanwhile: a fresh one below (dropping this
                // one frees any lock it took while waiting).
                Err(e) => tracing::debug!("reading other tools' history on the kept session: {e}"),
            }
        }
        (self.endpoint)
            .once("reading other tools' history", async |c| {
                binds::read_tools(c, &Tool::ALL, tables::db_err).await
            })
            .await
    }
}

#[async_trait]
impl SnapshotRead for MySqlLock {
    /// On the kept waiting session (or a new one, kept afterwards for the exclusive try), so a
    /// look costs no connection of its own. A lock the session took while waiting is kept
    /// through the look: if something is pending, the next `try_acquire` claims it on this
    /// session (given back, another blocked waiter would take it to look, and so on, with
    /// nobody claiming); if nothing is, [`MigrationLock::stop_waiting`] gives it back.
    ///
    /// [`MigrationLock::stop_waiting`]: dbwarden_core::MigrationLock::stop_waiting
    async fn read_snapshot(&self) -> Result<Snapshot, Error> {
        let kept = self.waiting.take().await;
        let was_kept = kept.is_some();
        let mut s = match kept {
            Some(s) => s,
            None => self.endpoint.lock_session().await?,
        };
        let read = async |s: &mut Session| {
            bounded(
                self.endpoint.statement_timeout,
                "reading the applied set",
                tables::read_snapshot(&mut s.conn, self.namespace.as_str(), &self.history_table),
            )
            .await
        };
        let mut r = read(&mut s).await;
        if r.is_err() && was_kept {
            // A kept session may have ended since (a server restart, a KILL, between a library
            // user's runs): one try on a fresh session, as an attempt does.
            tracing::debug!("the kept session could not read; reading on a fresh one");
            drop(s);
            s = self.endpoint.lock_session().await?;
            r = read(&mut s).await;
        }
        // On an error the session is dropped (it may be mid-transaction), freeing any lock.
        if r.is_ok() {
            self.waiting.put(s).await;
        }
        r
    }
}
