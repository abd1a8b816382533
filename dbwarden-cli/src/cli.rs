//! Command-line grammar (README, docs/design.md §8). Values stay raw strings here; `dbwarden_core::config`
//! validates them, so a flag, an environment variable and a config key fail the same way.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "dbwarden",
    version,
    about = "Safe schema migrations from many places at once",
    long_about = "Safe schema migrations from many places at once: exactly one runner applies \
                  pending migrations, the others wait or skip, and every one exits cleanly.",
    term_width = 80,
    max_term_width = 80,
    after_help = "Examples:\n  dbwarden migrate --migrations examples/migrations\n  dbwarden lock-status -u postgres://app@db/prod\n\nExit codes: 0 ok, 1 migration failed, 2 usage, 3 busy, 4 lost,\n10 STUCK, 11 DEAD, 12 NEEDS_REVIEW, 75 interrupted, 78 halted for review."
)]
pub struct Cli {
    /// More output (repeat for debug logs).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Log format on stderr: text or json (filter with RUST_LOG).
    #[arg(long, global = true, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args, Clone, Default)]
pub struct Common {
    /// Database URL [env: DATABASE_URL] [default: sqlite://dbwarden.db]
    #[arg(short = 'u', long = "database-url", value_name = "URL")]
    pub database_url: Option<String>,
    /// Lock namespace [env: DBWARDEN_NAMESPACE] [default: default]
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
    /// Config file [default: ./dbwarden.toml if present]
    #[arg(long, value_name = "FILE", env = "DBWARDEN_CONFIG")]
    pub config: Option<PathBuf>,
    /// Staleness threshold / lease TTL, e.g. 45s [env: DBWARDEN_LOCK_TTL]
    #[arg(long, value_name = "DUR")]
    pub lock_ttl: Option<String>,
    /// Heartbeat interval, e.g. 15s [env: DBWARDEN_HEARTBEAT_INTERVAL]
    #[arg(long, value_name = "DUR")]
    pub heartbeat_interval: Option<String>,
    /// History table name [env: DBWARDEN_HISTORY_TABLE]
    #[arg(long, value_name = "NAME")]
    pub history_table: Option<String>,
    /// The lock: advisory (PostgreSQL's session lock) or lease (a fenced lease row, for
    /// PostgreSQL behind a transaction pooler) [env: DBWARDEN_LOCK] [default: advisory]
    #[arg(long, value_name = "KIND")]
    pub lock: Option<String>,
}

/// Where lock events go (every command that takes or removes the lock): docs/operations.md, "Hooks on lock events".
#[derive(Debug, Args, Clone, Default)]
pub struct HookArgs {
    /// Command run with `sh -c` on each lock event, the event as JSON on its stdin
    /// [env: DBWARDEN_HOOK]
    #[arg(long, value_name = "COMMAND")]
    pub hook: Option<String>,
    /// Kill a hook still running after this long [env: DBWARDEN_HOOK_TIMEOUT] [default: 10s]
    #[arg(long, value_name = "DUR")]
    pub hook_timeout: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply pending migrations under the lock.
    #[command(
        after_help = "Example:\n  dbwarden migrate -u sqlite://app.db --migrations ./migrations --wait 2m"
    )]
    Migrate(MigrateArgs),
    /// Who holds the lock, and is it healthy? (exit 0/10/11/12)
    #[command(
        name = "lock-status",
        after_help = "Example:\n  dbwarden lock-status -u sqlite://app.db --json\n\nExit: 0 AVAILABLE/HEALTHY, 10 STUCK, 11 DEAD, 12 NEEDS_REVIEW."
    )]
    LockStatus(StatusArgs),
    /// Forcibly remove a lock after showing its holder (audited).
    #[command(after_help = "Example:\n  dbwarden unlock -u sqlite://app.db --holder 3f2a... --yes")]
    Unlock(UnlockArgs),
    /// Decide what happens to a migration halted for review (audited).
    #[command(after_help = "Example:\n  dbwarden resolve 42 --retry --yes")]
    Resolve(ResolveArgs),
    /// Run any command while holding the lock (exit code: the command's).
    #[command(
        after_help = "Example:\n  dbwarden run -u sqlite://app.db --wait 60s -- ./backup.sh\n\nThe command gets DBWARDEN_FENCING_TOKEN, DBWARDEN_EXECUTION_ID and\nDBWARDEN_NAMESPACE; it is sent SIGTERM (then SIGKILL) if the lock is lost."
    )]
    Run(RunArgs),
    /// Print a shell completion script.
    #[command(
        after_help = "Example:\n  dbwarden completions bash > /etc/bash_completion.d/dbwarden"
    )]
    Completions {
        /// bash, zsh, fish, elvish or powershell
        shell: clap_complete::Shell,
    },
    /// Undo the newest applied migrations with their .down.sql files (audited).
    #[command(
        after_help = "Example:\n  dbwarden revert -u postgres://app@db/prod --steps 1 --dry-run\n\nRuns <V>_<name>.down.sql newest first, under the lock, journaled like\nmigrate. A revert destroys data: it needs --yes (or a terminal to confirm on)."
    )]
    Revert(RevertArgs),
    /// Every migration of the folder and of the history, and the lock's verdict.
    #[command(
        after_help = "Example:\n  dbwarden status -u postgres://app@db/prod --json\n\nStandings: applied, pending, out_of_order, changed, missing, running, failed,\nneeds_review, reverted. Exit 0 (see `validate` for a verdict as an exit code)."
    )]
    Status(SurveyArgs),
    /// Check that the folder and the history agree, for CI before a deploy (exit 0 or 5).
    #[command(
        after_help = "Example:\n  dbwarden validate -u postgres://app@db/prod --migrations ./migrations\n\nExit: 0 agree (pending migrations are fine unless --no-pending), 5 they\ndisagree (changed, missing, out of order, failed, running), 12 NEEDS_REVIEW."
    )]
    Validate(ValidateArgs),
    /// Block until the folder's migrations are applied, without taking the lock.
    #[command(
        after_help = "Example:\n  dbwarden wait -u postgres://app@db/prod --until latest --timeout 10m\n\nFor replicas and init containers that must not migrate themselves.\nExit: 0 applied, 3 timed out, 78 halted for review, 2 a file it waits for\nchanged (or is out of order)."
    )]
    Wait(WaitArgs),
    /// Show the history table.
    #[command(after_help = "Example:\n  dbwarden history -u sqlite://app.db --json")]
    History(HistoryArgs),
    /// Take over a database sqlx-cli, golang-migrate or goose migrated (audited).
    #[command(
        after_help = "Example:\n  dbwarden adopt -u postgres://app@db/prod --from sqlx --dry-run\n\nImports the other tool's applied migrations as applied, without running them,\nin one transaction. What it left unfinished halts for review (exit 78)."
    )]
    Adopt(AdoptArgs),
    /// Record every migration up to VERSION applied, without running it (audited).
    #[command(
        after_help = "Example:\n  dbwarden baseline 20240101000000 -u postgres://app@db/prod --yes\n\nFor a database built by hand or restored from a dump."
    )]
    Baseline(BaselineArgs),
    /// Serve the lock's metrics on /metrics for Prometheus (one or several databases).
    #[command(
        after_help = "Example:\n  dbwarden exporter --listen 127.0.0.1:9711 -u postgres://app@db/prod\n\nTargets: -u/--namespace/--migrations, or [[exporter.targets]] in the config file\n(database_url, namespaces, migrations). Every scrape reads every target; one\nthat does not answer is dbwarden_up 0, never an error page. See docs/operations.md."
    )]
    Exporter(ExporterArgs),
}

#[derive(Debug, Args)]
pub struct ExporterArgs {
    #[command(flatten)]
    pub common: Common,
    /// Address to serve /metrics on, e.g. 127.0.0.1:9711 (no default: pick a free port)
    #[arg(long, value_name = "ADDR")]
    pub listen: String,
    /// Migrations folder whose pending/changed/review counts are exported [env: DBWARDEN_MIGRATIONS]
    #[arg(long, value_name = "DIR")]
    pub migrations: Option<String>,
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub common: Common,
    /// Migrations folder [env: DBWARDEN_MIGRATIONS] [default: ./migrations]
    #[arg(long, value_name = "DIR")]
    pub migrations: Option<String>,
    /// How long to wait for a busy lock: 0 = try once [env: DBWARDEN_WAIT] [default: 5m]
    #[arg(long, value_name = "DUR")]
    pub wait: Option<String>,
    /// If another runner holds the lock, print one line and exit 0.
    #[arg(long, conflicts_with = "wait")]
    pub skip_if_locked: bool,
    /// Print the plan without taking the lock.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the SQL of the plan, statement by statement as it would be sent, with each file's
    /// transaction mode (implies --dry-run; nothing runs, no lock is taken).
    #[arg(long)]
    pub sql: bool,
    /// Apply nothing above this version.
    #[arg(long, value_name = "VERSION")]
    pub to: Option<i64>,
    /// Also hold this lock every runner shares around the run: a lock-only engine's URL
    /// (redis://, redis+sentinel://, redis+cluster://) [env: DBWARDEN_LOCK_URL]
    #[arg(long, value_name = "URL", visible_alias = "redis-url")]
    pub lock_url: Option<String>,
    /// Proceed although an applied migration's file changed.
    #[arg(long)]
    pub allow_changed: bool,
    /// Apply pending migrations below the highest applied version (in version order) instead
    /// of refusing [env: DBWARDEN_ALLOW_OUT_OF_ORDER]
    #[arg(long)]
    pub allow_out_of_order: bool,
    /// resume_idempotent | halt | force [env: DBWARDEN_RECOVERY_POLICY]
    #[arg(long, value_name = "POLICY")]
    pub recovery_policy: Option<String>,
    /// How long one statement may wait for a table lock before its attempt is rolled back and
    /// retried: 0 = as long as the server lets it [env: DBWARDEN_LOCK_TIMEOUT] [default: 2s]
    #[arg(long, value_name = "DUR")]
    pub lock_timeout: Option<String>,
    /// Retries of an attempt that ran out of --lock-timeout [env: DBWARDEN_LOCK_RETRIES]
    /// [default: 10]
    #[arg(long, value_name = "N")]
    pub lock_retries: Option<String>,
    /// Owner label shown to others [default: host:pid]
    #[arg(long, value_name = "LABEL")]
    pub owner: Option<String>,
    /// Print a JSON summary on stdout (and nothing else there).
    #[arg(long)]
    pub json: bool,
    /// First adopt another tool's history if this database has one (see `adopt`).
    #[arg(long)]
    pub adopt: bool,
    #[command(flatten)]
    pub hooks: HookArgs,
    /// Migrate every target of FILE in this one process: TOML `[[targets]]` (database_url,
    /// name, namespace, schema, migrations) or one URL per line; `-` reads standard input
    #[arg(long, value_name = "FILE", conflicts_with_all = ["database_url", "dry_run", "sql", "adopt", "skip_if_locked"])]
    pub targets: Option<String>,
    /// With --targets: targets in flight at once [default: 8]
    #[arg(long, value_name = "N", requires = "targets", value_parser = clap::value_parser!(u16).range(1..))]
    pub parallel: Option<u16>,
    /// With --targets: run the first K targets first; if one fails, start no other
    #[arg(long, value_name = "K", requires = "targets")]
    pub canary: Option<usize>,
    /// With --targets: after F failed targets start no new one (those running finish)
    #[arg(long, value_name = "F", requires = "targets", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_failures: Option<u32>,
}

#[derive(Debug, Args)]
pub struct AdoptArgs {
    #[command(flatten)]
    pub common: Common,
    /// Migrations folder [default: ./migrations]
    #[arg(long, value_name = "DIR")]
    pub migrations: Option<String>,
    /// The tool whose history to import: sqlx, golang-migrate or goose [default: the one present]
    #[arg(long, value_name = "TOOL")]
    pub from: Option<String>,
    /// Show what would be imported, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask (required without a terminal).
    #[arg(long)]
    pub yes: bool,
    /// Adopt although a file changed since the other tool applied it.
    #[arg(long)]
    pub allow_changed: bool,
    /// How long to wait for a busy lock [default: 5m]
    #[arg(long, value_name = "DUR")]
    pub wait: Option<String>,
    #[command(flatten)]
    pub hooks: HookArgs,
}

#[derive(Debug, Args)]
pub struct BaselineArgs {
    /// The last migration the database already has.
    pub version: i64,
    #[command(flatten)]
    pub common: Common,
    /// Migrations folder [default: ./migrations]
    #[arg(long, value_name = "DIR")]
    pub migrations: Option<String>,
    /// Show what would be recorded, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask (required without a terminal).
    #[arg(long)]
    pub yes: bool,
    /// How long to wait for a busy lock [default: 5m]
    #[arg(long, value_name = "DUR")]
    pub wait: Option<String>,
    #[command(flatten)]
    pub hooks: HookArgs,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub common: Common,
    /// One JSON object on stdout (the same as --format json).
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// text, json, or openmetrics (for node_exporter's textfile collector: exit 0 whenever the
    /// exposition was written, dbwarden_up 0 when the database did not answer).
    #[arg(long, value_name = "FORMAT", value_parser = ["text", "json", "openmetrics"])]
    pub format: Option<String>,
    /// Refresh every second until interrupted.
    #[arg(long, conflicts_with = "format")]
    pub watch: bool,
    /// One verdict per target of FILE (as `migrate --targets` reads it; `-` reads standard
    /// input); the exit code is the most severe target's
    #[arg(long, value_name = "FILE", conflicts_with_all = ["database_url", "watch"])]
    pub targets: Option<String>,
    /// With --targets: targets read at once [default: 8]
    #[arg(long, value_name = "N", requires = "targets", value_parser = clap::value_parser!(u16).range(1..))]
    pub parallel: Option<u16>,
}

#[derive(Debug, Args)]
pub struct UnlockArgs {
    #[command(flatten)]
    pub common: Common,
    /// Only remove the lock of this execution id.
    #[arg(long, value_name = "EXECUTION_ID")]
    pub holder: Option<String>,
    /// Do not ask (required without a terminal).
    #[arg(long)]
    pub yes: bool,
    #[command(flatten)]
    pub hooks: HookArgs,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("decision").required(true).args(["retry", "mark_applied", "abandon"])))]
pub struct ResolveArgs {
    /// The migration version halted for review.
    pub version: i64,
    #[command(flatten)]
    pub common: Common,
    /// Migrations folder [default: ./migrations]
    #[arg(long, value_name = "DIR")]
    pub migrations: Option<String>,
    /// Re-run it from the statement that was in flight.
    #[arg(long)]
    pub retry: bool,
    /// Record it applied without running anything.
    #[arg(long)]
    pub mark_applied: bool,
    /// Forget the attempt: it is pending again from its first statement.
    #[arg(long)]
    pub abandon: bool,
    /// Do not ask (required without a terminal).
    #[arg(long)]
    pub yes: bool,
    /// How long to wait for a busy lock [default: 5m]
    #[arg(long, value_name = "DUR")]
    pub wait: Option<String>,
    #[command(flatten)]
    pub hooks: HookArgs,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["to", "steps"])))]
pub struct RevertArgs {
    #[command(flatten)]
    pub common: Common,
    /// Migrations folder [default: ./migrations]
    #[arg(long, value_name = "DIR")]
    pub migrations: Option<String>,
    /// Revert every applied migration above this version (it stays applied)
    #[arg(long, value_name = "VERSION")]
    pub to: Option<i64>,
    /// Revert the newest N applied migrations
    #[arg(long, value_name = "N")]
    pub steps: Option<usize>,
    /// Print what would run, without taking the lock.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask (required without a terminal).
    #[arg(long)]
    pub yes: bool,
    /// How long to wait for a busy lock: 0 = try once [default: 5m]
    #[arg(long, value_name = "DUR")]
    pub wait: Option<String>,
    /// Revert although a migration's file changed since it was applied.
    #[arg(long)]
    pub allow_changed: bool,
    /// resume_idempotent | halt | force, for a revert a previous run left half-done
    #[arg(long, value_name = "POLICY")]
    pub recovery_policy: Option<String>,
    /// Owner label shown to others [default: host:pid]
    #[arg(long, value_name = "LABEL")]
    pub owner: Option<String>,
    /// Print a JSON summary on stdout (and nothing else there).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub hooks: HookArgs,
}

#[derive(Debug, Args)]
pub struct SurveyArgs {
    #[command(flatten)]
    pub common: Common,
    /// Migrations folder [default: ./migrations]
    #[arg(long, value_name = "DIR")]
    pub migrations: Option<String>,
    /// One JSON object on stdout (docs/status.schema.json).
    #[arg(long)]
    pub json: bool,
    /// Every target of FILE (as `migrate --targets` reads it; `-` reads standard input), one
    /// line each; the exit code is the most severe target's
    #[arg(long, value_name = "FILE", conflicts_with = "database_url")]
    pub targets: Option<String>,
    /// With --targets: targets read at once [default: 8]
    #[arg(long, value_name = "N", requires = "targets", value_parser = clap::value_parser!(u16).range(1..))]
    pub parallel: Option<u16>,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub survey: SurveyArgs,
    /// Pending migrations fail too (after a deploy: is the database up to date?).
    #[arg(long)]
    pub no_pending: bool,
    /// Out-of-order files are not a failure (they are applied in version order)
    /// [env: DBWARDEN_ALLOW_OUT_OF_ORDER]
    #[arg(long)]
    pub allow_out_of_order: bool,
}

#[derive(Debug, Args)]
pub struct WaitArgs {
    #[command(flatten)]
    pub common: Common,
    /// Migrations folder [default: ./migrations]
    #[arg(long, value_name = "DIR")]
    pub migrations: Option<String>,
    /// Wait for every migration up to this version, or `latest` (all of the folder)
    #[arg(long, value_name = "VERSION", default_value = "latest")]
    pub until: String,
    /// Give up after this long (exit 3) [default: 5m]
    #[arg(long, value_name = "DUR")]
    pub timeout: Option<String>,
    /// Also wake on this outer lock's release (the one a `migrate --lock-url` holds)
    /// [env: DBWARDEN_LOCK_URL]
    #[arg(long, value_name = "URL", visible_alias = "redis-url")]
    pub lock_url: Option<String>,
    /// Out-of-order files will be applied (the migrating runs allow them), so wait for them
    /// [env: DBWARDEN_ALLOW_OUT_OF_ORDER]
    #[arg(long)]
    pub allow_out_of_order: bool,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub common: Common,
    /// One JSON array on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: Common,
    /// How long to wait for a busy lock: 0 = try once [default: 5m]
    #[arg(long, value_name = "DUR")]
    pub wait: Option<String>,
    /// If another holder has the lock, print one line and exit 0 without running.
    #[arg(long, conflicts_with = "wait")]
    pub skip_if_locked: bool,
    /// Share the lock with other --shared runs; a plain run excludes them all.
    #[arg(long)]
    pub shared: bool,
    /// After SIGTERM on a lost lock, wait this long before SIGKILL
    #[arg(long, value_name = "DUR", default_value = "10s")]
    pub kill_after: String,
    /// Owner label shown to others [default: host:pid]
    #[arg(long, value_name = "LABEL")]
    pub owner: Option<String>,
    /// Also hold this lock every runner shares around the command: a lock-only engine's URL
    /// (redis://...) [env: DBWARDEN_LOCK_URL]
    #[arg(long, value_name = "URL", visible_alias = "redis-url")]
    pub lock_url: Option<String>,
    #[command(flatten)]
    pub hooks: HookArgs,
    /// The command and its arguments (after --).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}
