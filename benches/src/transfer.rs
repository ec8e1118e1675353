//! `cargo xtask bench transfer`: how fast the store moves bytes between the two nodes, idle and
//! while both engines serve prompts, beside raw TCP between the same two Pods, in one run.
//!
//! On two engine-sized nodes with the operator: the walkthrough's store at the rig's sizes
//! (`walkthrough::ENGINE_RIG_STORE_CPU`), team-a's Binding, a ModelDeployment of two real vLLM
//! replicas attached to it, and two probe Pods of the store image, one pinned to each node.
//! - raw: a Python socket from the probe on node 0 to the probe on node 1 (256 MiB); each
//!   probe requests an engine's CPU (the store's client runs inside the engine's process);
//! - store: the store's own client in the probe on node 0 (no segment of its own, the master
//!   through its Service), put then get of each object size, for each transport setting of
//!   [`VARIANTS`] (the client's environment: pool, lanes, chunk size);
//! - idle: the engines up and quiet; loaded: both engines answering a loop of 480-token prompts
//!   (two streams each), as a busy inference node.
//!
//! Every setting runs [`ROUNDS`] times per condition in a rotated order; medians are printed.
//! Then what the transfers cost in CPU: per object size, one idle pass of [`CPU_PASS_BYTES`]
//! with the rendered setting, the CPU seconds of the members, the leader and the client read
//! from their Pods' cgroups around it (less those of an empty pass), per GB moved: what a
//! member's CPU request buys in transfer rate.
//!
//! Every failed put or get is counted and printed: a store error is not a fast transfer.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kvcache_e2e::cluster::{block_on, client_from};
use kvcache_e2e::engine::{self, TINY_MODEL};
use kvcache_e2e::pods::{self, exec, ip_of, name_of};
use kvcache_e2e::{images, walkthrough};

use crate::engine_rig::{self, BACKEND, NS, TEAM};

const MODEL: &str = "served";
const WAIT: Duration = Duration::from_secs(900);
/// The raw TCP probe's port and payload.
const RAW_PORT: &str = "5555";
const RAW_MIB: &str = "256";
/// Each probe's CPU request: an engine's (the store's client runs inside the engine's process,
/// with its share). At 100m the probes themselves starved under load: raw TCP fell to 0.07 of
/// its idle rate, and every store figure with it.
const PROBE_CPU: &str = "500m";
/// Rounds of every variant per condition, in a rotated order each round; medians reported.
const ROUNDS: usize = 3;
/// Each member's segment: every pass's objects fit without eviction.
const SEGMENT: &str = "2Gi";

/// Object sizes and how many of each a pass puts and gets.
const SIZES: [(usize, usize); 4] = [(64 << 10, 64), (512 << 10, 32), (1 << 20, 32), (8 << 20, 4)];

/// Bytes each CPU pass puts, then gets back, per object size (idle, the rendered setting):
/// enough that the transfers, not the client's start, make the CPU time.
const CPU_PASS_BYTES: usize = 256 << 20;

/// The client settings compared: a name and the environment the store's client runs with.
/// Mooncake 0.3.13.post1's TCP transport reads these at start (its `tcp_transport.cpp` and the
/// session's chunk size): the connection pool (on unless `0`), its lanes per peer (4), the chunk
/// each socket read and write moves (64 KiB), and the per-peer queue (1024 slices; past it and
/// its 1024-entry overflow a burst is refused as queue-full). `PASS_API=batch` is the pass's own:
/// the engines' way of calling the client (below) instead of one copying call per object.
/// `MC_TCP_PROGRESS_TIMEOUT_SEC` (30 s) is how long a connection may make no progress before
/// its transfer fails: shorter turns a stall into a failure (a recompute in an engine) sooner.
/// `MC_RPC_TIMEOUT_MS` and `MC_RPC_CONNECT_TIMEOUT_MS` (30 s each) bound each call to the
/// master: the render's 2 s for members, tried on an engine's client under load.
const VARIANTS: [Variant; 8] = [
    Variant::plain("0.3.13 defaults", &[]),
    Variant::plain("pool off", &[("MC_TCP_ENABLE_CONNECTION_POOL", "0")]),
    Variant::plain("8 lanes", &[("MC_TCP_LANES_PER_PEER", "8")]),
    Variant::plain("1 MiB chunks", &[("MC_TCP_SLICE_SIZE", "1048576")]),
    Variant::rendered(RENDERED, &[]),
    Variant::rendered("rendered, engines' batches", &[("PASS_API", "batch")]),
    Variant::rendered(
        "rendered, progress timeout 5 s",
        &[("MC_TCP_PROGRESS_TIMEOUT_SEC", "5")],
    ),
    Variant::rendered(
        "rendered, RPC timeouts 2 s",
        &[
            // What the render gives members (crates/kvcache-render/src/backend/member.rs),
            // given to a client: 30 s by default.
            ("MC_RPC_TIMEOUT_MS", "2000"),
            ("MC_RPC_CONNECT_TIMEOUT_MS", "2000"),
        ],
    ),
];

/// The setting the render and the injection give every client, as [`VARIANTS`] names it.
const RENDERED: &str = "rendered (queue 65535)";

/// One client setting of [`VARIANTS`].
struct Variant {
    name: &'static str,
    /// Whether it starts from what the render and the injection give every client
    /// (`kvcache_inject::transport::TCP_TUNING`) rather than the store's defaults.
    rendered: bool,
    /// Its own variables on top.
    extra: &'static [(&'static str, &'static str)],
}

impl Variant {
    const fn plain(name: &'static str, extra: &'static [(&'static str, &'static str)]) -> Self {
        Variant {
            name,
            rendered: false,
            extra,
        }
    }

    const fn rendered(name: &'static str, extra: &'static [(&'static str, &'static str)]) -> Self {
        Variant {
            name,
            rendered: true,
            extra,
        }
    }

    /// The environment the store's client runs with.
    fn env(&self) -> Vec<(&'static str, &'static str)> {
        let tuning = kvcache_inject::transport::TCP_TUNING
            .iter()
            .filter(|_| self.rendered)
            .map(|t| (t.name, t.value));
        tuning.chain(self.extra.iter().copied()).collect()
    }
}

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

/// Every round's rows per (condition, variant).
type Results = BTreeMap<(&'static str, &'static str), Vec<Vec<SizeRow>>>;

/// The median over rounds of one size's put and get rates, and the failures summed. A rate
/// counts only from passes whose puts (or gets) all succeeded: a failed get returns at once, so
/// a pass of failures would read as a fast one. NaN where no pass was whole.
fn medians(rounds: &[Vec<SizeRow>], size: usize) -> (f64, f64, usize) {
    let rows: Vec<&SizeRow> = rounds.iter().flatten().filter(|r| r.size == size).collect();
    let mid = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    (
        mid(rows
            .iter()
            .filter(|r| r.put_failed == 0)
            .map(|r| r.rate(r.put_s))
            .collect()),
        mid(rows
            .iter()
            .filter(|r| r.get_failed == 0)
            .map(|r| r.rate(r.get_s))
            .collect()),
        rows.iter().map(|r| r.put_failed + r.get_failed).sum(),
    )
}

/// A rate for the tables: MB/s, or "no whole pass".
fn mbs(rate: f64) -> String {
    if rate.is_nan() {
        "no whole pass".into()
    } else {
        format!("{rate:.0} MB/s")
    }
}

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
struct SizeRow {
    size: usize,
    count: usize,
    put_s: f64,
    get_s: f64,
    put_failed: usize,
    get_failed: usize,
    /// Of the failed gets, those whose object the master no longer listed.
    get_gone: usize,
}

impl SizeRow {
    fn rate(&self, seconds: f64) -> f64 {
        (self.size * self.count) as f64 / seconds / 1e6
    }
}

/// `leader_cpu`: the leader's CPU request in place of the rig's (`--leader-cpu`), through the
/// backend's `leader.resources`.
pub fn transfer(leader_cpu: Option<String>) -> anyhow::Result<()> {
    let rig = engine_rig::up("bench-transfer", |backend| {
        if let Some(groups) = backend["spec"]["connection"]["managed"]["members"].as_array_mut() {
            for g in groups {
                g["capacityPerMember"] = SEGMENT.into();
            }
        }
        if let Some(cpu) = leader_cpu {
            engine_rig::set_leader_cpu(backend, cpu);
        }
    })?;
    let node_names: Vec<String> = rig
        .nodes
        .nodes
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .collect();
    let kc = rig.nodes.control_plane.kubeconfig.clone();
    let logs = rig.dir.join("logs");
    let kept = logs.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let measured = measure(&client, &node_names).await;
        // The master's and the members' account of every failed pass, kept past the teardown.
        engine_rig::keep_logs(&client, &kept).await;
        measured
    })?;
    println!("store and engine logs: {}", logs.display());
    Ok(())
}

/// A probe Pod of the store image pinned to `node`, sleeping until exec'd into.
fn probe(name: &str, node: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "probe",
                "image": images::STORE.name,
                "imagePullPolicy": "Never",
                "command": ["sleep", "infinity"],
                "resources": {"requests": {"cpu": PROBE_CPU, "memory": "512Mi"}}
            }]
        }
    }))
    .expect("a Pod")
}

/// Runs the ModelDeployment and the probes, then every pass idle and under load.
async fn measure(client: &kube::Client, node_names: &[String]) -> Result<(), kvcache_e2e::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), TEAM);
    let [a, b] = ["probe-0", "probe-1"];
    for (name, node) in [a, b].iter().zip(node_names) {
        api.create(&PostParams::default(), &probe(name, node))
            .await?;
    }
    let md = engine::model_deployment(TEAM, MODEL, TINY_MODEL, Some(TEAM), 2);
    Api::<kvcache_api::ModelDeployment>::namespaced(client.clone(), TEAM)
        .patch(
            MODEL,
            &PatchParams::apply(walkthrough::MANAGER).force(),
            &Patch::Apply(&md),
        )
        .await?;
    let engines = pods::wait_ready(&api, &walkthrough::role_pods(MODEL, "server"), 2, WAIT).await?;
    let engines: Vec<String> = engines.iter().map(|p| name_of(p).to_owned()).collect();
    for name in [a, b] {
        pods::wait_pod(&api, name, "the probe Running", WAIT, |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .await?;
    }
    engine_rig::wait_store_ready(client).await?;
    let ip_a = ip_of(&api.get(a).await?).unwrap_or_default().to_owned();
    let ip_b = ip_of(&api.get(b).await?).unwrap_or_default().to_owned();
    let master = format!(
        "{}:{}",
        kvcache_render::backend::leader_name(BACKEND) + "." + NS + ".svc",
        kvcache_render::backend::RPC_PORT
    );
    println!("engines {engines:?} Ready; probes on {node_names:?}; master {master}");

    let mut results: Results = BTreeMap::new();
    let mut raw = BTreeMap::new();
    let mut cpu = Vec::new();
    for condition in ["idle", "loaded"] {
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let mut load = Vec::new();
        if condition == "loaded" {
            for (i, pod) in engines.iter().enumerate() {
                for stream in 0..2u32 {
                    let (api, pod, stop, served) =
                        (api.clone(), pod.clone(), stop.clone(), served.clone());
                    let mut seed = 100_000 * (1 + i as u32) + 10_000 * stream;
                    load.push(tokio::spawn(async move {
                        while !stop.load(Ordering::Relaxed) {
                            seed += 1;
                            let p = engine::prompt(seed, 480);
                            if engine::complete(&api, &pod, TINY_MODEL, &p, 16)
                                .await
                                .is_ok()
                            {
                                served.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }));
                }
            }
            // The engines busy before the first pass.
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        let mut raws = Vec::new();
        for round in 0..ROUNDS {
            let r = raw_pass(&api, (a, b), &ip_b).await?;
            println!("{condition} round {round}: raw TCP {r:.0} MB/s");
            raws.push(r);
            for k in 0..VARIANTS.len() {
                let i = (k + round) % VARIANTS.len();
                let variant = VARIANTS[i].name;
                let tag = format!("{condition}-{round}-{i}");
                let env = VARIANTS[i].env();
                let rows = store_pass(&api, a, &ip_a, &master, &tag, &env, &SIZES).await?;
                for row in &rows {
                    println!(
                        "{condition} round {round} {variant}: {} x {} KiB: put {:.1} MB/s, get {:.1} MB/s, failed {}/{} ({} gone)",
                        row.count,
                        row.size >> 10,
                        row.rate(row.put_s),
                        row.rate(row.get_s),
                        row.put_failed,
                        row.get_failed,
                        row.get_gone
                    );
                }
                results.entry((condition, variant)).or_default().push(rows);
            }
        }
        if condition == "idle" {
            cpu = cpu_cost(client, (&api, a), &ip_a, &master).await?;
        }
        raws.sort_by(f64::total_cmp);
        raw.insert(condition, raws[raws.len() / 2]);
        stop.store(true, Ordering::Relaxed);
        for task in load {
            let _ = task.await;
        }
        if condition == "loaded" {
            println!(
                "loaded: the engines answered {} prompts meanwhile",
                served.load(Ordering::Relaxed)
            );
        }
    }
    print_table(&results, &raw);
    print_cpu(&cpu);
    walkthrough::remove_model(client, TEAM, MODEL, WAIT).await?;
    Ok(())
}

/// Raw TCP from the probe `a` to the probe `b` (at `ip_b`): MB/s.
async fn raw_pass(
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
async fn store_pass(
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

/// The tables of benches/README.md ("transfer"): per variant and size, the median MB/s idle and
/// loaded, loaded/idle, store/raw.
fn print_table(results: &Results, raw: &BTreeMap<&str, f64>) {
    let (raw_idle, raw_loaded) = (raw["idle"], raw["loaded"]);
    println!();
    println!(
        "raw TCP node 0 -> node 1 (median of {ROUNDS}): idle {raw_idle:.0} MB/s, loaded {raw_loaded:.0} MB/s ({:.2})",
        raw_loaded / raw_idle
    );
    println!();
    println!(
        "| client setting | object | put idle | get idle | put loaded | get loaded | loaded/idle (put, get) | idle store/raw (put, get) | failed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for Variant { name: variant, .. } in VARIANTS {
        let (Some(idle), Some(loaded)) = (
            results.get(&("idle", variant)),
            results.get(&("loaded", variant)),
        ) else {
            continue;
        };
        for (size, count) in SIZES {
            let (pi, gi, fi) = medians(idle, size);
            let (pl, gl, fl) = medians(loaded, size);
            println!(
                "| {variant} | {count} x {} KiB | {} | {} | {} | {} | {:.2}, {:.2} | {:.2}, {:.2} | {} |",
                size >> 10,
                mbs(pi),
                mbs(gi),
                mbs(pl),
                mbs(gl),
                pl / pi,
                gl / gi,
                pi / raw_idle,
                gi / raw_idle,
                fi + fl
            );
        }
    }
}

/// What one object size costs in CPU: seconds spent by the store's members, its leader and the
/// client, over the bytes moved (put, then get back).
struct CpuRow {
    size: usize,
    count: usize,
    /// Put and get, seconds.
    put_s: f64,
    get_s: f64,
    /// CPU seconds: members (all of them), the leader, the client's Pod.
    members: f64,
    leader: f64,
    client: f64,
}

/// The CPU seconds every store Pod of the backend and the client's Pod have used so far:
/// (members, leader, client).
async fn cpu_now(
    client: &kube::Client,
    (api, probe): (&Api<Pod>, &str),
) -> Result<(f64, f64, f64), kvcache_e2e::Error> {
    let store: Api<Pod> = Api::namespaced(client.clone(), NS);
    let leader = kvcache_render::backend::leader_name(BACKEND);
    let (mut members, mut leaders) = (0.0, 0.0);
    let listed = store
        .list(
            &kube::api::ListParams::default()
                .labels(&format!("app.kubernetes.io/instance={BACKEND}")),
        )
        .await?;
    for p in &listed.items {
        if name_of(p).contains("-etcd") {
            continue;
        }
        let used = engine_rig::pod_cpu_seconds(p)?;
        if name_of(p).starts_with(&leader) {
            leaders += used;
        } else {
            members += used;
        }
    }
    let probe = engine_rig::pod_cpu_seconds(&api.get(probe).await?)?;
    Ok((members, leaders, probe))
}

/// Per object size, a pass of [`CPU_PASS_BYTES`] with the rendered setting (one `put` and one
/// `get` per object), idle, the CPU read from the Pods' cgroups before and after; an empty pass
/// first (the client's start, its mount on the master, the store's background work over as
/// long) is taken off each.
async fn cpu_cost(
    client: &kube::Client,
    (api, probe): (&Api<Pod>, &str),
    ip: &str,
    master: &str,
) -> Result<Vec<CpuRow>, kvcache_e2e::Error> {
    let rendered = &Variant::rendered(RENDERED, &[]).env();
    let pass = |tag: String, plan: Vec<(usize, usize)>| async move {
        let before = cpu_now(client, (api, probe)).await?;
        let rows = store_pass(api, probe, ip, master, &tag, rendered, &plan).await?;
        let after = cpu_now(client, (api, probe)).await?;
        let used = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
        Ok::<_, kvcache_e2e::Error>((rows, used))
    };
    let (_, empty) = pass("cpu-empty".into(), vec![(64 << 10, 0)]).await?;
    println!(
        "cpu: an empty pass used members {:.2} s, leader {:.2} s, client {:.2} s",
        empty.0, empty.1, empty.2
    );
    let mut out = Vec::new();
    for (size, _) in SIZES {
        let count = CPU_PASS_BYTES / size;
        let (rows, used) = pass(format!("cpu-{size}"), vec![(size, count)]).await?;
        let Some(row) = rows.first() else { continue };
        if row.put_failed + row.get_failed > 0 {
            println!(
                "cpu: {count} x {} KiB: {} puts and {} gets failed; left out",
                size >> 10,
                row.put_failed,
                row.get_failed
            );
            continue;
        }
        let cpu = CpuRow {
            size,
            count,
            put_s: row.put_s,
            get_s: row.get_s,
            members: (used.0 - empty.0).max(0.0),
            leader: (used.1 - empty.1).max(0.0),
            client: (used.2 - empty.2).max(0.0),
        };
        println!(
            "cpu: {count} x {} KiB in {:.2} s: members {:.2} s, leader {:.2} s, client {:.2} s",
            size >> 10,
            cpu.put_s + cpu.get_s,
            cpu.members,
            cpu.leader,
            cpu.client
        );
        out.push(cpu);
    }
    Ok(out)
}

/// The CPU table of benches/README.md ("transfer"): CPU seconds per GB moved, and the cores a
/// member needs at 1 GB/s.
fn print_cpu(rows: &[CpuRow]) {
    println!();
    println!(
        "| object | moved (put + get) | put | get | members, CPU s per GB | leader, CPU s per GB | client, CPU s per GB |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        let gb = 2.0 * (r.size * r.count) as f64 / 1e9;
        let mb = (r.size * r.count) as f64 / 1e6;
        println!(
            "| {} x {} KiB | {:.0} MB | {:.0} MB/s | {:.0} MB/s | {:.2} | {:.3} | {:.2} |",
            r.count,
            r.size >> 10,
            2.0 * mb,
            mb / r.put_s,
            mb / r.get_s,
            r.members / gb,
            r.leader / gb,
            r.client / gb
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rendered_settings_are_the_injections_and_the_defaults_are_not() {
        let tuning: Vec<(&str, &str)> = kvcache_inject::transport::TCP_TUNING
            .iter()
            .map(|t| (t.name, t.value))
            .collect();
        assert!(!tuning.is_empty());
        for v in &VARIANTS {
            let env = v.env();
            let has_tuning = tuning.iter().all(|t| env.contains(t));
            assert_eq!(has_tuning, v.name.starts_with("rendered"), "{}", v.name);
            assert!(v.extra.iter().all(|e| env.contains(e)), "{}", v.name);
        }
        assert_eq!(VARIANTS.iter().filter(|v| v.name == RENDERED).count(), 1);
    }

    fn row(get_s: f64, get_failed: usize) -> SizeRow {
        SizeRow {
            size: 1 << 20,
            count: 10,
            put_s: 0.1,
            get_s,
            put_failed: 0,
            get_failed,
            get_gone: 0,
        }
    }

    #[test]
    fn a_pass_with_failed_gets_gives_no_get_rate() {
        // The failed pass returned at once: counted, it would be the median.
        let rounds = vec![vec![row(1.0, 0)], vec![row(0.001, 9)], vec![row(0.002, 8)]];
        let (_, get, failed) = medians(&rounds, 1 << 20);
        assert!((get - row(1.0, 0).rate(1.0)).abs() < 1e-9, "{get}");
        assert_eq!(failed, 17);
        let (_, get, _) = medians(&[vec![row(0.001, 3)]], 1 << 20);
        assert_eq!(mbs(get), "no whole pass");
    }

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
