//! A member rollout seen from outside: keys written through the store's Python client and read
//! back with their bytes afterwards, and the member Pods watched so that the fewest Ready at any
//! moment is known (one member at a time leaves at most one missing).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::watcher;

use crate::pods::{exec, ip_of, is_ready, name_of};
use crate::{Error, Result};

/// N keys `PREFIX-i` of SIZE bytes each, every value its own bytes (SHA-256 of the key,
/// repeated), put or read back through the store's client (default tenant) and counted; argv:
/// master, this host's address, `put` or `get`, PREFIX, N, SIZE. A read asks `is_exist` first
/// (a miss is not an error) and compares every byte.
const KEYS: &str = r#"
import sys, hashlib
from mooncake.store import MooncakeDistributedStore
master, host, op, prefix, n, size = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
store = MooncakeDistributedStore()
rc = store.setup({"local_hostname": host, "metadata_server": "P2PHANDSHAKE", "global_segment_size": 0,
                  "local_buffer_size": 4 * size + (16 << 20), "protocol": "tcp", "rdma_devices": "",
                  "master_server_addr": master})
if rc != 0:
    print("RESULT setup", rc, flush=True)
    sys.exit(0)
def value(i):
    block = hashlib.sha256(f"{prefix}-{i}".encode()).digest()
    return (block * (size // len(block) + 1))[:size]
ok = wrong = missing = failed = 0
codes = set()
for i in range(n):
    key = f"{prefix}-{i}"
    if op == "put":
        rc = store.put(key, value(i))
        if rc == 0:
            ok += 1
        else:
            failed += 1
            codes.add(rc)
        continue
    present = store.is_exist(key)
    if present < 0:
        failed += 1
        codes.add(present)
    elif present == 0:
        missing += 1
    elif store.get(key) == value(i):
        ok += 1
    else:
        wrong += 1
print("RESULT", op, "ok", ok, "wrong", wrong, "missing", missing, "failed", failed, "of", n,
      "codes", ",".join(str(c) for c in sorted(codes)) or "none", flush=True)
store.close()
"#;

/// What a pass over the keys found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyCount {
    /// Put, or read back with exactly their bytes.
    pub ok: usize,
    /// Read back with other bytes.
    pub wrong: usize,
    /// Absent on the master.
    pub missing: usize,
    /// The store answered an error (a failed put, a negative `is_exist`).
    pub failed: usize,
    /// Keys in all.
    pub of: usize,
    /// The store's error codes among the failures (e.g. -1701 `TENANT_NOT_REGISTERED`).
    pub codes: Vec<i64>,
}

impl KeyCount {
    /// The share read back (or put) correctly, in percent.
    pub fn percent(&self) -> f64 {
        if self.of == 0 {
            return 0.0;
        }
        100.0 * self.ok as f64 / self.of as f64
    }

    /// Reads the client's `RESULT <op> ok N wrong N missing N failed N of N` line.
    fn parse(stdout: &str) -> Option<KeyCount> {
        let line = stdout.lines().find(|l| l.starts_with("RESULT "))?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let field = |name: &str| {
            words
                .iter()
                .position(|w| *w == name)
                .and_then(|i| words.get(i + 1))
                .and_then(|v| v.parse().ok())
        };
        Some(KeyCount {
            ok: field("ok")?,
            wrong: field("wrong")?,
            missing: field("missing")?,
            failed: field("failed")?,
            of: field("of")?,
            codes: words
                .iter()
                .position(|w| *w == "codes")
                .and_then(|i| words.get(i + 1))
                .map(|c| c.split(',').filter_map(|c| c.parse().ok()).collect())
                .unwrap_or_default(),
        })
    }
}

/// Puts (`put`) or reads back (`get`) `n` keys `prefix-i` of `size` bytes through the store's
/// client run inside `pod` (a Pod of the store image), dialling `master` from the Pod's address.
pub async fn keys(
    api: &Api<Pod>,
    pod: &str,
    master: &str,
    op: &str,
    prefix: &str,
    n: usize,
    size: usize,
) -> Result<KeyCount> {
    let p = api.get(pod).await?;
    let ip = ip_of(&p).unwrap_or("127.0.0.1").to_owned();
    let (n, size) = (n.to_string(), size.to_string());
    let out = exec(
        api,
        pod,
        None,
        &["python3", "-c", KEYS, master, &ip, op, prefix, &n, &size],
    )
    .await?;
    KeyCount::parse(&out.stdout).ok_or_else(|| Error::ClientOutput {
        status: if out.success {
            "exit 0".to_owned()
        } else {
            format!("failed in {pod}: {}", out.ended.trim())
        },
        output: format!(
            "{} / {}",
            out.stdout.trim(),
            crate::pods::last_lines(&out.stderr, 5).join(" | ")
        ),
    })
}

/// [`keys`] from this machine: the store's client from the harness's virtualenv on loopback,
/// dialling `master` (`host:port` or `etcd://...`).
pub fn keys_local(master: &str, op: &str, prefix: &str, n: usize, size: usize) -> Result<KeyCount> {
    let venv = crate::paths::mooncake_venv()?;
    let mut cmd = std::process::Command::new(venv.join("bin/python"));
    cmd.arg("-c").arg(KEYS).args([
        master,
        "127.0.0.1",
        op,
        prefix,
        &n.to_string(),
        &size.to_string(),
    ]);
    crate::store::loopback_env(&mut cmd);
    let out = cmd.output().map_err(|source| Error::Spawn {
        what: "the store's Python client".into(),
        source,
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    KeyCount::parse(&stdout).ok_or_else(|| Error::ClientOutput {
        status: out.status.to_string(),
        output: format!(
            "{} / {}",
            stdout.trim(),
            crate::pods::last_lines(&String::from_utf8_lossy(&out.stderr), 5).join(" | ")
        ),
    })
}

#[derive(Debug, Default)]
struct Seen {
    /// Each member Pod by name: Ready and not terminating.
    serving: BTreeMap<String, bool>,
    /// The fewest serving at once since the watch started listing.
    fewest: Option<usize>,
    /// Each change: seconds since the watch started, the Pod, serving or not, how many serve.
    timeline: Vec<String>,
}

/// A watch on member Pods that keeps the fewest Ready (and not terminating) at any moment.
pub struct MemberWatch {
    seen: Arc<Mutex<Seen>>,
    listed: tokio::sync::watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl MemberWatch {
    /// Starts watching the Pods `selector` picks in `api`'s namespace.
    pub fn start(api: Api<Pod>, selector: &str) -> MemberWatch {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let config = watcher::Config::default().labels(selector);
        let shared = seen.clone();
        let (tell, listed) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut listing = BTreeMap::new();
            let mut events = watcher(api, config).boxed();
            while let Some(Ok(event)) = events.next().await {
                let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
                let changed = match event {
                    watcher::Event::Init => {
                        listing.clear();
                        None
                    }
                    watcher::Event::InitApply(p) => {
                        listing.insert(name_of(&p).to_owned(), serving(&p));
                        None
                    }
                    watcher::Event::InitDone => {
                        s.serving = std::mem::take(&mut listing);
                        tell.send_replace(true);
                        Some("(listed)".to_owned())
                    }
                    watcher::Event::Apply(p) => {
                        let name = name_of(&p).to_owned();
                        let now = serving(&p);
                        (s.serving.insert(name.clone(), now) != Some(now)).then(|| {
                            format!("{name} {}", if now { "serving" } else { "not serving" })
                        })
                    }
                    watcher::Event::Delete(p) => {
                        let name = name_of(&p).to_owned();
                        s.serving.remove(&name);
                        Some(format!("{name} deleted"))
                    }
                };
                if let Some(what) = changed {
                    let count = s.serving.values().filter(|v| **v).count();
                    s.fewest = Some(s.fewest.map_or(count, |f| f.min(count)));
                    let at = started.elapsed().as_secs_f64();
                    s.timeline.push(format!("{at:.1}s {what}: {count} serving"));
                }
            }
        });
        MemberWatch { seen, listed, task }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The fewest member Pods serving at once so far (`None`: not listed yet).
    pub fn fewest_serving(&self) -> Option<usize> {
        self.seen().fewest
    }

    /// Every change seen, one line each.
    pub fn timeline(&self) -> Vec<String> {
        self.seen().timeline.clone()
    }

    /// Waits until the watch has listed the Pods.
    pub async fn listed(&self, within: Duration) -> Result<()> {
        let mut listed = self.listed.clone();
        match tokio::time::timeout(within, listed.wait_for(|l| *l)).await {
            Ok(Ok(_)) => Ok(()),
            outcome => Err(Error::Wait {
                what: format!("the member Pods' first listing (within {within:?})"),
                reason: format!("the watch listed nothing: {outcome:?}"),
            }),
        }
    }
}

impl Drop for MemberWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Ready and not terminating.
fn serving(p: &Pod) -> bool {
    is_ready(p) && p.metadata.deletion_timestamp.is_none()
}

/// A watch on one object that keeps every distinct `Status/Reason: message` its condition of a
/// type went through, in order (to see what `RolloutComplete` said during a rollout).
pub struct ConditionWatch {
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ConditionWatch {
    /// Starts watching the object `name` of `api` for its condition `type_`.
    pub fn start<K>(api: Api<K>, name: &str, type_: &'static str) -> ConditionWatch
    where
        K: crate::Watched + crate::status::HasStatus,
    {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let shared = seen.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let task = tokio::spawn(async move {
            let mut events = watcher(api, config).boxed();
            while let Some(Ok(event)) = events.next().await {
                let (watcher::Event::Apply(o) | watcher::Event::InitApply(o)) = event else {
                    continue;
                };
                let Some(c) = crate::status::condition(&o, type_) else {
                    continue;
                };
                let line = format!("{}/{}: {}", c.status, c.reason, c.message);
                let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
                if s.last() != Some(&line) {
                    s.push(line);
                }
            }
        });
        ConditionWatch { seen, task }
    }

    /// Every distinct `Status/Reason: message` seen so far, in order.
    pub fn seen(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for ConditionWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_count_is_read_back() {
        let c = KeyCount::parse(
            "noise\nRESULT get ok 95 wrong 1 missing 3 failed 1 of 100 codes -900\n",
        )
        .expect("a count");
        assert_eq!(
            c,
            KeyCount {
                ok: 95,
                wrong: 1,
                missing: 3,
                failed: 1,
                of: 100,
                codes: vec![-900]
            }
        );
        assert_eq!(c.percent(), 95.0);
        assert_eq!(KeyCount::parse("RESULT setup -1"), None);
    }
}
