//! The SQLite lock between runners: a sidecar file `<db>.dbwarden-lock` (mode 0600) held with
//! `flock(LOCK_EX|LOCK_NB)` for the whole run. Grade B: the kernel drops a flock when its holder
//! dies, so a `kill -9` frees the lock at once. The body is one JSON object written in one call,
//! padded to a fixed size so a reader never sees half of an old and half of a new body; it is how
//! another process sees the holder and its heartbeat while the database itself may be write-locked.
//!
//! What it cannot prevent: a filesystem whose flock does not reach other hosts (some NFS). A body
//! written by another host is therefore never taken over automatically, and a filesystem that
//! refuses flock is a clear error rather than a silent lock-free run.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use dbwarden_core::error::BusyInfo;
use dbwarden_core::{Error, HolderInfo};
use rustix::fs::{FlockOperation, flock};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Bodies are padded with spaces to this size and written with one `write` at offset 0.
const BODY_SIZE: usize = 1024;

/// The sidecar's JSON body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SidecarBody {
    pub pid: u32,
    pub host: String,
    pub execution_id: Uuid,
    pub namespace: String,
    pub start_time: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    #[serde(default)]
    pub owner: String,
    #[serde(default)]
    pub command: String,
    #[serde(default)]
    pub fencing_token: u64,
    /// `exclusive` or `shared`.
    #[serde(default = "exclusive")]
    pub mode: String,
    /// The holder's own ttl and heartbeat interval (absent in an older version's body).
    #[serde(default)]
    pub lock_ttl_ms: Option<u64>,
    #[serde(default)]
    pub heartbeat_interval_ms: Option<u64>,
}

fn exclusive() -> String {
    "exclusive".into()
}

impl SidecarBody {
    pub fn new(holder: &HolderInfo, namespace: &str) -> Self {
        SidecarBody {
            pid: holder.pid,
            host: holder.host.clone(),
            execution_id: holder.execution_id,
            namespace: namespace.to_owned(),
            start_time: holder.started_at,
            heartbeat_at: Utc::now(),
            owner: holder.owner.clone(),
            command: holder.command.clone(),
            fencing_token: 0,
            mode: exclusive(),
            lock_ttl_ms: holder.lock_ttl_ms,
            heartbeat_interval_ms: holder.heartbeat_interval_ms,
        }
    }

    /// The lock is busy, held by this body's writer; `note` says why when it is more than held.
    pub fn busy(&self, note: Option<String>) -> BusyInfo {
        BusyInfo {
            age: Some((Utc::now() - self.start_time).to_std().unwrap_or_default()),
            fencing_token: Some(self.fencing_token),
            holder: Some(self.holder()),
            note,
            server_full: false,
        }
    }

    pub fn holder(&self) -> HolderInfo {
        HolderInfo {
            host: self.host.clone(),
            pid: self.pid,
            execution_id: self.execution_id,
            owner: if self.owner.is_empty() {
                format!("{}:{}", self.host, self.pid)
            } else {
                self.owner.clone()
            },
            command: self.command.clone(),
            started_at: self.start_time,
            lock_ttl_ms: self.lock_ttl_ms,
            heartbeat_interval_ms: self.heartbeat_interval_ms,
        }
    }
}

/// Result of one attempt to take the sidecar.
pub enum TryLock {
    Locked(Sidecar),
    /// Another process holds the flock; its body if readable.
    Held(Option<SidecarBody>),
}

/// The held sidecar file.
#[derive(Debug)]
pub struct Sidecar {
    path: PathBuf,
    file: File,
    ino: u64,
    /// The body found when the file was locked (the previous holder's), then ours once written.
    body: Mutex<Option<SidecarBody>>,
    /// Dropping unlocks; it also removes the file unless the body is someone else's.
    keep_file: std::sync::atomic::AtomicBool,
}

impl Drop for Sidecar {
    /// Every path that drops a held sidecar (an error, a cancelled acquire, a dropped lease)
    /// releases it: remove the file if it is still ours, then unlock (closing the fd).
    fn drop(&mut self) {
        if !self.keep_file.load(std::sync::atomic::Ordering::SeqCst) {
            self.release();
        }
    }
}

fn flock_error(path: &Path, e: Errno) -> Error {
    Error::usage(format!(
        "cannot lock {}: flock failed ({e}); the filesystem may not support flock (e.g. some NFS): put the database on a local filesystem",
        path.display()
    ))
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::usage(format!("cannot use lock file {}: {e}", path.display()))
}

/// Read a body; `None` when the file is empty or not ours to parse.
pub fn read_body(file: &mut File) -> Option<SidecarBody> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.take(64 * 1024).read_to_string(&mut text).ok()?;
    serde_json::from_str(text.trim()).ok()
}

/// Is `pid` alive on this host? (`kill(pid, 0)`: EPERM still means alive.)
pub fn pid_alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    if matches!(rustix::process::test_kill_process(pid), Err(Errno::SRCH)) {
        return false;
    }
    // kill(pid, 0) succeeds for a zombie (killed, not yet reaped by its parent): its flock is
    // already gone, so it must not keep the lock file "busy" for waiters.
    let stat =
        std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z") | Some("X"))
}

/// One non-blocking flock attempt on the sidecar at `path` (created 0600 if missing).
/// `Ok(Err(body))`: someone else holds it.
pub fn open_locked(
    path: &Path,
    op: FlockOperation,
) -> Result<Result<(File, u64), Option<SidecarBody>>, Error> {
    // A releaser removes the file and then unlocks; a contender that opened the old file
    // may get its flock after that. Re-check that the locked inode is still the path's.
    for attempt in 0..8 {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| io_error(path, e))?;
        match flock(&file, op) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => {
                let body = read_body(&mut file);
                // An empty body is a moment, not a holder: a writer about to write its body, or
                // the last reader removing the file it created. Look again shortly.
                if body.is_none() && attempt < 7 {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    continue;
                }
                return Ok(Err(body));
            }
            Err(e) => return Err(flock_error(path, e)),
        }
        let ino = rustix::fs::fstat(&file)
            .map_err(|e| flock_error(path, e))?
            .st_ino;
        match std::fs::metadata(path) {
            Ok(m) if m.ino() == ino => return Ok(Ok((file, ino))),
            _ => continue, // lost the race with a release; try the new file
        }
    }
    Ok(Err(None))
}

impl Sidecar {
    /// One non-blocking attempt at the exclusive flock.
    pub fn try_lock(path: &Path) -> Result<TryLock, Error> {
        match open_locked(path, FlockOperation::NonBlockingLockExclusive)? {
            Ok((mut file, ino)) => {
                let body = read_body(&mut file);
                Ok(TryLock::Locked(Sidecar {
                    path: path.to_owned(),
                    file,
                    ino,
                    body: Mutex::new(body),
                    keep_file: std::sync::atomic::AtomicBool::new(false),
                }))
            }
            Err(body) => Ok(TryLock::Held(body)),
        }
    }

    /// The body found in the file when it was locked (the previous holder's, if any).
    pub fn found_body(&self) -> Option<SidecarBody> {
        match self.body.lock() {
            Ok(b) => b.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Write our body (one `write` of a fixed-size, space-padded buffer at offset 0).
    pub fn write_body(&self, body: &SidecarBody) -> Result<(), Error> {
        let mut buf = serde_json::to_vec(body).map_err(Error::database)?;
        if buf.len() > BODY_SIZE {
            return Err(Error::usage(
                "lock file body too large (owner or command too long)",
            ));
        }
        buf.resize(BODY_SIZE, b' ');
        buf.push(b'\n');
        rustix::io::pwrite(&self.file, &buf, 0)
            .map_err(|e| io_error(&self.path, e.into()))
            .and_then(|n| {
                if n == buf.len() {
                    Ok(())
                } else {
                    Err(io_error(&self.path, std::io::Error::other("short write")))
                }
            })?;
        if let Ok(mut b) = self.body.lock() {
            *b = Some(body.clone());
        }
        Ok(())
    }

    /// The path still names our locked file (not removed by `unlock`, not replaced).
    pub fn still_ours(&self) -> bool {
        std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.ino)
    }

    /// Refresh `heartbeat_at`; `false` when the file is no longer ours.
    pub fn beat(&self) -> Result<bool, Error> {
        if !self.still_ours() {
            return Ok(false);
        }
        let Some(mut body) = self.found_body() else {
            return Ok(false);
        };
        body.heartbeat_at = Utc::now();
        self.write_body(&body)?;
        Ok(self.still_ours())
    }

    /// Unlock without removing the file: it describes another holder (a foreign host, a live
    /// pid) that we must not erase.
    pub fn leave_file(self) {
        self.keep_file
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = flock(&self.file, FlockOperation::Unlock);
    }

    /// Release: remove the file (if it is still ours), then unlock.
    pub fn release(&self) {
        if self.still_ours() {
            let _ = std::fs::remove_file(&self.path);
        }
        let _ = flock(&self.file, FlockOperation::Unlock);
    }
}

/// Audit rows that could not be written because a migration held SQLite's write lock wait in
/// `<db>.dbwarden-audit-spool` (JSON lines, each appended with one write under a short flock)
/// until the next holder moves them into `dbwarden_lock_audit`.
pub mod spool {
    use super::*;
    use dbwarden_core::AuditRecord;

    fn lock_blocking(file: &File) -> Result<(), Errno> {
        flock(file, FlockOperation::LockExclusive)
    }

    /// Append one record.
    pub fn append(path: &Path, rec: &AuditRecord) -> Result<(), Error> {
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| io_error(path, e))?;
        lock_blocking(&file).map_err(|e| flock_error(path, e))?;
        let mut line = serde_json::to_vec(rec).map_err(Error::database)?;
        line.push(b'\n');
        let r = rustix::io::write(&file, &line).map_err(|e| io_error(path, e.into()));
        let _ = flock(&file, FlockOperation::Unlock);
        r.map(|_| ())
    }

    /// Take every spooled record out of the file.
    pub fn drain(path: &Path) -> Vec<AuditRecord> {
        let Ok(mut file) = OpenOptions::new().read(true).write(true).open(path) else {
            return Vec::new();
        };
        if lock_blocking(&file).is_err() {
            return Vec::new();
        }
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        let out = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let _ = file.set_len(0);
        let _ = flock(&file, FlockOperation::Unlock);
        out
    }
}

/// What `lock-status` sees of the sidecar, without taking it.
#[derive(Debug, Clone)]
pub struct SidecarView {
    pub held: bool,
    pub body: Option<SidecarBody>,
}

/// Look at the sidecar without creating it. A shared try-lock that succeeds means no one holds it
/// exclusively; it is dropped at once.
pub fn observe(path: &Path) -> Result<SidecarView, Error> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(SidecarView {
                held: false,
                body: None,
            });
        }
        Err(e) => return Err(io_error(path, e)),
    };
    let held = match flock(&file, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            let _ = flock(&file, FlockOperation::Unlock);
            false
        }
        Err(Errno::WOULDBLOCK) => true,
        Err(e) => return Err(flock_error(path, e)),
    };
    Ok(SidecarView {
        held,
        body: read_body(&mut file),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_the_same_file_is_refused_and_sees_the_holder() {
        let dir = tempdir();
        let path = dir.join("x.db.dbwarden-lock");
        let TryLock::Locked(held) = Sidecar::try_lock(&path).unwrap() else {
            panic!("first lock must succeed")
        };
        let body = SidecarBody::new(&HolderInfo::current(Some("me".into()), "test"), "default");
        held.write_body(&body).unwrap();
        match Sidecar::try_lock(&path).unwrap() {
            TryLock::Held(Some(b)) => assert_eq!(b.execution_id, body.execution_id),
            _ => panic!("second lock must see the holder"),
        }
        let view = observe(&path).unwrap();
        assert!(view.held);
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        held.release();
        assert!(!path.exists());
        assert!(matches!(
            Sidecar::try_lock(&path).unwrap(),
            TryLock::Locked(_)
        ));
    }

    #[test]
    fn a_body_is_always_whole() {
        let dir = tempdir();
        let path = dir.join("y.dbwarden-lock");
        let TryLock::Locked(held) = Sidecar::try_lock(&path).unwrap() else {
            panic!()
        };
        let mut body = SidecarBody::new(
            &HolderInfo::current(Some("a-much-longer-owner-label".into()), "x"),
            "ns",
        );
        held.write_body(&body).unwrap();
        body.owner = "b".into();
        held.write_body(&body).unwrap();
        let mut f = File::open(&path).unwrap();
        assert_eq!(read_body(&mut f).unwrap().owner, "b");
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            BODY_SIZE as u64 + 1
        );
    }

    #[test]
    fn a_killed_but_unreaped_child_is_dead() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(pid_alive(pid));
        child.kill().unwrap();
        // not waited for yet: a zombie until reaped
        let t0 = std::time::Instant::now();
        while pid_alive(pid) && t0.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!pid_alive(pid), "a zombie counts as dead");
        child.wait().unwrap();
    }

    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        assert!(pid_alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!pid_alive(pid));
    }

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("dbwarden-sidecar-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
