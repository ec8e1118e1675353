//! A store client held open in a Pod, as an engine holds one (docs/isolation.md#revocation):
//! one client set up for the process's life, putting a new key and reading the first one every
//! 200 ms, each round printed on its log as a JSON line with its wall-clock time. What it can
//! still do after its namespace's Binding is deleted is read from that log, followed as it is
//! written (the nodes are network namespaces of this machine: one clock).

use std::pin::Pin;
use std::time::Duration;

use futures::{AsyncBufReadExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams, PostParams};

use crate::{Error, Result};

/// The held client. argv: master, tenant, this host's address. Set up again (a new client)
/// until the master admits it; then the rounds, forever.
const HOLDER: &str = r#"
import json, sys, time
from mooncake.store import MooncakeDistributedStore
master, tenant, host = sys.argv[1], sys.argv[2], sys.argv[3]
while True:
    store = MooncakeDistributedStore()
    rc = store.setup({"local_hostname": host, "metadata_server": "P2PHANDSHAKE", "global_segment_size": 0,
                      "local_buffer_size": 16 << 20, "protocol": "tcp", "rdma_devices": "",
                      "master_server_addr": master, "tenant_id": tenant})
    print(json.dumps({"setup": rc, "t": time.time()}), flush=True)
    if rc == 0:
        break
    time.sleep(1)
i = 0
while True:
    t0 = time.time()
    put = store.put(f"held-{i}", bytes([i % 251]) * 4096)
    exist = store.is_exist("held-0")
    got = len(store.get("held-0"))
    print(json.dumps({"t0": t0, "put": put, "exist": exist, "got": got}), flush=True)
    i += 1
    time.sleep(0.2)
"#;

/// One round of the held client: when it started (seconds since the epoch), the put's code
/// (0: written), the first key's `is_exist` and the bytes its get returned.
#[derive(Clone, Copy, Debug, serde::Deserialize)]
pub struct Round {
    pub t0: f64,
    pub put: i64,
    pub exist: i64,
    pub got: usize,
}

impl Round {
    /// The put was stored.
    pub fn wrote(&self) -> bool {
        self.put == 0
    }

    /// The first key read back.
    pub fn read(&self) -> bool {
        self.got > 0
    }
}

/// Now, seconds since the epoch (the holder's clock).
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

type Lines = Pin<Box<dyn Stream<Item = std::io::Result<String>> + Send>>;

/// A holder Pod's log, followed.
pub struct Holder {
    name: String,
    lines: Lines,
    /// Every round read so far.
    pub rounds: Vec<Round>,
}

/// When the held client stopped writing and reading, in seconds after a moment (the Binding's
/// deletion), and what it got from then on.
#[derive(Clone, Debug)]
pub struct Cut {
    /// The start of the first round from which no put was stored.
    pub writes: f64,
    /// The start of the first round from which nothing was read back.
    pub reads: f64,
    /// Rounds after the moment, and the puts' codes from the cut on (the store's refusals).
    pub rounds: usize,
    pub refusals: Vec<i64>,
}

impl Holder {
    /// Starts the holder Pod `name` in `api`'s namespace, of `image` (the store's), dialling
    /// `master` as `tenant`, and follows its log once it runs.
    pub async fn start(
        api: &Api<Pod>,
        name: &str,
        image: &str,
        master: &str,
        tenant: &str,
    ) -> Result<Holder> {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "holder"}},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "holder", "image": image, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "exec python3 -c \"$0\" \"$1\" \"$2\" \"$POD_IP\"",
                                HOLDER, master, tenant],
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                    "securityContext": {"allowPrivilegeEscalation": false,
                                        "capabilities": {"drop": ["ALL"]}}
                }]
            }
        }))
        .map_err(|e| Error::Invalid {
            path: format!("the holder Pod {name}"),
            what: "Pod",
            reason: e.to_string(),
        })?;
        api.create(&PostParams::default(), &pod).await?;
        crate::pods::wait_pod(api, name, "running", Duration::from_secs(120), |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .await?;
        let lp = LogParams {
            follow: true,
            ..LogParams::default()
        };
        let lines = api.log_stream(name, &lp).await?.lines();
        Ok(Holder {
            name: name.to_owned(),
            lines: Box::pin(lines),
            rounds: Vec::new(),
        })
    }

    /// The next round on the log, within `within`; `None` when the log ended.
    async fn next(&mut self, within: Duration) -> Result<Option<Round>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.next())
                .await
                .map_err(|_| Error::Wait {
                    what: format!("a round on the log of {} (within {within:?})", self.name),
                    reason: format!("the rounds so far: {:?}", self.last(5)),
                })?;
            let Some(line) = line else {
                return Ok(None);
            };
            let line = line.map_err(|e| Error::Http {
                url: format!("the log of {}", self.name),
                message: e.to_string(),
            })?;
            // The store's own log lines and the setup's are not rounds.
            if let Ok(round) = serde_json::from_str::<Round>(&line) {
                self.rounds.push(round);
                return Ok(Some(round));
            }
        }
    }

    /// The last `n` rounds read.
    fn last(&self, n: usize) -> &[Round] {
        &self.rounds[self.rounds.len().saturating_sub(n)..]
    }

    /// Reads rounds until `n` in a row wrote and read back, within `within`.
    pub async fn serving(&mut self, n: usize, within: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let good = self
                .last(n)
                .iter()
                .filter(|r| r.wrote() && r.read())
                .count();
            if good == n {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if self.next(left).await?.is_none() {
                return Err(Error::Wait {
                    what: format!("{n} rounds in a row written and read on {}", self.name),
                    reason: format!("its log ended; the rounds: {:?}", self.last(10)),
                });
            }
        }
    }

    /// Reads the rounds that start after `since` (seconds since the epoch) until `n` in a row
    /// neither wrote nor read back, or until `within` after `since` has passed and `n` more
    /// rounds were read; from when on (seconds after `since`) no round wrote and none read
    /// (`None`: the last round read still wrote or read).
    pub async fn cut(&mut self, since: f64, n: usize, within: Duration) -> Result<Option<Cut>> {
        let until = since + within.as_secs_f64();
        let mut after: Vec<Round> = Vec::new();
        let mut past = 0;
        loop {
            let tail = &after[after.len().saturating_sub(n)..];
            if tail.len() == n && tail.iter().all(|r| !r.wrote() && !r.read()) {
                break;
            }
            if now() > until {
                past += 1;
                if past > n {
                    break;
                }
            }
            // A round takes a fraction of a second; a minute without one is a stuck client.
            match self.next(Duration::from_secs(60)).await? {
                Some(r) if r.t0 >= since => after.push(r),
                Some(_) => {}
                None => break,
            }
        }
        // From which round on every later one failed.
        let from = |ok: fn(&Round) -> bool| {
            let i = after.iter().rposition(ok).map_or(0, |i| i + 1);
            after.get(i).map(|r| r.t0 - since)
        };
        let (Some(writes), Some(reads)) = (from(Round::wrote), from(Round::read)) else {
            return Ok(None);
        };
        let mut refusals: Vec<i64> = after
            .iter()
            .filter(|r| r.t0 >= since + writes)
            .map(|r| r.put)
            .collect();
        refusals.dedup();
        Ok(Some(Cut {
            writes,
            reads,
            rounds: after.len(),
            refusals,
        }))
    }
}
