//! A fault proxy: a loopback TCP proxy a test puts between dbwarden and a real server, then
//! tells to misbehave. It never talks to anything but the one upstream address it is given.
//!
//! - [`Fault::Pass`]: bytes flow both ways.
//! - [`Fault::Hold`]: bytes are taken off both sockets and kept back, connections stay open,
//!   and new connections are accepted but get no answer: a link that stops answering without
//!   refusing (a dropped route, a frozen middlebox). [`Fault::Pass`] delivers what was kept,
//!   in order, as TCP would once the route comes back.
//! - [`Fault::Delay`]: every chunk is delivered that long after it was read, each way.
//! - [`Fault::Cut`]: every open connection is reset (RST) at once; new ones are reset on
//!   accept.
//!
//! The proxy runs on its own thread and runtime, so both synchronous tests (spawning `dbwarden`
//! processes) and async ones can use it.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does to the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Pass,
    Hold,
    Delay(Duration),
    Cut,
}

/// A running proxy; dropping it stops it and resets every connection through it.
pub struct FaultProxy {
    addr: SocketAddr,
    fault: Arc<watch::Sender<Fault>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// A proxy on a free loopback port forwarding to `upstream` (`host:port`, loopback only).
    pub fn start(upstream: &str) -> FaultProxy {
        let upstream: SocketAddr = upstream
            .to_socket_addrs()
            .unwrap_or_else(|e| panic!("fault proxy upstream {upstream}: {e}"))
            .next()
            .expect("an upstream address");
        assert!(
            upstream.ip().is_loopback(),
            "the fault proxy only forwards to loopback addresses, not {upstream}"
        );
        let (fault, rx) = watch::channel(Fault::Pass);
        let fault = Arc::new(fault);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("fault proxy runtime");
            rt.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                tokio::select! {
                    _ = accept_loop(listener, upstream, rx) => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime drops every connection task and its sockets.
        });
        let addr = addr_rx.recv().expect("fault proxy address");
        FaultProxy {
            addr,
            fault,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The proxy's own `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Change what the proxy does, for open and new connections alike.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    pub fn fault(&self) -> Fault {
        *self.fault.borrow()
    }

    /// `url` with its `host:port` (the part after `@`, or after `://`) replaced by the proxy's.
    pub fn url(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
        let (userinfo, hostpart) = match rest.split_once('@') {
            Some((u, h)) => (format!("{u}@"), h),
            None => (String::new(), rest),
        };
        let tail = hostpart
            .find(['/', '?'])
            .map(|i| &hostpart[i..])
            .unwrap_or("");
        format!("{scheme}://{userinfo}{}{tail}", self.addr)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.set(Fault::Cut);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The `host:port` of a server URL (`scheme://[user@]host:port[/…]`).
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").expect("a URL with a scheme").1;
    let hostpart = rest.rsplit_once('@').map(|(_, h)| h).unwrap_or(rest);
    let end = hostpart.find(['/', '?']).unwrap_or(hostpart.len());
    hostpart[..end].to_owned()
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, fault: watch::Receiver<Fault>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let fault = fault.clone();
        tokio::spawn(async move {
            if *fault.borrow() == Fault::Cut {
                reset(client);
                return;
            }
            connection(client, upstream, fault).await;
        });
    }
}

/// Close with RST instead of FIN, as a cut link looks to both ends.
fn reset(s: TcpStream) {
    let _ = s.set_zero_linger();
    drop(s);
}

async fn connection(client: TcpStream, upstream: SocketAddr, mut fault: watch::Receiver<Fault>) {
    let _ = client.set_nodelay(true);
    // A held link answers no new connection either: the upstream connection is made only
    // when bytes may flow.
    if !passable(&mut fault).await {
        reset(client);
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        reset(client);
        return;
    };
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // Each direction ends on its own (EOF is passed on as a half-close); a cut resets both.
    tokio::join!(pump(cr, sw, fault.clone()), pump(sr, cw, fault));
}

/// Wait while the link is held; false when it is cut.
async fn passable(fault: &mut watch::Receiver<Fault>) -> bool {
    loop {
        match *fault.borrow_and_update() {
            Fault::Cut => return false,
            Fault::Hold => {}
            Fault::Pass | Fault::Delay(_) => return true,
        }
        if fault.changed().await.is_err() {
            return false;
        }
    }
}

/// Copy one direction until EOF, an error or a cut; pass an EOF on as a half-close, and a cut as
/// a reset.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, fault: watch::Receiver<Fault>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    // Reader: always takes bytes off the socket (a held link swallows them), stamped with when
    // they arrived. Ends on EOF or error (false) or a cut (true).
    let mut reader_fault = fault.clone();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            tokio::select! {
                n = from.read(&mut buf) => match n {
                    Ok(0) | Err(_) => return false,
                    Ok(n) => {
                        if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                            return false;
                        }
                    }
                },
                changed = reader_fault.changed() => {
                    if changed.is_err() || *reader_fault.borrow() == Fault::Cut {
                        return true;
                    }
                }
            }
        }
    };
    // Writer: delivers what was read once the link lets it, until the reader is done and the
    // queue is empty (false), a write fails (false) or the link is cut (true).
    let mut writer_fault = fault;
    let to_ref = &mut to;
    let writer = async move {
        while let Some((at, bytes)) = rx.recv().await {
            loop {
                let f = *writer_fault.borrow_and_update();
                match f {
                    Fault::Cut => return true,
                    Fault::Hold => {
                        if writer_fault.changed().await.is_err() {
                            return true;
                        }
                    }
                    Fault::Delay(d) => {
                        tokio::select! {
                            _ = tokio::time::sleep_until(at + d) => break,
                            _ = writer_fault.changed() => {}
                        }
                    }
                    Fault::Pass => break,
                }
            }
            if to_ref.write_all(&bytes).await.is_err() {
                return false;
            }
        }
        false
    };
    let (cut_reading, cut_writing) = tokio::join!(reader, writer);
    if cut_reading || cut_writing {
        let _ = to.as_ref().set_zero_linger();
    } else {
        let _ = to.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn echo_server() -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn roundtrip(s: &mut std::net::TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        s.write_all(msg)?;
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got)?;
        Ok(got)
    }

    #[test]
    fn pass_hold_delay_cut() {
        let proxy = FaultProxy::start(&echo_server().to_string());
        let mut s = std::net::TcpStream::connect(proxy.addr()).unwrap();
        assert_eq!(roundtrip(&mut s, b"one").unwrap(), b"one");

        // Held: nothing comes back, the connection stays open; Pass delivers what was held.
        proxy.set(Fault::Hold);
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        s.write_all(b"two").unwrap();
        let mut buf = [0u8; 3];
        let e = s.read_exact(&mut buf).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{e}"
        );
        proxy.set(Fault::Pass);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"two");

        // Delayed: 100 ms each way, so a round trip takes at least 200 ms.
        proxy.set(Fault::Delay(Duration::from_millis(100)));
        let t = std::time::Instant::now();
        assert_eq!(roundtrip(&mut s, b"three").unwrap(), b"three");
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );

        // Cut: the open connection is reset, a new one too.
        proxy.set(Fault::Cut);
        std::thread::sleep(Duration::from_millis(100));
        assert!(roundtrip(&mut s, b"four").is_err());
        let mut s2 = std::net::TcpStream::connect(proxy.addr()).unwrap();
        s2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(roundtrip(&mut s2, b"five").is_err());

        // Pass again: new connections work.
        proxy.set(Fault::Pass);
        let mut s3 = std::net::TcpStream::connect(proxy.addr()).unwrap();
        assert_eq!(roundtrip(&mut s3, b"six").unwrap(), b"six");
    }

    #[test]
    fn url_rewrites_only_the_address() {
        let proxy = FaultProxy::start("127.0.0.1:9");
        let p = proxy.port();
        assert_eq!(
            proxy.url("postgres://root@127.0.0.1:5432/test?sslmode=disable"),
            format!("postgres://root@127.0.0.1:{p}/test?sslmode=disable")
        );
        assert_eq!(
            proxy.url("redis://127.0.0.1:6379"),
            format!("redis://127.0.0.1:{p}")
        );
        assert_eq!(
            host_port("mysql://root@127.0.0.1:3306/test"),
            "127.0.0.1:3306"
        );
        assert_eq!(host_port("http://127.0.0.1:8123"), "127.0.0.1:8123");
    }
}
