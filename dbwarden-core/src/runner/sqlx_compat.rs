//! A database that sqlx-cli migrates too: the handshake before applying (its lock, its
//! table, which of its rows we already have), and a migration sqlx-cli applied meanwhile.

use super::*;

/// After a transactional migration failed while mirroring to sqlx: whether sqlx's table now
/// says sqlx applied it (a sqlx-cli process, which takes no lock, ran it at the same time and
/// committed first); if so it is recorded applied here, audited.
pub(super) async fn applied_by_sqlx_meanwhile(
    store: &mut (dyn MigrationStore + 'static),
    token: FencingToken,
    holder: &HolderInfo,
    lock: &dyn MigrationLock,
    m: &Migration,
) -> Result<bool, Error> {
    use crate::other_tools::{self, ForeignHistory, Tool};
    let Some(compat) = store.sqlx_compat() else {
        return Ok(false);
    };
    let rows: Vec<_> = compat
        .sqlx_rows()
        .await?
        .into_iter()
        .filter(|r| r.version == m.version && r.ok)
        .collect();
    if rows.is_empty() {
        return Ok(false);
    }
    let plan = other_tools::plan(
        &ForeignHistory {
            tool: Tool::Sqlx,
            rows,
        },
        std::slice::from_ref(m),
    )?;
    if !plan.changed.is_empty() {
        return Ok(false);
    }
    other_tools::record(
        store,
        token,
        holder,
        lock,
        std::slice::from_ref(m),
        &plan,
        "sqlx_sync",
    )
    .await?;
    Ok(true)
}

/// `sqlx_compat`: take the lock sqlx's migrator takes (an old replica running it holds that lock
/// while it applies), record what sqlx applied since dbwarden last ran, and have every
/// migration this run applies written into `_sqlx_migrations` too, as sqlx would.
pub(super) async fn sqlx_handshake(
    lease: &mut Lease,
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    opts: &MigrateOptions,
    progress: &dyn Progress,
) -> Result<bool, Error> {
    use crate::other_tools::{self, ForeignHistory, SqlxCompatMode, Tool};
    if opts.sqlx_compat == SqlxCompatMode::Off {
        return Ok(false);
    }
    let token = lease.fencing_token();
    let lost = lease.lost_signal();
    let holder = lease.holder().clone();
    let store = store_of(lease)?;
    let Some(compat) = store.sqlx_compat() else {
        if opts.sqlx_compat == SqlxCompatMode::On {
            return Err(Error::usage(
                "sqlx_compat = on, but this engine has no sqlx to work with (PostgreSQL, MySQL and SQLite have)",
            ));
        }
        return Ok(false);
    };
    if opts.sqlx_compat == SqlxCompatMode::Auto && !compat.sqlx_table_exists().await? {
        return Ok(false);
    }
    let deadline = match opts.wait {
        Wait::No => Instant::now(),
        Wait::Up(d) => Instant::now() + d,
    };
    let mut backoff = wait::Backoff::new(Duration::from_millis(25), Duration::from_secs(1));
    while !compat.try_lock_sqlx().await? {
        lost.check()?;
        if Instant::now() >= deadline {
            return Err(Error::Busy(Box::new(BusyInfo {
                note: Some(
                    "sqlx's migration lock is held: a replica running sqlx's migrator is applying migrations"
                        .into(),
                ),
                ..Default::default()
            })));
        }
        tokio::time::sleep(backoff.next_pause()).await;
    }
    compat.mirror_to_sqlx().await?;
    let rows = compat.sqlx_rows().await?;
    let history = store.history().await?;
    let ours: std::collections::HashSet<i64> = history
        .iter()
        .filter(|r| r.state == HistoryState::Applied)
        .map(|r| r.version)
        .collect();
    let rows: Vec<_> = rows
        .into_iter()
        .filter(|r| !ours.contains(&r.version))
        .collect();
    if rows.is_empty() {
        return Ok(true);
    }
    // A version ours has half-done and sqlx recorded done: where ours rolled back (one
    // transaction) sqlx's is the only run, but a journaled one may have left statements done,
    // and then both tools ran part of it.
    for row in rows.iter().filter(|r| r.ok) {
        let half = history
            .iter()
            .any(|h| h.version == row.version && h.state.is_unfinished());
        let file = migrations.iter().find(|m| m.version == row.version);
        if half && file.is_none_or(|m| !m.mode.is_transaction()) {
            let stand_in = placeholder(row.version, None);
            let m = file.unwrap_or(&stand_in);
            let reason = format!(
                "sqlx applied migration {} while a journaled run of dbwarden's had left it half-done: both may have run part of it",
                row.version
            );
            lost.check()?;
            store
                .set_state(token, LockState::NeedsReview, Some(m))
                .await?;
            let rec = AuditRecord::new(lock.namespace(), "needs_review", &holder, reason.clone());
            store.audit(&rec).await?;
            return Err(Error::NeedsReview {
                version: row.version,
                reason,
            });
        }
    }
    let plan = other_tools::plan(
        &ForeignHistory {
            tool: Tool::Sqlx,
            rows,
        },
        migrations,
    )?;
    other_tools::check_changed(&plan, migrations, opts.allow_changed)?;
    progress.note(&format!(
        "sqlx_compat: recording what sqlx applied since: {}",
        plan.summary()
    ));
    lost.check()?;
    other_tools::record(store, token, &holder, lock, migrations, &plan, "sqlx_sync").await?;
    Ok(true)
}
