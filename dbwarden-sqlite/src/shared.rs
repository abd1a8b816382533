//! Shared mode for `dbwarden run --shared`: readers hold `flock(LOCK_SH)` on the same sidecar a
//! writer locks exclusively, so readers overlap and a writer excludes them all. Each reader
//! describes itself in its own file `<lock>.readers/<execution id>.json` (the sidecar body
//! belongs to the writer); a reader file whose pid is dead on this host is left over from a
//! crash (the kernel already dropped its flock) and is ignored and removed.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use dbwarden_core::{
    Attempt, Beat, Error, FencingToken, Grant, Heartbeat, HeldLock, HolderInfo, SharedLock,
};
use rustix::fs::{FlockOperation, flock};

use crate::SqliteLock;
use crate::claim::busy;
use crate::lock::{SidecarBody, open_locked, pid_alive};
use crate::store;

/// The folder of reader files for a sidecar.
pub fn readers_dir(lock_path: &Path) -> PathBuf {
    let mut name = lock_path.as_os_str().to_owned();
    name.push(".readers");
    PathBuf::from(name)
}

/// A held shared lock.
pub struct SharedHeld {
    file: Arc<File>,
    lock_path: PathBuf,
    ino: u64,
    reader_file: PathBuf,
    released: bool,
}

fn write_reader(path: &Path, body: &SidecarBody) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let text = serde_json::to_vec(body).map_err(Error::database)?;
    let tmp = path.with_extension("tmp");
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&text))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| Error::usage(format!("cannot write {}: {e}", path.display())))
}

/// `unlock`: remove every reader file; each reader's heartbeat then reports its lease lost.
pub fn remove_all(lock_path: &Path) {
    if let Ok(rd) = std::fs::read_dir(readers_dir(lock_path)) {
        for e in rd.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Take the sidecar in shared mode; `Ok(Err(body))` when a writer holds it (with its body).
pub fn try_lock_shared(
    lock_path: &Path,
    holder: &HolderInfo,
    namespace: &str,
    token: FencingToken,
) -> Result<Result<Grant, Option<SidecarBody>>, Error> {
    let (file, ino) = match open_locked(lock_path, FlockOperation::NonBlockingLockShared)? {
        Ok(v) => v,
        Err(body) => return Ok(Err(body)),
    };
    let dir = readers_dir(lock_path);
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::usage(format!("cannot create {}: {e}", dir.display())))?;
    let mut body = SidecarBody::new(holder, namespace);
    body.mode = "shared".into();
    body.fencing_token = token.0;
    let reader_file = dir.join(format!("{}.json", holder.execution_id));
    write_reader(&reader_file, &body)?;
    let beat = ReaderHeartbeat {
        path: reader_file.clone(),
        body,
    };
    let held = SharedHeld {
        file: Arc::new(file),
        lock_path: lock_path.to_owned(),
        ino,
        reader_file,
        released: false,
    };
    Ok(Ok(Grant::new(token, None, beat, held)))
}

/// Every live shared holder; leftovers of dead readers on this host are removed.
pub fn list(lock_path: &Path) -> Vec<HolderInfo> {
    let host = dbwarden_core::holder::hostname();
    let Ok(rd) = std::fs::read_dir(readers_dir(lock_path)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let Some(body) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<SidecarBody>(&b).ok())
        else {
            continue;
        };
        if body.host == host && !pid_alive(body.pid) {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        out.push(body.holder());
    }
    out.sort_by_key(|h| h.started_at);
    out
}

struct ReaderHeartbeat {
    path: PathBuf,
    body: SidecarBody,
}

#[async_trait]
impl Heartbeat for ReaderHeartbeat {
    async fn beat(&self) -> Result<Beat, Error> {
        if !self.path.exists() {
            return Ok(Beat::Gone(
                "the reader file was removed (forced unlock?)".into(),
            ));
        }
        let mut body = self.body.clone();
        body.heartbeat_at = Utc::now();
        write_reader(&self.path, &body)?;
        Ok(Beat::Alive)
    }
}

#[async_trait]
impl HeldLock for SharedHeld {
    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        self.unlock();
        Ok(())
    }
}

impl SharedHeld {
    /// Remove our reader file and unlock. The last reader out (its shared flock converts to an
    /// exclusive one without waiting) also removes the readers folder and the sidecar, when the
    /// sidecar is still the one it locked and empty (a reader created it: a writer's release
    /// removes its own, and a body a writer left behind on purpose is never erased), so a look
    /// by `migrate` leaves no files behind. Otherwise other readers or a writer are there.
    fn unlock(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        let _ = std::fs::remove_file(&self.reader_file);
        if flock(&*self.file, FlockOperation::NonBlockingLockExclusive).is_ok() {
            let same = std::fs::metadata(&self.lock_path)
                .is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == self.ino && m.len() == 0);
            if same && std::fs::remove_dir(readers_dir(&self.lock_path)).is_ok() {
                let _ = std::fs::remove_file(&self.lock_path);
            }
        }
        let _ = flock(&*self.file, FlockOperation::Unlock);
    }
}

impl Drop for SharedHeld {
    fn drop(&mut self) {
        self.unlock();
    }
}

#[async_trait]
impl SharedLock for SqliteLock {
    async fn try_acquire_shared(&self, holder: &HolderInfo) -> Result<Attempt, Error> {
        let token = match self.connect_existing().await? {
            Some(mut conn) => store::read_status(&mut conn, self.namespace.as_str())
                .await?
                .map_or(0, |s| s.fencing_token),
            None => 0,
        };
        match try_lock_shared(
            &self.lock_path,
            holder,
            self.namespace.as_str(),
            FencingToken(token),
        )? {
            Ok(grant) => Ok(Attempt::Acquired(grant)),
            Err(body) => Ok(Attempt::Busy(busy(body.as_ref()))),
        }
    }

    async fn shared_holders(&self) -> Result<Vec<HolderInfo>, Error> {
        Ok(list(&self.lock_path))
    }
}
