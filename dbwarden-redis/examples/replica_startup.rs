//! An application replica's start-up: every replica starts at once, exactly one applies the
//! pending migrations under the Redis lease, the others wait for it and then find nothing to
//! do, and all of them go on to serve.
//!
//! ```text
//! cargo run -p dbwarden-redis --example replica_startup -- redis://127.0.0.1:6379
//! # four replicas at once:
//! for i in 1 2 3 4; do target/debug/examples/replica_startup redis://127.0.0.1:6379 & done; wait
//! ```
//!
//! The "migrations" here change data in Redis itself, so the example needs nothing else. Each
//! one is recorded with `lease.fenced_set` (see `RedisLock::fenced_set`): if this replica lost the lease meanwhile
//! (paused longer than the ttl, `dbwarden unlock`), the write is rejected instead of racing
//! the new holder. With a SQL database, pass `lease.fencing_token()` along and make the write
//! conditional on it in the same way.

use std::time::Duration;

use dbwarden_core::{Error, Wait};
use dbwarden_redis::RedisLock;

const NAMESPACE: &str = "replica-startup-example";

/// version, what it does, the command that does it.
fn migrations() -> Vec<(u64, &'static str, redis::Cmd)> {
    let key = |k: &str| format!("app:{{{NAMESPACE}}}:{k}");
    vec![
        (1, "create the feature flags", {
            let mut c = redis::cmd("HSET");
            c.arg(key("flags")).arg("new_checkout").arg("off");
            c
        }),
        (2, "seed the plan catalogue", {
            let mut c = redis::cmd("RPUSH");
            c.arg(key("plans"))
                .arg("free")
                .arg("team")
                .arg("enterprise");
            c
        }),
        (3, "turn the new checkout on", {
            let mut c = redis::cmd("HSET");
            c.arg(key("flags")).arg("new_checkout").arg("on");
            c
        }),
    ]
}

async fn start(url: &str) -> Result<(), Error> {
    let lock = RedisLock::from_url(url, NAMESPACE)?.ttl(Duration::from_secs(30));
    let data = redis::Client::open(url).map_err(|e| Error::usage(e.to_string()))?;
    let mut conn = data
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| Error::unreachable(url, e))?;
    let version_key = format!("app:{{{NAMESPACE}}}:schema_version");

    // Wait up to 5 minutes for the replica that is migrating; it renews the lease every 10 s.
    let applied = lock
        .run(Wait::Up(Duration::from_secs(300)), |lease| async move {
            let token = lease.fencing_token();
            // Read the applied version only now, under the lease.
            let current: u64 = redis::cmd("GET")
                .arg(&version_key)
                .query_async::<Option<u64>>(&mut conn)
                .await
                .map_err(Error::database)?
                .unwrap_or(0);
            let mut applied = Vec::new();
            for (version, what, cmd) in migrations() {
                if version <= current {
                    continue;
                }
                lease.check()?; // stop before the next step once the lease is lost
                let _: redis::Value = cmd.query_async(&mut conn).await.map_err(Error::database)?;
                lease.fenced_set(&version_key, version.to_string()).await?;
                applied.push(format!("{version} ({what})"));
            }
            Ok::<_, Error>((token, applied))
        })
        .await??;

    let (token, applied) = applied;
    if applied.is_empty() {
        println!(
            "pid {}: nothing to migrate (lease token {token}); serving",
            std::process::id()
        );
    } else {
        println!(
            "pid {}: applied {} under lease token {token}; serving",
            std::process::id(),
            applied.join(", ")
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("REDIS_URL").ok())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    if let Err(e) = start(&url).await {
        // busy / lost / unreachable / misconfigured each have their own exit code.
        eprintln!("replica start-up failed: {e}");
        std::process::exit(i32::from(e.exit_code().code()));
    }
}
