//! `lock-status` and `unlock` on a Redis lease: the operator sees the holder, its token and when
//! the lease expires; `unlock` needs a confirmation, removes only the named holder's lease,
//! fences the holder out (its next fenced write is rejected, its lease reports lost) and leaves
//! an audit entry in `dbwarden:{<ns>}:audit`.

use std::process::{Command, Stdio};
use std::time::Duration;

use dbwarden_tests::redis_util::{Peek, Probe, redis_url};
use dbwarden_tests::{Sandbox, unique_name};

#[test]
fn unlock_shows_the_holder_asks_for_confirmation_fences_it_out_and_audits() {
    let url = redis_url();
    let mut peek = Peek::connect(&url);
    let sb = Sandbox::new();
    let ns = unique_name("unlock");
    let data = format!("app:{{{ns}}}:data");
    let mut holder = Probe::new(
        Command::new(env!("CARGO_BIN_EXE_redis_probe"))
            .args(["hold", &url, &ns, "3000", &data])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn redis_probe"),
    );
    let token: u64 = holder.expect("acquired ", Duration::from_secs(30))["acquired ".len()..]
        .parse()
        .unwrap();

    // What the operator sees.
    let r = sb.run(&["lock-status", "-u", &url, "--namespace", &ns]);
    assert_eq!(r.code, 0, "{r:?}");
    for want in [
        "HEALTHY".to_owned(),
        "engine=redis (grade C)".to_owned(),
        format!("pid={}", holder.pid()),
        format!("fencing token     {token}"),
        "lease expires".to_owned(),
        "redis_probe hold".to_owned(),
    ] {
        assert!(
            r.stdout.contains(&want),
            "{want:?} missing in:\n{}",
            r.stdout
        );
    }
    let (_, status) = sb.status(&["-u", &url, "--namespace", &ns]);
    let execution = status["holder"]["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(status["engine"], "redis");
    assert_eq!(status["grade"], "C");
    assert_eq!(status["held"], true);
    let now = chrono_ms(&status["server_now"]);
    let expires = chrono_ms(&status["expires_at"]);
    assert!(expires > now && expires <= now + 3000, "{status}");

    // No terminal and no --yes: refused before anything changes.
    let r = sb.run(&["unlock", "-u", &url, "--namespace", &ns]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("without --yes"), "{r:?}");
    assert!(peek.holder(&ns).is_some());

    let r = sb.run(&[
        "unlock",
        "-u",
        &url,
        "--namespace",
        &ns,
        "--holder",
        &execution,
        "--yes",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("unlocked namespace"), "{r:?}");
    assert!(r.stderr.contains(&format!("pid={}", holder.pid())), "{r:?}");
    let (code, status) = sb.status(&["-u", &url, "--namespace", &ns]);
    assert_eq!(code, 0);
    assert_eq!(status["verdict"], "AVAILABLE", "{status}");
    assert_eq!(peek.fence(&ns), Some(token + 1), "unlock bumps the fence");

    // The removed holder learns it at its next renewal; its fenced write is rejected.
    let lost = holder.expect("lost: ", Duration::from_secs(10));
    assert!(lost.contains("taken over"), "{lost}");
    let write = holder.expect("fenced write ", Duration::from_secs(10));
    assert!(write.starts_with("fenced write rejected"), "{write}");
    assert!(peek.get(&data).unwrap().contains(&format!("token {token}")));
    assert!(!peek.get(&data).unwrap().contains("STALE"));

    let audit = peek.audit(&ns);
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(audit[0]["action"], "forced_unlock");
    assert_eq!(audit[0]["holder_execution_id"], execution.as_str());
    assert!(audit[0]["reason"].as_str().unwrap().contains("HEALTHY"));
    assert!(audit[0]["actor"].as_str().unwrap().contains("pid="));
    assert!(audit[0]["at_ms"].as_i64().unwrap() > 0);

    let r = sb.run(&["unlock", "-u", &url, "--namespace", &ns, "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("nothing to unlock"), "{r:?}");
    assert_eq!(peek.audit(&ns).len(), 1);
}

fn chrono_ms(v: &serde_json::Value) -> i64 {
    let s = v.as_str().unwrap_or_else(|| panic!("not a timestamp: {v}"));
    chrono::DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .timestamp_millis()
}
