//! Taking over a database another tool migrated (docs/migrations.md, "Switching from another tool").
//!
//! A database that sqlx-cli, golang-migrate or goose migrated has that tool's history table
//! and none of ours: `migrate` must not run its migrations a second time. It refuses before
//! writing anything, and `dbwarden adopt` imports the other tool's applied set under the lock,
//! in one transaction, audited. What the other tool left unfinished (sqlx's `success = false`,
//! golang-migrate's `dirty`) is halted for review, never applied silently. `baseline` does the
//! same for a database built by hand: every file up to a version is recorded applied.
//!
//! What the other tools' rows mean is decided in [`crate::other_tools`]; this module holds the
//! two workflows that take the lock to record it.

use crate::migration::Migration;
use crate::runner::{self, Progress};
use crate::wait::{self, Wait};
use crate::{AuditRecord, Error, HeartbeatConfig, HolderInfo, Lease, LockState, MigrationLock};

pub use crate::other_tools::*;

/// What `adopt` and `baseline` need besides the files.
#[derive(Debug, Clone)]
pub struct AdoptOptions {
    pub wait: Wait,
    pub heartbeat: HeartbeatConfig,
    pub allow_changed: bool,
    /// `migrate --adopt`: a database that has dbwarden history by the time the lock is taken
    /// (another runner adopted it first) is not an error; nothing is imported.
    pub if_needed: bool,
    /// Where lock events go (a dead holder's lock broken, the lock lost).
    pub events: crate::events::Events,
}

/// `dbwarden adopt`: under the lock, read the other tool's history again, check it against
/// `expected` (what the human confirmed), and record it in one transaction, audited. `None`
/// when another runner adopted it first and `opts.if_needed` says that is fine.
pub async fn adopt(
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    holder: &HolderInfo,
    from: Option<Tool>,
    expected: &Plan,
    opts: &AdoptOptions,
) -> Result<Option<Plan>, Error> {
    let lease = wait::acquire(lock, holder, opts.wait, opts.heartbeat).await?;
    runner::hold(lock, migrations, &opts.events, lease, async |lease| {
        adopt_locked(lease, lock, migrations, from, expected, opts).await
    })
    .await
}

async fn adopt_locked(
    lease: &mut Lease,
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    from: Option<Tool>,
    expected: &Plan,
    opts: &AdoptOptions,
) -> Result<Option<Plan>, Error> {
    let token = lease.fencing_token();
    let holder = lease.holder().clone();
    let store = runner::store_of(lease)?;
    let ours = store.history().await?;
    if !ours.is_empty() && opts.if_needed {
        return Ok(None);
    }
    if !ours.is_empty() {
        return Err(Error::usage(format!(
            "this database already has dbwarden history ({} row(s)): nothing to adopt",
            ours.len()
        )));
    }
    let theirs = other_tools(lock).await?;
    let history = choose(&theirs, from.or(Some(expected.tool)))?;
    let plan = plan(history, migrations)?;
    if plan != *expected {
        return Err(Error::usage(format!(
            "{}'s history changed while dbwarden was taking the lock (now: {}); nothing was imported, run adopt again",
            plan.tool,
            plan.summary()
        )));
    }
    check_changed(&plan, migrations, opts.allow_changed)?;
    let action = format!("adopt_{}", plan.tool.flag().replace('-', "_"));
    record(store, token, &holder, lock, migrations, &plan, &action).await?;
    Ok(Some(plan))
}

/// `dbwarden baseline <VERSION>`: under the lock, record every file up to `version` applied
/// without running it, in one transaction, audited. Returns the versions recorded.
pub async fn baseline(
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    holder: &HolderInfo,
    version: i64,
    opts: &AdoptOptions,
    progress: &dyn Progress,
) -> Result<Vec<i64>, Error> {
    let lease = wait::acquire(lock, holder, opts.wait, opts.heartbeat).await?;
    runner::hold(lock, migrations, &opts.events, lease, async |lease| {
        let token = lease.fencing_token();
        let holder = lease.holder().clone();
        if lease
            .previous()
            .is_some_and(|p| p.state == LockState::NeedsReview)
        {
            return Err(Error::usage(
                "a run halted for review: resolve it before a baseline",
            ));
        }
        let store = runner::store_of(lease)?;
        let history = store.history().await?;
        let versions = baseline_plan(migrations, &history, version)?;
        let marked: Vec<&Migration> = migrations
            .iter()
            .filter(|m| versions.contains(&m.version))
            .collect();
        store
            .record_adopted(token, holder.execution_id, &marked, None)
            .await?;
        let rec = AuditRecord::new(
            lock.namespace(),
            "baseline",
            &holder,
            format!(
                "baseline at version {version}: {} migration(s) recorded applied without running",
                marked.len()
            ),
        );
        store.audit(&rec).await?;
        progress.note(&format!(
            "recorded {} migration(s) up to version {version} as applied, without running them",
            marked.len()
        ));
        Ok(versions)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::Dialect;

    fn files(versions: &[i64]) -> Vec<Migration> {
        versions
            .iter()
            .map(|v| {
                Migration::from_sql(
                    *v,
                    format!("m_{v}"),
                    format!("SELECT {v};\n"),
                    Dialect::Postgres,
                )
                .unwrap()
            })
            .collect()
    }

    fn row(version: i64, ok: bool) -> ForeignRow {
        ForeignRow {
            version,
            description: None,
            checksum: None,
            ok,
        }
    }

    fn versions(p: &Plan) -> Vec<i64> {
        p.applied.iter().map(|i| i.version).collect()
    }

    #[test]
    fn sqlx_rows_are_applied_checked_and_an_unsuccessful_one_is_left_for_review() {
        let ms = files(&[1, 2, 3, 4]);
        let mut rows: Vec<ForeignRow> = ms[..2]
            .iter()
            .map(|m| ForeignRow {
                version: m.version,
                description: Some(m.sqlx_description()),
                checksum: Some(m.sqlx_checksum().unwrap()),
                ok: true,
            })
            .collect();
        let h = ForeignHistory {
            tool: Tool::Sqlx,
            rows: rows.clone(),
        };
        let p = plan(&h, &ms).unwrap();
        assert_eq!(versions(&p), [1, 2]);
        assert_eq!((p.review, p.changed.clone()), (None, vec![]));

        rows[1].checksum = Some(vec![0; 48]);
        rows.push(row(3, false));
        let p = plan(
            &ForeignHistory {
                tool: Tool::Sqlx,
                rows,
            },
            &ms,
        )
        .unwrap();
        assert_eq!(versions(&p), [1, 2]);
        assert_eq!(p.changed, [2]);
        assert_eq!(p.review, Some(3));
        assert!(
            check_changed(&p, &ms, false)
                .unwrap_err()
                .to_string()
                .contains("migration 2")
        );
        assert!(check_changed(&p, &ms, true).is_ok());
    }

    #[test]
    fn sqlx_rows_without_a_file_are_kept_for_the_record() {
        let ms = files(&[2]);
        let mut r = row(1, true);
        r.description = Some("create users".into());
        let p = plan(
            &ForeignHistory {
                tool: Tool::Sqlx,
                rows: vec![r, row(2, true)],
            },
            &ms,
        )
        .unwrap();
        assert_eq!(
            p.applied[0],
            Imported {
                version: 1,
                description: "create_users".into(),
                file: false
            }
        );
        assert!(p.applied[1].file);
    }

    #[test]
    fn golang_migrate_applies_every_file_up_to_its_version_and_dirty_needs_review() {
        let ms = files(&[1, 2, 5, 9]);
        let clean = ForeignHistory {
            tool: Tool::GolangMigrate,
            rows: vec![row(5, true)],
        };
        let p = plan(&clean, &ms).unwrap();
        assert_eq!((versions(&p), p.review), (vec![1, 2, 5], None));
        let dirty = ForeignHistory {
            tool: Tool::GolangMigrate,
            rows: vec![row(5, false)],
        };
        let p = plan(&dirty, &ms).unwrap();
        assert_eq!((versions(&p), p.review), (vec![1, 2], Some(5)));
        let nil = ForeignHistory {
            tool: Tool::GolangMigrate,
            rows: vec![row(-1, false)],
        };
        let p = plan(&nil, &ms).unwrap();
        assert_eq!((versions(&p), p.review), (vec![], Some(1)));
    }

    #[test]
    fn goose_takes_the_newest_row_of_each_version_and_skips_its_version_zero() {
        let ms = files(&[1, 2, 3]);
        let h = ForeignHistory {
            tool: Tool::Goose,
            rows: vec![
                row(0, true),
                row(1, true),
                row(2, true),
                row(3, true),
                row(3, false),
            ],
        };
        let p = plan(&h, &ms).unwrap();
        assert_eq!((versions(&p), p.review), (vec![1, 2], None));
    }

    #[test]
    fn refusal_only_when_our_history_is_empty_and_theirs_is_not() {
        let theirs = vec![
            ForeignHistory {
                tool: Tool::Goose,
                rows: vec![],
            },
            ForeignHistory {
                tool: Tool::Sqlx,
                rows: vec![row(1, true), row(2, true)],
            },
        ];
        let h = unadopted(true, &theirs, None).unwrap();
        assert_eq!(h.tool, Tool::Sqlx);
        let msg = refusal(h).to_string();
        assert!(
            msg.contains("sqlx-cli")
                && msg.contains("2 row(s)")
                && msg.contains("adopt --from sqlx"),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
        assert!(unadopted(false, &theirs, None).is_none());
        assert!(unadopted(true, &theirs[..1], None).is_none());
    }

    #[test]
    fn choosing_the_tool() {
        let theirs = vec![
            ForeignHistory {
                tool: Tool::Sqlx,
                rows: vec![row(1, true)],
            },
            ForeignHistory {
                tool: Tool::Goose,
                rows: vec![row(1, true)],
            },
        ];
        assert!(
            choose(&theirs, None)
                .unwrap_err()
                .to_string()
                .contains("--from")
        );
        assert_eq!(
            choose(&theirs, Some(Tool::Goose)).unwrap().tool,
            Tool::Goose
        );
        assert!(choose(&theirs, Some(Tool::GolangMigrate)).is_err());
        assert!(
            choose(&[], None)
                .unwrap_err()
                .to_string()
                .contains("baseline")
        );
        assert_eq!(Tool::parse("golang-migrate").unwrap(), Tool::GolangMigrate);
        assert!(Tool::parse("flyway").is_err());
    }

    #[test]
    fn baseline_marks_files_up_to_the_version_that_have_no_row() {
        let ms = files(&[1, 2, 3, 4]);
        assert_eq!(baseline_plan(&ms, &[], 3).unwrap(), [1, 2, 3]);
        assert!(baseline_plan(&ms, &[], 7).is_err());
    }

    #[test]
    fn sqlx_lock_key_matches_sqlx() {
        // crc32("test") = 0xD87F7E0C; times 0x3d32ad9e.
        assert_eq!(sqlx_lock_key("test"), 0x3d32_ad9e_i64 * 0xD87F_7E0C_i64);
        assert_eq!(format!("{:x}", sqlx_lock_key("test")), "33c13cc34135e768");
        assert!(sqlx_lock_key("a_database_name_that_is_rather_long") > 0);
    }
}
