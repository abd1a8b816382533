//! An application that migrates every tenant's database at start-up (database-per-tenant), in
//! one process, at most N at once, each tenant under its own lock: the library form of
//! `dbwarden migrate --targets`.
//!
//! ```sh
//! cargo run -p dbwarden --example tenants -- 4 postgres://app@db/acme postgres://app@db/globex
//! ```
//!
//! Prints one line per tenant and the reports as one JSON line on stdout. Exit code: 0 when
//! every tenant is migrated (by this process or another replica), otherwise the most severe
//! tenant's, as `dbwarden migrate --targets` exits.

use std::process::ExitCode;

use dbwarden::{EmbeddedMigrations, Migrator, TargetOutcome};

static MIGRATIONS: EmbeddedMigrations = dbwarden::embed_migrations!("examples/migrations");

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let parallel: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(8);
    let tenants: Vec<String> = args.collect();
    let reports = match Migrator::new(&MIGRATIONS)
        .owner("tenants example")
        .run_targets(tenants, parallel)
        .await
    {
        Ok(reports) => reports,
        Err(e) => {
            eprintln!("tenants: error: {e}");
            return ExitCode::from(e.exit_code().code());
        }
    };
    for r in &reports {
        match &r.outcome {
            TargetOutcome::Applied { applied, .. } => {
                eprintln!("tenants: {}: ready ({applied} applied now)", r.name)
            }
            other => eprintln!("tenants: {}: {other:?}", r.name),
        }
    }
    println!("{}", serde_json::to_string(&reports).unwrap_or_default());
    ExitCode::from(dbwarden::core::fleet::exit_code(&reports).code())
}
