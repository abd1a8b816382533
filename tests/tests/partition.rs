//! A lock server cut off from the rest of its cluster *together with its holder* — the failure
//! neither a kill nor a pause shows: the cut-off server keeps answering the holder as if
//! nothing happened, while the majority side promotes another and a second runner asks there.
//! How often do two `dbwarden run` commands both believe they hold the lock?
//!
//! Every server runs on a host of this test's own (network namespaces on one bridge,
//! `dbwarden_tests::netns`); a cut takes the host's link down, so every byte between it and the
//! others is held, while the holder on that host still reaches its server. Each round:
//! 1. holder A runs `dbwarden run --lock-url …` on the primary's (the leader's) host, a command
//!    that would take 16–20 s; once it is inside, that host is cut off;
//! 2. runner B, outside, asks the same lock through the rest of the cluster (`--wait 60s`);
//! 3. a ledger of enter/leave times shows whether B entered before A left: a moment of two
//!    holders;
//! 4. the host is healed and the cluster settles before the next round.
//!
//! Redis behind Sentinel: with the replication wait (the default, one replica must confirm each
//! grant and renewal) and, as the baseline that proves the campaign sees two holders, without
//! it (`?replicas=0`). etcd: the leader cut off. The tallies are printed (docs/engines.md, "Cut
//! off with its holder"). These tests start servers of their own and take minutes, so
//! scripts/test.sh runs them in its last step, with the tests that restart servers.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dbwarden_tests::etcd_util::ledgered;
use dbwarden_tests::netns::Net;
use dbwarden_tests::{Run, Sandbox, dbwarden_bin, unique_name};

const ROUNDS: usize = 10;
/// The Redis hosts that hold data (host 4 runs the sentinel).
const DATA: [u8; 3] = [1, 2, 3];
const BASELINE_ROUNDS: usize = 3;
/// The holder's lease and renewal period: a partition outlives the lease many times over. The
/// holder stops `ttl − interval` after its last good renewal, at most half an interval late;
/// the other side's lease runs out at `ttl`: a margin of at least half the interval (1.5 s;
/// 1.6–2.2 s measured), so a loaded machine's late signal or shell does not eat it.
const LEASE: [&str; 4] = ["--lock-ttl", "9s", "--heartbeat-interval", "3s"];

/// What one campaign saw.
#[derive(Debug, Default)]
struct Tally {
    rounds: usize,
    /// Rounds in which B entered while A's command still ran.
    double_holders: usize,
    /// A's exit codes (4: it saw its lease lost and stopped its command).
    a_codes: Vec<i32>,
    /// From the cut to A's command stopped, and to B's command started (ms).
    a_stopped_ms: Vec<u128>,
    b_entered_ms: Vec<u128>,
}

impl Tally {
    fn print(&self, what: &str) {
        eprintln!(
            "{what}: {} rounds, {} moments of two holders; A exit codes {:?}; cut → A stopped {:?} ms; cut → B entered {:?} ms",
            self.rounds, self.double_holders, self.a_codes, self.a_stopped_ms, self.b_entered_ms
        );
    }
}

/// `dbwarden` with the sandbox's environment rules, on host `host` of `net` (or outside every
/// namespace with `None`).
fn dbwarden(sb: &Sandbox, net: &Net, host: Option<u8>, args: &[&str]) -> Child {
    let mut c = match host {
        Some(h) => net.command(h, dbwarden_bin()),
        None => Command::new(dbwarden_bin()),
    };
    c.args(args).current_dir(sb.path()).stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k == "DATABASE_URL" || k.starts_with("DBWARDEN_") || k == "RUST_LOG" {
            c.env_remove(k);
        }
    }
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dbwarden")
}

/// Nanoseconds since the epoch, as `date +%s%N` writes them in the ledger.
fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// `who`'s enter and leave times in `ledger` (nanoseconds), where written.
fn times(ledger: &Path, who: &str) -> (Option<u128>, Option<u128>) {
    let text = std::fs::read_to_string(ledger).unwrap_or_default();
    let at = |what: &str| {
        // Whole lines only: a shell may be appending one right now.
        text.split_inclusive('\n').find_map(|l| {
            let l = l.strip_suffix('\n')?;
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() == 3 && f[0] == what && f[1] == who).then(|| f[2].parse().unwrap())
        })
    };
    (at("enter"), at("leave"))
}

fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Ask `settled` until it names the host the next round starts from (the primary, the leader),
/// for at most 60 s; `logs` are shown if it never does.
fn settle(round: usize, settled: impl Fn() -> Option<u8>, logs: impl Fn() -> String) -> u8 {
    let t0 = Instant::now();
    loop {
        if let Some(h) = settled() {
            return h;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "round {round}: the cluster did not settle within 60 s (a host whose bridge traffic goes through iptables, br_netfilter with a FORWARD policy of DROP, drops it):\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last `n` lines of each of `files` in `dir`, for a failure message.
fn tails(dir: &Path, files: &[String], n: usize) -> String {
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            format!(
                "--- {f}\n{}",
                lines[lines.len().saturating_sub(n)..].join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// One round on `net`: A on host `cut`, B outside; the host cut while A is inside, and B
/// started once `promoted` says the rest of the cluster has a new primary to ask.
#[allow(clippy::too_many_arguments)]
fn round(
    net: &Net,
    cut: u8,
    a_url: &str,
    b_url: &str,
    a_body: &str,
    ns: &str,
    promoted: impl Fn() -> bool,
    tally: &mut Tally,
) -> (Run, Run) {
    let sb = Sandbox::new();
    let ledger = sb.path().join("ledger");
    let (a_db, b_db) = (sb.path().join("a.db"), sb.path().join("b.db"));
    // Each its own database: only the lock under test keeps them apart.
    let spawn = |host: Option<u8>, who: &str, db: &PathBuf, url: &str, body: &str| {
        let script = ledgered(&ledger, who, body);
        let db = format!("sqlite://{}", db.display());
        let mut args = vec!["run", "-u", &db, "--lock-url", url, "--namespace", ns];
        args.extend(LEASE);
        args.extend(["--wait", "60s", "--", "sh", "-c", &script]);
        dbwarden(&sb, net, host, &args)
    };
    let a = spawn(Some(cut), "A", &a_db, a_url, a_body);
    wait_until("A inside its command", Duration::from_secs(30), || {
        times(&ledger, "A").0.is_some()
    });
    net.cut(cut);
    let cut_at = now_ns();
    wait_until("a new primary", Duration::from_secs(30), &promoted);
    // B is started again, as an orchestrator restarts a runner, while the cluster is still
    // settling (its client cannot reach a primary yet: exit 2).
    let asked = Instant::now();
    let b = loop {
        let b = Run::wait(
            spawn(None, "B", &b_db, b_url, "true"),
            Duration::from_secs(90),
        );
        if b.code == 2
            && b.stderr.contains("cannot reach")
            && asked.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        break b;
    };
    let a = Run::wait(a, Duration::from_secs(60));
    net.heal(cut);
    let (_, a_left) = times(&ledger, "A");
    let (b_entered, _) = times(&ledger, "B");
    let a_left = a_left.unwrap_or_else(|| panic!("A left no mark: {a:?}"));
    let b_entered = b_entered.unwrap_or_else(|| panic!("B never entered: {b:?}"));
    tally.rounds += 1;
    tally.a_codes.push(a.code);
    tally
        .a_stopped_ms
        .push(a_left.saturating_sub(cut_at) / 1_000_000);
    tally
        .b_entered_ms
        .push(b_entered.saturating_sub(cut_at) / 1_000_000);
    if b_entered < a_left {
        tally.double_holders += 1;
    }
    (a, b)
}

// ---------------------------------------------------------------------------------------------
// Redis behind Sentinel: a primary and two replicas on hosts 1..=3, the sentinel on host 4 (so
// the side that promotes still has a replica to confirm grants: with one replica, it has none,
// and a confirmed lease is simply unavailable there until the cut heals).

fn redis_query<T: redis::FromRedisValue>(addr: &str, cmd: &redis::Cmd) -> Option<T> {
    let client = redis::Client::open(format!("redis://{addr}")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    cmd.query(&mut conn).ok()
}

fn info_field(info: &str, name: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|v| v.trim().to_owned())
}

struct Sentinel<'a> {
    net: &'a Net,
    // Before `dir`: fields drop in order, and the servers stop before their files go.
    _servers: Servers,
    dir: tempfile::TempDir,
}

/// Server processes, killed and reaped at the end.
#[derive(Default)]
struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl<'a> Sentinel<'a> {
    fn start(net: &'a Net) -> Sentinel<'a> {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        let mut servers = Servers::default();
        for i in DATA {
            let mut conf = format!(
                "port 6379\nbind {}\nprotected-mode no\ndaemonize no\ndir {d}\ndbfilename {i}.rdb\nlogfile {d}/{i}.log\nsave \"\"\nappendonly no\n",
                net.addr(i)
            );
            if i != 1 {
                conf.push_str(&format!("replicaof {} 6379\n", net.addr(1)));
            }
            let path = dir.path().join(format!("{i}.conf"));
            std::fs::write(&path, conf).unwrap();
            let server = net
                .command(i, "redis-server")
                .arg(&path)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server");
            servers.0.push(server);
        }
        let conf = format!(
            "port 26379\nbind {}\nprotected-mode no\ndaemonize no\ndir {d}\nlogfile {d}/sentinel.log\n\
             sentinel monitor svc {} 6379 1\nsentinel down-after-milliseconds svc 1000\nsentinel failover-timeout svc 2000\n",
            net.addr(4),
            net.addr(1)
        );
        let path = dir.path().join("sentinel.conf");
        std::fs::write(&path, conf).unwrap();
        let sentinel = net
            .command(4, "redis-server")
            .arg(&path)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server --sentinel");
        servers.0.push(sentinel);
        Sentinel {
            net,
            dir,
            _servers: servers,
        }
    }

    fn addr(&self) -> String {
        format!("{}:26379", self.net.addr(4))
    }

    fn url(&self, replicas: u32) -> String {
        format!("redis+sentinel://{}/svc?replicas={replicas}", self.addr())
    }

    /// The host of the primary the sentinel names.
    fn primary(&self) -> Option<u8> {
        let (ip, _port): (String, String) = redis_query(
            &self.addr(),
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg("svc"),
        )?;
        DATA.into_iter().find(|&i| self.net.addr(i) == ip)
    }

    fn info(&self, host: u8) -> String {
        redis_query(
            &format!("{}:6379", self.net.addr(host)),
            redis::cmd("INFO").arg("replication"),
        )
        .unwrap_or_default()
    }

    /// The sentinel names a primary whose replica is attached and in sync, and sees both as
    /// healthy: the next round starts from a settled cluster. Returns the primary's host.
    fn settled(&self) -> Option<u8> {
        let p = self.primary()?;
        let pi = self.info(p);
        let primary_ok = info_field(&pi, "role").as_deref() == Some("master")
            && info_field(&pi, "connected_slaves").as_deref() == Some("2");
        let replicas_ok = DATA.into_iter().filter(|&r| r != p).all(|r| {
            let ri = self.info(r);
            info_field(&ri, "master_link_status").as_deref() == Some("up")
                && info_field(&ri, "master_host").as_deref() == Some(self.net.addr(p).as_str())
        });
        let flags = |kind: &str| -> Vec<String> {
            let rows: Vec<Vec<String>> =
                redis_query(&self.addr(), redis::cmd("SENTINEL").arg(kind).arg("svc"))
                    .unwrap_or_default();
            rows.iter()
                .filter_map(|row| {
                    row.chunks(2)
                        .find(|kv| kv[0] == "flags")
                        .map(|kv| kv[1].clone())
                })
                .collect()
        };
        let healthy = flags("replicas") == ["slave", "slave"];
        (primary_ok && replicas_ok && healthy).then_some(p)
    }

    fn logs(&self) -> String {
        let files = ["1.log", "2.log", "3.log", "sentinel.log"].map(String::from);
        tails(self.dir.path(), &files, 15)
    }
}

fn redis_campaign(replicas: u32, rounds: usize) -> Tally {
    let net = Net::new(&format!("dbwr{replicas}"), 10 + replicas as u8, 4);
    let sentinel = Sentinel::start(&net);
    let url = sentinel.url(replicas);
    let mut tally = Tally::default();
    // The baseline's A believes for its whole command: long enough for B to get in.
    let a_body = if replicas == 0 {
        "sleep 16 & wait"
    } else {
        "sleep 20 & wait"
    };
    for r in 0..rounds {
        let primary = settle(r, || sentinel.settled(), || sentinel.logs());
        let ns = unique_name("cut");
        // B asks once the sentinel names the replica: before, it would be sent to the cut-off
        // primary and give up as unreachable (exit 2), as a runner would.
        let promoted = || sentinel.primary().is_some_and(|p| p != primary);
        let (a, b) = round(&net, primary, &url, &url, a_body, &ns, promoted, &mut tally);
        assert_eq!(b.code, 0, "round {r}: B {b:?}\n{}", sentinel.logs());
        if replicas > 0 {
            assert_eq!(a.code, 4, "round {r}: A must see its lease lost: {a:?}");
        } else {
            assert!([0, 4].contains(&a.code), "round {r}: A {a:?}");
        }
    }
    tally
}

/// With the replication wait (the default behind Sentinel): A's renewals on the cut-off
/// primary are never confirmed, so A stops its command (exit 4) before its lease can run out on
/// the promoted replica where B asks: no two holders, round after round.
#[test]
fn redis_primary_cut_off_with_its_holder() {
    let t = redis_campaign(1, ROUNDS);
    t.print("Redis behind Sentinel, replicas=1, primary cut off with its holder");
    assert_eq!(t.double_holders, 0, "{t:?}");
    // The baseline on the same machine: without the wait, the cut-off primary keeps renewing
    // A's lease while the promoted replica hands it to B — the campaign sees two holders.
    let base = redis_campaign(0, BASELINE_ROUNDS);
    base.print("Redis behind Sentinel, replicas=0 (baseline), primary cut off with its holder");
    assert!(base.double_holders > 0, "{base:?}");
}

// ---------------------------------------------------------------------------------------------
// etcd: three members on hosts 1..=3.

struct Etcd<'a> {
    net: &'a Net,
    // Before `dir`: fields drop in order, and the servers stop before their files go.
    _servers: Servers,
    dir: tempfile::TempDir,
}

impl<'a> Etcd<'a> {
    fn start(net: &'a Net) -> Etcd<'a> {
        let dir = tempfile::tempdir().unwrap();
        let cluster = (1..=3u8)
            .map(|i| format!("m{i}=http://{}:2380", net.addr(i)))
            .collect::<Vec<_>>()
            .join(",");
        let mut servers = Servers::default();
        for i in 1..=3u8 {
            let a = net.addr(i);
            let log = std::fs::File::create(dir.path().join(format!("m{i}.log"))).unwrap();
            let member = net
                .command(i, "etcd")
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(dir.path().join(format!("m{i}")))
                .args(["--listen-client-urls", &format!("http://{a}:2379")])
                .args(["--advertise-client-urls", &format!("http://{a}:2379")])
                .args(["--listen-peer-urls", &format!("http://{a}:2380")])
                .args(["--initial-advertise-peer-urls", &format!("http://{a}:2380")])
                .args(["--initial-cluster", &cluster])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "dbwarden-partition"])
                .args(["--logger", "zap", "--log-level", "warn"])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("etcd (Debian's etcd-server)");
            servers.0.push(member);
        }
        Etcd {
            net,
            dir,
            _servers: servers,
        }
    }

    /// Each member's view: (its id, the leader it knows), or None where it does not answer.
    fn views(&self) -> Vec<Option<(u64, u64)>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (1..=3u8)
            .map(|i| {
                rt.block_on(async {
                    let ep = format!("http://{}:2379", self.net.addr(i));
                    let opts = etcd_client::ConnectOptions::new()
                        .with_connect_timeout(Duration::from_millis(500))
                        .with_timeout(Duration::from_millis(500));
                    let mut c = etcd_client::Client::connect([ep], Some(opts)).await.ok()?;
                    let s = c.status().await.ok()?;
                    Some((s.header()?.member_id(), s.leader()))
                })
            })
            .collect()
    }

    /// Every member answers and all name the same leader: its host.
    fn settled(&self) -> Option<u8> {
        let views = self.views();
        let views: Vec<(u64, u64)> = views.into_iter().collect::<Option<_>>()?;
        let leader = views[0].1;
        if leader == 0 || views.iter().any(|v| v.1 != leader) {
            return None;
        }
        views
            .iter()
            .position(|v| v.0 == leader)
            .map(|i| i as u8 + 1)
    }

    fn logs(&self) -> String {
        let files: Vec<String> = (1..=3).map(|i| format!("m{i}.log")).collect();
        tails(self.dir.path(), &files, 10)
    }
}

/// The etcd leader cut off with its holder: the cut-off member loses its quorum, so A's
/// keep-alives stop being answered and A stops (exit 4); the majority elects a new leader,
/// which keeps A's lease for one more ttl and only then lets B in: no two holders.
#[test]
fn etcd_leader_cut_off_with_its_holder() {
    let net = Net::new("dbwe", 20, 3);
    let etcd = Etcd::start(&net);
    let mut tally = Tally::default();
    for r in 0..ROUNDS {
        let leader = settle(r, || etcd.settled(), || etcd.logs());
        let prefix = unique_name("cut");
        let a_url = format!("etcd://{}:2379/{prefix}", net.addr(leader));
        let others: Vec<String> = (1..=3u8)
            .filter(|&i| i != leader)
            .map(|i| format!("{}:2379", net.addr(i)))
            .collect();
        let b_url = format!("etcd://{}/{prefix}", others.join(","));
        let (a, b) = round(
            &net,
            leader,
            &a_url,
            &b_url,
            "sleep 20 & wait",
            "default",
            // The majority elects a leader by itself; B's client waits for it.
            || true,
            &mut tally,
        );
        assert_eq!(b.code, 0, "round {r}: B {b:?}\n{}", etcd.logs());
        assert_eq!(a.code, 4, "round {r}: A must see its lease lost: {a:?}");
    }
    tally.print("etcd, leader cut off with its holder");
    assert_eq!(tally.double_holders, 0, "{tally:?}");
}
