//! PostgreSQL read replica: a real hot standby of the test server (pg_basebackup into a
//! temporary folder, started on a spare port as the postgres user). `migrate`, `lock-status`
//! and `unlock` refuse it with exit 2 and a message that says to use the primary; nothing is
//! written on the primary.
//!
//! Needs the server on this host and replication connections from 127.0.0.1 trusted
//! (`scripts/services.sh pg-extras` sets that up).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use dbwarden_tests::pg::{Client, PgDb, base_url};
use dbwarden_tests::{Run, Sandbox, signal};
use rustix::process::Signal;
use sqlx::postgres::PgConnectOptions;

/// A throw-away standby; stopped (immediate shutdown) and deleted when dropped.
struct Standby {
    dir: tempfile::TempDir,
    port: u16,
    server: Option<Child>,
}

fn as_postgres(program: &Path) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=postgres",
        "--regid=postgres",
        "--init-groups",
        "--",
    ])
    .arg(program)
    .stdin(Stdio::null());
    c
}

fn spare_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a spare port");
    l.local_addr().unwrap().port()
}

impl Standby {
    fn start(primary: &PgConnectOptions, bindir: &Path) -> Standby {
        let dir = tempfile::Builder::new()
            .prefix("dbwarden-standby-")
            .tempdir()
            .expect("tempdir");
        let st = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(dir.path())
            .status()
            .expect("chown");
        assert!(
            st.success(),
            "chown the standby folder to postgres (tests run as root)"
        );
        let data = dir.path().join("data");
        let t0 = Instant::now();
        let out = as_postgres(&bindir.join("pg_basebackup"))
            .args(["-h", primary.get_host()])
            .args(["-p", &primary.get_port().to_string()])
            .args(["-U", primary.get_username()])
            .arg("-D")
            .arg(&data)
            .args(["-R", "-X", "stream", "-c", "fast", "-w"])
            .output()
            .expect("run pg_basebackup");
        assert!(
            out.status.success(),
            "pg_basebackup failed ({}); replication from 127.0.0.1 must be trusted: run `scripts/services.sh pg-extras`",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        eprintln!("pg_basebackup took {:?}", t0.elapsed());
        let port = spare_port();
        let conf = format!(
            "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\nhot_standby = on\nshared_buffers = 16MB\nfsync = off\n",
            dir.path().display()
        );
        let write = |name: &str, text: &str| {
            let p: PathBuf = data.join(name);
            std::fs::write(&p, text).unwrap();
            Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&p)
                .status()
                .unwrap();
        };
        write("postgresql.conf", &conf);
        write(
            "pg_hba.conf",
            "local all all trust\nhost all all 127.0.0.1/32 trust\n",
        );
        write("pg_ident.conf", "");
        let log = std::fs::File::create(dir.path().join("standby.log")).unwrap();
        let server = as_postgres(&bindir.join("postgres"))
            .arg("-D")
            .arg(&data)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the standby");
        Standby {
            dir,
            port,
            server: Some(server),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("standby.log")).unwrap_or_default()
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        if let Some(mut s) = self.server.take() {
            signal(s.id(), Signal::QUIT); // immediate shutdown
            let _ = s.wait();
        }
    }
}

#[test]
fn a_hot_standby_is_refused_everywhere_and_nothing_is_written() {
    let db = PgDb::new();
    db.exec("CREATE TABLE app (x INTEGER)");
    let primary = PgConnectOptions::from_str(&base_url()).expect("DBWARDEN_TEST_PG_URL");
    let major = db.count("SELECT current_setting('server_version_num')::int / 10000");
    let bindir = PathBuf::from(format!("/usr/lib/postgresql/{major}/bin"));
    assert!(
        bindir.join("postgres").exists(),
        "{} not found: the standby test needs the server binaries on this host",
        bindir.display()
    );
    let t0 = Instant::now();
    let standby = Standby::start(&primary, &bindir);
    let url = db.url_on_port(standby.port);
    // Ready and in recovery (it replays from the primary it was copied from).
    loop {
        let ok = Client::try_connect(&url).map(|mut c| c.query("SELECT pg_is_in_recovery()"));
        match ok {
            Ok(v) if v == ["true"] => break,
            Ok(v) => panic!("the standby is not in recovery: {v:?}"),
            Err(_) if t0.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Err(_) => panic!("the standby did not start: {}", standby.log()),
        }
    }
    eprintln!(
        "standby ready on port {} after {:?}",
        standby.port,
        t0.elapsed()
    );

    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    for args in [
        vec!["migrate", "-u", url.as_str()],
        vec!["lock-status", "-u", url.as_str()],
        vec!["unlock", "--yes", "-u", url.as_str()],
    ] {
        let r: Run = sb.run(&args);
        assert_eq!(r.code, 2, "{args:?}: {r:?}");
        assert!(r.stderr.contains("read replica"), "{r:?}");
        assert!(r.stderr.contains("primary"), "{r:?}");
        assert_eq!(r.stderr_lines().len(), 1, "{r:?}");
    }
    assert_eq!(
        db.count("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"),
        1,
        "nothing written on the primary"
    );
    // The same command against the primary works.
    assert_eq!(sb.run(&["migrate", "-u", &db.url]).code, 0);
}
