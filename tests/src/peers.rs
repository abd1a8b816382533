//! The peer tools the drop-in tests compare with: sqlx-cli 0.9.0 (built by `scripts/test.sh`
//! into `target/peers`, as `scripts/bench.sh` builds it), and the servers' own schema dumps.
//! A missing tool fails the test loudly with the command that provides it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Run;

/// sqlx-cli's `sqlx`: `$DBWARDEN_SQLX_BIN`, or `target/peers/bin/sqlx` of this workspace.
pub fn sqlx_cli() -> PathBuf {
    let path = std::env::var_os("DBWARDEN_SQLX_BIN").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/peers/bin/sqlx"),
        PathBuf::from,
    );
    assert!(
        path.is_file(),
        "sqlx-cli 0.9.0 is missing at {} (set DBWARDEN_SQLX_BIN, or build it: `cargo install sqlx-cli --version 0.9.0 --locked --no-default-features --features postgres,mysql,sqlite,rustls --root target/peers`; scripts/test.sh does this)",
        path.display()
    );
    path
}

/// `sqlx migrate run --database-url <url> --source <dir>`, to completion (2 minutes at most).
pub fn sqlx_migrate(url: &str, dir: &Path) -> Run {
    let child = Command::new(sqlx_cli())
        .args(["migrate", "run", "--database-url", url, "--source"])
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn sqlx-cli");
    Run::wait(child, std::time::Duration::from_secs(120))
}

/// A SQLite URL sqlx-cli opens (creating the file).
pub fn sqlx_sqlite_url(db: &Path) -> String {
    format!("sqlite://{}?mode=rwc", db.display())
}

fn output(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what} could not start ({e}): is it installed?"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 dump")
}

/// The tables every tool keeps for itself, left out of a schema comparison.
const BOOKKEEPING: [&str; 4] = [
    "dbwarden_lock",
    "dbwarden_lock_audit",
    "dbwarden_migrations",
    "_sqlx_migrations",
];

/// `pg_dump --schema-only` of the database at `url`, without the tools' own tables.
pub fn pg_schema(url: &str) -> String {
    let mut cmd = Command::new("pg_dump");
    cmd.args(["--schema-only", "--no-owner", "--no-privileges"]);
    // dbwarden's tables and the audit table's sequence, and sqlx's table.
    cmd.args([
        "--exclude-table=public.dbwarden*",
        "--exclude-table=public._sqlx_migrations",
    ]);
    cmd.args(["-d", url]);
    // pg_dump 15.14+ fences the dump with `\restrict <random key>` lines.
    output(&mut cmd, "pg_dump")
        .lines()
        .filter(|l| !l.starts_with("\\restrict") && !l.starts_with("\\unrestrict"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `mariadb-dump --no-data` (with routines, events and triggers) of the database at `url`,
/// without the tools' own tables; an event's STARTS time (its creation time) is blanked.
pub fn mariadb_schema(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (auth, path) = rest.split_once('/').expect("a database in the URL");
    let db = path.split('?').next().unwrap_or(path);
    let (user, hostport) = auth.rsplit_once('@').unwrap_or(("root", auth));
    let user = user.split(':').next().unwrap_or(user);
    let (host, port) = hostport.split_once(':').unwrap_or((hostport, "3306"));
    let mut cmd = Command::new("mariadb-dump");
    cmd.args([
        "-h",
        host,
        "-P",
        port,
        "-u",
        user,
        "--no-data",
        "--skip-comments",
        "--skip-dump-date",
        "--routines",
        "--events",
        "--triggers",
    ]);
    for t in BOOKKEEPING {
        cmd.arg(format!("--ignore-table={db}.{t}"));
    }
    cmd.arg(db);
    let dump = output(&mut cmd, "mariadb-dump");
    dump.lines()
        .map(|l| match l.find("STARTS '") {
            Some(i) => {
                let end = l[i + 8..].find('\'').map_or(l.len(), |j| i + 8 + j + 1);
                format!("{}STARTS '…'{}", &l[..i], &l[end..])
            }
            None => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every schema object of the SQLite file (`type name tbl_name sql`), without the tools' own.
pub fn sqlite_schema(db: &Path) -> Vec<String> {
    crate::sqlite_query(
        db,
        "SELECT type || ' ' || name || ' ' || tbl_name || ' ' || coalesce(sql, '') FROM sqlite_master \
         WHERE name NOT LIKE 'dbwarden%' AND name NOT LIKE '_sqlx%' AND name NOT LIKE 'sqlite_%' \
         ORDER BY type, name",
    )
}

/// The migration folders under `tests/fixtures/constructs/<engine>/<part>`.
pub fn constructs(engine: &str, part: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/constructs")
        .join(engine)
        .join(part)
}

/// Copy every file of `from` into `to` (created).
pub fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the migrations folder");
    for entry in std::fs::read_dir(from).expect("read the fixture folder") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, to.join(path.file_name().expect("a file name"))).expect("copy");
    }
}

/// The versions of the `.sql` files in `dir`, sorted.
pub fn versions_in(dir: &Path) -> Vec<i64> {
    let mut v: Vec<i64> = std::fs::read_dir(dir)
        .expect("read the folder")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            dbwarden_core::migration::parse_file_name(&name).map(|(v, _)| v)
        })
        .collect();
    v.sort_unstable();
    v
}
