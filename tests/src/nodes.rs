//! Real worker nodes on this machine: each a kubelet v1.34.4 with its own containerd + runc, in
//! its own network namespace with its own address on a bridge the harness creates, its own
//! cgroup root, and a CNI `bridge` + `host-local` Pod range; routes join the Pod ranges across
//! nodes and to the host. Images come from OCI archives built locally (no registry).
//!
//! Everything made is listed in a teardown script (processes, mounts, the namespaces, the bridge,
//! the routes, the iptables rule, the cgroup directories) that runs on drop, from a watchdog
//! when the test process is gone, and from `cargo xtask cluster down`.
//!
//! What it takes from this machine kind is in `shared/spec/real-nodes-here.md`: containerd's
//! `restrict_oom_score_adj = true`, runc, a non-loopback node address, a local sandbox image,
//! `nsenter --net` (not `ip netns exec`), one cgroup root per kubelet.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use crate::cluster::{ControlPlane, block_on, client_from};
use crate::images::{self, Image};
use crate::process::{Proc, wait_for};
use crate::{Error, Result, paths};

/// How long a node gets to register and become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Where the nodes' sockets and mount namespaces live (a private mount, so namespace files
/// can be kept there).
pub(crate) const RUN_DIR: &str = "/run/kvcache-nodes";
/// Host paths each node sees as its own folder: the disk tier's path in the examples, and the
/// kubelet's Pod log folders (a kubelet removes the log folders of Pods it does not run, so
/// shared folders lose the other nodes' logs).
pub const PRIVATE_PATHS: &[&str] = &["/var/lib/kvcache", "/var/log/pods", "/var/log/containers"];

/// Memory each node offers Pods (`allocatable`): the machine's memory is shared by every node,
/// so each reserves the rest; demo-sized members fit, an oversized one stays Pending.
pub const NODE_ALLOCATABLE_MEMORY: u64 = 4 << 30;
/// Memory each node of a cluster that runs the real vLLM engine offers Pods: two engine
/// replicas (each requests its InstanceType's 4Gi plus the 128Mi staging buffer; a tiny model
/// measured about 3.7 GiB resident) beside the store's demo-size member. Two such nodes offer
/// 20 GiB of the machine's 24: the tests keep at most three engines running at once.
pub const ENGINE_NODE_ALLOCATABLE_MEMORY: u64 = 10 << 30;
/// Labels every node carries: what the examples select (`kvcache: "true"` for the disk-heavy
/// group, the walkthrough's InstanceType).
pub const NODE_LABELS: &str = "kvcache=true,gpustack.ai/instance-type=gpu-a10-24g";
/// The extended resource each node advertises through its status (the standard way to test
/// extended resources without a device plugin): one GPU, for roles that ask for one.
pub const NODE_GPUS: (&str, &str) = ("nvidia.com/gpu", "1");

/// The machine's memory, from /proc/meminfo.
fn machine_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// The Pod sandbox image every node's runtime gets.
pub const PAUSE_IMAGE: &str = images::PAUSE.name;
/// A tiny image with static busybox (`httpd`, `wget`, `sh`), for tests of the nodes themselves.
pub const BUSYBOX_IMAGE: &str = images::BUSYBOX.name;

/// Where the nodes will live, fixed before the control plane starts so that the API server
/// can advertise (and be reached on) the bridge's host address.
#[derive(Clone, Debug)]
pub struct NodeNetwork {
    /// The slot this process claimed ([`crate::slots`]): every name and range below is its own.
    slot: u32,
    tag: u32,
    /// The bridge the nodes join.
    pub bridge: String,
    /// The host's address on it: the API server's advertised address.
    pub host_ip: String,
}

impl NodeNetwork {
    /// Claims a node network no other cluster on this machine holds (a short tag keeps
    /// interface names under 15 characters); the nodes' teardown gives it back.
    pub fn plan() -> Result<NodeNetwork> {
        let slot = crate::slots::claim()?;
        let tag = crate::slots::tag(slot);
        Ok(NodeNetwork {
            slot,
            tag,
            bridge: format!("kvcb{tag}"),
            host_ip: format!("10.220.{}.1", 20 + slot),
        })
    }

    /// The bridge's /24 with `host` as the last octet.
    fn address(&self, host: usize) -> String {
        format!("10.220.{}.{host}", 20 + self.slot)
    }

    /// The Pod ranges of every node (a /16; each node takes a /24 of it).
    fn pod_octet(&self) -> u32 {
        100 + self.slot
    }
}

/// A node the harness brought up: its name, addresses, folders and kubelet log.
pub struct NodeInfo {
    /// Where the node's own host folders live (its view of `PRIVATE_PATHS`).
    pub host_root: PathBuf,
    /// Its name (also its hostname).
    pub name: String,
    /// Its address on the node bridge.
    pub ip: String,
    /// The node's Pod subnet (a /24) that its CNI bridge allocates from; the host routes it via
    /// `ip`.
    pub pod_cidr: String,
    pub kubelet_log: PathBuf,
    /// The file its private mount namespace is kept in (`nsenter --mount`).
    pub mount_ns: PathBuf,
    /// Its folder: configs and logs.
    pub dir: PathBuf,
}

/// Running nodes. Dropping them tears everything down.
pub struct Nodes {
    pub nodes: Vec<NodeInfo>,
    /// The cluster DNS server's address (the bridge's host address).
    pub dns: String,
    /// A kubeconfig that reaches the API server from inside the nodes' network (the admin's,
    /// on the bridge address).
    pub kubeconfig: PathBuf,
    /// The teardown script (also run by `cargo xtask cluster down`).
    pub teardown: PathBuf,
    procs: Vec<Proc>,
    watchdog: Option<Child>,
}

fn sh(script: &str) -> Result<()> {
    let out = Command::new("sh")
        .arg("-ec")
        // Each command is traced to stderr behind this marker, so a failure names its own line.
        // On the script's first line, so the shell's own `sh: N:` line numbers stay the script's.
        .arg(format!("PS4='{TRACE}'; set -x; {script}"))
        .output()
        .map_err(|source| Error::Spawn {
            what: "sh".into(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        let (step, message) = failed_step(&String::from_utf8_lossy(&out.stderr));
        Err(Error::NodeSetup {
            step: step.unwrap_or_else(|| script.lines().next().unwrap_or_default().to_owned()),
            message,
        })
    }
}

/// What `sh` prefixes each traced command with.
const TRACE: &str = "+kvc+ ";

/// From a traced script's stderr: the last command it ran (the one that failed, under `-e`)
/// and everything else it printed.
fn failed_step(stderr: &str) -> (Option<String>, String) {
    let mut step = None;
    let mut message = Vec::new();
    for line in stderr.lines() {
        // bash repeats the marker's first character once per nesting level (`$(...)`).
        match line.trim_start_matches('+').strip_prefix(&TRACE[1..]) {
            Some(command) => step = Some(command.to_owned()),
            None => message.push(line),
        }
    }
    (step, message.join("\n").trim().to_owned())
}

/// The cgroup v1 hierarchies a kubelet needs its root in (cgroup2's `unified` is made by the
/// kubelet itself and removed on teardown).
fn hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|d| {
            d.filter_map(std::result::Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_dir() && !p.ends_with("unified"))
                .collect()
        })
        .unwrap_or_default()
}

impl Nodes {
    /// Starts `count` nodes on `net` against `cp` (started with `advertise` set to
    /// `net.host_ip`) and waits until every one is Ready.
    pub fn start(cp: &ControlPlane, net: &NodeNetwork, count: usize, dir: &Path) -> Result<Nodes> {
        Self::start_with(cp, net, count, dir, images::NODE_DEFAULT)
    }

    /// As [`Nodes::start`], loading only `wanted` (plus the sandbox image) into each node.
    pub fn start_with(
        cp: &ControlPlane,
        net: &NodeNetwork,
        count: usize,
        dir: &Path,
        wanted: &[Image],
    ) -> Result<Nodes> {
        Self::start_sized(cp, net, count, dir, wanted, NODE_ALLOCATABLE_MEMORY)
    }

    /// As [`Nodes::start_with`], each node offering Pods `memory` bytes.
    pub fn start_sized(
        cp: &ControlPlane,
        net: &NodeNetwork,
        count: usize,
        dir: &Path,
        wanted: &[Image],
        memory: u64,
    ) -> Result<Nodes> {
        let teardown = dir.join("teardown.sh");
        let mut down =
            String::from("#!/bin/sh\n# Generated by the node harness: undoes what it made.\n");
        let mut procs = Vec::new();
        let result = Self::bring_up(cp, net, count, dir, (wanted, memory), &mut down, &mut procs);
        let bridge = &net.bridge;
        let _ = writeln!(
            down,
            "# {RUN_DIR} stays a private mount: another cluster's nodes may be using it.\nip link del {bridge} 2>/dev/null\n# Pod sandboxes' namespaces (CNI names them cni-*), once nothing runs in them.\nfor n in $(ip netns list 2>/dev/null | awk '/^cni-/{{print $1}}'); do [ -z \"$(ip netns pids $n 2>/dev/null)\" ] && ip netns del $n; done\n{release}\nexit 0",
            release = crate::slots::release_command(net.slot)
        );
        std::fs::write(&teardown, &down).map_err(crate::io("writing the teardown script"))?;
        let nodes = match result {
            Ok(nodes) => nodes,
            Err(e) => {
                // A half-made set of nodes is undone at once, not left behind.
                for p in &mut procs {
                    p.kill();
                }
                let _ = Command::new("sh").arg(&teardown).status();
                return Err(e);
            }
        };
        let watchdog = watchdog(&teardown)?;
        let kubeconfig = dir
            .join(nodes.first().map_or("", |n| n.name.as_str()))
            .join("kubeconfig");
        let mut all = Nodes {
            nodes,
            dns: net.host_ip.clone(),
            kubeconfig,
            teardown,
            procs,
            watchdog: Some(watchdog),
        };
        // On an error from here, dropping `all` runs the teardown.
        all.wait_ready(&cp.kubeconfig)?;
        all.advertise_gpus(&cp.kubeconfig)?;
        Ok(all)
    }

    /// Makes the bridge and the nodes, noting in `down` how to undo each step as it is taken.
    fn bring_up(
        cp: &ControlPlane,
        net: &NodeNetwork,
        count: usize,
        dir: &Path,
        (wanted, memory): (&[Image], u64),
        down: &mut String,
        procs: &mut Vec<Proc>,
    ) -> Result<Vec<NodeInfo>> {
        let port = api_port(cp)?;
        let images = paths::images_dir()?;
        let bin = paths::k8s_bin()?;
        let mut imports = Vec::new();
        let mut nodes = Vec::new();

        prepare_host(&net.bridge, &net.host_ip)?;
        let shared = Shared {
            bin: &bin,
            host_ip: &net.host_ip,
            kubeconfig: node_kubeconfig(cp, &net.host_ip, port)?,
            cluster_cidr: format!("10.{}.0.0/16", net.pod_octet()),
            ca: &cp.pki.ca_cert,
            memory,
        };
        procs.push(start_dns(cp, dir, &shared, down)?);

        for i in 0..count {
            let node = NodePlan::new(net, dir, i);
            node.private_mounts()?;
            node.note_teardown(down);
            node.join_network(&net.bridge, &net.host_ip)?;
            node.make_cgroups()?;
            node.write_runtime_configs()?;
            let containerd = node.start_containerd()?;
            // The images load while the kubelet starts; `start` waits for them before the
            // nodes count as up.
            imports.push(Import::spawn(&node.name, &node.sock, &images, wanted)?);
            procs.push(containerd);
            procs.push(node.start_kubelet(&shared)?);
            procs.push(node.start_kube_proxy(&shared)?);
            nodes.push(node.info());
        }
        for import in imports {
            import.finish()?;
        }
        route_pod_ranges(&nodes)?;
        Ok(nodes)
    }

    fn advertise_gpus(&self, kubeconfig: &Path) -> Result<()> {
        let kc = kubeconfig.to_owned();
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        block_on(async move {
            let client = client_from(&kc).await?;
            let api = Api::<Node>::all(client);
            let (resource, count) = NODE_GPUS;
            let patch = serde_json::json!({"status": {
                "capacity": {resource: count},
                "allocatable": {resource: count},
            }});
            for n in names {
                api.patch_status(
                    &n,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await?;
            }
            Ok(())
        })
    }

    fn wait_ready(&mut self, kubeconfig: &Path) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        loop {
            let kc = kubeconfig.to_owned();
            let ready = block_on(async move {
                let client = client_from(&kc).await?;
                let nodes = Api::<Node>::all(client).list(&Default::default()).await?;
                Ok(nodes
                    .items
                    .into_iter()
                    .filter(|n| {
                        n.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| {
                                c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                    })
                    .filter_map(|n| n.metadata.name)
                    .collect::<Vec<_>>())
            })?;
            if names.iter().all(|n| ready.contains(n)) {
                return Ok(());
            }
            if let Some(p) = self.procs.iter_mut().find(|p| p.exited_now()) {
                return Err(Error::NotReady {
                    what: format!("{} exited (last log lines:\n{})", p.name, p.log_tail(15)),
                    seconds: 0,
                    log: p.log.display().to_string(),
                });
            }
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    what: format!("nodes {names:?} (Ready so far: {ready:?})"),
                    seconds: READY_TIMEOUT.as_secs(),
                    log: self
                        .nodes
                        .first()
                        .map(|n| n.kubelet_log.display().to_string())
                        .unwrap_or_default(),
                });
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Enforces NetworkPolicy on every node with a real enforcer: kube-router's firewall alone
    /// (`--run-firewall`, no routing or service proxy), built by `cargo xtask setup` from its
    /// module (`xtask/go/kube-router`), in the node's network and mount namespaces, as on a
    /// cluster that runs it as a DaemonSet. It belongs to the harness and never ships. Returns
    /// once every node's firewall has synced once (its log says `sync iptables took`).
    pub fn enforce_network_policy(&mut self) -> Result<()> {
        let bin = paths::k8s_bin()?.join("kube-router");
        if !bin.exists() {
            return Err(Error::Missing {
                what: "kube-router (the harness's NetworkPolicy enforcer)".into(),
                path: bin,
            });
        }
        for node in &self.nodes {
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--mount={}", node.mount_ns.display()))
                .arg(format!("--net=/var/run/netns/{}", node.name))
                .arg(&bin)
                .args([
                    "--run-firewall=true",
                    "--run-router=false",
                    "--run-service-proxy=false",
                    "--metrics-port=0",
                ])
                .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
                .arg(format!("--hostname-override={}", node.name))
                // A trailing argument so the teardown's pattern ends at the name.
                .arg("--v=1");
            let log = node.dir.join("kube-router.log");
            self.procs.push(Proc::spawn(
                &format!("kube-router {}", node.name),
                cmd,
                &log,
            )?);
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        for node in &self.nodes {
            let log = node.dir.join("kube-router.log");
            loop {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if text.contains("sync iptables took") {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(Error::NotReady {
                        what: format!("kube-router on {}", node.name),
                        seconds: READY_TIMEOUT.as_secs(),
                        log: log.display().to_string(),
                    });
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        Ok(())
    }

    /// Leaves the nodes running after this handle is gone (for `cargo xtask cluster up`);
    /// returns the process ids. The teardown script undoes them.
    pub fn detach(mut self) -> Vec<u32> {
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        std::mem::take(&mut self.procs)
            .into_iter()
            .map(Proc::detach)
            .collect()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for p in &mut self.procs {
            p.kill();
        }
        if !self.procs.is_empty() {
            let _ = Command::new("sh").arg(&self.teardown).status();
        }
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

/// The API server's port, from its `https://host:port` address.
fn api_port(cp: &ControlPlane) -> Result<u16> {
    cp.server
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .ok_or_else(|| Error::NodeSetup {
            step: "reading the API server port".into(),
            message: cp.server.clone(),
        })
}

/// A private mount to keep the nodes' mount namespace files in, and the bridge the nodes join;
/// the API server listens on the bridge's host address too.
fn prepare_host(bridge: &str, host_ip: &str) -> Result<()> {
    sh(&format!(
        "mkdir -p {RUN_DIR}\nmountpoint -q {RUN_DIR} || mount --bind {RUN_DIR} {RUN_DIR}\nmount --make-private {RUN_DIR}"
    ))?;
    sh(&format!(
        "ip link add {bridge} type bridge\nip addr add {host_ip}/24 dev {bridge}\nip link set {bridge} up"
    ))
}

/// The admin kubeconfig, pointed at the API server's address on the bridge (what the nodes
/// reach).
fn node_kubeconfig(cp: &ControlPlane, host_ip: &str, port: u16) -> Result<String> {
    Ok(std::fs::read_to_string(&cp.kubeconfig)
        .map_err(crate::io("reading the admin kubeconfig"))?
        .replace(
            &format!("    server: {}", cp.server),
            &format!("    server: https://{host_ip}:{port}"),
        ))
}

/// Cluster DNS: CoreDNS on the bridge's host address, answering for cluster.local from the API
/// server; every node's kubelet hands that address to its Pods.
fn start_dns(
    cp: &ControlPlane,
    dir: &Path,
    shared: &Shared<'_>,
    down: &mut String,
) -> Result<Proc> {
    let host_ip = shared.host_ip;
    std::fs::write(
        dir.join("Corefile"),
        format!(
            ".:53 {{\n    bind {host_ip}\n    errors\n    cache 5\n    kubernetes cluster.local in-addr.arpa ip6.arpa {{\n        kubeconfig {kc} kvcache-e2e\n        fallthrough in-addr.arpa ip6.arpa\n    }}\n}}\n",
            kc = cp.kubeconfig.display()
        ),
    )
    .map_err(crate::io("writing the Corefile"))?;
    let mut dns = Command::new(shared.bin.join("coredns"));
    dns.arg("-conf").arg(dir.join("Corefile"));
    let dns = Proc::spawn("coredns", dns, &dir.join("coredns.log"))?;
    let _ = writeln!(down, "pkill -9 -f '{}/Corefile'", dir.display());
    Ok(dns)
}

/// Pod ranges across nodes: each node routes the others' ranges to their address.
fn route_pod_ranges(nodes: &[NodeInfo]) -> Result<()> {
    for n in nodes {
        for other in nodes.iter().filter(|o| o.name != n.name) {
            sh(&format!(
                "ip -n {} route add {} via {}",
                n.name, other.pod_cidr, other.ip
            ))?;
        }
    }
    Ok(())
}

/// What every node of one bring-up shares.
struct Shared<'a> {
    /// The folder of the Kubernetes binaries and CoreDNS.
    bin: &'a Path,
    /// The bridge's host address: the API server's and cluster DNS's address for the nodes.
    host_ip: &'a str,
    /// The admin kubeconfig, pointed at `host_ip`.
    kubeconfig: String,
    /// Every node's Pod ranges together (a /16), kube-proxy's `clusterCIDR`.
    cluster_cidr: String,
    /// The CA the kubelets trust client certificates of (the API server's).
    ca: &'a Path,
    /// Memory each node offers Pods, bytes.
    memory: u64,
}

/// One node's names, addresses and paths, fixed before anything of it is made.
struct NodePlan {
    name: String,
    ip: String,
    pod_cidr: String,
    /// The host end of its veth pair on the bridge.
    veth: String,
    /// Its folder under the cluster's: configs, logs, images, Pod data, its own host folders.
    dir: PathBuf,
    /// Its folder under [`RUN_DIR`]: containerd's socket and state, its mount namespace file,
    /// its `host-local` address book.
    run: PathBuf,
    sock: PathBuf,
    /// The file its private mount namespace is kept in.
    mnt: PathBuf,
}

impl NodePlan {
    fn new(net: &NodeNetwork, dir: &Path, i: usize) -> NodePlan {
        let tag = net.tag;
        let name = format!("kvc{tag}n{i}");
        let run = PathBuf::from(RUN_DIR).join(&name);
        NodePlan {
            ip: net.address(10 + i),
            pod_cidr: format!("10.{}.{i}.0/24", net.pod_octet()),
            veth: format!("kvcv{tag}{i}"),
            dir: dir.join(&name),
            sock: run.join("containerd.sock"),
            mnt: run.join("mnt"),
            run,
            name,
        }
    }

    /// Its folders, and its own view of host paths, as on a separate machine: a private mount
    /// namespace (kept in a file) in which each of PRIVATE_PATHS is the node's own folder.
    fn private_mounts(&self) -> Result<()> {
        std::fs::create_dir_all(self.dir.join("cni")).map_err(crate::io("node directories"))?;
        std::fs::create_dir_all(&self.run).map_err(crate::io("node run directory"))?;
        std::fs::write(&self.mnt, "").map_err(crate::io("the mount namespace file"))?;
        let mut binds = String::new();
        for p in PRIVATE_PATHS {
            let own = self.dir.join("host").join(p.trim_start_matches('/'));
            std::fs::create_dir_all(&own).map_err(crate::io("a node's own folder"))?;
            let _ = write!(
                binds,
                "mkdir -p {p} && mount --bind {} {p} && ",
                own.display()
            );
        }
        sh(&format!(
            "unshare --mount={m} --propagation private sh -c '{binds}true'",
            m = self.mnt.display()
        ))
    }

    /// Notes in `down` how to undo the node: its processes, mounts, namespace, cgroups, route
    /// and folders.
    fn note_teardown(&self, down: &mut String) {
        let NodePlan {
            name,
            pod_cidr,
            veth,
            ..
        } = self;
        let _ = writeln!(
            down,
            "pkill -9 -f '{d}/kubelet.yaml'\npkill -9 -f '{d}/kube-proxy.yaml'\npkill -9 -f 'kube-router .*--hostname-override={name} '\npkill -9 -f '{d}/containerd.toml'\nfor p in $(pgrep -f '{sock}'); do kill -9 $p; done\nfor f in $(find /sys/fs/cgroup/pids/{name} -name cgroup.procs 2>/dev/null); do for p in $(cat $f); do kill -9 $p 2>/dev/null; done; done\ngrep -E ' ({d}|{r})' /proc/mounts | awk '{{print $2}}' | sort -r | xargs -r -n1 umount -l 2>/dev/null\numount {r}/mnt 2>/dev/null\nip netns del {name} 2>/dev/null\n# The host end goes now, not when the last process of the namespace has exited (a store\n# Pod freeing its segment takes seconds), so the slot's next cluster can make it again.\nip link del {veth} 2>/dev/null\nfor h in /sys/fs/cgroup/*/{name}; do [ -d $h ] && find $h -depth -type d -exec rmdir {{}} \\; 2>/dev/null; done\nip route del {pod_cidr} 2>/dev/null\nrm -rf {r}\n# The node's images and Pod data (about 1 GiB a node), once nothing is mounted there.\ngrep -qE ' {d}/' /proc/mounts || rm -rf {d}/containerd {d}/kubelet",
            d = self.dir.display(),
            r = self.run.display(),
            sock = self.sock.display(),
        );
    }

    /// Its network namespace with its address on the bridge, a default route through the host,
    /// and the host's route to its Pod range.
    fn join_network(&self, bridge: &str, host_ip: &str) -> Result<()> {
        let NodePlan {
            name,
            ip,
            pod_cidr,
            veth,
            ..
        } = self;
        sh(&format!(
            "ip netns add {name}\nip link add {veth} type veth peer name eth0 netns {name}\nip link set {veth} master {bridge} up\nip -n {name} addr add {ip}/24 dev eth0\nip -n {name} link set eth0 up\nip -n {name} link set lo up\nip -n {name} route add default via {host_ip}\nip netns exec {name} sysctl -qw net.ipv4.ip_forward=1\nip route add {pod_cidr} via {ip}"
        ))
    }

    /// Its cgroup root in every v1 hierarchy (cpuset's seeded from the parent's).
    fn make_cgroups(&self) -> Result<()> {
        for h in hierarchies() {
            let cg = h.join(&self.name);
            std::fs::create_dir_all(&cg)
                .map_err(crate::io(format!("creating {}", cg.display())))?;
            if h.ends_with("cpuset") {
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    let v = std::fs::read_to_string(h.join(f)).unwrap_or_default();
                    std::fs::write(cg.join(f), v).map_err(crate::io(format!("writing {f}")))?;
                }
            }
        }
        Ok(())
    }

    /// containerd's config and the CNI config it hands Pods.
    fn write_runtime_configs(&self) -> Result<()> {
        std::fs::write(
            self.dir.join("containerd.toml"),
            format!(
                "version = 2\nroot = \"{d}/containerd\"\nstate = \"{r}/containerd\"\n[grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n[debug]\n  address = \"\"\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{PAUSE_IMAGE}\"\n  restrict_oom_score_adj = true\n  [plugins.\"io.containerd.grpc.v1.cri\".cni]\n    bin_dir = \"/usr/lib/cni\"\n    conf_dir = \"{d}/cni\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n    snapshotter = \"overlayfs\"\n    default_runtime_name = \"runc\"\n    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n      runtime_type = \"io.containerd.runc.v2\"\n",
                d = self.dir.display(),
                r = self.run.display(),
                sock = self.sock.display(),
            ),
        )
        .map_err(crate::io("writing the containerd config"))?;
        // The address book of `host-local` is the node's own (`dataDir` in its run folder,
        // removed with it), as on a separate machine. In the default /var/lib/cni/networks
        // every node of every cluster shared one `last_reserved_ip.0`, always another
        // node's address, so each node handed out its lowest free address: an address freed
        // by a deleted leader Pod went at once to the next Pod on that node, and a member
        // whose client redialed the old leader's address (through a Service rule kube-proxy
        // had not yet dropped) mounted on another backend's new master (store_on_nodes in
        // CI: one master listed three segments, the restarted backend's one).
        let ipam_dir = self.run.join("ipam");
        let pod_cidr = &self.pod_cidr;
        std::fs::write(
            self.dir.join("cni/10-bridge.conflist"),
            format!(
                "{{\"cniVersion\":\"0.4.0\",\"name\":\"kvc\",\"plugins\":[{{\"type\":\"bridge\",\"bridge\":\"cni0\",\"isGateway\":true,\"ipMasq\":false,\"ipam\":{{\"type\":\"host-local\",\"dataDir\":\"{ipam}\",\"ranges\":[[{{\"subnet\":\"{pod_cidr}\"}}]],\"routes\":[{{\"dst\":\"0.0.0.0/0\"}}]}}}},{{\"type\":\"portmap\",\"capabilities\":{{\"portMappings\":true}}}}]}}\n",
                ipam = ipam_dir.display(),
            ),
        )
        .map_err(crate::io("writing the CNI config"))
    }

    /// containerd in the node's mount and network namespaces, once its socket is there.
    fn start_containerd(&self) -> Result<Proc> {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount={}", self.mnt.display()))
            .arg(format!("--net=/var/run/netns/{}", self.name))
            .arg("containerd")
            .arg("--config")
            .arg(self.dir.join("containerd.toml"));
        let mut containerd = Proc::spawn(
            &format!("containerd {}", self.name),
            cmd,
            &self.dir.join("containerd.log"),
        )?;
        wait_for(&mut containerd, Duration::from_secs(30), || {
            self.sock.exists()
        })?;
        Ok(containerd)
    }

    /// The kubelet, with its kubeconfig and config, in the node's namespaces.
    fn start_kubelet(&self, shared: &Shared<'_>) -> Result<Proc> {
        let NodePlan { name, ip, .. } = self;
        std::fs::write(self.dir.join("kubeconfig"), &shared.kubeconfig)
            .map_err(crate::io("writing the node kubeconfig"))?;
        // runtimeRequestTimeout: the first container of an image is unpacked inside its
        // CreateContainer call; the engine image's 5 GB took longer than the default 2
        // minutes on two nodes at once, and each cancelled unpack started again from zero.
        // imageGCHighThresholdPercent 100: no image garbage collection. The kubelet measures
        // the machine's disk, which all nodes share; with the engine's layers unpacked it
        // passed the default 85% and removed the sandbox image, which no registry can bring
        // back (every new Pod on that node then failed `failed to get sandbox image`).
        let host_ip = shared.host_ip;
        std::fs::write(
            self.dir.join("kubelet.yaml"),
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: cgroupfs\ncgroupRoot: /{name}\nfailCgroupV1: false\nfailSwapOn: false\ncontainerRuntimeEndpoint: unix://{sock}\nreadOnlyPort: 0\nhealthzBindAddress: 127.0.0.1\nenforceNodeAllocatable: []\nevictionHard: {{}}\nauthentication:\n  anonymous: {{enabled: false}}\n  webhook: {{enabled: false}}\n  x509: {{clientCAFile: {ca}}}\nauthorization: {{mode: AlwaysAllow}}\nregisterNode: true\nresolvConf: /etc/resolv.conf\nclusterDNS: [{host_ip}]\nclusterDomain: cluster.local\nruntimeRequestTimeout: 15m\nimageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\nsystemReserved:\n  memory: \"{reserved}\"\n",
                sock = self.sock.display(),
                ca = shared.ca.display(),
                reserved = machine_memory().saturating_sub(shared.memory),
            ),
        )
        .map_err(crate::io("writing the kubelet config"))?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount={}", self.mnt.display()))
            .arg(format!("--mount={}", self.mnt.display()))
            .arg(format!("--net=/var/run/netns/{name}"))
            .arg(shared.bin.join("kubelet"))
            .arg("--config")
            .arg(self.dir.join("kubelet.yaml"))
            .arg("--kubeconfig")
            .arg(self.dir.join("kubeconfig"))
            .arg("--root-dir")
            .arg(self.dir.join("kubelet"))
            .args(["--hostname-override", name, "--node-ip", ip])
            .arg(format!("--node-labels={NODE_LABELS}"));
        Proc::spawn(&format!("kubelet {name}"), cmd, &self.kubelet_log())
    }

    /// kube-proxy (iptables) in the node's namespace: ClusterIP Services work from its Pods.
    /// Conntrack limits are the host's (not per namespace): left alone.
    fn start_kube_proxy(&self, shared: &Shared<'_>) -> Result<Proc> {
        let NodePlan { name, ip, .. } = self;
        let cluster_cidr = &shared.cluster_cidr;
        std::fs::write(
            self.dir.join("kube-proxy.yaml"),
            format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclientConnection:\n  kubeconfig: {d}/kubeconfig\nhostnameOverride: {name}\nmode: iptables\nclusterCIDR: {cluster_cidr}\nbindAddress: {ip}\nhealthzBindAddress: 127.0.0.1:10256\nmetricsBindAddress: 127.0.0.1:10249\nconntrack:\n  maxPerCore: 0\n  min: 0\n  tcpEstablishedTimeout: 0s\n  tcpCloseWaitTimeout: 0s\n",
                d = self.dir.display(),
            ),
        )
        .map_err(crate::io("writing the kube-proxy config"))?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount={}", self.mnt.display()))
            .arg(format!("--net=/var/run/netns/{name}"))
            .arg(shared.bin.join("kube-proxy"))
            .arg("--config")
            .arg(self.dir.join("kube-proxy.yaml"));
        Proc::spawn(
            &format!("kube-proxy {name}"),
            cmd,
            &self.dir.join("kube-proxy.log"),
        )
    }

    fn kubelet_log(&self) -> PathBuf {
        self.dir.join("kubelet.log")
    }

    /// What the tests read of the node once it is up.
    fn info(self) -> NodeInfo {
        NodeInfo {
            host_root: self.dir.join("host"),
            kubelet_log: self.kubelet_log(),
            mount_ns: self.mnt.clone(),
            dir: self.dir.clone(),
            name: self.name,
            ip: self.ip,
            pod_cidr: self.pod_cidr,
        }
    }
}

/// The images loading into one node's containerd.
struct Import {
    node: String,
    sock: PathBuf,
    running: Vec<(Image, Child)>,
}

impl Import {
    /// Starts one `ctr images import` per image (the sandbox image always).
    fn spawn(node: &str, sock: &Path, dir: &Path, wanted: &[Image]) -> Result<Import> {
        let mut all: Vec<Image> = vec![images::PAUSE];
        all.extend(wanted.iter().copied().filter(|i| *i != images::PAUSE));
        let mut running = Vec::new();
        for image in all {
            let archive = dir.join(image.archive);
            if !archive.exists() {
                return Err(Error::Missing {
                    what: format!("the image {}", image.name),
                    path: archive,
                });
            }
            let child = Command::new("ctr")
                .arg("-a")
                .arg(sock)
                .args(["-n", "k8s.io", "images", "import", "--no-unpack"])
                .arg(&archive)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|source| Error::Spawn {
                    what: "ctr".into(),
                    source,
                })?;
            running.push((image, child));
        }
        Ok(Import {
            node: node.to_owned(),
            sock: sock.to_owned(),
            running,
        })
    }

    /// Waits for every import, then gives each image its further names.
    fn finish(self) -> Result<()> {
        for (image, child) in self.running {
            let out = child.wait_with_output().map_err(|source| Error::Spawn {
                what: "ctr".into(),
                source,
            })?;
            if !out.status.success() {
                return Err(Error::NodeSetup {
                    step: format!("importing {} into {}", image.name, self.node),
                    message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                });
            }
            for tag in image.also {
                let out = Command::new("ctr")
                    .arg("-a")
                    .arg(&self.sock)
                    .args(["-n", "k8s.io", "images", "tag", "--force", image.name, tag])
                    .output()
                    .map_err(|source| Error::Spawn {
                        what: "ctr".into(),
                        source,
                    })?;
                if !out.status.success() {
                    return Err(Error::NodeSetup {
                        step: format!("naming {} {tag} on {}", image.name, self.node),
                        message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Runs the teardown script once this test process is gone (a `static` is never dropped).
fn watchdog(teardown: &Path) -> Result<Child> {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "while kill -0 {parent} 2>/dev/null; do sleep 0.5; done; sleep 1; sh {script}",
            parent = std::process::id(),
            script = teardown.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.spawn().map_err(|source| Error::Spawn {
        what: "the node watchdog".into(),
        source,
    })
}

/// A control plane with real nodes: the fixture of the end-to-end tests that run Pods.
pub struct NodeCluster {
    /// The control plane (advertising the node bridge's host address).
    pub control_plane: ControlPlane,
    pub nodes: Nodes,
}

impl NodeCluster {
    /// Starts a control plane and `count` nodes with `images` in `dir`.
    pub fn start(dir: &Path, count: usize, images: &[Image]) -> Result<NodeCluster> {
        Self::start_sized(dir, count, images, NODE_ALLOCATABLE_MEMORY)
    }

    /// As [`NodeCluster::start`], each node offering Pods `memory` bytes.
    pub fn start_sized(
        dir: &Path,
        count: usize,
        images: &[Image],
        memory: u64,
    ) -> Result<NodeCluster> {
        let net = NodeNetwork::plan()?;
        let control_plane = ControlPlane::start(
            dir,
            &crate::cluster::Options {
                advertise: Some(net.host_ip.clone()),
                ..crate::cluster::Options::default()
            },
        )?;
        let nodes = Nodes::start_sized(&control_plane, &net, count, dir, images, memory)?;
        Ok(NodeCluster {
            control_plane,
            nodes,
        })
    }

    /// A client as the cluster's admin.
    pub async fn client(&self) -> Result<kube::Client> {
        client_from(&self.control_plane.kubeconfig).await
    }
}

/// The one cluster with two nodes and every image of this test binary (started on first use;
/// torn down by the watchdogs when the binary exits).
pub fn shared() -> &'static NodeCluster {
    static SHARED: std::sync::OnceLock<std::result::Result<NodeCluster, String>> =
        std::sync::OnceLock::new();
    let c = SHARED.get_or_init(|| {
        let dir = paths::scratch("nodes").map_err(|e| e.to_string())?;
        NodeCluster::start(&dir, 2, images::NODE_DEFAULT).map_err(|e| e.to_string())
    });
    match c {
        Ok(c) => c,
        Err(e) => panic!("the cluster with nodes could not start: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_script_names_the_line_that_failed_and_only_its_error() {
        let err = sh("true\nls /no/such/folder\ntrue").expect_err("ls fails");
        let Error::NodeSetup { step, message } = err else {
            panic!("not a node set-up error: {err:?}");
        };
        assert_eq!(step, "ls /no/such/folder");
        assert!(message.starts_with("ls: "), "{message:?}");
        assert!(!message.contains(TRACE), "{message:?}");
        sh("true\ntrue").expect("a script that succeeds");
    }
}
