//! The dispatcher: each subcommand is a file of its own (`migrate.rs`, `lock_status.rs`,
//! `unlock.rs`, `resolve.rs`, `history.rs`, `run.rs`, `adopt.rs`, `revert.rs`, `survey.rs`,
//! `exporter.rs`; a fleet: `fleet.rs`), and none of them calls back here.

use dbwarden_core::{Error, ExitCode};

use crate::cli::{Cli, Command};

pub async fn run(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Migrate(a) if a.targets.is_some() => {
            let path = a.targets.clone().unwrap_or_default();
            crate::fleet::migrate(a, &path).await
        }
        Command::Migrate(a) => crate::migrate::migrate(a, cli.verbose).await,
        Command::LockStatus(a) => match a.targets.clone() {
            Some(path) => crate::fleet::lock_status(&a, &path).await,
            None => crate::lock_status::lock_status(a).await,
        },
        Command::Unlock(a) => crate::unlock::unlock(a).await,
        Command::Resolve(a) => crate::resolve::resolve(a).await,
        Command::Run(a) => crate::run::command(a).await,
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "dbwarden", &mut std::io::stdout());
            Ok(ExitCode::OK)
        }
        Command::Adopt(a) => crate::adopt::adopt_command(a).await,
        Command::Baseline(a) => crate::adopt::baseline_command(a).await,
        Command::Revert(a) => crate::revert::revert(a, cli.verbose).await,
        Command::Status(a) => crate::survey::status(a).await,
        Command::Validate(a) => crate::survey::validate(a).await,
        Command::Wait(a) => crate::survey::wait(a).await,
        Command::Exporter(a) => crate::exporter::serve(a).await,
        Command::History(a) => crate::history::history(a).await,
    }
}
