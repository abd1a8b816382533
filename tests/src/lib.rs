//! Helpers for dbwarden's integration tests: run the real `dbwarden` binary as separate
//! processes in a private temporary folder, and look at the database it wrote.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use tempfile::TempDir;

pub mod chaos;
pub mod clickhouse;
pub mod conformance;
pub mod etcd_util;
pub mod memory;
pub mod modes;
pub mod mysql;
pub mod netns;
pub mod peers;
pub mod pg;
pub mod proxy;
pub mod redis_util;
pub mod schema;

/// A short unique name for a per-test database or namespace: `<prefix>_<12 hex>`.
pub fn unique_name(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A server URL for tests from `var`, or the local default; tests never skip silently.
pub fn server_url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// The 3-member etcd cluster of scripts/services.sh (`DBWARDEN_TEST_ETCD_URL`).
pub fn etcd_url() -> String {
    server_url(
        "DBWARDEN_TEST_ETCD_URL",
        "etcd://127.0.0.1:2379,127.0.0.1:2381,127.0.0.1:2383",
    )
}

/// `scripts/services.sh WHAT` (start, or for `pg-failover` / `etcd-kill-leader` stop, one of
/// the suite's servers); a failure fails the test with the script's output.
pub fn services(what: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/services.sh");
    let out = Command::new("bash")
        .args([script, what])
        .output()
        .expect("bash scripts/services.sh");
    assert!(
        out.status.success(),
        "scripts/services.sh {what} failed (its servers are part of the suite):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A loopback port nothing listens on right now (for a server a test starts itself).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// `promtool check metrics` on an exposition: it must pass with nothing to say.
pub fn promtool_check_metrics(text: &str) {
    use std::io::Write;
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/services.sh promtool installs it)");
    promtool
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = promtool.wait_with_output().expect("promtool");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `dbwarden` binary: `$DBWARDEN_BIN`, or built (once per test process) with cargo.
pub fn dbwarden_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(p) = std::env::var("DBWARDEN_BIN") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().expect("current test executable");
        // target/<profile>/deps/<test> -> target/<profile>/dbwarden, built in that profile
        // (scripts/soak.sh runs the tests with --release: the binary must be that build too).
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target dir")
            .to_path_buf();
        // With the etcd engine: the tests run `--lock-url etcd://…` (scripts/services.sh
        // installs the protoc it needs).
        let mut args = vec![
            "build",
            "-q",
            "-p",
            "dbwarden-cli",
            "--features",
            "etcd",
            "--bin",
            "dbwarden",
        ];
        if dir.file_name().is_some_and(|n| n == "release") {
            args.push("--release");
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        // Without the variables cargo set for this test crate: ring's build script watches
        // CARGO_MANIFEST_DIR, so with it this build rebuilt ring, rustls, sqlx and every
        // engine crate, and the next `cargo nextest run` rebuilt them back (about 50 s each).
        for (k, _) in std::env::vars() {
            if k.starts_with("CARGO_PKG_")
                || k.starts_with("CARGO_MANIFEST_")
                || k.starts_with("CARGO_CRATE_")
                || k.starts_with("CARGO_BIN_")
                || matches!(
                    k.as_str(),
                    "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR" | "OUT_DIR"
                )
            {
                build.env_remove(k);
            }
        }
        let status = build
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build for the dbwarden binary");
        assert!(status.success(), "cargo build -p dbwarden-cli failed");
        let bin = dir.join("dbwarden");
        assert!(
            bin.exists(),
            "dbwarden binary not found at {}",
            bin.display()
        );
        bin
    })
    .clone()
}

/// A private working folder for one test, with helpers to run `dbwarden` in it.
pub struct Sandbox {
    pub dir: TempDir,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    pub fn new() -> Self {
        Sandbox {
            dir: tempfile::Builder::new()
                .prefix("dbwarden-test-")
                .tempdir()
                .expect("tempdir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn db(&self) -> PathBuf {
        self.path().join("dbwarden.db")
    }

    pub fn migrations(&self) -> PathBuf {
        self.path().join("migrations")
    }

    /// A `dbwarden` command in this folder, with no DATABASE_URL/DBWARDEN_* leaking in.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(dbwarden_bin());
        c.args(args).current_dir(self.path()).stdin(Stdio::null());
        for (k, _) in std::env::vars() {
            if k == "DATABASE_URL" || k.starts_with("DBWARDEN_") || k == "RUST_LOG" {
                c.env_remove(k);
            }
        }
        c
    }

    /// Run to completion (at most 120 s).
    pub fn run(&self, args: &[&str]) -> Run {
        let child = self
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dbwarden");
        Run::wait(child, Duration::from_secs(120))
    }

    pub fn spawn(&self, args: &[&str]) -> Child {
        self.cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dbwarden")
    }

    /// Write `migrations/<name>` (creating the folder).
    pub fn write_migration(&self, name: &str, sql: &str) {
        std::fs::create_dir_all(self.migrations()).unwrap();
        std::fs::write(self.migrations().join(name), sql).unwrap();
    }

    /// Every path below the folder (to prove that nothing was created).
    pub fn listing(&self) -> Vec<String> {
        let mut out = Vec::new();
        walk(self.path(), self.path(), &mut out);
        out.sort();
        out
    }

    /// `lock-status --json`, parsed, with its exit code.
    pub fn status(&self, extra: &[&str]) -> (i32, serde_json::Value) {
        let mut args = vec!["lock-status", "--json"];
        args.extend_from_slice(extra);
        let r = self.run(&args);
        let v = serde_json::from_str(r.stdout.trim())
            .unwrap_or_else(|e| panic!("lock-status --json is not JSON ({e}): {r:?}"));
        (r.code, v)
    }

    /// Poll lock-status until `pred` holds (at most `limit`).
    pub fn wait_status(
        &self,
        extra: &[&str],
        limit: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let t0 = Instant::now();
        loop {
            let (_, v) = self.status(extra);
            if pred(&v) {
                return v;
            }
            assert!(t0.elapsed() < limit, "lock-status never matched; last: {v}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().display().to_string());
            if p.is_dir() && !p.is_symlink() {
                walk(root, &p, out);
            }
        }
    }
}

/// A finished process.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn wait(child: Child, limit: Duration) -> Run {
        let t0 = Instant::now();
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let out: Output = match rx.recv_timeout(limit) {
            Ok(o) => o.expect("wait for dbwarden"),
            Err(_) => {
                signal(pid, rustix::process::Signal::KILL);
                // What it said before it was killed, to tell where it hung.
                let said = rx
                    .recv_timeout(Duration::from_secs(10))
                    .ok()
                    .and_then(Result::ok)
                    .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                    .unwrap_or_default();
                panic!("dbwarden (pid {pid}) did not finish within {limit:?}; its stderr:\n{said}");
            }
        };
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            elapsed: t0.elapsed(),
        }
    }

    /// Non-empty lines on stderr.
    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect()
    }
}

/// A spawned `dbwarden` whose stderr is read as it comes, so a test can wait for the moment a
/// log line marks (run it with `-v` for the info lines) instead of sleeping and hoping.
pub struct StderrWatch {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl StderrWatch {
    /// `child` must have its stderr piped (as [`Sandbox::spawn`] does).
    pub fn new(mut child: Child) -> StderrWatch {
        use std::io::BufRead;
        let err = child.stderr.take().expect("stderr is piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        StderrWatch {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Wait (at most `limit`) for a stderr line containing `needle`.
    pub fn wait_for(&mut self, needle: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(needle);
                    self.seen.push(line);
                    if found {
                        return;
                    }
                }
                Err(_) => panic!(
                    "no stderr line with {needle:?} within {limit:?}; it said:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Wait for the process to end (at most `limit`), with everything it said.
    pub fn finish(self, limit: Duration) -> Run {
        let StderrWatch {
            child,
            lines,
            mut seen,
        } = self;
        let mut run = Run::wait(child, limit);
        // The reader ends at EOF, once the process is gone.
        seen.extend(lines.iter());
        run.stderr = seen.join("\n");
        run
    }
}

/// `kill -9` a runner (and SIGCONT it, in case it was paused), reap it, and check that the
/// kill is what ended it.
pub fn kill9(child: Child) {
    signal(child.id(), rustix::process::Signal::KILL);
    signal(child.id(), rustix::process::Signal::CONT);
    let r = Run::wait(child, Duration::from_secs(10));
    assert_eq!(r.code, -1, "the runner must die by SIGKILL: {r:?}");
}

/// Send a signal to a process (SIGKILL, SIGSTOP, SIGCONT, ...).
pub fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, sig);
    }
}

/// `body` on a fresh connection to the SQLite file `db` (created when `create`), which waits up
/// to `busy` for a write lock, on a runtime of its own; the connection is closed afterwards.
fn on_sqlite<T>(
    db: &Path,
    create: bool,
    busy: Duration,
    body: impl AsyncFnOnce(&mut sqlx::sqlite::SqliteConnection) -> T,
) -> T {
    use sqlx::Connection;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let opts = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(db)
            .create_if_missing(create)
            .busy_timeout(busy);
        let mut conn = sqlx::sqlite::SqliteConnection::connect_with(&opts)
            .await
            .unwrap_or_else(|e| panic!("open {}: {e}", db.display()));
        let out = body(&mut conn).await;
        let _ = conn.close().await;
        out
    })
}

/// Run one query against a SQLite file and return the first column of every row as strings.
pub fn sqlite_query(db: &Path, sql: &str) -> Vec<String> {
    use sqlx::Row;
    on_sqlite(db, false, Duration::from_secs(30), async |conn| {
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_all(conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        rows.iter()
            .map(|r| {
                use sqlx::ValueRef;
                let raw = r.try_get_raw(0).unwrap();
                if raw.is_null() {
                    "NULL".to_owned()
                } else if let Ok(i) = r.try_get::<i64, _>(0) {
                    i.to_string()
                } else {
                    r.try_get::<String, _>(0).unwrap_or_default()
                }
            })
            .collect()
    })
}

/// Run statements (several allowed) against a SQLite file, creating it if needed.
pub fn sqlite_exec(db: &Path, sql: &str) {
    on_sqlite(db, true, Duration::from_secs(30), async |conn| {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    })
}

/// Whether some connection holds `db`'s write lock right now: a `BEGIN IMMEDIATE` that does not
/// wait says so. A test uses it to know a statement is running, not about to start.
pub fn sqlite_write_locked(db: &Path) -> bool {
    on_sqlite(
        db,
        false,
        Duration::ZERO,
        async |conn| match sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut *conn).await {
            Ok(_) => {
                let _ = sqlx::raw_sql("ROLLBACK").execute(conn).await;
                false
            }
            Err(e) if e.to_string().contains("locked") => true,
            Err(e) => panic!("BEGIN IMMEDIATE on {}: {e}", db.display()),
        },
    )
}

pub fn sqlite_count(db: &Path, sql: &str) -> i64 {
    sqlite_query(db, sql)[0].parse().expect("a count")
}

/// Rows per second this machine's SQLite counts through a recursive CTE, measured once per
/// test process (it varies several-fold with load, so a fixed constant makes "slow" statements
/// either too short to hit or long enough to time out).
fn cte_rows_per_second() -> u64 {
    static RATE: OnceLock<u64> = OnceLock::new();
    *RATE.get_or_init(|| {
        use sqlx::Connection;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut c = sqlx::sqlite::SqliteConnection::connect("sqlite::memory:")
                .await
                .unwrap();
            let n = 1_000_000u64;
            let t0 = Instant::now();
            let _: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n}) SELECT count(*) FROM c"
            )))
            .fetch_one(&mut c)
            .await
            .unwrap();
            (n as f64 / t0.elapsed().as_secs_f64().max(1e-3)) as u64
        })
    })
}

/// A statement that keeps SQLite busy for roughly `secs` seconds on this machine.
pub fn slow_select(secs: u32) -> String {
    format!(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {}) SELECT count(*) FROM c",
        secs as u64 * cte_rows_per_second()
    )
}

/// A `sh -c` script that sleeps `secs` and appends "<name> <start> <end>" (epoch seconds) to
/// `log`: children of `dbwarden run` write it so a test can prove who overlapped whom.
pub fn timed_script(log: &Path, name: &str, secs: f64) -> String {
    format!(
        "s=$(date +%s.%N); sleep {secs}; e=$(date +%s.%N); echo \"{name} $s $e\" >> {}",
        log.display()
    )
}

/// The (name, start, end) lines [`timed_script`] children wrote.
pub fn spans(log: &Path) -> Vec<(String, f64, f64)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            (
                p[0].to_owned(),
                p[1].parse().unwrap(),
                p[2].parse().unwrap(),
            )
        })
        .collect()
}

/// The fencing tokens `migrate` runs got for holding the lock alone, sorted: a run that only
/// looked (under the shared lock, or in one consistent read) says so and took none.
fn exclusive_tokens(runs: &[Run]) -> Vec<u64> {
    let mut v: Vec<u64> = runs
        .iter()
        .flat_map(|r| r.stderr.lines())
        .filter(|l| l.starts_with("dbwarden: applied ") && !l.contains("unchanged"))
        .filter_map(|l| l.rsplit_once("fencing token ")?.1.trim().parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// `runs` started together on a fresh database whose lock now stores token `stored`: every run
/// that held the lock alone got its own token, 1..=k, and `stored` is k (the others only looked
/// and bumped nothing). Returns k.
pub fn assert_exclusive_tokens(runs: &[Run], stored: i64) -> usize {
    let tokens = exclusive_tokens(runs);
    assert_eq!(
        tokens,
        (1..=tokens.len() as u64).collect::<Vec<_>>(),
        "{runs:?}"
    );
    assert_eq!(stored, tokens.len() as i64, "{runs:?}");
    tokens.len()
}

/// The application's reads of a table on a connection of its own, every 100 ms, each timed,
/// until stopped: the longest wait (the table-lock tests' probe).
pub struct Probe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<(Duration, usize)>,
}

impl Probe {
    /// Start reading with `read` (one query, blocking until it returns).
    pub fn start(mut read: impl FnMut() + Send + 'static) -> Probe {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let (mut longest, mut n) = (Duration::ZERO, 0);
            while !flag.load(Ordering::SeqCst) {
                let t0 = Instant::now();
                read();
                longest = longest.max(t0.elapsed());
                n += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            (longest, n)
        });
        Probe { stop, handle }
    }

    /// Stop and return the longest read.
    pub fn stop(self) -> Duration {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (longest, n) = self.handle.join().expect("the probe thread");
        assert!(n >= 1, "the probe never ran");
        longest
    }
}
