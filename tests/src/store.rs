//! A real Mooncake store on loopback: the master binary, members (`mc_store_rest_server`'s module,
//! configured through the same `MOONCAKE_*` environment the render layer uses), and the Python
//! client for puts and gets.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kvcache_render::observe::exposition::Exposition;

use crate::process::{Proc, free_port, wait_for, wait_tcp};
use crate::{Error, Result, paths};

const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How to start a master.
#[derive(Clone, Debug, Default)]
pub struct MasterOptions {
    /// Seconds before a silent member is dropped (the store's default is 10).
    pub client_ttl: Option<u32>,
    /// Extra flags, `-key=value`, after the harness's own.
    pub extra_args: Vec<String>,
    /// Fixed ports (RPC, metrics) instead of free ones: a restarted master keeps its address.
    pub ports: Option<(u16, u16)>,
}

impl MasterOptions {
    /// A multi-tenant master reading its tenant ledger from the policy document at `policy`
    /// (the file connector, as the render gives a managed leader).
    pub fn multi_tenant(policy: &Path) -> Self {
        MasterOptions {
            extra_args: vec![
                "--enable_multi_tenants=true".into(),
                "--tenant_quota_connector_type=file".into(),
                format!("--tenant_quota_connector_uri={}", policy.display()),
            ],
            ..Default::default()
        }
    }
}

/// A `mooncake_master` from the store's virtualenv, listening on loopback; dropping it kills it.
pub struct Master {
    pub proc: Proc,
    /// RPC port (what members and clients dial).
    pub rpc_port: u16,
    /// Admin and metrics port.
    pub metrics_port: u16,
    dir: PathBuf,
    options: MasterOptions,
}

/// A real multi-tenant master with one member of `segment` bytes mounted, its tenant policy
/// rendered for the backend `backend` (no Binding yet): what an external backend over a real
/// store needs (the pool reads its ledger and publishes its address).
pub fn multi_tenant_store(
    dir: &Path,
    backend: &str,
    segment: u64,
    within: Duration,
) -> Result<(Master, Member)> {
    let policy = dir.join("tenant-quota-policy.yaml");
    let document = kvcache_quota::policy::render(backend, &[]).map_err(|e| Error::Invalid {
        path: policy.display().to_string(),
        what: "tenant quota policy",
        reason: e.to_string(),
    })?;
    std::fs::write(&policy, document.to_yaml()).map_err(|source| Error::Io {
        context: format!("writing {}", policy.display()),
        source,
    })?;
    let master = Master::start(dir, MasterOptions::multi_tenant(&policy))?;
    let member = Member::start(dir, &MemberOptions::new(master.address(), segment))?;
    master.wait_capacity(segment, within)?;
    Ok((master, member))
}

impl Master {
    /// Starts a master in `dir` and waits for `/health` to answer.
    pub fn start(dir: &Path, options: MasterOptions) -> Result<Master> {
        let (rpc_port, metrics_port) = match options.ports {
            Some(p) => p,
            None => (free_port()?, free_port()?),
        };
        let mut cmd = Command::new(paths::mooncake_master()?);
        cmd.current_dir(dir)
            .arg("--rpc_address=127.0.0.1")
            .arg(format!("--rpc_port={rpc_port}"))
            .arg("--metrics_host=127.0.0.1")
            .arg(format!("--metrics_port={metrics_port}"))
            .arg("--default_kv_lease_ttl=500");
        if let Some(ttl) = options.client_ttl {
            cmd.arg(format!("--client_ttl={ttl}"));
        }
        cmd.args(&options.extra_args);
        let mut proc = Proc::spawn(
            "mooncake_master",
            cmd,
            &dir.join(format!("master-{rpc_port}.log")),
        )?;
        let health = format!("http://127.0.0.1:{metrics_port}/health");
        wait_for(&mut proc, START_TIMEOUT, || http_get(&health).is_ok())?;
        Ok(Master {
            proc,
            rpc_port,
            metrics_port,
            dir: dir.to_owned(),
            options: MasterOptions {
                ports: Some((rpc_port, metrics_port)),
                ..options
            },
        })
    }

    /// `127.0.0.1:<rpc port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.rpc_port)
    }

    /// `http://127.0.0.1:<metrics port>`.
    pub fn admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.metrics_port)
    }

    /// A gauge or counter from `/metrics` (without labels).
    pub fn metric(&self, name: &str) -> Result<f64> {
        let text = http_get(&format!("{}/metrics", self.admin_url()))?;
        metric_value(&text, name).ok_or_else(|| Error::Http {
            url: format!("{}/metrics", self.admin_url()),
            message: format!("no {name} in the exposition"),
        })
    }

    /// Waits until `master_total_capacity_bytes` is `want`.
    pub fn wait_capacity(&self, want: u64, timeout: Duration) -> Result<()> {
        // Byte counts below 2^53 are exact as f64.
        wait_metric(
            &self.admin_url(),
            "master_total_capacity_bytes",
            want as f64,
            timeout,
        )
    }

    /// `master_total_capacity_bytes`.
    pub fn capacity_bytes(&self) -> Result<u64> {
        // Gauges are printed as integers or floats; byte counts are exact either way.
        Ok(self.metric("master_total_capacity_bytes")? as u64)
    }

    /// `/health` as JSON.
    pub fn health(&self) -> Result<serde_json::Value> {
        let url = format!("{}/health", self.admin_url());
        let text = http_get(&url)?;
        serde_json::from_str(&text).map_err(|e| Error::Http {
            url,
            message: e.to_string(),
        })
    }

    /// Leaves the master running after this handle is gone; returns its pid.
    pub fn detach(self) -> u32 {
        self.proc.detach()
    }

    /// Kills the master (SIGKILL) and starts it again on the same ports.
    pub fn restart(&mut self) -> Result<()> {
        self.proc.kill();
        let fresh = Master::start(&self.dir, self.options.clone())?;
        *self = fresh;
        Ok(())
    }
}

/// Waits until the master at `admin_url` reports `name` equal to `want`; fails naming the
/// sample, the value awaited and the last value read (or the read's error).
pub fn wait_metric(admin_url: &str, name: &str, want: f64, timeout: Duration) -> Result<()> {
    let url = format!("{admin_url}/metrics");
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let last = http_get(&url).map(|t| metric_value(&t, name));
        if matches!(last, Ok(Some(v)) if v == want) {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(Error::Wait {
                what: format!("{name} = {want} at {url} ({}s)", timeout.as_secs()),
                reason: match last {
                    Ok(Some(v)) => format!("last value {v}"),
                    Ok(None) => "the sample is absent".into(),
                    Err(e) => e.to_string(),
                },
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The value of an unlabelled sample in Prometheus text exposition, read with
/// [`kvcache_render::observe::exposition`].
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    Exposition::parse(text).unlabelled(name)
}

/// The samples of `name` in Prometheus text (or OpenMetrics) exposition, read with
/// [`kvcache_render::observe::exposition`]: each one's labels and value, in the order exposed. Lines
/// that do not read are skipped.
pub fn samples(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    Exposition::parse(text)
        .samples
        .into_iter()
        .filter(|s| s.name == name)
        .map(|s| (s.labels.into_iter().collect(), s.value))
        .collect()
}

/// The sum of the samples of `name` whose labels include every pair of `with`; `None` when
/// there is no such sample.
pub fn metric_sum(text: &str, name: &str, with: &[(&str, &str)]) -> Option<f64> {
    samples(text, name)
        .into_iter()
        .filter(|(l, _)| {
            with.iter()
                .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, v)| v)
        .reduce(|a, b| a + b)
}

/// How to start a member.
#[derive(Clone, Debug)]
pub struct MemberOptions {
    /// `MOONCAKE_MASTER`.
    pub master: String,
    /// `MOONCAKE_GLOBAL_SEGMENT_SIZE`, bytes.
    pub segment_bytes: u64,
    /// `MOONCAKE_LOCAL_BUFFER_SIZE`, bytes.
    pub local_buffer_bytes: u64,
    /// More environment (`MOONCAKE_OFFLOAD_*`, `MOONCAKE_TENANT_ID`, …).
    pub env: Vec<(String, String)>,
}

impl MemberOptions {
    /// A member contributing `segment_bytes` to the master at `master`.
    pub fn new(master: impl Into<String>, segment_bytes: u64) -> Self {
        MemberOptions {
            master: master.into(),
            segment_bytes,
            local_buffer_bytes: 16 << 20,
            env: Vec::new(),
        }
    }
}

/// A running member (`python -m mooncake.mooncake_store_service`, the real process of the
/// `mc_store_rest_server` entry point).
pub struct Member {
    pub proc: Proc,
    /// The port its REST service (`--port`) answers on, on loopback.
    pub port: u16,
}

/// The environment every store process on loopback gets.
pub fn loopback_env(cmd: &mut Command) {
    cmd.env("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        .env("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE")
        .env("MOONCAKE_PROTOCOL", "tcp")
        .env("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1")
        .env("PYTHONUNBUFFERED", "1");
}

impl Member {
    /// Starts a member in `dir` and waits until its REST port answers (it mounts before serving).
    pub fn start(dir: &Path, options: &MemberOptions) -> Result<Member> {
        let venv = paths::mooncake_venv()?;
        let port = free_port()?;
        let mut cmd = Command::new(venv.join("bin/python"));
        cmd.current_dir(dir)
            .args(["-m", "mooncake.mooncake_store_service", "--port"])
            .arg(port.to_string());
        loopback_env(&mut cmd);
        cmd.env("MOONCAKE_MASTER", &options.master)
            .env(
                "MOONCAKE_GLOBAL_SEGMENT_SIZE",
                options.segment_bytes.to_string(),
            )
            .env(
                "MOONCAKE_LOCAL_BUFFER_SIZE",
                options.local_buffer_bytes.to_string(),
            )
            .envs(options.env.iter().map(|(k, v)| (k, v)));
        let mut proc = Proc::spawn(
            "mc_store_rest_server",
            cmd,
            &dir.join(format!("member-{port}.log")),
        )?;
        wait_tcp(
            &mut proc,
            SocketAddr::from(([127, 0, 0, 1], port)),
            START_TIMEOUT,
        )?;
        Ok(Member { proc, port })
    }
}

/// The Python client, one process per call. A get first asks `is_exist` (1 present, 0 absent,
/// negative: the store's error), so a miss and a failed read are told apart: the client's `get`
/// returns empty bytes for both. argv: master, op (`put`, `get`, `remove`, or `mount`: the setup
/// alone, which mounts a segment when argv[7] is above 0), key, tenant (empty: the store's
/// default), size, this host's address, the segment to mount (bytes, 0 when absent).
pub(crate) const CLIENT: &str = r#"
import sys
from mooncake.store import MooncakeDistributedStore
master, op, key = sys.argv[1], sys.argv[2], sys.argv[3]
tenant = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None
host = sys.argv[6] if len(sys.argv) > 6 and sys.argv[6] else "127.0.0.1"
segment = int(sys.argv[7]) if len(sys.argv) > 7 and sys.argv[7] else 0
cfg = {"local_hostname": host, "metadata_server": "P2PHANDSHAKE",
       "global_segment_size": segment, "local_buffer_size": 16 * 1024 * 1024,
       "protocol": "tcp", "rdma_devices": "", "master_server_addr": master}
if tenant:
    cfg["tenant_id"] = tenant
store = MooncakeDistributedStore()
rc = store.setup(cfg)
if rc != 0:
    print("RESULT setup", rc)
    sys.exit(0)
if op == "put":
    size = int(sys.argv[5]) if len(sys.argv) > 5 else 4096
    print("RESULT put", store.put(key, bytes([7]) * size))
elif op == "remove":
    print("RESULT remove", store.remove(key))
elif op == "mount":
    print("RESULT mount", segment)
else:
    present = store.is_exist(key)
    if present < 0:
        print("RESULT exist", present)
    elif present == 0:
        print("RESULT miss 0")
    else:
        print("RESULT get", len(store.get(key)))
store.close()
"#;

/// What a get found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The key is present; its value has this many bytes.
    Hit(usize),
    /// The store answered that the key is absent.
    Miss,
}

/// What the Python client printed: the step and the store's code.
fn client(
    master: &str,
    op: &str,
    key: &str,
    tenant: Option<&str>,
    size: usize,
) -> Result<(String, i64)> {
    let venv = paths::mooncake_venv()?;
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.arg("-c")
        .arg(CLIENT)
        .args([master, op, key, tenant.unwrap_or(""), &size.to_string()]);
    loopback_env(&mut cmd);
    let out = cmd.output().map_err(|source| Error::Spawn {
        what: "the store's Python client".into(),
        source,
    })?;
    client_answer(
        master,
        &out.status.to_string(),
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(&out.stderr),
    )
}

/// Reads the client's `RESULT <step> <code>` line.
pub(crate) fn client_answer(
    master: &str,
    status: &str,
    stdout: &str,
    stderr: &str,
) -> Result<(String, i64)> {
    let unreadable = |line: &str| Error::ClientOutput {
        status: status.to_owned(),
        output: format!(
            "{line}{}",
            stderr.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
        ),
    };
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .ok_or_else(|| unreadable(""))?;
    let (what, code) = line.split_once(' ').ok_or_else(|| unreadable(line))?;
    let code: i64 = code.trim().parse().map_err(|_| unreadable(line))?;
    if what == "setup" {
        return Err(Error::Store {
            op: "setup",
            master: master.to_owned(),
            code,
        });
    }
    Ok((what.to_owned(), code))
}

/// Puts `size` bytes under `key` as `tenant` (None: the store's default). Returns the store's
/// code: 0 is success, negative codes are the store's errors (-1701 `TENANT_NOT_REGISTERED`).
pub fn put(master: &str, key: &str, tenant: Option<&str>, size: usize) -> Result<i64> {
    client(master, "put", key, tenant, size).map(|(_, code)| code)
}

/// What a get's answer means (see [`get`]).
pub(crate) fn lookup(master: &str, what: &str, code: i64) -> Result<Lookup> {
    match what {
        "miss" => Ok(Lookup::Miss),
        "get" if code > 0 => Ok(Lookup::Hit(usize::try_from(code).unwrap_or(usize::MAX))),
        "get" => Err(Error::Store {
            op: "get of a present key",
            master: master.to_owned(),
            code,
        }),
        _ => Err(Error::Store {
            op: "is_exist",
            master: master.to_owned(),
            code,
        }),
    }
}

/// Reads `key` as `tenant`: a hit with its size, or a miss. A store error (a negative code from
/// the existence check, or a present key that reads back empty) is an `Error::Store`, never a miss.
pub fn get(master: &str, key: &str, tenant: Option<&str>) -> Result<Lookup> {
    let (what, code) = client(master, "get", key, tenant, 0)?;
    lookup(master, &what, code)
}

/// A plain HTTP GET on loopback; a non-200 answer is an error.
pub fn http_get(url: &str) -> Result<String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .max_redirects(0)
        .build()
        .into();
    let mut response = agent.get(url).call().map_err(|e| Error::Http {
        url: url.to_owned(),
        message: e.to_string(),
    })?;
    response
        .body_mut()
        .read_to_string()
        .map_err(|e| Error::Http {
            url: url.to_owned(),
            message: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::{metric_sum, metric_value, samples};

    #[test]
    fn reads_labelled_samples_and_sums_those_with_the_labels_asked() {
        let text = "# HELP kvcache_operator_reconciles Reconciles.\n\
            # TYPE kvcache_operator_reconciles counter\n\
            kvcache_operator_reconciles_total{controller=\"kvcachepool\",result=\"ok\"} 3\n\
            kvcache_operator_reconciles_total{controller=\"kvcachepool\",result=\"store_read\"} 2\n\
            kvcache_operator_reconciles_total{controller=\"kvcachebackend\",result=\"ok\"} 1 1700000000\n\
            kvcache_operator_reconciles_total_other{controller=\"kvcachepool\"} 9\n\
            kvcache_operator_leader 1\n\
            odd{note=\"a \\\"quoted\\\", } here\"} 4\n\
            # EOF\n";
        let all = samples(text, "kvcache_operator_reconciles_total");
        assert_eq!(all.len(), 3, "{all:?}");
        assert_eq!(all[0].0["controller"], "kvcachepool");
        assert_eq!(all[0].0["result"], "ok");
        assert_eq!(
            all[2].1, 1.0,
            "a timestamp after the value is not the value"
        );
        let pool = [("controller", "kvcachepool")];
        let reconciles = "kvcache_operator_reconciles_total";
        assert_eq!(metric_sum(text, reconciles, &pool), Some(5.0));
        assert_eq!(metric_sum(text, reconciles, &[]), Some(6.0));
        assert_eq!(
            metric_sum(text, reconciles, &[("controller", "modeldeployment")]),
            None
        );
        assert_eq!(metric_sum(text, "kvcache_operator_leader", &[]), Some(1.0));
        let odd = samples(text, "odd");
        assert_eq!(odd[0].0["note"], "a \"quoted\", } here");
        assert_eq!(odd[0].1, 4.0);
    }

    #[test]
    fn reads_unlabelled_samples() {
        let text = "# HELP x\nmaster_total_capacity_bytes 134217728\nsegment_total_capacity_bytes{segment=\"a\"} 1\nmaster_key_count 0\n";
        assert_eq!(
            metric_value(text, "master_total_capacity_bytes"),
            Some(134_217_728.0)
        );
        assert_eq!(metric_value(text, "master_key_count"), Some(0.0));
        assert_eq!(metric_value(text, "segment_total_capacity_bytes"), None);
        // A timestamp after the value, as the format allows.
        assert_eq!(
            metric_value(
                "master_allocated_bytes 5 1700000000000\n",
                "master_allocated_bytes"
            ),
            Some(5.0)
        );
    }
}
