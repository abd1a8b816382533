//! Other tools' history tables (sqlx-cli's, golang-migrate's, goose's): what an engine reads of
//! them ([`OtherTools`]), what they mean for the files here ([`plan`]), the refusal `migrate`
//! gives on a database another tool migrated, and how an adoption is recorded ([`record`]).
//! Pure policy over the store and the lock: the workflows that take the lock for it (`adopt`,
//! `baseline`, sqlx interoperation) live above, in [`crate::adopt`] and the runner.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use async_trait::async_trait;

use crate::migration::Migration;
use crate::{AuditRecord, Error, HistoryState, HolderInfo, MigrationLock};

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
