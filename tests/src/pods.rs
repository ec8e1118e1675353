//! Pods on the real nodes: wait until they are Ready, read their logs, run a command inside one
//! (through the API server and the kubelet, as `kubectl logs` and `kubectl exec` do).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{AttachParams, ListParams, LogParams};
use kube::runtime::wait::await_condition;

use crate::{Error, Result};

/// Whether a Pod's Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The Pod's node, if it is scheduled.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// The Pod's address, once it has one.
pub fn ip_of(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.pod_ip.as_deref())
}

/// A Pod's `metadata.name`; empty when it has none.
pub fn name_of(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

/// Waits until `count` Pods matching `selector` are Ready, none terminating (and no more
/// match); returns them, sorted by name. A timeout names the selector and shows each Pod's
/// phase and conditions.
pub async fn wait_ready(
    api: &Api<Pod>,
    selector: &str,
    count: usize,
    within: Duration,
) -> Result<Vec<Pod>> {
    wait_pods(
        api,
        selector,
        &format!("{count} Ready, none terminating"),
        within,
        |pods| {
            // A terminating Pod reads Ready until its container stops: a command run in it
            // then dies with it.
            pods.len() == count
                && pods
                    .iter()
                    .all(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none())
        },
    )
    .await
}

/// Waits until the Pods matching `selector` satisfy `ok`; `what` says what was waited for.
/// Returns them, sorted by name.
pub async fn wait_pods(
    api: &Api<Pod>,
    selector: &str,
    what: &str,
    within: Duration,
    ok: impl Fn(&[Pod]) -> bool,
) -> Result<Vec<Pod>> {
    let deadline = tokio::time::Instant::now() + within;
    let lp = ListParams::default().labels(selector);
    let mut last: Vec<Pod>;
    loop {
        // A list, then a watch for the next change of any of them (bounded by the deadline).
        let mut pods = api.list(&lp).await?.items;
        pods.sort_by(|a, b| name_of(a).cmp(name_of(b)));
        if ok(&pods) {
            return Ok(pods);
        }
        last = pods;
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        let wait = (deadline - now).min(Duration::from_secs(2));
        let _ = tokio::time::timeout(wait, next_change(api, &lp)).await;
    }
    Err(Error::Wait {
        what: format!("Pods {selector}: {what} (within {within:?})"),
        reason: format!(
            "{}\nrecent events in the namespace:\n{}",
            describe(&last),
            recent_events(api).await
        ),
    })
}

/// The namespace's last warning and normal events, one line each (for a wait that ran out).
async fn recent_events(pods: &Api<Pod>) -> String {
    use k8s_openapi::api::core::v1::Event;
    let client: kube::Client = pods.clone().into_client();
    let ns = pods.namespace().unwrap_or("default").to_owned();
    let events: Api<Event> = Api::namespaced(client, &ns);
    match events.list(&ListParams::default()).await {
        Ok(list) => {
            let mut lines: Vec<String> = list
                .items
                .iter()
                .map(|e| {
                    format!(
                        "{} {}/{}: {} {}",
                        e.type_.as_deref().unwrap_or_default(),
                        e.involved_object.kind.as_deref().unwrap_or_default(),
                        e.involved_object.name.as_deref().unwrap_or_default(),
                        e.reason.as_deref().unwrap_or_default(),
                        e.message.as_deref().unwrap_or_default()
                    )
                })
                .collect();
            let skip = lines.len().saturating_sub(15);
            lines.drain(..skip);
            lines.join("\n")
        }
        Err(e) => format!("(events not readable: {e})"),
    }
}

async fn next_change(api: &Api<Pod>, lp: &ListParams) {
    use futures::StreamExt;
    let wp = kube::api::WatchParams::default()
        .labels(lp.label_selector.as_deref().unwrap_or_default())
        .timeout(2);
    if let Ok(stream) = api.watch(&wp, "0").await {
        let mut stream = Box::pin(stream);
        let _ = stream.next().await;
    }
}

/// One line per Pod: name, node, phase, and its conditions and container states.
pub fn describe(pods: &[Pod]) -> String {
    if pods.is_empty() {
        return "no Pods matched".into();
    }
    pods.iter()
        .map(|p| {
            let s = p.status.as_ref();
            let conditions: Vec<String> = s
                .and_then(|s| s.conditions.as_ref())
                .map(|c| {
                    c.iter()
                        .map(|c| {
                            format!(
                                "{}={} {}",
                                c.type_,
                                c.status,
                                c.message.as_deref().unwrap_or_default()
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let containers: Vec<String> = s
                .and_then(|s| s.container_statuses.as_ref())
                .map(|cs| {
                    cs.iter()
                        .map(|c| format!("{}: {:?}", c.name, c.state))
                        .collect()
                })
                .unwrap_or_default();
            format!(
                "{} on {:?}: {} [{}] {}",
                name_of(p),
                node_of(p),
                s.and_then(|s| s.phase.as_deref()).unwrap_or("?"),
                conditions.join("; "),
                containers.join("; ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until the named Pod satisfies `ok`.
pub async fn wait_pod(
    api: &Api<Pod>,
    name: &str,
    what: &str,
    within: Duration,
    ok: impl Fn(&Pod) -> bool,
) -> Result<Pod> {
    let cond = |p: Option<&Pod>| p.is_some_and(&ok);
    if let Ok(Ok(Some(p))) =
        tokio::time::timeout(within, await_condition(api.clone(), name, cond)).await
    {
        return Ok(p);
    }
    let last = api.get_opt(name).await?;
    Err(Error::Wait {
        what: format!("Pod {name}: {what} (within {within:?})"),
        reason: describe(&last.into_iter().collect::<Vec<_>>()),
    })
}

/// A GET on `path` (with its query) of a Pod's `port`, through the API server's Pod proxy (as
/// `kubectl get --raw /api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/<path>` does).
pub async fn proxy_get(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    port: u16,
    path: &str,
) -> Result<String> {
    let req = http::Request::get(format!(
        "/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/{path}"
    ))
    .body(Vec::new())
    .map_err(|e| Error::Http {
        url: path.to_owned(),
        message: e.to_string(),
    })?;
    Ok(client.request_text(req).await?)
}

/// One of the master's admin pages (`metrics`, `get_all_segments`, …) at `admin` (the leader
/// Service's `host:port`), read from inside `pod` (the host has no route to Services).
pub async fn master_page(api: &Api<Pod>, pod: &str, admin: &str, page: &str) -> Result<String> {
    master_page_in_container(api, pod, None, admin, page).await
}

/// As [`master_page`], from `container` of `pod` (a leader Pod's `master`, reading its own
/// `127.0.0.1:9003`).
pub async fn master_page_in(
    api: &Api<Pod>,
    pod: &str,
    container: &str,
    admin: &str,
    page: &str,
) -> Result<String> {
    master_page_in_container(api, pod, Some(container), admin, page).await
}

async fn master_page_in_container(
    api: &Api<Pod>,
    pod: &str,
    container: Option<&str>,
    admin: &str,
    page: &str,
) -> Result<String> {
    let url = format!("http://{admin}/{page}");
    let out = exec(
        api,
        pod,
        container,
        &[
            "python3",
            "-c",
            "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode())",
            &url,
        ],
    )
    .await?;
    if out.success {
        Ok(out.stdout)
    } else {
        Err(Error::Http {
            url,
            message: out.stderr,
        })
    }
}

/// The last `n` lines of `text`, in their order: the tail of a failed process's output for an
/// error message.
pub fn last_lines(text: &str, n: usize) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

/// The logs of a Pod's container (`None`: its only one).
pub async fn logs(api: &Api<Pod>, pod: &str, container: Option<&str>) -> Result<String> {
    let lp = LogParams {
        container: container.map(str::to_owned),
        ..LogParams::default()
    };
    Ok(api.logs(pod, &lp).await?)
}

/// Waits until a Pod's log holds `needle`; returns the log.
pub async fn wait_log(
    api: &Api<Pod>,
    pod: &str,
    container: Option<&str>,
    needle: &str,
    within: Duration,
) -> Result<String> {
    let deadline = tokio::time::Instant::now() + within;
    let mut last: String;
    loop {
        match logs(api, pod, container).await {
            Ok(log) if log.contains(needle) => return Ok(log),
            Ok(log) => last = log,
            Err(e) => last = format!("(logs not readable: {e})"),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Wait {
                what: format!("Pod {pod}: a log line with {needle:?} (within {within:?})"),
                reason: format!("its log so far:\n{last}"),
            });
        }
        // Logs have no watch: read again shortly.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// What a command run in a Pod printed, and whether it succeeded.
#[derive(Clone, Debug)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    /// Exit status 0.
    pub success: bool,
    /// How the command ended when it did not succeed, as the kubelet said (its exit code, or
    /// that the container went); empty on success.
    pub ended: String,
}

/// Runs `command` in the Pod's container (`None`: its only one) and collects what it printed.
pub async fn exec(
    api: &Api<Pod>,
    pod: &str,
    container: Option<&str>,
    command: &[&str],
) -> Result<Output> {
    use tokio::io::AsyncReadExt;
    let mut params = AttachParams::default().stdout(true).stderr(true);
    if let Some(c) = container {
        params = params.container(c);
    }
    let mut attached = api.exec(pod, command.iter().copied(), &params).await?;
    let mut stdout = String::new();
    let mut stderr = String::new();
    let out = attached.stdout();
    let err = attached.stderr();
    let status = attached.take_status();
    // A stream that breaks is an error, never an empty answer (a command that printed
    // nothing reads as such only when its streams ended cleanly).
    let read_out = async {
        match out {
            Some(mut o) => o.read_to_string(&mut stdout).await.map(drop),
            None => Ok(()),
        }
    };
    let read_err = async {
        match err {
            Some(mut e) => e.read_to_string(&mut stderr).await.map(drop),
            None => Ok(()),
        }
    };
    let (read_out, read_err) = tokio::join!(read_out, read_err);
    if let Err(e) = read_out.and(read_err) {
        return Err(Error::Http {
            url: format!(
                "exec {} in {pod}",
                command.first().copied().unwrap_or_default()
            ),
            message: format!("its output stream broke: {e}"),
        });
    }
    let status = match status {
        Some(s) => s.await,
        None => None,
    };
    let _ = attached.join().await;
    let success = status
        .as_ref()
        .is_some_and(|s| s.status.as_deref() == Some("Success"));
    let ended = match &status {
        _ if success => String::new(),
        None => "no exit status (the stream closed without one)".to_owned(),
        Some(s) => format!(
            "{} {}",
            s.reason.as_deref().unwrap_or_default(),
            s.message.as_deref().unwrap_or_default()
        ),
    };
    Ok(Output {
        stdout,
        stderr,
        success,
        ended,
    })
}

/// The store's Python client run inside `pod` (any Pod whose image carries it: a member, the
/// engine stand-in), one process per call, dialling `master` (`host:port`, names resolved by
/// the cluster DNS) from the Pod's own address.
async fn store_client(
    api: &Api<Pod>,
    pod: &str,
    master: &str,
    op: &str,
    key: &str,
    tenant: Option<&str>,
    size: usize,
) -> Result<(String, i64)> {
    let p = api.get(pod).await?;
    let ip = ip_of(&p).unwrap_or("127.0.0.1").to_owned();
    let size = size.to_string();
    let out = exec(
        api,
        pod,
        None,
        &[
            "python3",
            "-c",
            crate::store::CLIENT,
            master,
            op,
            key,
            tenant.unwrap_or(""),
            &size,
            &ip,
        ],
    )
    .await?;
    crate::store::client_answer(
        master,
        if out.success { "exit 0" } else { "failed" },
        &out.stdout,
        &out.stderr,
    )
}

/// Puts `size` bytes under `key` through the store's client inside `pod`; the store's code.
pub async fn store_put(
    api: &Api<Pod>,
    pod: &str,
    master: &str,
    key: &str,
    tenant: Option<&str>,
    size: usize,
) -> Result<i64> {
    store_client(api, pod, master, "put", key, tenant, size)
        .await
        .map(|(_, code)| code)
}

/// Reads `key` through the store's client inside `pod`: a hit or the store's own miss; a store
/// error is an error.
pub async fn store_get(
    api: &Api<Pod>,
    pod: &str,
    master: &str,
    key: &str,
    tenant: Option<&str>,
) -> Result<crate::store::Lookup> {
    let (what, code) = store_client(api, pod, master, "get", key, tenant, 0).await?;
    crate::store::lookup(master, &what, code)
}

/// ROUNDS rounds of N puts of SIZE bytes through the store's client (default tenant), a second
/// apart (past the objects' lease, so a round may evict the one before); argv: master, this
/// host's address, ROUNDS, N, SIZE. Run with `python3 -c` in a Pod of the store image to fill
/// segments and drive a disk tier.
pub const PUT_MANY: &str = r#"
import sys, time
from mooncake.store import MooncakeDistributedStore
master, host, rounds, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
store = MooncakeDistributedStore()
rc = store.setup({"local_hostname": host, "metadata_server": "P2PHANDSHAKE", "global_segment_size": 0,
                  "local_buffer_size": 16 << 20, "protocol": "tcp", "rdma_devices": "", "master_server_addr": master})
assert rc == 0, f"setup {rc}"
for r in range(rounds):
    codes = [store.put(f"tier-{r}-{i}", bytes([i % 256]) * size) for i in range(n)]
    print("round", r, "ok", codes.count(0), "codes", sorted(set(codes)), flush=True)
    time.sleep(1)
store.close()
"#;

/// The host processes of a Pod's container (found by the container id in their cgroup): to
/// signal a container's process or read its memory from the host, without the kubelet.
pub fn host_pids(pod: &Pod) -> Vec<i32> {
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.as_deref())
        .and_then(|c| c.rsplit("://").next())
        .unwrap_or_default()
        .to_owned();
    assert!(!id.is_empty(), "the Pod has a running container");
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(&id))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::last_lines;

    #[test]
    fn last_lines_keeps_the_tail_in_its_order() {
        assert_eq!(last_lines("a\nb\nc\n", 2), ["b", "c"]);
        assert_eq!(last_lines("a", 5), ["a"]);
        assert!(last_lines("", 3).is_empty());
    }
}
