//! An application replica that still runs sqlx's embedded migrator at start-up, as an app does
//! with `sqlx::migrate!("./migrations").run(&pool)`: the "old replicas" of a rolling switch
//! from sqlx to dbwarden. sqlx's `Migrator::run` takes sqlx's advisory lock for the whole run.
//!
//! Usage: `sqlx_replica <DATABASE_URL> <MIGRATIONS_DIR>`; exit 0 when the migrator succeeded,
//! 1 with its error otherwise.

use sqlx::Connection;
use sqlx::migrate::Migrator;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(url), Some(dir)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: sqlx_replica <DATABASE_URL> <MIGRATIONS_DIR>");
        std::process::exit(2);
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let r: Result<(), String> = rt.block_on(async {
        let migrator = Migrator::new(std::path::Path::new(dir))
            .await
            .map_err(|e| format!("reading {dir}: {e}"))?;
        if url.starts_with("mysql:") || url.starts_with("mariadb:") {
            let mut conn = sqlx::MySqlConnection::connect(url)
                .await
                .map_err(|e| format!("connecting: {e}"))?;
            migrator.run(&mut conn).await
        } else {
            let mut conn = sqlx::PgConnection::connect(url)
                .await
                .map_err(|e| format!("connecting: {e}"))?;
            migrator.run(&mut conn).await
        }
        .map_err(|e| format!("migrating: {e}"))
    });
    if let Err(e) = r {
        eprintln!("sqlx_replica: {e}");
        std::process::exit(1);
    }
}
