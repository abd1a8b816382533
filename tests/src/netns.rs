//! Hosts of a test's own on one machine: network namespaces on one bridge (Debian's iproute2;
//! needs root, as CI runs). Each host has its own address and its own ports, and a partition
//! is real: [`Net::cut`] takes a host's link down, so every byte between it and the others is
//! held (TCP retransmits until [`Net::heal`] brings it back), while the processes on that host
//! still reach each other over its own loopback.
//!
//! A `Net` removes its namespaces and bridge when dropped, and one left behind by a killed
//! run is removed when the next run makes the same one. Two runs on one machine (two
//! checkouts) take turns: a `Net` holds a lock file named after its tag while it lives.

use std::process::{Command, Stdio};

/// A bridge `<tag>br` with address `10.213.<subnet>.254`, and hosts `10.213.<subnet>.<i>`.
pub struct Net {
    tag: String,
    subnet: u8,
    hosts: Vec<u8>,
    /// `flock`ed while this net lives (see the module docs).
    _turn: std::fs::File,
}

/// Run `ip` with `args`; panics with its output unless it succeeds.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ip (Debian's iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Like [`ip`], ignoring failure (removing what may not exist).
fn ip_quiet(args: &[&str]) {
    let _ = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Net {
    /// A bridge for hosts 1..=`n`. `tag` (at most 8 characters) names the interfaces and
    /// namespaces; `subnet` keeps two nets of one run apart.
    pub fn new(tag: &str, subnet: u8, n: u8) -> Net {
        assert!(tag.len() <= 8, "interface names are at most 15 characters");
        let turn = std::env::temp_dir().join(format!("dbwarden-netns-{tag}.lock"));
        let turn = std::fs::File::create(&turn).expect("the net's lock file");
        rustix::fs::flock(&turn, rustix::fs::FlockOperation::LockExclusive)
            .expect("flock the net's lock file");
        let net = Net {
            tag: tag.to_owned(),
            subnet,
            hosts: (1..=n).collect(),
            _turn: turn,
        };
        net.remove();
        let br = net.bridge();
        ip(&["link", "add", &br, "type", "bridge"]);
        ip(&["addr", "add", &format!("{}/24", net.addr(254)), "dev", &br]);
        ip(&["link", "set", &br, "up"]);
        for &i in &net.hosts {
            let (ns, outer) = (net.ns(i), net.outer(i));
            ip(&["netns", "add", &ns]);
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ]);
            ip(&["link", "set", &outer, "master", &br]);
            ip(&["link", "set", &outer, "up"]);
            let addr = format!("{}/24", net.addr(i));
            for args in [
                vec!["addr", "add", addr.as_str(), "dev", "eth0"],
                vec!["link", "set", "eth0", "up"],
                vec!["link", "set", "lo", "up"],
            ] {
                let mut full = vec!["netns", "exec", &ns, "ip"];
                full.extend(args);
                ip(&full);
            }
        }
        net
    }

    fn bridge(&self) -> String {
        format!("{}br", self.tag)
    }

    fn outer(&self, i: u8) -> String {
        format!("{}v{i}", self.tag)
    }

    /// The namespace of host `i`.
    pub fn ns(&self, i: u8) -> String {
        format!("{}h{i}", self.tag)
    }

    /// Host `i`'s address (254: the bridge, reachable from outside every namespace).
    pub fn addr(&self, i: u8) -> String {
        format!("10.213.{}.{i}", self.subnet)
    }

    /// `program args…` run on host `i`.
    pub fn command(&self, i: u8, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(i)]).arg(program);
        c
    }

    /// Host `i` cut off: its link down, so nothing crosses between it and any other host.
    pub fn cut(&self, i: u8) {
        ip(&["link", "set", &self.outer(i), "down"]);
    }

    /// Host `i`'s link up again.
    pub fn heal(&self, i: u8) {
        ip(&["link", "set", &self.outer(i), "up"]);
    }

    /// Every process left on the hosts killed, the namespaces and the bridge removed.
    fn remove(&self) {
        for &i in &self.hosts {
            let ns = self.ns(i);
            if let Ok(out) = Command::new("ip").args(["netns", "pids", &ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse::<u32>() {
                        crate::signal(pid, rustix::process::Signal::KILL);
                    }
                }
            }
            ip_quiet(&["link", "del", &self.outer(i)]);
            ip_quiet(&["netns", "del", &ns]);
        }
        ip_quiet(&["link", "del", &self.bridge()]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.remove();
    }
}
