//! Bad input around Redis gets one clear line and exit 2, with nothing written and no password
//! shown: ttl ≤ 0, a bad or unsupported URL, an unreachable server, a Redis URL where the
//! database belongs. The library tells the same cases apart through `Error::kind`.

use std::time::{Duration, Instant};

use dbwarden_core::Wait;
use dbwarden_redis::{RedisClient, RedisLock};
use dbwarden_tests::redis_util::{Peek, redis_url};
use dbwarden_tests::{Run, Sandbox, unique_name};

fn one_line_exit_2(r: &Run, wants: &[&str]) {
    assert_eq!(r.code, 2, "{r:?}");
    let lines = r.stderr_lines();
    assert_eq!(lines.len(), 1, "{r:?}");
    assert!(lines[0].starts_with("dbwarden: error: "), "{r:?}");
    for w in wants {
        assert!(lines[0].contains(w), "{w:?} missing: {}", lines[0]);
    }
}

#[test]
fn the_cli_refuses_bad_redis_input_with_exit_2_and_touches_nothing() {
    let url = redis_url();
    let sb = Sandbox::new();
    sb.write_migration("0001_t.sql", "CREATE TABLE t (x INTEGER);");
    let db = format!("sqlite://{}", sb.db().display());
    let ns = unique_name("bad");
    let before = sb.listing();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["lock-status", "-u", "redis://127.0.0.1:1"],
            vec!["cannot reach 127.0.0.1:1", "check that Redis runs there"],
        ),
        (
            vec!["lock-status", "-u", "redis://:hunter2@127.0.0.1:1"],
            vec!["cannot reach 127.0.0.1:1"],
        ),
        (
            vec!["lock-status", "-u", "redis://127.0.0.1:notaport"],
            vec!["invalid Redis URL", "redis://127.0.0.1:notaport"],
        ),
        (
            vec!["lock-status", "-u", "redis://:hunter2@127.0.0.1:6379/nodb"],
            vec!["invalid Redis URL", "redis://:***@127.0.0.1:6379/nodb"],
        ),
        (
            vec!["lock-status", "-u", "rediss://127.0.0.1:6379"],
            vec!["TLS"],
        ),
        (
            vec!["lock-status", "-u", &url, "--lock-ttl", "0"],
            vec!["lock_ttl must be greater than 0"],
        ),
        (
            vec!["lock-status", "-u", &url, "--lock-ttl=-5s"],
            vec!["lock_ttl"],
        ),
        (
            vec![
                "lock-status",
                "-u",
                &url,
                "--lock-ttl",
                "50ms",
                "--heartbeat-interval",
                "10ms",
            ],
            vec!["too short"],
        ),
        (
            vec!["lock-status", "-u", &url, "--namespace", "no spaces"],
            vec!["invalid namespace"],
        ),
        (
            vec!["unlock", "-u", "redis://127.0.0.1:1", "--yes"],
            vec!["cannot reach 127.0.0.1:1"],
        ),
        (
            vec!["migrate", "-u", &url],
            vec!["keeps no migration tables", "--lock-url"],
        ),
        (
            vec!["history", "-u", &url],
            vec!["no migration history", "--lock-url"],
        ),
        (
            vec!["migrate", "-u", &db, "--redis-url", "redis://127.0.0.1:1"],
            vec!["cannot reach 127.0.0.1:1"],
        ),
        (
            vec![
                "migrate",
                "-u",
                &db,
                "--redis-url",
                "redis://:hunter2@h:port",
            ],
            vec!["--lock-url: invalid Redis URL"],
        ),
        (
            vec![
                "migrate",
                "-u",
                &db,
                "--lock-url",
                "redis://:hunter2@h:port",
            ],
            vec!["--lock-url: invalid Redis URL"],
        ),
        (
            vec!["migrate", "-u", &db, "--lock-url", &db],
            vec!["keeps migration tables of its own", "lock-only engine"],
        ),
        (
            vec!["migrate", "-u", &db, "--redis-url", &url, "--lock-ttl", "0"],
            vec!["lock_ttl must be greater than 0"],
        ),
    ];
    for (args, wants) in cases {
        let mut args = args;
        if !args.contains(&"--namespace") {
            args.extend(["--namespace", &ns]);
        }
        let r = sb.run(&args);
        one_line_exit_2(&r, &wants);
        assert!(!r.stderr.contains("hunter2"), "{r:?}");
        assert!(
            r.elapsed < Duration::from_secs(15),
            "{args:?} took {:?}",
            r.elapsed
        );
    }
    // Nothing was created: no database file, no lock in Redis.
    assert_eq!(sb.listing(), before);
    let mut peek = Peek::connect(&url);
    assert!(!peek.exists(&format!("dbwarden:{{{ns}}}:lock")));
    assert!(peek.fence(&ns).is_none());
    assert!(peek.audit(&ns).is_empty());
}

#[test]
fn the_library_tells_misconfigured_from_unreachable_from_busy() {
    let url = redis_url();
    Peek::connect(&url);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = RedisClient::from_url(&url).unwrap();
        let e = RedisLock::new(client.clone(), "no spaces")
            .acquire(Wait::No)
            .await
            .unwrap_err();
        assert!(e.is_misconfigured(), "{e}");
        assert!(RedisLock::try_new(client.clone(), "no spaces").is_err());
        let e = RedisLock::new(client.clone(), "x")
            .ttl(Duration::ZERO)
            .acquire(Wait::No)
            .await
            .unwrap_err();
        assert!(e.is_misconfigured(), "{e}");
        assert!(e.to_string().contains("greater than 0"), "{e}");
        let e = RedisLock::new(client.clone(), "x")
            .ttl(Duration::from_secs(3))
            .heartbeat_interval(Duration::from_secs(2))
            .acquire(Wait::No)
            .await
            .unwrap_err();
        assert!(e.is_misconfigured(), "{e}");

        let t0 = Instant::now();
        let down = RedisLock::new(RedisClient::from_url("redis://127.0.0.1:1").unwrap(), "x")
            .connect_timeout(Duration::from_secs(2));
        let e = down.acquire(Wait::No).await.unwrap_err();
        assert!(e.is_unreachable(), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert_eq!(e.exit_code().code(), 2);

        let ns = unique_name("kinds");
        let lock = RedisLock::new(client, &ns).ttl(Duration::from_secs(5));
        let lease = lock.acquire(Wait::No).await.unwrap();
        let e = lock.acquire(Wait::No).await.unwrap_err();
        assert!(e.is_busy(), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("token {}", lease.fencing_token())),
            "{e}"
        );
        let e = lock
            .run(Wait::Up(Duration::from_millis(300)), |_| async {})
            .await
            .unwrap_err();
        assert!(e.is_busy(), "{e}");
        lease.release().await.unwrap();
    });
}
