//! Taking over a database another tool migrated (docs/migrations.md, "Switching from another tool").
//!
//! A database that sqlx-cli, golang-migrate or goose migrated has that tool's history table
//! and none of ours: `migrate` must not run its migrations a second time. It refuses before
//! writing anything, and `dbwarden adopt` imports the other tool's applied set under the lock,
//! in one transaction, audited. What the other tool left unfinished (sqlx's `success = false`,
//! golang-migrate's `dirty`) is halted for review, never applied silently. `baseline` does the
//! same for a database built by hand: every file up to a version is recorded applied.
//!
//! The engines only read the other tools' tables ([`OtherTools`]); what the rows mean is
//! decided here, in [`plan`].

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use async_trait::async_trait;

use crate::migration::Migration;
use crate::runner::{self, Progress};
use crate::wait::{self, Wait};
use crate::{
    AuditRecord, Error, HeartbeatConfig, HistoryState, HolderInfo, Lease, LockState, MigrationLock,
};

/// A migration tool whose history dbwarden can adopt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tool {
    /// sqlx-cli (and `sqlx::migrate!()`): `_sqlx_migrations`, one row per migration.
    Sqlx,
    /// golang-migrate: `schema_migrations`, one row holding the latest version and `dirty`.
    GolangMigrate,
    /// goose: `goose_db_version`, one row per up or down step.
    Goose,
}

impl Tool {
    /// Every tool, in the order they are looked for.
    pub const ALL: [Tool; 3] = [Tool::Sqlx, Tool::GolangMigrate, Tool::Goose];

    /// The tool's own name.
    pub fn name(self) -> &'static str {
        match self {
            Tool::Sqlx => "sqlx-cli",
            Tool::GolangMigrate => "golang-migrate",
            Tool::Goose => "goose",
        }
    }

    /// How `--from` spells it.
    pub fn flag(self) -> &'static str {
        match self {
            Tool::Sqlx => "sqlx",
            Tool::GolangMigrate => "golang-migrate",
            Tool::Goose => "goose",
        }
    }

    /// Its history table (the default name).
    pub fn table(self) -> &'static str {
        match self {
            Tool::Sqlx => "_sqlx_migrations",
            Tool::GolangMigrate => "schema_migrations",
            Tool::Goose => "goose_db_version",
        }
    }

    /// `--from sqlx|golang-migrate|goose`.
    pub fn parse(s: &str) -> Result<Tool, Error> {
        Tool::ALL
            .into_iter()
            .find(|t| t.flag() == s || t.name() == s)
            .ok_or_else(|| {
                Error::usage(format!(
                    "unknown tool {s:?} for --from: use sqlx, golang-migrate or goose"
                ))
            })
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `sqlx_compat`: whether `migrate` interoperates with sqlx's migrator — takes the lock sqlx
/// takes, records what sqlx applied since, and writes each migration it applies into
/// `_sqlx_migrations` the way sqlx would — so that during a rolling switch neither tool runs a
/// migration the other ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SqlxCompatMode {
    /// On when the database has `_sqlx_migrations` (it was adopted from sqlx), off otherwise.
    #[default]
    Auto,
    On,
    Off,
}

impl SqlxCompatMode {
    pub fn parse(s: &str) -> Result<SqlxCompatMode, Error> {
        match s {
            "auto" => Ok(SqlxCompatMode::Auto),
            "on" | "true" => Ok(SqlxCompatMode::On),
            "off" | "false" => Ok(SqlxCompatMode::Off),
            _ => Err(Error::usage(format!(
                "invalid sqlx_compat {s:?}: use auto, on or off"
            ))),
        }
    }
}

/// One row of another tool's history table, as the engine read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignRow {
    pub version: i64,
    /// sqlx: the description it recorded.
    pub description: Option<String>,
    /// sqlx: the SHA-384 of the file it applied.
    pub checksum: Option<Vec<u8>>,
    /// sqlx `success`, goose `is_applied`, golang-migrate `NOT dirty`.
    pub ok: bool,
}

/// Another tool's history table, in the order the tool wrote it (goose: by `id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignHistory {
    pub tool: Tool,
    pub rows: Vec<ForeignRow>,
}

/// Reading the other tools' history tables: an optional capability of an engine with
/// migration tables (PostgreSQL, MySQL, SQLite).
#[async_trait]
pub trait OtherTools: Send + Sync {
    /// Every other tool's history table present in the database, read without the lock and
    /// without creating anything.
    async fn other_tools(&self) -> Result<Vec<ForeignHistory>, Error>;
}

/// One migration an adoption records applied.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Imported {
    pub version: i64,
    pub description: String,
    /// The file is in the folder (else the row is kept for the record, with no checksum).
    pub file: bool,
}

/// What adopting another tool's history will record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Plan {
    pub tool: Tool,
    /// Applied by the other tool: recorded APPLIED, not run.
    pub applied: Vec<Imported>,
    /// Left unfinished by the other tool: recorded, and the run halts for review there.
    pub review: Option<i64>,
    /// sqlx recorded another checksum than the file's: the file changed since it ran.
    pub changed: Vec<i64>,
}

impl Plan {
    /// One line per fact, for the terminal and the audit row.
    pub fn summary(&self) -> String {
        let files = self.applied.iter().filter(|i| i.file).count();
        let mut s = format!(
            "{} migration(s) {} applied ({} with their file here)",
            self.applied.len(),
            self.tool,
            files
        );
        if let Some(v) = self.applied.iter().map(|i| i.version).max() {
            s.push_str(&format!(", up to version {v}"));
        }
        if let Some(v) = self.review {
            s.push_str(&format!(
                "; migration {v} was left unfinished by {}: it will need review",
                self.tool
            ));
        }
        s
    }
}

/// Decides what `history` means for the files in `migrations` (pure: the policy of adoption).
///
/// - sqlx: each successful row is applied (its checksum is compared with the file's); the first
///   unsuccessful row is left for review.
/// - golang-migrate: the one row names the latest version `V`: every file up to `V` is applied
///   (and `V` itself too unless the row is dirty, when `V` is left for review).
/// - goose: the newest row of each version says whether it is applied; version 0 is goose's
///   own bookkeeping row.
pub fn plan(history: &ForeignHistory, migrations: &[Migration]) -> Result<Plan, Error> {
    let files: BTreeMap<i64, &Migration> = migrations.iter().map(|m| (m.version, m)).collect();
    let mut applied = BTreeMap::new();
    let mut review = None;
    let mut changed = Vec::new();
    let mut add = |version: i64, description: Option<&str>| {
        let file = files.get(&version);
        let description = file
            .map(|m| m.description.clone())
            .or_else(|| description.map(|d| d.replace(' ', "_")))
            .unwrap_or_default();
        applied.insert(
            version,
            Imported {
                version,
                description,
                file: file.is_some(),
            },
        );
    };
    match history.tool {
        Tool::Sqlx => {
            for row in &history.rows {
                if !row.ok {
                    review = Some(review.map_or(row.version, |v: i64| v.min(row.version)));
                    continue;
                }
                if let (Some(m), Some(recorded)) = (files.get(&row.version), &row.checksum)
                    && m.sqlx_checksum()? != *recorded
                {
                    changed.push(row.version);
                }
                add(row.version, row.description.as_deref());
            }
        }
        Tool::GolangMigrate => {
            if let Some(row) = history.rows.iter().max_by_key(|r| r.version) {
                let upto = if row.ok { row.version } else { row.version - 1 };
                for m in files.values().filter(|m| m.version <= upto) {
                    add(m.version, None);
                }
                if row.ok && row.version >= 0 && !files.contains_key(&row.version) {
                    add(row.version, None);
                }
                if !row.ok {
                    // Dirty at -1: the first migration's down step failed half-way.
                    let first = files.keys().next().copied().unwrap_or(0);
                    review = Some(if row.version < 0 { first } else { row.version });
                }
            }
        }
        Tool::Goose => {
            let mut latest: BTreeMap<i64, bool> = BTreeMap::new();
            for row in history.rows.iter().filter(|r| r.version != 0) {
                latest.insert(row.version, row.ok);
            }
            for (version, ok) in latest {
                if ok {
                    add(version, None);
                }
            }
        }
    }
    Ok(Plan {
        tool: history.tool,
        applied: applied.into_values().collect(),
        review,
        changed,
    })
}

/// The other tool's history this database holds that dbwarden has not adopted: `Some` when
/// our history is empty and another tool recorded at least one migration. With several
/// tools' tables and no `from`, the one with the most rows is named.
pub fn unadopted(
    ours_empty: bool,
    theirs: &[ForeignHistory],
    from: Option<Tool>,
) -> Option<&ForeignHistory> {
    if !ours_empty {
        return None;
    }
    theirs
        .iter()
        .filter(|h| from.is_none_or(|t| t == h.tool))
        .filter(|h| !h.rows.is_empty())
        .max_by_key(|h| h.rows.len())
}

/// The refusal `migrate` gives on a database another tool migrated (exit 2, nothing written).
pub fn refusal(h: &ForeignHistory) -> Error {
    let latest = h.rows.iter().map(|r| r.version).max().unwrap_or_default();
    Error::usage(format!(
        "this database was migrated by {} ({}: {} row(s), latest version {latest}) and has no dbwarden history: running the folder would apply those migrations again; run `dbwarden adopt --from {}` (or `migrate --adopt`) to take it over",
        h.tool,
        h.tool.table(),
        h.rows.len(),
        h.tool.flag()
    ))
}

/// Reads the other tools' tables through the engine, or nothing where it has none.
pub async fn other_tools(lock: &dyn MigrationLock) -> Result<Vec<ForeignHistory>, Error> {
    match lock.other_tools() {
        Some(reader) => reader.other_tools().await,
        None => Ok(Vec::new()),
    }
}

/// `migrate`'s check before anything is taken or written: refuse a database another tool
/// migrated and dbwarden never adopted.
pub async fn refuse_unadopted(lock: &dyn MigrationLock) -> Result<(), Error> {
    if lock.other_tools().is_none() {
        return Ok(());
    }
    let ours_empty = lock.read_history().await?.is_empty();
    if !ours_empty {
        return Ok(());
    }
    let theirs = other_tools(lock).await?;
    match unadopted(true, &theirs, None) {
        Some(h) => Err(refusal(h)),
        None => Ok(()),
    }
}

/// [`refuse_unadopted`] for a run that already knows our history is empty.
pub async fn refuse_if_other_tools(lock: &dyn MigrationLock) -> Result<(), Error> {
    let theirs = other_tools(lock).await?;
    match unadopted(true, &theirs, None) {
        Some(h) => Err(refusal(h)),
        None => Ok(()),
    }
}

/// Which tool to adopt from: `from`, or the only one present.
pub fn choose(theirs: &[ForeignHistory], from: Option<Tool>) -> Result<&ForeignHistory, Error> {
    let present: Vec<&ForeignHistory> = theirs.iter().filter(|h| !h.rows.is_empty()).collect();
    match from {
        Some(tool) => present.into_iter().find(|h| h.tool == tool).ok_or_else(|| {
            Error::usage(format!(
                "no {} history here ({} is missing or empty); nothing to adopt",
                tool,
                tool.table()
            ))
        }),
        None => match present.as_slice() {
            [] => Err(Error::usage(
                "no other tool's history here (_sqlx_migrations, schema_migrations, goose_db_version): nothing to adopt; for a database built by hand use `dbwarden baseline <VERSION>`",
            )),
            [one] => Ok(one),
            many => Err(Error::usage(format!(
                "several tools' histories here ({}): say which with --from",
                many.iter()
                    .map(|h| h.tool.flag())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        },
    }
}

/// A plan whose files changed since the other tool ran them stops the adoption (exit 2), as a
/// changed applied file stops `migrate`.
pub fn check_changed(
    plan: &Plan,
    migrations: &[Migration],
    allow_changed: bool,
) -> Result<(), Error> {
    let Some(&version) = plan.changed.first() else {
        return Ok(());
    };
    if allow_changed {
        return Ok(());
    }
    let file = migrations
        .iter()
        .find(|m| m.version == version)
        .map(|m| m.path.display().to_string())
        .unwrap_or_default();
    Err(Error::usage(format!(
        "migration {version} ({file}) changed since {} applied it (its SHA-384 differs from the one in {}); restore the file, or pass --allow-changed to adopt it as it is now",
        plan.tool,
        plan.tool.table()
    )))
}

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

/// Writes `plan` in one transaction: its applied rows, and the review halt if any; audited as
/// `action`.
pub(crate) async fn record(
    store: &mut (dyn crate::MigrationStore + 'static),
    token: crate::FencingToken,
    holder: &HolderInfo,
    lock: &dyn MigrationLock,
    migrations: &[Migration],
    plan: &Plan,
    action: &str,
) -> Result<(), Error> {
    let files: BTreeMap<i64, &Migration> = migrations.iter().map(|m| (m.version, m)).collect();
    let stand_ins: Vec<Migration> = plan
        .applied
        .iter()
        .filter(|i| !i.file)
        .map(|i| {
            let mut m = Migration::stand_in(i.version, "");
            m.description = i.description.clone();
            m
        })
        .collect();
    let applied: Vec<&Migration> = plan
        .applied
        .iter()
        .filter_map(|i| files.get(&i.version).copied())
        .chain(stand_ins.iter())
        .collect();
    let review_stand_in;
    let halted = match plan.review {
        Some(v) => Some(match files.get(&v) {
            Some(m) => *m,
            None => {
                review_stand_in = Migration::stand_in(v, "");
                &review_stand_in
            }
        }),
        None => None,
    };
    store
        .record_adopted(token, holder.execution_id, &applied, halted)
        .await?;
    let rec = AuditRecord::new(
        lock.namespace(),
        action,
        holder,
        format!("from {}: {}", plan.tool.table(), plan.summary()),
    );
    store.audit(&rec).await?;
    if let Some(v) = plan.review {
        let why = match plan.tool {
            // A dirty version is the one a step started from or went to: an up step to it
            // that stopped half-way, or a down step from the next one.
            Tool::GolangMigrate => format!(
                "golang-migrate marked it dirty: an up step to it, or a down step from the version after it, stopped half-way; see what it left, then `dbwarden resolve {v} --mark-applied`, `--retry` or `--abandon`"
            ),
            tool => format!(
                "{tool} recorded it as unfinished; see what it left, then `dbwarden resolve {v} --mark-applied`, `--retry` or `--abandon`"
            ),
        };
        return Err(Error::NeedsReview {
            version: v,
            reason: why,
        });
    }
    Ok(())
}

/// What `baseline` will record: every file up to `version` with no history row yet.
pub fn baseline_plan(
    migrations: &[Migration],
    history: &[crate::HistoryRow],
    version: i64,
) -> Result<Vec<i64>, Error> {
    let known: HashSet<i64> = history
        .iter()
        .filter(|r| r.state == HistoryState::Applied)
        .map(|r| r.version)
        .collect();
    if let Some(r) = history
        .iter()
        .find(|r| r.state != HistoryState::Applied && r.version <= version)
    {
        let next = if r.state == HistoryState::Reverted {
            "it was undone: apply it with `dbwarden migrate --to …`".to_owned()
        } else {
            format!("decide it with `dbwarden resolve {} …`", r.version)
        };
        return Err(Error::usage(format!(
            "migration {} is {} in the history: {next} before a baseline",
            r.version,
            r.state.as_str(),
        )));
    }
    if !migrations.iter().any(|m| m.version == version) {
        return Err(Error::usage(format!(
            "no migration file has version {version}: a baseline names the last file the database already has"
        )));
    }
    Ok(migrations
        .iter()
        .filter(|m| m.version <= version && !known.contains(&m.version))
        .map(|m| m.version)
        .collect())
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

/// sqlx's advisory-lock key for a database (sqlx's `generate_lock_id`): the CRC-32
/// (ISO-HDLC, as zlib's) of the database name times 0x3d32ad9e. PostgreSQL takes it as a
/// `bigint`; MySQL's lock name is its lowercase hex.
///
/// ```
/// assert_eq!(dbwarden_core::adopt::sqlx_lock_key("test"), 3729328775749822312);
/// ```
pub fn sqlx_lock_key(database: &str) -> i64 {
    const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
    0x3d32_ad9e_i64 * i64::from(CRC.checksum(database.as_bytes()))
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
