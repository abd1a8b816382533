//! Running the tools as separate processes, the way CI and replicas run them: `dbwarden migrate`
//! (the release binary) and `sqlx migrate run`, alone or many at once, timed from the first spawn
//! to the last exit; peak RSS through `/usr/bin/time -f %M`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::error::{Result, fail};

/// A program and its arguments.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

impl Invocation {
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, items: I) -> Self {
        self.args.extend(items.into_iter().map(Into::into));
        self
    }
}

/// How one process ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub wall: Duration,
    /// `None`: killed by a signal.
    pub code: Option<i32>,
    pub rss_kb: Option<u64>,
    /// The last line of output, for a failure message.
    pub last_error: String,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// Where the tools are and where their logs go.
pub struct Tools {
    pub dbwarden: PathBuf,
    pub sqlx: Option<PathBuf>,
    /// GNU time, for peak RSS.
    pub time: Option<PathBuf>,
    pub work: PathBuf,
    seq: AtomicU32,
}

/// A child being run, with the files its stderr and RSS land in.
pub struct Running {
    pub child: Child,
    started: Instant,
    stderr: PathBuf,
    rss: Option<PathBuf>,
}

impl Tools {
    pub fn new(dbwarden: PathBuf, sqlx: Option<PathBuf>, work: PathBuf) -> Result<Self> {
        std::fs::create_dir_all(work.join("logs"))?;
        let time = Some(PathBuf::from("/usr/bin/time")).filter(|p| p.exists());
        Ok(Tools {
            dbwarden,
            sqlx,
            time,
            work,
            seq: AtomicU32::new(0),
        })
    }

    /// `dbwarden migrate` of `dir` into `url`/`namespace`.
    pub fn dbwarden_migrate(&self, url: &str, namespace: &str, dir: &Path) -> Invocation {
        Invocation {
            program: self.dbwarden.clone(),
            args: Vec::new(),
        }
        .args([
            "migrate",
            "-u",
            url,
            "--namespace",
            namespace,
            "--migrations",
        ])
        .arg(dir)
    }

    /// Any other `dbwarden` subcommand.
    pub fn dbwarden(&self, args: &[&str]) -> Invocation {
        Invocation {
            program: self.dbwarden.clone(),
            args: Vec::new(),
        }
        .args(args.iter().copied())
    }

    /// `sqlx migrate run` of `dir` into `url`.
    pub fn sqlx_migrate(&self, url: &str, dir: &Path) -> Result<Invocation> {
        let program = self
            .sqlx
            .clone()
            .ok_or_else(|| fail("sqlx-cli not found"))?;
        Ok(Invocation {
            program,
            args: Vec::new(),
        }
        .args([
            "migrate",
            "run",
            "--no-dotenv",
            "--database-url",
            url,
            "--source",
        ])
        .arg(dir))
    }

    /// Start `inv` with a clean environment (no `DATABASE_URL`, no `DBWARDEN_*`, no config file
    /// in the working directory), stdout and stderr to a log file.
    pub fn spawn(&self, inv: &Invocation, measure_rss: bool, own_group: bool) -> Result<Running> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let stderr = self.work.join("logs").join(format!("{n}.err"));
        let rss = (measure_rss && self.time.is_some())
            .then(|| self.work.join("logs").join(format!("{n}.rss")));
        let log = std::fs::File::create(&stderr)?;
        let mut cmd = match (&rss, &self.time) {
            (Some(file), Some(time)) => {
                let mut c = Command::new(time);
                c.args(["-f", "%M", "-o"])
                    .arg(file)
                    .arg(&inv.program)
                    .args(&inv.args);
                c
            }
            _ => {
                let mut c = Command::new(&inv.program);
                c.args(&inv.args);
                c
            }
        };
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.work)
            .current_dir(&self.work)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        if own_group {
            cmd.process_group(0);
        }
        let started = Instant::now();
        let child = cmd
            .spawn()
            .map_err(|e| fail(format!("cannot start {}: {e}", inv.program.display())))?;
        Ok(Running {
            child,
            started,
            stderr,
            rss,
        })
    }

    /// Run one process to its end.
    pub async fn run(&self, inv: &Invocation, measure_rss: bool) -> Result<Outcome> {
        let r = self.spawn(inv, measure_rss, false)?;
        r.finish().await
    }

    /// Start `count` copies of `inv` at once; the wall time runs from the first spawn to the
    /// last exit.
    pub async fn run_many(
        &self,
        inv: &Invocation,
        count: usize,
    ) -> Result<(Duration, Vec<Outcome>)> {
        let t0 = Instant::now();
        let mut running = Vec::with_capacity(count);
        for _ in 0..count {
            running.push(self.spawn(inv, false, false)?);
        }
        let mut outcomes = Vec::with_capacity(count);
        for r in running {
            outcomes.push(r.finish().await?);
        }
        Ok((t0.elapsed(), outcomes))
    }
}

impl Running {
    /// Wait for the process and collect its outcome.
    pub async fn finish(mut self) -> Result<Outcome> {
        let status = self.child.wait().await?;
        let wall = self.started.elapsed();
        let rss_kb = self.rss.as_ref().and_then(|f| {
            std::fs::read_to_string(f)
                .ok()?
                .lines()
                .rev()
                .find_map(|l| l.trim().parse().ok())
        });
        let last_error = std::fs::read_to_string(&self.stderr)
            .unwrap_or_default()
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty() && !l.starts_with("Command exited"))
            .unwrap_or_default()
            .to_owned();
        Ok(Outcome {
            wall,
            code: status.code(),
            rss_kb,
            last_error,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// `k/n exit 0`, plus the first failure's message.
pub fn exit_summary(outcomes: &[Outcome]) -> String {
    let ok = outcomes.iter().filter(|o| o.ok()).count();
    let mut s = format!("{ok}/{} exit 0", outcomes.len());
    if let Some(bad) = outcomes.iter().find(|o| !o.ok()) {
        let code = bad.code.map_or("signal".to_owned(), |c| c.to_string());
        s.push_str(&format!(
            " (first failure: exit {code}: {})",
            bad.last_error
        ));
    }
    s
}
