//! The `dbwarden` binary: parse, load settings, run one command, map the outcome to an exit code.
#![forbid(unsafe_code)]

mod adopt;
mod cli;
mod commands;
mod common;
mod engines;
mod exporter;
mod fleet;
mod history;
mod hooks;
mod lock_status;
mod metrics;
mod migrate;
mod output;
mod progress;
mod resolve;
mod revert;
mod run;
mod survey;
mod unlock;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            let code = match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => 0,
                _ => 2,
            };
            if code == 0 {
                let _ = e.print();
            } else {
                // One clear line (clap's first line), not a wall of usage text.
                // clap's first paragraph (e.g. "required arguments were not provided: <COMMAND>")
                // folded into one line, without the usage block.
                let text = e.to_string();
                let first: Vec<&str> = text
                    .lines()
                    .take_while(|l| !l.trim().is_empty())
                    .map(str::trim)
                    .collect();
                eprintln!(
                    "dbwarden: {} (see `dbwarden --help`)",
                    first.join(" ").trim_start_matches("error: ")
                );
            }
            return ExitCode::from(code);
        }
    };
    init_tracing(cli.verbose, cli.log_format == "json");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dbwarden: error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => ExitCode::from(code.code()),
        Err(e) => {
            let msg = dbwarden_core::error::one_line(&e.to_string());
            eprintln!("dbwarden: error: {msg}");
            ExitCode::from(e.exit_code().code())
        }
    }
}

fn init_tracing(verbose: u8, json: bool) {
    let default = match verbose {
        0 => "warn,sqlx=error",
        1 => "info,sqlx=warn",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a CI log or a pod's log gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
