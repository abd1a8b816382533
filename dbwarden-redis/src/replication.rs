//! Confirming lease writes on replicas. Redis replicates asynchronously: a primary that dies
//! right after granting a lease may take the grant with it, and the replica promoted in its
//! place then grants the same lease to a second holder. So, where replicas are asked for
//! (`redis+sentinel://…?replicas=N`, default 1 there, or [`crate::RedisLock::confirm_replicas`]),
//! every acquire and every renewal is followed by `WAIT N timeout` **on the same connection, in
//! the same pipeline**, and only counts once N replicas acknowledged it:
//! - an acquire not confirmed in time is taken back and reported busy (core waits it out within
//!   `--wait`, like a full server), never handed out;
//! - a renewal not confirmed is a failed heartbeat: after `ttl − interval` without a confirmed
//!   one, the holder is told its lease is lost, before the copy on the replicas (extended only
//!   by confirmed renewals) expires.
//!
//! What it does not give: a replica that acknowledged may still not be the one promoted when
//! there are several (Sentinel prefers the most up-to-date, after `replica-priority`); ask for
//! as many confirmations as there are replicas to rule that out. See docs/design.md.

use std::time::Duration;

use redis::{FromRedisValue, RedisResult, Script, ScriptInvocation};

use crate::client::Conn;

/// How many replicas must acknowledge a lease write, and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Confirm {
    pub replicas: u32,
    pub timeout: Duration,
}

impl Confirm {
    /// `None` when no replica is asked for.
    pub fn new(replicas: u32, timeout: Duration) -> Option<Self> {
        (replicas > 0).then_some(Confirm {
            replicas,
            timeout: timeout.max(Duration::from_millis(10)),
        })
    }

    fn timeout_ms(&self) -> u64 {
        self.timeout.as_millis() as u64
    }
}

/// A Lua script with its source: a confirmed call loads it in the same pipeline, so a server
/// that has not cached it yet (a freshly promoted primary, say) costs no second `WAIT`.
pub(crate) struct Lua {
    pub source: String,
    pub script: Script,
}

impl Lua {
    pub fn new(source: String) -> Self {
        Lua {
            script: Script::new(&source),
            source,
        }
    }
}

/// Run `call` (an invocation of `lua`), then (when `confirm` is set) `WAIT` on the same
/// connection in one pipeline. Returns the script's reply and, when asked, how many replicas
/// acknowledged it.
pub(crate) async fn invoke<T: FromRedisValue>(
    conn: &mut Conn,
    lua: &Lua,
    call: &ScriptInvocation<'_>,
    confirm: Option<Confirm>,
) -> RedisResult<(T, Option<u32>)> {
    let Some(c) = confirm else {
        return Ok((call.invoke_async(conn).await?, None));
    };
    let (reply, acked): (T, u32) = redis::pipe()
        .cmd("SCRIPT")
        .arg("LOAD")
        .arg(&lua.source)
        .ignore()
        .invoke_script(call)
        .cmd("WAIT")
        .arg(c.replicas)
        .arg(c.timeout_ms())
        .query_async(conn)
        .await?;
    Ok((reply, Some(acked)))
}

/// Whether `acked` (from [`invoke`]) falls short of what `confirm` asked for.
pub(crate) fn short(confirm: Option<Confirm>, acked: Option<u32>) -> Option<(u32, Confirm)> {
    let c = confirm?;
    let n = acked.unwrap_or(0);
    (n < c.replicas).then_some((n, c))
}

/// The sentence an unconfirmed write ends in.
pub(crate) fn shortfall(acked: u32, c: Confirm) -> String {
    format!(
        "only {acked} of {} replica(s) confirmed it within {} (WAIT)",
        c.replicas,
        dbwarden_core::duration::human(c.timeout)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_replicas_asked_means_no_confirmation() {
        assert_eq!(Confirm::new(0, Duration::from_secs(1)), None);
        let c = Confirm::new(2, Duration::from_millis(1)).unwrap();
        assert_eq!(c.timeout, Duration::from_millis(10));
        assert_eq!(short(None, None), None);
        assert_eq!(short(Some(c), Some(2)), None);
        assert_eq!(short(Some(c), Some(1)), Some((1, c)));
        assert_eq!(short(Some(c), None), Some((0, c)));
    }
}
