//! `dbwarden unlock`: show the holder, confirm, and let core break the lock (audited).

use dbwarden_core::lock::UnlockOutcome;
use dbwarden_core::{AuditRecord, Error, ExitCode, HolderInfo, verdict};

use crate::cli::UnlockArgs;
use crate::common::{confirm, ensure_can_confirm, layer, put_hooks, settings};
use crate::hooks::Hooks;
use crate::output::color_stdout;
use crate::{engines, output};

pub async fn unlock(a: UnlockArgs) -> Result<ExitCode, Error> {
    let mut flags = layer(&a.common);
    put_hooks(&mut flags, &a.hooks);
    let settings = settings(&a.common, flags)?;
    let expected = a
        .holder
        .as_deref()
        .map(|h| {
            uuid::Uuid::parse_str(h).map_err(|_| {
                Error::usage(format!("--holder {h:?} is not an execution id (a UUID)"))
            })
        })
        .transpose()?;
    let lock = engines::open(&settings)?;
    ensure_can_confirm(a.yes, "remove this lock")?;
    let obs = lock.observe().await?;
    let ttl = verdict::judged_ttl(&obs, settings.lock_ttl.unwrap_or(lock.default_ttl()));
    let verdict = verdict::decide(&obs, ttl);
    eprint!(
        "{}",
        output::status_human(&obs, verdict, ttl, color_stdout())
    );
    confirm(a.yes, "remove this lock")?;
    let me = HolderInfo::current(None, "dbwarden unlock");
    let record = AuditRecord::new(
        lock.namespace(),
        "forced_unlock",
        &me,
        format!("dbwarden unlock (verdict was {verdict})"),
    );
    match dbwarden_core::unlock::force(lock.as_ref(), expected, &record).await? {
        UnlockOutcome::Unlocked { holder } => {
            eprintln!(
                "dbwarden: unlocked namespace {}: a live holder stops at its next heartbeat, and its writes are fenced out (audited)",
                lock.namespace()
            );
            let hooks = Hooks::start(&settings);
            hooks.events().unlocked(
                lock.as_ref(),
                &me,
                holder.as_ref().or(obs.holder.as_ref()),
                obs.fencing_token,
                verdict,
            );
            hooks.finish().await;
            Ok(ExitCode::OK)
        }
        UnlockOutcome::NothingToUnlock => {
            eprintln!(
                "dbwarden: nothing to unlock in namespace {}",
                lock.namespace()
            );
            Ok(ExitCode::OK)
        }
        UnlockOutcome::HolderMismatch { actual } => Err(Error::usage(format!(
            "--holder does not match: the lock belongs to execution {}; nothing changed",
            actual.map_or_else(|| "none".to_owned(), |u| u.to_string())
        ))),
    }
}
