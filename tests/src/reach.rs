//! Probes of who reaches what, run inside Pods: TCP connections to `host:port` targets, each
//! answered connected, refused (a reset: nothing listens, or a policy that rejects) or dropped
//! (no answer within the probe's timeout: what a NetworkPolicy enforcer does to a packet it
//! denies). A probe that could not run (the exec failed, Python raised anything else) is an
//! error, never counted as a refusal.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use crate::pods::{exec, ip_of};
use crate::{Error, Result};

/// How a connection attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// The three-way handshake completed.
    Connected,
    /// The peer (or a policy) answered with a reset.
    Refused,
    /// Nothing answered within the probe's timeout.
    Dropped,
}

impl Reach {
    /// Connected: the target is reachable.
    pub fn open(self) -> bool {
        self == Reach::Connected
    }
}

/// Connects to each `host:port` in argv (2 s each) and prints one JSON object, target to
/// `connected`, `refused` or `dropped`. Any other failure raises (exit status 1).
const PROBE: &str = r#"
import json, socket, sys
out = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), 2).close()
        out[target] = "connected"
    except ConnectionRefusedError:
        out[target] = "refused"
    except (socket.timeout, TimeoutError):
        out[target] = "dropped"
print(json.dumps(out))
"#;

/// Probes `targets` (`host:port`) from `pod` (an image with python3).
pub async fn probe(
    api: &Api<Pod>,
    pod: &str,
    targets: &[String],
) -> Result<BTreeMap<String, Reach>> {
    let mut command = vec!["python3", "-c", PROBE];
    command.extend(targets.iter().map(String::as_str));
    let out = exec(api, pod, None, &command).await?;
    let failed = |why: String| Error::Wait {
        what: format!("a reachability probe from {pod} to {targets:?}"),
        reason: why,
    };
    if !out.success {
        return Err(failed(format!(
            "the probe did not run to its end: {}",
            out.stderr
        )));
    }
    let answers: BTreeMap<String, String> = serde_json::from_str(out.stdout.trim())
        .map_err(|e| failed(format!("unreadable answer {:?}: {e}", out.stdout)))?;
    answers
        .into_iter()
        .map(|(t, r)| match r.as_str() {
            "connected" => Ok((t, Reach::Connected)),
            "refused" => Ok((t, Reach::Refused)),
            "dropped" => Ok((t, Reach::Dropped)),
            other => Err(failed(format!("{t}: {other}"))),
        })
        .collect()
}

/// Probes `targets` from `pod` until every one's reach is `open`, within `within`; how long it
/// took. A wait that runs out names `what` and the answers last seen.
pub async fn wait_reach(
    api: &Api<Pod>,
    pod: &str,
    targets: &[String],
    open: bool,
    within: std::time::Duration,
    what: &str,
) -> Result<std::time::Duration> {
    if targets.is_empty() {
        // Every one of nothing is both open and closed: a wait over none proves nothing.
        return Err(Error::Wait {
            what: what.to_owned(),
            reason: "no target to probe".into(),
        });
    }
    let started = std::time::Instant::now();
    loop {
        let seen = probe(api, pod, targets).await?;
        if seen.values().all(|r| r.open() == open) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > within {
            return Err(Error::Wait {
                what: what.to_owned(),
                reason: format!("{pod} last saw {seen:?}"),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Prints the TCP ports a process in `pod`'s network namespace listens on, not on loopback alone
/// (`/proc/net/tcp` and `tcp6`, state 0A).
const LISTENING: &str = r#"
ports = set()
for path in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        lines = open(path).read().splitlines()[1:]
    except OSError:
        continue
    for line in lines:
        f = line.split()
        address, port = f[1].rsplit(":", 1)
        loopback = address in ("0100007F", "00000000000000000000000001000000")
        if f[3] == "0A" and not loopback:
            ports.add(int(port, 16))
print(" ".join(str(p) for p in sorted(ports)))
"#;

/// The ports `pod` (its `container`) listens on beyond loopback, as `IP:PORT` targets.
pub async fn listening(api: &Api<Pod>, pod: &Pod, container: Option<&str>) -> Result<Vec<String>> {
    let name = crate::pods::name_of(pod);
    let ip = ip_of(pod).ok_or_else(|| Error::Wait {
        what: format!("the address of {name}"),
        reason: "the Pod has none".into(),
    })?;
    let out = exec(api, name, container, &["python3", "-c", LISTENING]).await?;
    if !out.success {
        return Err(Error::Wait {
            what: format!("the listening ports of {name}"),
            reason: out.stderr,
        });
    }
    Ok(out
        .stdout
        .split_whitespace()
        .map(|p| format!("{ip}:{p}"))
        .collect())
}

/// Whether the store's client in `pod` reads `key` through the master `master`: `Ok(false)`
/// when its setup cannot reach the master (the store's own setup error, or no answer within a
/// minute); `Ok(true)` when the store answered the read (a hit or a miss). A client that did not
/// run is an error.
pub async fn store_answers(api: &Api<Pod>, pod: &Pod, master: &str, key: &str) -> Result<bool> {
    let attempt = StoreAttempt {
        op: "get",
        key,
        tenant: "",
        segment: 0,
    };
    Ok(store_attempt(api, pod, master, &attempt).await?.is_some())
}

/// One call of the store's client ([`crate::store::CLIENT`]): its operation (`get`, `put`,
/// `remove`, `mount`), key, tenant id (empty: the store's default) and the segment its setup
/// mounts (bytes; 0 mounts none).
#[derive(Clone, Copy, Debug)]
pub struct StoreAttempt<'a> {
    pub op: &'a str,
    pub key: &'a str,
    pub tenant: &'a str,
    pub segment: u64,
}

/// Runs `attempt` with the store's client in `pod` through the master `master`: `Ok(None)` when
/// its setup cannot reach the master (the store's own setup error, or no answer within a
/// minute); `Ok(Some(line))` with the client's `RESULT` line when the store answered (a read's
/// hit or miss, a put's or remove's code, a mount's setup done). A client that did not run is an
/// error.
pub async fn store_attempt(
    api: &Api<Pod>,
    pod: &Pod,
    master: &str,
    attempt: &StoreAttempt<'_>,
) -> Result<Option<String>> {
    let name = crate::pods::name_of(pod);
    let ip = ip_of(pod).unwrap_or("127.0.0.1");
    let segment = attempt.segment.to_string();
    // The exit status printed after the client: `timeout` ends a client still waiting for the
    // master with 124.
    let out = exec(
        api,
        name,
        None,
        &[
            "sh",
            "-c",
            "timeout 60 python3 -c \"$1\" \"$2\" \"$3\" \"$4\" \"$5\" 4096 \"$6\" \"$7\"; echo EXIT $?",
            "sh",
            crate::store::CLIENT,
            master,
            attempt.op,
            attempt.key,
            attempt.tenant,
            ip,
            &segment,
        ],
    )
    .await?;
    let result = out.stdout.lines().find_map(|l| l.strip_prefix("RESULT "));
    let status = out.stdout.lines().find_map(|l| l.strip_prefix("EXIT "));
    match (result, status) {
        (Some(r), _) if r.starts_with("setup ") => Ok(None),
        (Some(r), _) => Ok(Some(r.to_owned())),
        (None, Some("124")) => Ok(None),
        _ => Err(Error::Wait {
            what: format!(
                "a store {} of {} from {name} through {master}",
                attempt.op, attempt.key
            ),
            reason: format!(
                "the client did not run to an answer ({}): {}",
                status.unwrap_or("no status"),
                crate::pods::last_lines(&out.stderr, 5).join(" | ")
            ),
        }),
    }
}
