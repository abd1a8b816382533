//! The migration folders the process benchmarks run: 300 trivial migrations (one `CREATE TABLE`
//! and one `INSERT` each, named the sqlx way so sqlx-cli runs the same folder), and one long
//! migration for the failover benchmark.

use std::path::{Path, PathBuf};

use crate::engine::Kind;
use crate::error::Result;

/// How many trivial migrations the throughput, stampede and RSS benchmarks apply.
pub const TRIVIAL_COUNT: u32 = 300;

/// Write `count` trivial migrations for `kind` into `dir` (created) and return it.
pub fn trivial(dir: &Path, kind: Kind, count: u32) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    for v in 1..=count {
        let table = format!("bench_{v:04}");
        let create = match kind {
            Kind::ClickHouse => {
                format!("CREATE TABLE {table} (id UInt32, note String) ENGINE = Log;")
            }
            _ => {
                format!("CREATE TABLE {table} (id INTEGER PRIMARY KEY, note VARCHAR(16) NOT NULL);")
            }
        };
        let body = format!("{create}\nINSERT INTO {table} (id, note) VALUES (1, 'x');\n");
        std::fs::write(dir.join(format!("{v:04}_create_{table}.sql")), body)?;
    }
    Ok(dir.to_path_buf())
}

/// How many `INSERT`s the big data migration holds.
pub const BIG_STATEMENTS: u32 = 100_000;

/// A table, then one data migration of `statements` single-row `INSERT`s (about 8.8 MB for
/// 100 000): the file a team generates to backfill data. Plain SQL every engine runs.
pub fn big(dir: &Path, statements: u32) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("0001_create_big_data.sql"),
        "CREATE TABLE big_data (id BIGINT PRIMARY KEY, name VARCHAR(64) NOT NULL, amount BIGINT NOT NULL);\n",
    )?;
    let mut body = String::with_capacity(statements as usize * 90);
    for i in 0..statements {
        body.push_str(&format!(
            "INSERT INTO big_data (id, name, amount) VALUES ({i}, 'row number {i}; backfilled', {});\n",
            (u64::from(i) * 7919) % 100_000
        ));
    }
    std::fs::write(dir.join("0002_backfill_big_data.sql"), body)?;
    Ok(dir.to_path_buf())
}

/// One migration that keeps its runner busy for ten minutes, for `kind` (`None` where the
/// failover holder is `dbwarden run -- sleep` instead).
pub fn long(dir: &Path, kind: Kind) -> Result<Option<PathBuf>> {
    let body = match kind {
        Kind::Postgres => "SELECT pg_sleep(600);\n".to_owned(),
        Kind::MariaDb => "SELECT SLEEP(600);\n".to_owned(),
        // ClickHouse's sleep() stops at 3 s per call.
        Kind::ClickHouse => "SELECT sleep(3);\n".repeat(200),
        Kind::Sqlite | Kind::Redis | Kind::Etcd => return Ok(None),
    };
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("0001_long.sql"), body)?;
    Ok(Some(dir.to_path_buf()))
}
