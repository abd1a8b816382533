//! Taking the named lock: a `GET_LOCK` try or wait, a dead holder's `KILL`, and the claim.

use std::sync::Arc;
use std::time::Duration;

use dbwarden_core::error::BusyInfo;
use dbwarden_core::takeover::{Decision, Freed, Liveness, Probe, judge};
use dbwarden_core::wait::SILENT_DEATH_POLL;
use dbwarden_core::{Attempt, Error, Grant, HolderInfo};
use sqlx::mysql::MySqlConnection;

use crate::beat::LockBeat;
use crate::held::MySqlHeld;
use crate::lock::{self, GetLock, Session, bounded, get_lock};
use crate::store::MySqlStore;
use crate::tables::{bump_and_claim, create_tables};
use crate::{MySqlLock, status};

/// What [`MySqlLock::check_holder`] found.
pub(crate) enum Holder {
    /// Its liveness session is open: the process lives (or is paused).
    Alive,
    /// Its process was gone; its lock session has been `KILL`ed.
    Killed,
    /// Someone else holds the lock now, the session ended on its own, or it cannot be killed.
    Changed,
}

impl MySqlLock {
    /// `GET_LOCK(name, 0)`: one try that never waits.
    pub(crate) async fn get_lock_now(&self, s: &mut Session) -> Result<GetLock, Error> {
        let got = bounded(self.endpoint.statement_timeout, "GET_LOCK", async {
            get_lock(&mut s.conn, &self.lock_name, Duration::ZERO)
                .await
                .map_err(crate::tables::db_err)
        })
        .await?;
        s.holds = got == GetLock::Acquired;
        Ok(got)
    }

    /// A waiter's blocking `GET_LOCK` until `deadline`: `Some(true)` once `s` holds the lock,
    /// `Some(false)` at the deadline, `None` when the session failed (NULL, error, no answer).
    pub(crate) async fn block_in_get_lock(
        &self,
        s: &mut Session,
        deadline: tokio::time::Instant,
    ) -> Option<bool> {
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let slice = if s.suspect.is_some() {
                left.min(SILENT_DEATH_POLL)
            } else {
                left
            };
            if slice.is_zero() {
                return Some(false);
            }
            let limit = slice + self.endpoint.statement_timeout;
            match tokio::time::timeout(limit, get_lock(&mut s.conn, &self.lock_name, slice)).await {
                Ok(Ok(GetLock::Acquired)) => {
                    s.holds = true;
                    return Some(true);
                }
                Ok(Ok(GetLock::Busy)) => {}
                _ => return None,
            }
            if let Some(x) = s.suspect {
                match self.check_holder(&mut s.conn, x).await.ok()? {
                    Holder::Alive => {}
                    Holder::Changed => s.suspect = None,
                    Holder::Killed => {
                        s.suspect = None;
                        s.killed = Some(x);
                    }
                }
            }
        }
    }

    /// Whether the holder whose lock session is `x` still lives, and if its process is gone
    /// while the server still runs that session's statement, `KILL` the session: the server
    /// ends it and frees the lock for the next `GET_LOCK` of `conn`.
    pub(crate) async fn check_holder(
        &self,
        conn: &mut MySqlConnection,
        x: u64,
    ) -> Result<Holder, Error> {
        let limit = self.endpoint.statement_timeout;
        let (owner, alive_free) = bounded(limit, "checking the holder", async {
            sqlx::query_as::<_, (Option<i64>, Option<i64>)>(
                "SELECT CAST(IS_USED_LOCK(?) AS SIGNED), CAST(IS_FREE_LOCK(?) AS SIGNED)",
            )
            .bind(&self.lock_name)
            .bind(lock::alive_name(x))
            .fetch_one(&mut *conn)
            .await
            .map_err(crate::tables::db_err)
        })
        .await?;
        if owner.map(|o| o as u64) != Some(x) {
            return Ok(Holder::Changed);
        }
        // The fact: the liveness lock is free exactly when the holder's process is gone. Core
        // decides what that means.
        let process = match alive_free {
            Some(1) => Liveness::Dead,
            _ => Liveness::Alive,
        };
        if !matches!(
            judge(&Probe::session_holder(process)),
            Decision::Break { .. }
        ) {
            return Ok(Holder::Alive);
        }
        if self.kill_denied.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(Holder::Changed);
        }
        tracing::warn!(
            connection = x,
            "the lock holder's process is gone (its liveness session ended) but the server still runs its session's statement: killing connection {x} to take over"
        );
        let kill = tokio::time::timeout(limit, lock::kill_session(conn, x)).await;
        Ok(match kill {
            Ok(Ok(true)) => Holder::Killed,
            // It ended on its own meanwhile.
            Ok(Ok(false)) => Holder::Changed,
            Ok(Err(e)) => {
                let why = if lock::is_kill_denied(&e) {
                    self.kill_denied
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    "this user may not KILL it (that needs the same user, or CONNECTION_ADMIN or SUPER)".to_owned()
                } else {
                    format!("KILL failed: {e}")
                };
                tracing::warn!(
                    connection = x,
                    "the dead holder's session (connection {x}) keeps the lock until its statement ends: {why}"
                );
                Holder::Changed
            }
            Err(_) => {
                return Err(Error::database(format!(
                    "KILL {x}: the server did not answer within {} (statement_timeout)",
                    dbwarden_core::duration::human(limit)
                )));
            }
        })
    }

    pub(crate) async fn fresh_attempt(&self) -> Result<(Session, GetLock), Error> {
        let mut s = self.endpoint.lock_session().await?;
        let got = self.get_lock_now(&mut s).await?;
        Ok((s, got))
    }

    /// We hold the named lock on `s`: create the tables, bump the token, write the status row.
    pub(crate) async fn claim(
        &self,
        mut s: Session,
        holder: &HolderInfo,
    ) -> Result<Attempt, Error> {
        let ns = self.namespace.as_str();
        let limit = self.endpoint.statement_timeout;
        // The liveness lock is taken before the status row names this session: a waiter that
        // reads the row may rely on it. Its connection is opened while the tables are checked.
        let kept = self.kept_alive.take().await;
        let (kept, stale) = match kept {
            Some(a) if a.for_session == s.id => (Some(a), None),
            other => (None, other),
        };
        if let Some(a) = stale {
            let _ = sqlx::Connection::close(a.conn).await;
        }
        let lock_id = s.id;
        let (alive, tables) = tokio::join!(
            async {
                match kept {
                    Some(a) => match lock::still_alive(a, lock_id).await {
                        Ok(a) => Ok(Some(a)),
                        Err(gone) => {
                            // Ended, cut or stuck: make sure it holds nothing, then anew.
                            if let Ok(mut c) = self.endpoint.connect().await {
                                let _ =
                                    tokio::time::timeout(limit, lock::kill_session(&mut c, gone))
                                        .await;
                                let _ = sqlx::Connection::close(c).await;
                            }
                            self.endpoint.alive_session(lock_id).await
                        }
                    },
                    None => self.endpoint.alive_session(lock_id).await,
                }
            },
            bounded(
                limit,
                "creating the tables",
                create_tables(&mut s.conn, &self.history_table, &self.status_upgraded)
            ),
        );
        let settings = tables?;
        // On every early return `s` is dropped: its session ends and frees the lock. A full
        // server is `Error::Busy`, as for the lock session itself.
        let Some(alive) = alive? else {
            return Ok(Attempt::Busy(BusyInfo {
                note: Some(format!(
                    "another session holds {:?}, the liveness lock of this run's lock session",
                    lock::alive_name(s.id)
                )),
                ..BusyInfo::default()
            }));
        };
        let killed = s.killed;
        let (token, previous) = bounded(limit, "claiming the lock", async {
            bump_and_claim(&mut s.conn, ns, holder, s.id, settings).await
        })
        .await?;
        // An active row left by a holder whose session is gone (the server freed its lock, or
        // this run KILLed it).
        let why = previous.as_ref().filter(|p| p.state.is_active()).map(|p| {
            let conn = p.db_connection_id.as_deref().unwrap_or("?");
            let session = format!("connection {conn}");
            match killed {
                Some(k) if k.to_string() == conn => Freed::SessionKilled {
                    session,
                    state: p.state,
                },
                _ => Freed::SessionEnded {
                    session,
                    lock: "lock",
                    state: p.state,
                },
            }
        });
        let took_from = previous.as_ref().and_then(status::holder_of);
        let beat = Arc::new(LockBeat {
            endpoint: self.endpoint.clone(),
            lock_name: self.lock_name.clone(),
            lock_conn_id: s.id,
            alive_conn_id: alive.id,
            namespace: ns.to_owned(),
            token,
            conn: Default::default(),
        });
        let store = MySqlStore::new(s.conn, s.id, self, None);
        let held = MySqlHeld {
            store: Some(store),
            alive: Some(alive),
            keep: self.waiting.clone(),
            keep_alive: self.kept_alive.clone(),
            beat: beat.clone(),
        };
        let grant = Grant::new(token, previous, beat, held).broke(why, took_from);
        Ok(Attempt::Acquired(grant))
    }
}
