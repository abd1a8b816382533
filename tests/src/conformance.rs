//! The contract of `MigrationLock`, `HeldLock`, `Heartbeat` and `MigrationStore` (docs/design.md
//! §5), checked the same way on every engine through the library: one line per engine in
//! `tests/tests/conformance.rs` runs all of it. Each check uses its own namespace.
//!
//! - exclusion: a second contender is refused while the lock is held, and takes it after release;
//! - namespaces are independent;
//! - dropping a lease (without `release`) frees the lock promptly, on every engine;
//! - fencing tokens strictly increase with every acquire, whoever acquires;
//! - `observe` and the verdict: AVAILABLE, then HEALTHY naming the holder, its token and the
//!   ttl it runs with, then AVAILABLE again;
//! - a holder that dies without its final state reads DEAD, and the next acquirer is handed
//!   its status row (what recovery inspects);
//! - `force_unlock`: `--holder` with someone else's id changes nothing; an unlock fires the
//!   holder's lost-signal, fences out every write of its store, and lets the next one in with a
//!   larger token; nothing held is "nothing to unlock";
//! - every store write with a token that is not the stored one fails as lost and writes nothing;
//! - a holder whose heartbeat stops (its process frozen, its session alive): a grade A or B
//!   lock stays its own past the ttl and reads STUCK; a grade C lease goes to the next
//!   contender once the ttl ran out, never before, with a larger token and the old holder's row
//!   handed over, and the frozen holder's writes are fenced out;
//! - an audit row can be written without the lock.

use std::future::Future;
use std::time::{Duration, Instant};

use dbwarden_core::config::{LockKind, Settings};
use dbwarden_core::lock::UnlockOutcome;
use dbwarden_core::migration::Migration;
use dbwarden_core::{
    Attempt, AuditRecord, Error, FencingToken, Grade, HeartbeatConfig, HolderInfo, Lease,
    LockState, MigrationLock, Namespace, Verdict, Wait, verdict, wait::acquire,
};
use uuid::Uuid;

/// An engine's factory, as every engine crate exports it.
pub type Factory = fn(&Settings) -> Result<Box<dyn MigrationLock>, Error>;

/// The heartbeat every check holds with: short, so a lost lease is noticed within seconds.
const HB: HeartbeatConfig = HeartbeatConfig {
    interval: Duration::from_millis(500),
    ttl: Duration::from_secs(3),
};

/// One engine on one fresh database.
pub struct Subject {
    pub name: &'static str,
    pub url: String,
    pub factory: Factory,
    /// Prepended to every namespace (for servers that tests share without a database of
    /// their own: Redis).
    pub prefix: String,
    /// The primitive, where the engine offers a choice (PostgreSQL's `lock = "lease"`).
    pub lock: LockKind,
    /// ClickHouse's `cluster` setting.
    pub cluster: Option<String>,
}

impl Subject {
    pub fn new(name: &'static str, url: String, factory: Factory) -> Subject {
        Subject {
            name,
            url,
            factory,
            prefix: String::new(),
            lock: LockKind::Native,
            cluster: None,
        }
    }

    /// A new lock object on the subject's database, as another process would open it.
    fn lock(&self, ns: &str) -> Box<dyn MigrationLock> {
        self.lock_held_with(ns, HB)
    }

    /// [`Self::lock`] for leases of `hb`.
    fn lock_held_with(&self, ns: &str, hb: HeartbeatConfig) -> Box<dyn MigrationLock> {
        let settings = Settings {
            database_url: self.url.clone(),
            namespace: Namespace::new(&format!("{}{ns}", self.prefix)).unwrap(),
            lock_ttl: Some(hb.ttl),
            heartbeat_interval: hb.interval,
            lock: self.lock,
            cluster: self.cluster.clone(),
            ..Settings::default()
        };
        (self.factory)(&settings).unwrap_or_else(|e| panic!("[{}] opening {ns}: {e}", self.name))
    }
}

/// Run every check on `subject`.
pub fn run(subject: Subject) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let s = &subject;
    rt.block_on(async {
        check(s, "exclusion", exclusion_and_handover(s)).await;
        check(s, "namespaces", namespaces_are_independent(s)).await;
        check(s, "drop", dropping_a_lease_frees_the_lock(s)).await;
        check(s, "tokens", tokens_strictly_increase(s)).await;
        check(s, "observe", observe_and_verdict(s)).await;
        check(s, "dead holder", a_dead_holder_is_found(s)).await;
        check(s, "unlock", unlock_fences_out_and_signals(s)).await;
        check(s, "stale tokens", stale_token_writes_fail(s)).await;
        check(s, "frozen holder", a_frozen_holder_by_grade(s)).await;
        check(s, "audit", audit_without_the_lock(s)).await;
    });
}

async fn check(s: &Subject, what: &str, f: impl Future<Output = ()>) {
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("[{}] {what}: no answer within 60 s", s.name));
    eprintln!("[{}] {what}: ok in {:?}", s.name, t0.elapsed());
}

fn holder(label: &str) -> HolderInfo {
    HolderInfo::current(Some(label.to_owned()), format!("conformance {label}"))
}

async fn take(s: &Subject, lock: &dyn MigrationLock, who: &HolderInfo, wait: Wait) -> Lease {
    acquire(lock, who, wait, HB)
        .await
        .unwrap_or_else(|e| panic!("[{}] {} could not acquire: {e}", s.name, who.owner))
}

/// One attempt by `who` while someone else holds the lock: refused, naming the holder where
/// the engine names one.
async fn refused(s: &Subject, lock: &dyn MigrationLock, who: &HolderInfo, by: &HolderInfo) {
    match lock.try_acquire(who).await {
        Ok(Attempt::Busy(info)) => {
            if let Some(h) = &info.holder {
                assert_eq!(h.execution_id, by.execution_id, "[{}] {info}", s.name);
            }
        }
        Err(e) if e.is_busy() => {}
        Ok(Attempt::Acquired(_)) => panic!("[{}] two holders at once", s.name),
        Ok(Attempt::BrokeThenBusy(b, _)) => {
            panic!("[{}] broke a live holder's lock: {b:?}", s.name)
        }
        Err(e) => panic!("[{}] a busy attempt failed: {e}", s.name),
    }
    lock.stop_waiting().await;
}

async fn exclusion_and_handover(s: &Subject) {
    let (a, b) = (s.lock("excl"), s.lock("excl"));
    let (ha, hb) = (holder("a"), holder("b"));
    let la = take(s, &*a, &ha, Wait::No).await;
    refused(s, &*b, &hb, &ha).await;
    let ta = la.fencing_token();
    la.release().await.unwrap();
    let lb = take(s, &*b, &hb, Wait::Up(Duration::from_secs(10))).await;
    assert!(lb.fencing_token() > ta, "[{}] tokens must grow", s.name);
    lb.release().await.unwrap();
}

async fn namespaces_are_independent(s: &Subject) {
    let (a, c) = (s.lock("ns_one"), s.lock("ns_two"));
    let la = take(s, &*a, &holder("a"), Wait::No).await;
    let lc = take(s, &*c, &holder("c"), Wait::No).await;
    lc.release().await.unwrap();
    la.release().await.unwrap();
}

async fn dropping_a_lease_frees_the_lock(s: &Subject) {
    // A lease far longer than a drop takes even on a loaded machine, so "freed by the drop"
    // and "ran out" cannot be mistaken for one another.
    const LONG: HeartbeatConfig = HeartbeatConfig {
        interval: Duration::from_secs(5),
        ttl: Duration::from_secs(30),
    };
    let (a, b) = (
        s.lock_held_with("dropped", LONG),
        s.lock_held_with("dropped", LONG),
    );
    let la = acquire(&*a, &holder("a"), Wait::No, LONG)
        .await
        .unwrap_or_else(|e| panic!("[{}] a could not acquire: {e}", s.name));
    let t = la.fencing_token();
    drop(la);
    let t0 = Instant::now();
    let lb = acquire(&*b, &holder("b"), Wait::Up(Duration::from_secs(60)), LONG)
        .await
        .unwrap_or_else(|e| panic!("[{}] b could not acquire: {e}", s.name));
    let took = t0.elapsed();
    assert!(
        took < LONG.ttl / 2,
        "[{}] the next holder got a dropped lock only after {took:?} (the lease is {:?})",
        s.name,
        LONG.ttl
    );
    assert!(lb.fencing_token() > t, "[{}]", s.name);
    lb.release().await.unwrap();
}

async fn tokens_strictly_increase(s: &Subject) {
    let locks = [s.lock("tokens"), s.lock("tokens")];
    let mut tokens = Vec::new();
    for round in 0..4 {
        let lock = &*locks[round % 2];
        let l = take(s, lock, &holder("t"), Wait::Up(Duration::from_secs(10))).await;
        tokens.push(l.fencing_token().0);
        l.release().await.unwrap();
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "[{}] tokens {tokens:?}",
        s.name
    );
    let o = locks[0].observe().await.unwrap();
    if let Some(t) = o.fencing_token {
        assert!(t >= *tokens.last().unwrap(), "[{}] observed {t}", s.name);
    }
}

async fn observe_and_verdict(s: &Subject) {
    let lock = s.lock("observed");
    let fallback = lock.default_ttl();
    let o = lock.observe().await.unwrap();
    assert!(!o.held, "[{}] {o:?}", s.name);
    assert_eq!(verdict::decide(&o, fallback), Verdict::Available);

    let me = holder("observed");
    let l = take(s, &*lock, &me, Wait::No).await;
    let o = s.lock("observed").observe().await.unwrap();
    assert!(o.held, "[{}] {o:?}", s.name);
    assert_eq!(verdict::decide(&o, fallback), Verdict::Healthy, "{o:?}");
    let h = o.holder.as_ref().expect("the holder is named");
    assert_eq!(h.execution_id, me.execution_id, "[{}] {o:?}", s.name);
    assert_eq!(h.lock_ttl_ms, Some(3000), "[{}] its own ttl: {o:?}", s.name);
    assert_eq!(verdict::judged_ttl(&o, fallback), HB.ttl);
    assert_eq!(o.fencing_token, Some(l.fencing_token().0), "[{}]", s.name);
    finish(l).await;

    let o = lock.observe().await.unwrap();
    assert!(!o.held, "[{}] {o:?}", s.name);
    assert_eq!(verdict::decide(&o, fallback), Verdict::Available, "{o:?}");
}

/// A holder that is done writes its final state, then releases (what the runner does). A
/// release without it leaves the status row RUNNING, which reads DEAD: "did not finish".
async fn finish(mut l: Lease) {
    let t = l.fencing_token();
    if let Some(store) = l.store() {
        store.set_state(t, LockState::Complete, None).await.unwrap();
    }
    l.release().await.unwrap();
}

async fn a_dead_holder_is_found(s: &Subject) {
    let (a, b) = (s.lock("dead"), s.lock("dead"));
    if a.dialect().is_none() {
        return; // a lock only: no status row outlives the lease
    }
    let ha = holder("a");
    let la = take(s, &*a, &ha, Wait::No).await;
    let ta = la.fencing_token();
    drop(la); // its session ends without a final state, as when the process dies
    // Some engines free a dropped lock in the background (ClickHouse drops its lock table):
    // wait until the primitive reads free, then judge.
    let t0 = Instant::now();
    let o = loop {
        let o = b.observe().await.unwrap();
        if !o.held || t0.elapsed() > Duration::from_secs(10) {
            break o;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let v = verdict::decide(&o, b.default_ttl());
    assert_eq!(v, Verdict::Dead, "[{}] {o:?}", s.name);
    let lb = take(s, &*b, &holder("b"), Wait::Up(Duration::from_secs(10))).await;
    let prev = lb.previous().expect("the dead holder's row");
    assert_eq!(prev.execution_id, Some(ha.execution_id), "[{}]", s.name);
    assert_eq!(prev.fencing_token, ta.0, "[{}]", s.name);
    assert!(prev.state.is_active(), "[{}] {prev:?}", s.name);
    finish(lb).await;
}

fn expect_lost(s: &Subject, r: Result<(), Error>, what: &str) {
    match r {
        Err(e) if e.is_lost() => {}
        other => panic!("[{}] {what}: expected a lost lock, got {other:?}", s.name),
    }
}

/// A migration of one harmless statement every SQL engine runs.
fn probe(lock: &dyn MigrationLock, version: i64) -> Option<Migration> {
    let dialect = lock.dialect()?;
    Some(Migration::from_sql(version, format!("probe_{version}"), "SELECT 1", dialect).unwrap())
}

/// Every store write of `lease` with `token`: each fails as lost. The writes that take a
/// lost-signal get one that never fires, so what refuses them is the database (the fence, or
/// the holder's session that an unlock ended), never the client having heard it lost.
async fn every_write_is_fenced(s: &Subject, lease: &mut Lease, token: FencingToken, m: &Migration) {
    let exec = lease.holder().execution_id;
    let lost = dbwarden_core::LostSignal::never();
    let Some(store) = lease.store() else { return };
    expect_lost(
        s,
        store.set_state(token, LockState::Running, Some(m)).await,
        "set_state",
    );
    expect_lost(
        s,
        store.journal_begin(token, exec, m, 0).await,
        "journal_begin",
    );
    expect_lost(
        s,
        store.journal_statement(token, m, 0, &lost).await,
        "journal_statement",
    );
    expect_lost(
        s,
        store
            .journal_end(token, m, dbwarden_core::HistoryState::Applied, 1)
            .await,
        "journal_end",
    );
    expect_lost(s, store.mark_applied(token, exec, m).await, "mark_applied");
    expect_lost(
        s,
        store.journal_batch(token, m, 0..1, &lost).await,
        "journal_batch",
    );
    expect_lost(
        s,
        store.record_adopted(token, exec, &[m], None).await,
        "record_adopted",
    );
    expect_lost(
        s,
        store.record_adopted(token, exec, &[], Some(m)).await,
        "record_adopted (halted)",
    );
    expect_lost(s, store.forget(token, m.version).await, "forget");
    if store.transactional() {
        expect_lost(
            s,
            store.apply_in_transaction(token, exec, m, &lost).await,
            "apply_in_transaction",
        );
    }
}

async fn unlock_fences_out_and_signals(s: &Subject) {
    let (a, b, c) = (s.lock("unlocked"), s.lock("unlocked"), s.lock("unlocked"));
    let (ha, hb) = (holder("a"), holder("b"));
    let me = holder("operator");
    let record = AuditRecord::new(a.namespace(), "forced_unlock", &me, "conformance");

    let mut la = take(s, &*a, &ha, Wait::No).await;
    let ta = la.fencing_token();
    match dbwarden_core::unlock::force(&*c, Some(Uuid::new_v4()), &record)
        .await
        .unwrap()
    {
        UnlockOutcome::HolderMismatch { actual } => {
            assert_eq!(actual, Some(ha.execution_id), "[{}]", s.name)
        }
        other => panic!("[{}] --holder of someone else: {other:?}", s.name),
    }
    refused(s, &*b, &hb, &ha).await;
    assert!(
        !la.is_lost(),
        "[{}] a mismatched unlock touched the holder",
        s.name
    );

    match dbwarden_core::unlock::force(&*c, None, &record)
        .await
        .unwrap()
    {
        UnlockOutcome::Unlocked { holder: Some(h) } => {
            assert_eq!(h.execution_id, ha.execution_id, "[{}]", s.name)
        }
        UnlockOutcome::Unlocked { holder: None } => {}
        other => panic!("[{}] unlock of a live holder: {other:?}", s.name),
    }
    tokio::time::timeout(Duration::from_secs(10), la.lost())
        .await
        .unwrap_or_else(|_| panic!("[{}] the unlocked holder never heard it", s.name));
    if let Some(m) = probe(&*a, 901) {
        every_write_is_fenced(s, &mut la, ta, &m).await;
        let history = c.read_history().await.unwrap();
        assert!(
            history.iter().all(|r| r.version != 901),
            "[{}] a fenced-out write landed: {history:?}",
            s.name
        );
    }
    drop(la);

    let lb = take(s, &*b, &hb, Wait::Up(Duration::from_secs(15))).await;
    assert!(lb.fencing_token() > ta, "[{}]", s.name);
    finish(lb).await;
    match dbwarden_core::unlock::force(&*c, None, &record)
        .await
        .unwrap()
    {
        UnlockOutcome::NothingToUnlock => {}
        other => panic!("[{}] unlock of a free lock: {other:?}", s.name),
    }
}

async fn stale_token_writes_fail(s: &Subject) {
    let lock = s.lock("stale");
    let Some(m) = probe(&*lock, 902) else { return };
    let mut l = take(s, &*lock, &holder("s"), Wait::No).await;
    let t = l.fencing_token();
    every_write_is_fenced(s, &mut l, FencingToken(t.0 + 1), &m).await;
    every_write_is_fenced(s, &mut l, FencingToken(t.0 - 1), &m).await;
    let exec = l.holder().execution_id;
    // With its own token the same store writes.
    let store = l.store().expect("a store");
    store.mark_applied(t, exec, &m).await.unwrap();
    store.forget(t, m.version).await.unwrap();
    l.release().await.unwrap();
    let history = lock.read_history().await.unwrap();
    assert!(
        history.iter().all(|r| r.version != 902),
        "[{}] {history:?}",
        s.name
    );
}

async fn audit_without_the_lock(s: &Subject) {
    let lock = s.lock("audited");
    let me = holder("auditor");
    let record = AuditRecord::new(lock.namespace(), "lock_conflict", &me, "conformance");
    lock.audit(&record).await.unwrap();
}

/// A holder frozen with the lock: taken without a lease, so nothing beats for it, and kept.
async fn a_frozen_holder_by_grade(s: &Subject) {
    let (a, b) = (s.lock("frozen"), s.lock("frozen"));
    // As core's acquire records them: the ttl the holder is judged by.
    let (ha, hb) = (holder("frozen").with_settings(&HB), holder("next"));
    let (ta, mut held) = match a.try_acquire(&ha).await {
        Ok(Attempt::Acquired(grant)) => (grant.token, grant.held),
        Ok(Attempt::Busy(info) | Attempt::BrokeThenBusy(_, info)) => {
            panic!("[{}] a free lock was busy: {info}", s.name)
        }
        Err(e) => panic!("[{}] {e}", s.name),
    };
    let taken_at = Instant::now();
    match a.grade() {
        Grade::A | Grade::B => {
            // Its session (or process) is alive: past its ttl it is stuck, not free.
            tokio::time::sleep(HB.ttl + Duration::from_secs(1)).await;
            refused(s, &*b, &hb, &ha).await;
            let o = b.observe().await.unwrap();
            assert_eq!(
                verdict::decide(&o, b.default_ttl()),
                Verdict::Stuck,
                "[{}] {o:?}",
                s.name
            );
            held.release().await.unwrap();
            let lb = take(s, &*b, &hb, Wait::Up(Duration::from_secs(10))).await;
            assert!(lb.fencing_token() > ta, "[{}]", s.name);
            lb.release().await.unwrap();
        }
        Grade::C => {
            // Only the ttl frees it: the next contender waits it out, and not less.
            let lb = take(s, &*b, &hb, Wait::Up(HB.ttl * 4)).await;
            let waited = taken_at.elapsed();
            assert!(
                waited >= HB.ttl - Duration::from_millis(250),
                "[{}] a live lease was taken after {waited:?}, within its {:?} ttl",
                s.name,
                HB.ttl
            );
            assert!(lb.fencing_token() > ta, "[{}]", s.name);
            if a.dialect().is_some() {
                let prev = lb.previous().expect("the frozen holder's row");
                assert_eq!(prev.execution_id, Some(ha.execution_id), "[{}]", s.name);
            }
            // The frozen holder wakes: every write it tries is fenced out.
            if let (Some(m), Some(store)) = (probe(&*a, 903), held.store()) {
                let exec = ha.execution_id;
                expect_lost(s, store.mark_applied(ta, exec, &m).await, "mark_applied");
                expect_lost(
                    s,
                    store.set_state(ta, LockState::Complete, None).await,
                    "set_state",
                );
                let history = b.read_history().await.unwrap();
                assert!(
                    history.iter().all(|r| r.version != 903),
                    "[{}] {history:?}",
                    s.name
                );
            }
            drop(held);
            finish(lb).await;
        }
    }
}
