//! A lease frees its lock on every path: explicit release, early return with an error, panic
//! unwinding, and cancellation of the future that owns it. Uses an in-memory lock so the
//! property is proved for the core Lease itself, independent of any engine.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dbwarden_core::error::BusyInfo;
use dbwarden_core::wait::acquire;
use dbwarden_core::{
    Attempt, AuditRecord, Beat, Error, FencingToken, Grade, Grant, Heartbeat, HeartbeatConfig,
    HeldLock, HistoryRow, HolderInfo, MigrationLock, Namespace, Observation, Wait,
};

#[derive(Default)]
struct MemLock {
    held: Arc<AtomicBool>,
    fence: Arc<AtomicU64>,
    gone: Arc<AtomicBool>,
    ns: Namespace,
    ttl_only: bool,
    /// Attempts left that fail with `Error::Busy` (a full server) before the lock is tried.
    full: AtomicU64,
}

struct MemHeld {
    held: Arc<AtomicBool>,
}

struct MemBeat(Arc<AtomicBool>);

#[async_trait]
impl Heartbeat for MemBeat {
    async fn beat(&self) -> Result<Beat, Error> {
        if self.0.load(Ordering::SeqCst) {
            Ok(Beat::Gone("taken away".into()))
        } else {
            Ok(Beat::Alive)
        }
    }
}

#[async_trait]
impl HeldLock for MemHeld {
    async fn release(self: Box<Self>) -> Result<(), Error> {
        Ok(()) // Drop does the work
    }
}

impl Drop for MemHeld {
    fn drop(&mut self) {
        self.held.store(false, Ordering::SeqCst);
    }
}

#[async_trait]
impl MigrationLock for MemLock {
    fn identity(&self) -> dbwarden_core::Identity<'_> {
        dbwarden_core::Identity {
            engine: "memory",
            grade: if self.ttl_only { Grade::C } else { Grade::A },
            namespace: &self.ns,
            reach: None,
        }
    }

    async fn try_acquire(&self, _holder: &HolderInfo) -> Result<Attempt, Error> {
        if self
            .full
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Error::Busy(Box::default()));
        }
        if self
            .held
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Ok(Attempt::Busy(BusyInfo::default()));
        }
        let token = FencingToken(self.fence.fetch_add(1, Ordering::SeqCst) + 1);
        let held = MemHeld {
            held: self.held.clone(),
        };
        let beat = MemBeat(self.gone.clone());
        Ok(Attempt::Acquired(Grant::new(token, None, beat, held)))
    }
    async fn observe(&self) -> Result<Observation, Error> {
        unimplemented!("not needed here")
    }
    async fn sight(&self) -> Result<dbwarden_core::unlock::Sighting, Error> {
        unimplemented!("not needed here")
    }
    async fn break_lock(
        &self,
        _seen: &dbwarden_core::unlock::Sighting,
        _expected: Option<uuid::Uuid>,
        _record: AuditRecord,
    ) -> Result<dbwarden_core::unlock::Broke, Error> {
        unimplemented!("not needed here")
    }
    async fn audit(&self, _record: &AuditRecord) -> Result<(), Error> {
        Ok(())
    }
    async fn read_history(&self) -> Result<Vec<HistoryRow>, Error> {
        Ok(vec![])
    }

    fn dialect(&self) -> Option<dbwarden_core::migration::Dialect> {
        None
    }
}

fn holder() -> HolderInfo {
    HolderInfo::current(None, "test")
}

const HB: HeartbeatConfig = HeartbeatConfig {
    interval: Duration::from_secs(1),
    ttl: Duration::from_secs(3),
};

#[tokio::test]
async fn released_explicitly_and_on_error_return() {
    let lock = MemLock::default();
    let lease = acquire(&lock, &holder(), Wait::No, HB).await.unwrap();
    assert_eq!(lease.fencing_token(), FencingToken(1));
    assert!(lock.held.load(Ordering::SeqCst));
    assert!(
        acquire(&lock, &holder(), Wait::No, HB)
            .await
            .unwrap_err()
            .is_busy()
    );
    lease.release().await.unwrap();
    assert!(!lock.held.load(Ordering::SeqCst));

    async fn fails(lock: &MemLock) -> Result<(), Error> {
        let _lease = acquire(lock, &holder(), Wait::No, HB).await?;
        Err(Error::database("boom"))
    }
    assert!(fails(&lock).await.is_err());
    assert!(!lock.held.load(Ordering::SeqCst), "error path must release");
    // Tokens strictly increase across acquisitions.
    let again = acquire(&lock, &holder(), Wait::No, HB).await.unwrap();
    assert_eq!(again.fencing_token(), FencingToken(3));
}

/// An engine that finds the server full says `Error::Busy` from its attempt: the wait policy
/// retries it while time is left, and reports busy (exit 3) when there is none.
#[tokio::test]
async fn a_full_server_is_waited_for_like_a_busy_lock() {
    let lock = MemLock {
        full: AtomicU64::new(2),
        ..MemLock::default()
    };
    let lease = acquire(&lock, &holder(), Wait::Up(Duration::from_secs(10)), HB)
        .await
        .unwrap();
    assert_eq!(lease.fencing_token(), FencingToken(1));
    assert_eq!(
        lock.full.load(Ordering::SeqCst),
        0,
        "both full attempts were retried"
    );
    lease.release().await.unwrap();

    lock.full.store(1, Ordering::SeqCst);
    let e = acquire(&lock, &holder(), Wait::No, HB).await.unwrap_err();
    assert_eq!(e.exit_code().code(), 3, "{e}");
    assert!(!lock.held.load(Ordering::SeqCst));
}

#[tokio::test]
async fn released_on_panic_unwinding() {
    let lock = Arc::new(MemLock::default());
    let l2 = lock.clone();
    let task = tokio::spawn(async move {
        let _lease = acquire(l2.as_ref(), &holder(), Wait::No, HB).await.unwrap();
        panic!("the migration code panicked");
    });
    assert!(task.await.unwrap_err().is_panic());
    assert!(!lock.held.load(Ordering::SeqCst), "panic must release");
}

#[tokio::test]
async fn released_on_cancellation() {
    let lock = Arc::new(MemLock::default());
    let l2 = lock.clone();
    let task = tokio::spawn(async move {
        let _lease = acquire(l2.as_ref(), &holder(), Wait::No, HB).await.unwrap();
        std::future::pending::<()>().await;
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(lock.held.load(Ordering::SeqCst));
    task.abort();
    let _ = task.await;
    assert!(
        !lock.held.load(Ordering::SeqCst),
        "cancellation must release"
    );
    // a timeout around the owner is a cancellation too
    let r = tokio::time::timeout(Duration::from_millis(50), async {
        let _lease = acquire(lock.as_ref(), &holder(), Wait::No, HB)
            .await
            .unwrap();
        std::future::pending::<()>().await
    })
    .await;
    assert!(r.is_err());
    assert!(!lock.held.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_waiter_gets_the_lock_when_the_holder_releases() {
    let lock = Arc::new(MemLock::default());
    let first = acquire(lock.as_ref(), &holder(), Wait::No, HB)
        .await
        .unwrap();
    let l2 = lock.clone();
    let waiter = tokio::spawn(async move {
        acquire(
            l2.as_ref(),
            &holder(),
            Wait::Up(Duration::from_secs(10)),
            HB,
        )
        .await
        .map(|l| l.fencing_token())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished());
    drop(first);
    assert_eq!(waiter.await.unwrap().unwrap(), FencingToken(2));
    // and a bounded wait gives up with Busy
    let _held = acquire(lock.as_ref(), &holder(), Wait::No, HB)
        .await
        .unwrap();
    let t0 = std::time::Instant::now();
    let e = acquire(
        lock.as_ref(),
        &holder(),
        Wait::Up(Duration::from_millis(300)),
        HB,
    )
    .await
    .unwrap_err();
    assert!(e.is_busy());
    assert!(t0.elapsed() >= Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn the_lost_signal_fires_when_a_beat_finds_the_lock_gone() {
    let lock = MemLock::default();
    let lease = acquire(&lock, &holder(), Wait::No, HB).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!lease.is_lost());
    lock.gone.store(true, Ordering::SeqCst);
    let reason = tokio::time::timeout(Duration::from_secs(2), lease.lost())
        .await
        .expect("lost within one interval");
    assert_eq!(reason, "taken away");
    assert!(lease.lost_signal().check().unwrap_err().is_lost());
}

#[tokio::test(start_paused = true)]
async fn a_ttl_lease_frozen_past_its_grace_is_lost_before_the_next_beat_runs() {
    // A process frozen (SIGSTOP, a VM pause) past its TTL resumes with its heartbeat task not
    // yet run; the very next check before a statement must already say lost.
    let lock = MemLock {
        ttl_only: true,
        ..MemLock::default()
    };
    let lease = acquire(&lock, &holder(), Wait::No, HB).await.unwrap();
    assert!(lease.lost_signal().check().is_ok());
    tokio::time::advance(Duration::from_secs(10)).await; // no yield to the heartbeat task
    let err = lease.lost_signal().check().unwrap_err();
    assert!(err.is_lost(), "{err}");
    assert!(err.to_string().contains("no successful heartbeat"), "{err}");
    // A grade A lease (the engine frees it only when the session dies) is not second-guessed.
    let a = MemLock::default();
    let lease = acquire(&a, &holder(), Wait::No, HB).await.unwrap();
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(lease.lost_signal().check().is_ok());
}
