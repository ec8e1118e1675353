//! One pass each way between the probes: raw TCP, and the store's own client putting and getting
//! every object size.

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kvcache_e2e::pods::exec;

/// The raw TCP probe's port and payload.
const RAW_PORT: &str = "5555";

const RAW_MIB: &str = "256";

/// One pass of the store client: per size, MB/s of puts and gets and the failures. With
/// `PASS_API=batch` it calls the client as vLLM's store connector does: the objects in a
/// registered buffer, put and got back in batches of [`ENGINE_BATCH`] keys without a copy
/// (`batch_put_from`, `batch_get_into`); otherwise one `put` and one `get` (copies) per object.
const STORE_PASS: &str = r#"
import ctypes, json, os, sys, time
from mooncake.store import MooncakeDistributedStore
master, host, tag, plan, batch = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5])
store = MooncakeDistributedStore()
rc = store.setup({"local_hostname": host, "metadata_server": "P2PHANDSHAKE", "global_segment_size": 0,
                  "local_buffer_size": 256 << 20, "protocol": "tcp", "rdma_devices": "", "master_server_addr": master})
if rc != 0:
    print(json.dumps({"error": f"setup returned {rc}"})); sys.exit(1)
# Earlier passes' objects go first, forced: each was read, so the render's read lease
# (-default_kv_lease_ttl=5m) keeps it otherwise, the store fills in minutes, and its eviction
# takes the objects nobody has read yet (this pass's, between their put and their get).
store.remove_by_regex("^xfer-", True)
engines = os.environ.get("PASS_API") == "batch"
if engines:
    room = max([size * count for size, count in plan] + [1])
    buf = ctypes.create_string_buffer(room)
    base = ctypes.addressof(buf)
    if store.register_buffer(base, room) != 0:
        print(json.dumps({"error": "register_buffer failed"})); sys.exit(1)
rows = []
for size, count in plan:
    data = os.urandom(size)
    keys = [f"xfer-{tag}-{size}-{i}" for i in range(count)]
    if engines:
        for i in range(count):
            ctypes.memmove(base + i * size, data, size)
        ptrs = [base + i * size for i in range(count)]
        chunks = [range(i, min(i + batch, count)) for i in range(0, count, batch)]
        t = time.perf_counter()
        codes = [c for r in chunks for c in store.batch_put_from([keys[i] for i in r], [ptrs[i] for i in r], [size] * len(r))]
        put_s = time.perf_counter() - t
        ctypes.memset(base, 0, size * count)
        t = time.perf_counter()
        read = [n for r in chunks for n in store.batch_get_into([keys[i] for i in r], [ptrs[i] for i in r], [size] * len(r))]
        get_s = time.perf_counter() - t
        bad = [i for i, n in enumerate(read) if n != size or ctypes.string_at(ptrs[i], size) != data]
    else:
        t = time.perf_counter(); codes = [store.put(k, data) for k in keys]; put_s = time.perf_counter() - t
        t = time.perf_counter(); got = [store.get(k) for k in keys]; get_s = time.perf_counter() - t
        bad = [i for i, g in enumerate(got) if len(g) != size or g != data]
    # A failed get of an object the master no longer lists lost the object (evicted, removed);
    # of one it still lists, the transfer.
    gone = sum(1 for i in bad if store.is_exist(keys[i]) != 1)
    rows.append({"size": size, "count": count, "put_s": put_s, "get_s": get_s,
                 "put_failed": sum(1 for c in codes if c != 0), "get_failed": len(bad), "get_gone": gone})
if engines:
    store.unregister_buffer(base)
store.close()
print(json.dumps({"rows": rows}))
"#;

/// Keys per batch call in the engines' way: a 2,048-token prompt of 32-token blocks, as vLLM's
/// connector saves or loads it in one call.
const ENGINE_BATCH: usize = 64;

/// The raw TCP receiver: one connection, everything read, the byte count answered.
const RAW_SERVER: &str = r#"
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1); s.settimeout(120)
c, _ = s.accept(); n = 0
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
c.sendall(str(n).encode()); c.close()
"#;

/// The raw TCP sender: MiB of 1 MiB writes to the receiver, timed to its answer.
const RAW_CLIENT: &str = r#"
import json, socket, sys, time
host, port, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
buf = b"x" * (1 << 20)
for attempt in range(100):
    try:
        s = socket.create_connection((host, port), timeout=120); break
    except OSError:
        time.sleep(0.1)
t = time.perf_counter()
for _ in range(mib): s.sendall(buf)
s.shutdown(socket.SHUT_WR)
n = int(s.recv(64)); secs = time.perf_counter() - t
print(json.dumps({"bytes": n, "seconds": secs}))
"#;

/// The distinct errors the store's client logged (glog lines at `E`, their text after the
/// source position), at most `limit`: why a pass's puts or gets failed.
fn client_errors(stderr: &str, limit: usize) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for line in stderr.lines().filter(|l| l.starts_with('E')) {
        let text = line.split_once("] ").map_or(line, |(_, t)| t).trim();
        if !seen.iter().any(|s| s == text) {
            seen.push(text.to_owned());
        }
        if seen.len() == limit {
            break;
        }
    }
    seen
}

/// One store pass's figures for one size.
#[derive(Clone, Debug, serde::Deserialize)]
pub(super) struct SizeRow {
    pub(super) size: usize,
    pub(super) count: usize,
    pub(super) put_s: f64,
    pub(super) get_s: f64,
    pub(super) put_failed: usize,
    pub(super) get_failed: usize,
    /// Of the failed gets, those whose object the master no longer listed.
    pub(super) get_gone: usize,
}

impl SizeRow {
    pub(super) fn rate(&self, seconds: f64) -> f64 {
        (self.size * self.count) as f64 / seconds / 1e6
    }
}

/// Raw TCP from the probe `a` to the probe `b` (at `ip_b`): MB/s.
pub(super) async fn raw_pass(
    api: &Api<Pod>,
    (a, b): (&str, &str),
    ip_b: &str,
) -> Result<f64, kvcache_e2e::Error> {
    let server_cmd = ["python3", "-c", RAW_SERVER, RAW_PORT];
    let sender_cmd = ["python3", "-c", RAW_CLIENT, ip_b, RAW_PORT, RAW_MIB];
    let server = exec(api, b, None, &server_cmd);
    let sender = exec(api, a, None, &sender_cmd);
    let (server, sender) = tokio::join!(server, sender);
    let (server, sender) = (server?, sender?);
    if !server.success || !sender.success {
        return Err(kvcache_e2e::Error::Engine {
            pod: a.to_owned(),
            message: format!(
                "the raw TCP probe failed: sender {} {}; receiver {}",
                sender.stdout, sender.stderr, server.stderr
            ),
        });
    }
    let v: serde_json::Value =
        serde_json::from_str(sender.stdout.trim()).map_err(|e| kvcache_e2e::Error::Engine {
            pod: a.to_owned(),
            message: format!("an unreadable raw TCP answer ({e}): {}", sender.stdout),
        })?;
    Ok(v["bytes"].as_f64().unwrap_or_default() / v["seconds"].as_f64().unwrap_or(f64::NAN) / 1e6)
}

/// One pass of the store's client in the probe `pod` with `env` set.
pub(super) async fn store_pass(
    api: &Api<Pod>,
    pod: &str,
    ip: &str,
    master: &str,
    tag: &str,
    env: &[(&str, &str)],
    plan: &[(usize, usize)],
) -> Result<Vec<SizeRow>, kvcache_e2e::Error> {
    let plan = serde_json::to_string(plan).unwrap_or_default();
    let batch = ENGINE_BATCH.to_string();
    let mut command: Vec<String> = vec!["env".into()];
    command.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    command.extend(
        ["python3", "-c", STORE_PASS, master, ip, tag, &plan, &batch]
            .iter()
            .map(|s| (*s).to_owned()),
    );
    let args: Vec<&str> = command.iter().map(String::as_str).collect();
    let out = exec(api, pod, None, &args).await?;
    let failed = |why: String| kvcache_e2e::Error::Engine {
        pod: pod.to_owned(),
        message: format!(
            "the store pass {tag} failed ({why}): {} {}",
            out.stdout,
            out.stderr
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        ),
    };
    let last = out.stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(last).map_err(|e| failed(e.to_string()))?;
    if !out.success {
        return Err(failed("a non-zero exit".into()));
    }
    let rows: Vec<SizeRow> =
        serde_json::from_value(v["rows"].clone()).map_err(|e| failed(e.to_string()))?;
    if rows.iter().any(|r| r.put_failed + r.get_failed > 0) {
        for e in client_errors(&out.stderr, 3) {
            println!("{tag}: the store's client logged: {e}");
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_errors_are_told_once_each_without_their_prefix() {
        let stderr = "I1205 13:00:00.1 7 a.cpp:1] fine\nE1205 13:00:00.2 7 b.cpp:9] Transfer failed for key: x\nE1205 13:00:01.0 8 b.cpp:9] Transfer failed for key: x\nE1205 13:00:02.0 8 c.cpp:3] get failed\n";
        assert_eq!(
            client_errors(stderr, 3),
            ["Transfer failed for key: x", "get failed"]
        );
        assert_eq!(client_errors(stderr, 1).len(), 1);
    }
}
