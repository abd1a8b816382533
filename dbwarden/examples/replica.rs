//! An application replica that applies its embedded migrations at start-up, the way sqlx users
//! call `sqlx::migrate!().run(&pool)`, but safe with many replicas starting at once.
//!
//! ```sh
//! # four replicas at once, in one process (each with its own lock and connections):
//! DATABASE_URL=sqlite://app.db cargo run -p dbwarden --example replica -- 4
//! # or four processes:
//! for i in 1 2 3 4; do DATABASE_URL=postgres://app@db/prod target/debug/examples/replica & done; wait
//! ```
//!
//! Exit code: 0 when the migrations are applied (by this replica or another), otherwise the
//! code `dbwarden migrate` would exit with (2 changed file or bad URL, 3 busy, 78 review, ...).

use std::process::ExitCode;

use dbwarden::{EmbeddedMigrations, Migrator, Outcome};

static MIGRATIONS: EmbeddedMigrations = dbwarden::embed_migrations!("examples/migrations");

#[tokio::main]
async fn main() -> ExitCode {
    let replicas: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let runs = (0..replicas).map(|i| async move {
        let migrator = Migrator::new(&MIGRATIONS).owner(format!("replica-{i}"));
        match migrator.run().await {
            Ok(Outcome::Done(report)) => {
                eprintln!(
                    "replica-{i}: ready: applied {} migration(s), {} already applied (fencing token {})",
                    report.applied.len(),
                    report.already_applied,
                    report.fencing_token
                );
                0
            }
            Ok(Outcome::Skipped(busy)) => {
                eprintln!("replica-{i}: skipped: {busy}");
                0
            }
            Err(e) => {
                eprintln!("replica-{i}: error: {e}");
                e.exit_code().code()
            }
        }
    });
    let worst = futures_join_all(runs).await.into_iter().max().unwrap_or(0);
    ExitCode::from(worst)
}

/// Run the replicas concurrently on this runtime.
async fn futures_join_all<F: std::future::Future<Output = u8> + Send + 'static>(
    runs: impl Iterator<Item = F>,
) -> Vec<u8> {
    let handles: Vec<_> = runs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap_or(70));
    }
    out
}
