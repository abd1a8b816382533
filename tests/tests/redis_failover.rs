//! A Redis primary killed (kill -9) while a lease is held, its replica promoted by Sentinel,
//! many times over: how often do two holders both believe they hold the lease?
//!
//! Each test starts a primary, a replica and a sentinel of its own on free loopback ports, so
//! it can kill primaries without touching the shared servers. Every round:
//! 1. holder A takes the lease through `redis+sentinel://` (on "lagging" rounds, while the
//!    replica is stopped with SIGSTOP and 40 MiB of writes behind: asynchronous replication
//!    has not carried the grant yet);
//! 2. the primary is killed with kill -9 (and the replica continued); Sentinel promotes it;
//! 3. holder B tries to take the same lease from the new primary. If B gets it while A still
//!    believes it holds it (A took it and its lease has not reported lost), that is one moment
//!    of two holders;
//! 4. the old primary comes back as a replica of the new one, and the next round starts.
//!
//! Without the replication wait (`?replicas=0`) the lagging rounds hand the lease out twice;
//! with it (the default, one replica), an unconfirmed grant is never handed out and a confirmed
//! one survives the failover: zero moments, and B is refused while A holds.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dbwarden_core::{Lease, Wait};
use dbwarden_redis::RedisLock;
use dbwarden_tests::{Run, Sandbox, free_port, signal, unique_name};
use rustix::process::Signal;

const ROUNDS: usize = 10;

/// A primary, a replica and one sentinel (quorum 1) of this test's own.
struct Trio {
    dir: tempfile::TempDir,
    data: [u16; 2],
    sentinel: u16,
}

impl Trio {
    /// Start the three on free ports. A port found free can be taken by another process (a
    /// client's outgoing connection, another test) before the server binds it, and a
    /// daemonized redis-server that cannot bind just exits: a trio whose servers do not all
    /// answer within 10 s is stopped and started again on other ports.
    fn start() -> Trio {
        for _ in 0..5 {
            let trio = Trio::start_once();
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(10) {
                let up = [trio.data[0], trio.data[1], trio.sentinel]
                    .iter()
                    .all(|&p| trio.answers(p));
                if up {
                    trio.wait_healthy();
                    return trio;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            eprintln!(
                "a Redis trio did not come up on ports {:?}/{} (trying others):\n{}",
                trio.data,
                trio.sentinel,
                trio.logs()
            );
        }
        panic!("five Redis trios in a row did not come up; see the logs above");
    }

    fn start_once() -> Trio {
        let dir = tempfile::tempdir().unwrap();
        let mut ports = [free_port(), free_port(), free_port()];
        while ports[0] == ports[1] || ports[1] == ports[2] || ports[0] == ports[2] {
            ports = [free_port(), free_port(), free_port()];
        }
        let trio = Trio {
            data: [ports[0], ports[1]],
            sentinel: ports[2],
            dir,
        };
        trio.start_data(trio.data[0], None);
        trio.start_data(trio.data[1], Some(trio.data[0]));
        let conf = trio.dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {s}\nbind 127.0.0.1\ndaemonize yes\npidfile {d}/{s}.pid\nlogfile {d}/{s}.log\ndir {d}\n\
                 sentinel monitor svc 127.0.0.1 {p} 1\n\
                 sentinel down-after-milliseconds svc 1000\n\
                 sentinel failover-timeout svc 2000\n",
                s = trio.sentinel,
                d = trio.dir.path().display(),
                p = trio.data[0]
            ),
        )
        .unwrap();
        run(Command::new("redis-server").arg(&conf).arg("--sentinel"));
        trio
    }

    /// The server on `port` is this trio's own (its process id is the one in our pidfile),
    /// not another process that took the port first.
    fn answers(&self, port: u16) -> bool {
        let info: Option<String> = query(port, redis::cmd("INFO").arg("server"));
        let pid = info
            .as_deref()
            .and_then(|i| field(i, "process_id"))
            .and_then(|p| p.parse::<u32>().ok());
        pid.is_some() && pid == pid_in(&self.pidfile(port))
    }

    /// The last lines of each server's log (the directory goes with the trio).
    fn logs(&self) -> String {
        let mut out = String::new();
        for port in [self.data[0], self.data[1], self.sentinel] {
            let text = std::fs::read_to_string(self.dir.path().join(format!("{port}.log")))
                .unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- {port}.log\n"));
            for l in &lines[lines.len().saturating_sub(8)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    fn start_data(&self, port: u16, replica_of: Option<u16>) {
        let d = self.dir.path();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "yes"])
            // A replica that (re)joins is served at once, not after the default 5 s that a
            // primary waits to gather more replicas for one diskless transfer.
            .args(["--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(d)
            .arg("--dbfilename")
            .arg(format!("{port}.rdb"))
            .arg("--pidfile")
            .arg(self.pidfile(port))
            .arg("--logfile")
            .arg(d.join(format!("{port}.log")));
        if let Some(p) = replica_of {
            cmd.args(["--replicaof", "127.0.0.1", &p.to_string()]);
        }
        run(&mut cmd);
    }

    fn pidfile(&self, port: u16) -> PathBuf {
        self.dir.path().join(format!("{port}.pid"))
    }

    fn pid(&self, port: u16) -> u32 {
        pid_in(&self.pidfile(port)).unwrap_or_else(|| panic!("no pid for port {port}"))
    }

    fn url(&self, replicas: u32) -> String {
        format!(
            "redis+sentinel://127.0.0.1:{}/svc?replicas={replicas}",
            self.sentinel
        )
    }

    /// Put the (stopped) replica 40 MiB of writes behind `primary`: more than the kernel's
    /// socket buffers hold, so what is written next stays in the primary's own memory and
    /// dies with it. (Without this, a grant already in the replica's socket buffer when the
    /// primary dies may still reach it.)
    fn fall_behind(&self, primary: u16) {
        let client = redis::Client::open(format!("redis://127.0.0.1:{primary}")).unwrap();
        let mut conn = client.get_connection().unwrap();
        let chunk = vec![b'x'; 4 << 20];
        for i in 0..10 {
            let _: () = redis::cmd("SET")
                .arg(format!("backlog:{i}"))
                .arg(&chunk)
                .query(&mut conn)
                .unwrap();
        }
    }

    /// The healthy primary's port and its replica's.
    fn roles(&self) -> (u16, u16) {
        let primary = self.wait_healthy();
        let replica = if primary == self.data[0] {
            self.data[1]
        } else {
            self.data[0]
        };
        (primary, replica)
    }

    /// After `primary` was killed: wait (until `deadline`) for the sentinel to name `replica`,
    /// then bring the killed one back as the new primary's replica.
    fn finish_failover(&self, primary: u16, replica: u16, deadline: Instant) {
        while self.primary() != Some(replica) {
            assert!(
                Instant::now() < deadline,
                "no new primary within 30 s of the kill:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(self.pidfile(primary));
        self.start_data(primary, Some(replica));
    }

    /// The port of the primary the sentinel names now, if it answers as one.
    fn primary(&self) -> Option<u16> {
        let addr: Vec<String> = query(
            self.sentinel,
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg("svc"),
        )?;
        let port: u16 = addr.get(1)?.parse().ok()?;
        let role: Vec<redis::Value> = query(port, &redis::cmd("ROLE"))?;
        matches!(role.first(), Some(redis::Value::BulkString(b)) if b == b"master").then_some(port)
    }

    /// The sentinel's own flags for the service say a usable primary, as a client checks them
    /// (`master`, and neither subjectively nor objectively down). Right after a failover the
    /// sentinel may still name the new primary while its flags are not there yet, and a client
    /// asking then is told the service has no primary.
    fn flags_healthy(&self) -> bool {
        let kv: Option<Vec<String>> = query(
            self.sentinel,
            redis::cmd("SENTINEL").arg("master").arg("svc"),
        );
        let flags = kv.and_then(|kv| {
            kv.chunks(2)
                .find(|p| p[0] == "flags")
                .and_then(|p| p.get(1).cloned())
        });
        flags
            .is_some_and(|f| f.contains("master") && !f.contains("s_down") && !f.contains("o_down"))
    }

    /// Until the sentinel names a primary whose replica is online and has caught up with
    /// everything the primary had written when the wait began, and its flags say so too.
    fn wait_healthy(&self) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut target: Option<(u16, u64)> = None;
        loop {
            if self.flags_healthy()
                && let Some(p) = self.primary()
                && let Some(info) = query::<String>(p, redis::cmd("INFO").arg("replication"))
                && let Some(offset) =
                    field(&info, "master_repl_offset").and_then(|o| o.parse().ok())
            {
                let want = match target {
                    Some((tp, want)) if tp == p => want,
                    _ => {
                        target = Some((p, offset));
                        offset
                    }
                };
                let caught_up = info.lines().any(|l| {
                    l.starts_with("slave0:")
                        && l.contains("state=online")
                        && replica_offset(l).is_some_and(|o| o >= want)
                });
                if caught_up {
                    return p;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no primary with an up-to-date replica within 30 s:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `offset=N` of a `slaveN:` line of INFO replication.
fn replica_offset(line: &str) -> Option<u64> {
    line.split(',')
        .find_map(|kv| kv.strip_prefix("offset="))
        .and_then(|o| o.parse().ok())
}

impl Drop for Trio {
    fn drop(&mut self) {
        for port in [self.data[0], self.data[1], self.sentinel] {
            if let Some(pid) = pid_in(&self.pidfile(port)) {
                signal(pid, Signal::CONT);
                signal(pid, Signal::KILL);
            }
        }
    }
}

fn pid_in(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .expect("redis-server (scripts/services.sh redis)");
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Option<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    cmd.query(&mut conn).ok()
}

fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

#[derive(Debug, Default)]
struct Tally {
    /// Rounds in which B took the lease while A still believed it held it.
    double_holders: usize,
    /// Rounds in which A's grant was handed out to A at all.
    a_held: usize,
    /// Rounds in which B was refused because A's lease survived the failover.
    b_refused: usize,
    failover_ms: Vec<u128>,
}

async fn acquire_b(url: &str, ns: &str) -> Result<Lease, dbwarden_core::Error> {
    // A fresh lock, as a replica starting after the failover would have.
    let b = RedisLock::from_url(url, ns)
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .statement_timeout(Duration::from_secs(2))
        .ttl(Duration::from_secs(30));
    b.acquire(Wait::No).await
}

fn campaign(replicas: u32) -> Tally {
    let trio = Trio::start();
    let url = trio.url(replicas);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut tally = Tally::default();
    for round in 0..ROUNDS {
        let lagging = round % 2 == 0;
        let (primary, replica) = trio.roles();
        let ns = unique_name("failover");
        // A renews every 10 s: its belief spans the whole failover, as with the default ttl.
        // It waits at most 500 ms (half its statement timeout) for a replica to confirm.
        let a = RedisLock::from_url(&url, &ns)
            .unwrap()
            .connect_timeout(Duration::from_secs(1))
            .statement_timeout(Duration::from_secs(1))
            .ttl(Duration::from_secs(30));
        if lagging {
            signal(trio.pid(replica), Signal::STOP);
            trio.fall_behind(primary);
        }
        // A lagging round tries once (its grant cannot be confirmed: the replica is stopped);
        // any other round waits for a confirmation slowed by the machine's load.
        let wait = if lagging {
            Wait::No
        } else {
            Wait::Up(Duration::from_secs(10))
        };
        // Under load, the 40 MiB write can keep the primary from answering the sentinel's
        // pings for its 1 s: the sentinel marks it down and a client asking then is told the
        // service has no primary. That is not the lease's answer; ask again once the sentinel
        // names the same primary as healthy (the stopped replica cannot be promoted).
        let asked_at = Instant::now();
        let lease_a = loop {
            match rt.block_on(a.acquire(wait)) {
                Err(dbwarden_core::Error::Unreachable { .. })
                    if asked_at.elapsed() < Duration::from_secs(20) =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                    while !(trio.flags_healthy() && trio.primary() == Some(primary)) {
                        assert!(
                            asked_at.elapsed() < Duration::from_secs(20),
                            "round {round}: the sentinel did not name {primary} again within 20 s:\n{}",
                            trio.logs()
                        );
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                other => break other,
            }
        };
        let primary_pid = trio.pid(primary);
        signal(primary_pid, Signal::KILL);
        if lagging {
            signal(trio.pid(replica), Signal::CONT);
        }
        let killed_at = Instant::now();
        if lease_a.is_ok() {
            tally.a_held += 1;
        } else if replicas == 0 {
            panic!("round {round}: without the replication wait A must get the lease: {lease_a:?}");
        }

        // Once a new primary answers, the killed one comes back as its replica (behind
        // Sentinel, a lease write needs a replica to confirm it); B tries from then on, and
        // errors while there is no primary or no replica yet are retried.
        let deadline = Instant::now() + Duration::from_secs(30);
        trio.finish_failover(primary, replica, deadline);
        let b_outcome = loop {
            let error = match rt.block_on(acquire_b(&url, &ns)) {
                Ok(lease) => break Some(lease),
                // Refused because A holds it; "not confirmed" (no replica back yet) is retried.
                Err(dbwarden_core::Error::Busy(info)) if !info.server_full => break None,
                Err(e) => e,
            };
            assert!(
                Instant::now() < deadline,
                "round {round}: B neither took the lease nor was refused within 30 s of the kill: {error}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        tally.failover_ms.push(killed_at.elapsed().as_millis());
        let a_believes = lease_a.as_ref().is_ok_and(|l| !l.is_lost());
        match &b_outcome {
            Some(_) if a_believes => tally.double_holders += 1,
            None => {
                assert!(
                    a_believes,
                    "round {round}: B was refused, but A does not hold the lease"
                );
                tally.b_refused += 1;
            }
            Some(_) => {}
        }
        rt.block_on(async {
            if let Some(b) = b_outcome {
                let _ = b.release().await;
            }
            if let Ok(a) = lease_a {
                let _ = a.release().await;
            }
        });
    }
    eprintln!(
        "replicas={replicas}: {ROUNDS} failovers ({} with a lagging replica): {} moments of two holders; A held in {} rounds; B refused in {}; kill → B's answer {:?} ms",
        ROUNDS.div_ceil(2),
        tally.double_holders,
        tally.a_held,
        tally.b_refused,
        tally.failover_ms
    );
    tally
}

/// The baseline: asynchronous replication alone. A grant the replica had not received when the
/// primary died is lost, and the promoted replica hands the lease to a second holder while the
/// first still believes it holds it. (This also proves the test can see two holders.)
#[test]
fn without_the_replication_wait_a_failover_hands_the_lease_out_twice() {
    let t = campaign(0);
    assert_eq!(t.a_held, ROUNDS);
    assert!(
        t.double_holders >= ROUNDS / 2,
        "every lagging round should end with two holders: {t:?}"
    );
}

/// With the replication wait (the default behind Sentinel), no failover ever makes two
/// holders: the lagging rounds' grants are never handed out, and the confirmed ones survive
/// on the promoted replica, so B is refused while A holds.
#[test]
fn with_the_replication_wait_no_failover_makes_two_holders() {
    let t = campaign(1);
    assert_eq!(t.double_holders, 0, "{t:?}");
    assert_eq!(
        t.a_held,
        ROUNDS / 2,
        "only the rounds whose replica answered may grant the lease: {t:?}"
    );
    assert_eq!(
        t.b_refused,
        ROUNDS / 2,
        "a confirmed lease survives the failover: {t:?}"
    );
}

// What a user of the CLI sees behind Sentinel (each test on a trio of its own).

fn holder_for(sb: &Sandbox, url: &str, ttl: &str, interval: &str, script: &str) -> Child {
    sb.cmd(&[
        "run",
        "-u",
        url,
        "--lock-ttl",
        ttl,
        "--heartbeat-interval",
        interval,
        "--",
        "sh",
        "-c",
        script,
    ])
    .env("DBWARDEN_CONNECT_TIMEOUT", "2s")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap()
}

/// A `run` that holds the lease when its primary is killed keeps it: the lease was confirmed
/// on the replica Sentinel promotes, the holder's renewals follow the new primary, another
/// runner is refused meanwhile, and the holder's command finishes with exit 0.
#[test]
fn a_run_holding_the_lease_through_a_failover_keeps_it() {
    let trio = Trio::start();
    let url = trio.url(1);
    let sb = Sandbox::new();
    // The holder may go `ttl − interval` without a confirmed renewal: 12 s, above the 3–7 s a
    // failover takes here (kill, promotion, the holder finding the new primary). With 9 s it
    // rode out the failover only when its renewal landed in the last instant before the
    // lease's expiry on the new primary; now it stops 6 s after its last
    // confirmed renewal began, as documented.
    // Its command ends when the test says so (after the other runner was refused), not after
    // a time that a slow failover could outlast.
    let holder = holder_for(
        &sb,
        &url,
        "15s",
        "3s",
        "while [ ! -e go ]; do sleep 0.1; done",
    );
    sb.wait_status(&["-u", &url], Duration::from_secs(20), |v| {
        v["held"] == true
    });
    let (primary, replica) = trio.roles();
    signal(trio.pid(primary), Signal::KILL);
    let deadline = Instant::now() + Duration::from_secs(30);
    trio.finish_failover(primary, replica, deadline);
    // Right after a failover the sentinel may not vouch for the new primary yet (exit 2,
    // "cannot reach"): asked again until it answers.
    let other = loop {
        let r = sb.run(&["run", "-u", &url, "--wait", "0", "--", "true"]);
        if r.code != 2 || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        other.code, 3,
        "the lease survived the failover, so another runner is refused: {other:?}"
    );
    std::fs::write(sb.path().join("go"), "").unwrap();
    let r = Run::wait(holder, Duration::from_secs(60));
    assert_eq!(
        r.code, 0,
        "the holder kept its lease through the failover: {r:?}"
    );
    let (code, status) = sb.status(&["-u", &url]);
    assert_eq!(
        (code, &status["verdict"]),
        (0, &"AVAILABLE".into()),
        "{status}"
    );
}

/// A holder whose renewals no replica confirms any more is told its lease is lost within
/// `ttl − interval`: its command is stopped and it exits 4.
#[test]
fn a_holder_whose_replica_stops_confirming_exits_4() {
    let trio = Trio::start();
    let url = trio.url(1);
    let sb = Sandbox::new();
    let holder = holder_for(&sb, &url, "6s", "2s", "exec sleep 30");
    sb.wait_status(&["-u", &url], Duration::from_secs(20), |v| {
        v["held"] == true
    });
    let (_, replica) = trio.roles();
    signal(trio.pid(replica), Signal::STOP);
    let stopped_at = Instant::now();
    let r = Run::wait(holder, Duration::from_secs(60));
    let took = stopped_at.elapsed();
    signal(trio.pid(replica), Signal::CONT);
    assert_eq!(r.code, 4, "{r:?}");
    assert!(
        took <= Duration::from_millis(4000 + 2500),
        "lost within ttl − interval (4 s) of the last confirmed renewal; took {took:?}: {r:?}"
    );
    assert!(r.stderr.contains("not confirmed"), "{r:?}");
}

/// An acquire that no replica confirms is never handed out: it is taken back and counts as
/// busy. With `--wait 0` that is exit 3 naming the shortfall, the command does not run and the
/// lease is not left behind; with a wait, the runner waits for a replica to confirm (as after a
/// failover, while the returning replica resyncs) and then runs.
#[test]
fn an_acquire_no_replica_confirms_is_waited_out_and_never_handed_out() {
    let trio = Trio::start();
    let url = trio.url(1);
    let sb = Sandbox::new();
    let (_, replica) = trio.roles();
    let marker = sb.path().join("ran");
    let marker_arg = marker.display().to_string();
    signal(trio.pid(replica), Signal::STOP);
    let r = sb.run(&["run", "-u", &url, "--wait", "0", "--", "touch", &marker_arg]);
    assert_eq!(r.code, 3, "not confirmed is busy for now: {r:?}");
    assert!(
        r.stderr.contains("0 of 1 replica(s) confirmed"),
        "the error says why: {r:?}"
    );
    assert!(!marker.exists(), "the command must not run");
    let (_, status) = sb.status(&["-u", &url]);
    assert_eq!(status["held"], false, "taken back: {status}");
    // A runner with a wait, while the replica is still stopped: it waits, and runs once the
    // replica confirms.
    let waiter = sb.spawn(&[
        "run",
        "-u",
        &url,
        "--wait",
        "30s",
        "--",
        "touch",
        &marker_arg,
    ]);
    std::thread::sleep(Duration::from_secs(3));
    assert!(!marker.exists(), "nothing runs before a replica confirms");
    signal(trio.pid(replica), Signal::CONT);
    let ok = Run::wait(waiter, Duration::from_secs(60));
    assert_eq!(ok.code, 0, "{ok:?}");
    assert!(marker.exists());
}
