//! The `hook` setting: run a command on every lock event, with the event as one JSON object on
//! its stdin (docs/operations.md, "Hooks on lock events").
//!
//! Events are queued the moment core decides them and run one at a time, in order, on a task
//! of their own: a hook never delays a statement, a heartbeat or the release of the lock. Each
//! run is bounded by `hook_timeout`; past it the hook's whole process group is killed (so the
//! `sleep` a `sh -c` started dies with it). A hook that fails, hangs or cannot start is a
//! warning on stderr and nothing else: the exit code, the rows written and what is applied are
//! those of the run without it. The command finishes its hooks (each within its bound) before
//! it exits.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use dbwarden_core::config::Settings;
use dbwarden_core::events::{Event, EventSink, Events};
use rustix::process::{Pid, Signal, kill_process_group};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// The hooks of one command: where its events go, and the task that runs them.
pub struct Hooks {
    events: Events,
    done: watch::Sender<bool>,
    worker: Option<JoinHandle<()>>,
}

struct Queue(mpsc::UnboundedSender<Event>);

impl EventSink for Queue {
    fn emit(&self, event: Event) {
        // The worker lives until `finish`; a send after it is gone has nobody left to run it.
        let _ = self.0.send(event);
    }
}

impl Hooks {
    /// Start the hook runner when `settings` name a hook (otherwise events go nowhere).
    pub fn start(settings: &Settings) -> Hooks {
        let (done, done_rx) = watch::channel(false);
        let Some(command) = settings.hook.clone() else {
            return Hooks {
                events: Events::default(),
                done,
                worker: None,
            };
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let bound = settings.hook_timeout;
        let worker = tokio::spawn(work(command, bound, rx, done_rx));
        Hooks {
            events: Events::new(Arc::new(Queue(tx))).database(&settings.database_url),
            done,
            worker: Some(worker),
        }
    }

    /// Where the command sends its events.
    pub fn events(&self) -> Events {
        self.events.clone()
    }

    /// Run what is still queued (each within its bound) and stop.
    pub async fn finish(mut self) {
        let _ = self.done.send(true);
        if let Some(worker) = self.worker.take() {
            let _ = worker.await;
        }
    }
}

async fn work(
    command: String,
    bound: Duration,
    mut queue: mpsc::UnboundedReceiver<Event>,
    mut done: watch::Receiver<bool>,
) {
    loop {
        let next = tokio::select! {
            biased;
            event = queue.recv() => event,
            _ = done.wait_for(|d| *d) => None,
        };
        match next {
            Some(event) => run(&command, bound, &event).await,
            None => break,
        }
    }
    // Finishing: what was queued before `finish` still runs, each within its bound.
    while let Ok(event) = queue.try_recv() {
        run(&command, bound, &event).await;
    }
}

/// Run the hook once for `event`, within `bound`. Only the event's name goes into a log line:
/// the command line is the operator's and may hold a secret.
async fn run(command: &str, bound: Duration, event: &Event) {
    let name = event.name();
    // One line, written in one call: hooks of several runners appending to one file
    // (`cat >> events.jsonl`) do not interleave.
    let line = format!("{}\n", event.to_json());
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .env("DBWARDEN_EVENT", name)
        .env("DBWARDEN_NAMESPACE", &event.namespace)
        .stdin(Stdio::piped())
        .stdout(stderr())
        .stderr(Stdio::inherit())
        // Its own process group: on timeout the group is killed, children included.
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("the hook for {name} could not start: {e}; the run is unaffected");
            return;
        }
    };
    let pid = child.id();
    let talk = async {
        if let Some(mut stdin) = child.stdin.take() {
            // A hook that does not read its stdin closes the pipe: not an error.
            let _ = stdin.write_all(line.as_bytes()).await;
        }
        child.wait().await
    };
    let outcome = tokio::time::timeout(bound, talk).await;
    match outcome {
        Ok(Ok(status)) if status.success() => {}
        Ok(Ok(status)) => {
            tracing::warn!("the hook for {name} failed ({status}); the run is unaffected")
        }
        Ok(Err(e)) => tracing::warn!("waiting for the hook for {name}: {e}"),
        Err(_) => {
            if let Some(pgid) = pid.and_then(|p| Pid::from_raw(p as i32)) {
                let _ = kill_process_group(pgid, Signal::KILL);
            }
            // Reaped at once after SIGKILL; bounded all the same.
            let _ = tokio::time::timeout(Duration::from_secs(1), child.wait()).await;
            tracing::warn!(
                "the hook for {name} was still running after hook_timeout ({}): killed; the run is unaffected",
                dbwarden_core::duration::human(bound)
            );
        }
    }
}

/// A hook's stdout goes to our stderr: stdout stays the command's own (`--json`).
fn stderr() -> Stdio {
    use std::os::fd::AsFd;
    match std::io::stderr().as_fd().try_clone_to_owned() {
        Ok(fd) => Stdio::from(fd),
        Err(_) => Stdio::null(),
    }
}
