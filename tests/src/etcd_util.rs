//! Reading the etcd cluster behind a test's back: its revision, and the history of a key as
//! etcd itself recorded it (every create and delete, in revision order), which proves or
//! disproves that two holders ever held a lock key at once.

use etcd_client::{Client, EventType, WatchOptions};

/// The cluster of [`crate::etcd_url`], without the `etcd://` scheme and prefix.
fn endpoints() -> Vec<String> {
    let url = crate::etcd_url();
    let hosts = url.trim_start_matches("etcd://");
    let hosts = hosts.split('/').next().unwrap_or(hosts);
    hosts.split(',').map(|h| format!("http://{h}")).collect()
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// One change of a key: created (`true`) or deleted, at a revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub created: bool,
    pub revision: i64,
}

/// The cluster's current revision.
pub fn revision() -> i64 {
    block_on(async {
        let mut c = Client::connect(endpoints(), None).await.expect("etcd");
        let r = c.get("/", None).await.expect("etcd get");
        r.header().expect("a header").revision()
    })
}

/// Every create and delete of `key` after revision `from`, in order: what a watch from
/// there replays (etcd sends the history at once; it is complete once the watch has been quiet
/// for two seconds). An update of a key that exists is not a create (its version is above 1).
pub fn history(key: &str, from: i64) -> Vec<Change> {
    block_on(async {
        let mut c = Client::connect(endpoints(), None).await.expect("etcd");
        let opts = WatchOptions::new().with_start_revision(from + 1);
        let mut stream = c.watch(key, Some(opts)).await.expect("etcd watch");
        let mut out = Vec::new();
        let quiet = std::time::Duration::from_secs(2);
        while let Ok(r) = tokio::time::timeout(quiet, stream.message()).await {
            let r = r.expect("etcd watch").expect("etcd watch stream");
            for e in r.events() {
                let kv = e.kv().expect("an event's key");
                let created = match e.event_type() {
                    EventType::Put if kv.version() == 1 => true,
                    EventType::Put => continue,
                    EventType::Delete => false,
                };
                out.push(Change {
                    created,
                    revision: kv.mod_revision(),
                });
            }
        }
        out
    })
}

/// A shell command that appends `enter <who> <ns>` to `ledger`, runs `body`, and appends
/// `leave <who> <ns>` when it ends, also when it is stopped (SIGTERM, which also stops a `body`
/// in the background).
pub fn ledgered(ledger: &std::path::Path, who: &str, body: &str) -> String {
    let l = ledger.display();
    format!(
        "trap 'kill $! 2>/dev/null; echo leave {who} $(date +%s%N) >> {l}; exit 143' TERM; echo enter {who} $(date +%s%N) >> {l}; {body}; trap '' TERM; echo leave {who} $(date +%s%N) >> {l}"
    )
}

/// The (who, entered, left) intervals of a ledger written by [`ledgered`] commands, in order;
/// panics unless each closes before the next opens.
pub fn intervals(ledger: &std::path::Path) -> Vec<(String, u128, u128)> {
    let text = std::fs::read_to_string(ledger).unwrap_or_default();
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len() % 2, 0, "every enter has its leave: {text}");
    lines
        .chunks(2)
        .map(|p| {
            assert!(
                p[0][0] == "enter" && p[1][0] == "leave" && p[0][1] == p[1][1],
                "two holders at once: {text}"
            );
            (
                p[0][1].to_owned(),
                p[0][2].parse().unwrap(),
                p[1][2].parse().unwrap(),
            )
        })
        .collect()
}

/// etcd's own record of a lock key: created and deleted in turn, never created twice.
pub fn alternates(changes: &[Change]) {
    for w in changes.windows(2) {
        assert_ne!(
            w[0].created, w[1].created,
            "two holders at once: {changes:?}"
        );
    }
    assert!(changes.first().is_none_or(|c| c.created), "{changes:?}");
}
