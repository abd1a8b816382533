//! A release by anyone but the owner changes nothing: the compare-and-delete script with a wrong
//! token, and `dbwarden unlock --holder <someone else>`, leave the lock, the holder record and
//! the fence as they were, and the owner keeps renewing.

use std::process::{Command, Stdio};
use std::time::Duration;

use dbwarden_redis::lock::RELEASE_LUA;
use dbwarden_tests::redis_util::{Peek, Probe, redis_url};
use dbwarden_tests::{Sandbox, unique_name};

#[test]
fn a_release_with_the_wrong_token_changes_nothing() {
    let url = redis_url();
    let mut peek = Peek::connect(&url);
    let sb = Sandbox::new();
    let ns = unique_name("nonowner");
    let keys = dbwarden_redis::lock::Keys::new(&ns);
    let data = format!("app:{{{ns}}}:data");
    let mut owner = Probe::new(
        Command::new(env!("CARGO_BIN_EXE_redis_probe"))
            .args(["hold", &url, &ns, "1500", &data])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn redis_probe"),
    );
    let token: u64 = owner.expect("acquired ", Duration::from_secs(30))["acquired ".len()..]
        .parse()
        .unwrap();
    let lease_id = peek.get(&keys.lock).expect("held");
    let holder = peek.holder(&ns).expect("holder record");
    let execution = holder["execution_id"].as_str().unwrap().to_owned();

    // Wrong tokens: a made-up one, the holder's execution id, its fencing token, empty.
    for wrong in [
        "0123456789abcdef0123456789abcdef",
        execution.as_str(),
        &token.to_string(),
        "",
    ] {
        let released: i64 = peek.query(
            redis::cmd("EVAL")
                .arg(RELEASE_LUA)
                .arg(2)
                .arg(&keys.lock)
                .arg(&keys.holder)
                .arg(wrong)
                .arg(&keys.released)
                .arg(token),
        );
        assert_eq!(released, 0, "released with {wrong:?}");
        assert_eq!(peek.get(&keys.lock).as_deref(), Some(lease_id.as_str()));
        assert_eq!(
            peek.holder(&ns).unwrap()["execution_id"],
            holder["execution_id"]
        );
        assert_eq!(peek.fence(&ns), Some(token));
    }

    // `unlock --holder` naming another execution: refused, nothing changed, nothing audited.
    let other = "00000000-0000-4000-8000-000000000000";
    let r = sb.run(&[
        "unlock",
        "-u",
        &url,
        "--namespace",
        &ns,
        "--holder",
        other,
        "--yes",
    ]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("does not match"), "{r:?}");
    assert!(r.stderr.contains(&execution), "{r:?}");
    assert_eq!(peek.get(&keys.lock).as_deref(), Some(lease_id.as_str()));
    assert_eq!(peek.fence(&ns), Some(token));
    assert!(peek.audit(&ns).is_empty());

    // The owner still holds and renews: two ttls later lock-status still names it.
    std::thread::sleep(Duration::from_millis(3200));
    let (code, status) = sb.status(&["-u", &url, "--namespace", &ns]);
    assert_eq!(code, 0, "{status}");
    assert_eq!(status["verdict"], "HEALTHY", "{status}");
    assert_eq!(status["holder"]["pid"], owner.pid(), "{status}");
    assert_eq!(status["fencing_token"], token, "{status}");
    assert_eq!(peek.get(&keys.lock).as_deref(), Some(lease_id.as_str()));
}
