//! The rig the engine benchmarks share (`bench prefix`, `bench transfer`): two engine-sized
//! nodes with the real vLLM image, the walkthrough's store at the rig's sizes, its pool,
//! team-a's Binding, the engines' InstanceType, and the operator.

use std::path::PathBuf;

use kube::api::DynamicObject;
use kvcache_e2e::cluster::{self, block_on, client_from};
use kvcache_e2e::engine;
use kvcache_e2e::nodes::{ENGINE_NODE_ALLOCATABLE_MEMORY, NodeCluster};
use kvcache_e2e::operator::Operator;
use kvcache_e2e::{images, paths, walkthrough};

/// Where the store runs.
pub const NS: &str = "gpustack-system";
/// The namespace of the engines and of their Binding.
pub const TEAM: &str = "team-a";
/// The walkthrough's backend.
pub const BACKEND: &str = "mooncake-dram";

/// A running rig; dropping it stops the operator, then the cluster (fields drop in order).
pub struct Rig {
    _operator: Operator,
    pub nodes: NodeCluster,
    pub dir: PathBuf,
}

/// Brings the rig up in a scratch folder named `name`; `edit` changes the backend (its JSON)
/// before it is applied.
pub fn up(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> anyhow::Result<Rig> {
    let dir = paths::scratch(name)?;
    let nodes =
        NodeCluster::start_sized(&dir, 2, images::WITH_VLLM, ENGINE_NODE_ALLOCATABLE_MEMORY)?;
    let mut objects = engine::walkthrough_store(1)?;
    edit(&mut objects[0]);
    objects.push(engine::binding(TEAM, "shared-dram", None));
    objects.push(engine::instance_type());
    let objects: Vec<DynamicObject> = objects
        .into_iter()
        .map(serde_json::from_value)
        .collect::<Result<_, _>>()
        .map_err(|e| kvcache_e2e::Error::Invalid {
            path: format!("the {name} benchmark's objects"),
            what: "object",
            reason: e.to_string(),
        })?;
    let kc = nodes.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        cluster::install_crds(&client, &cluster::crds_dir()).await?;
        walkthrough::ensure_namespace(&client, NS).await?;
        walkthrough::apply(&client, &objects).await
    })?;
    let operator = Operator::builder(&nodes.nodes.kubeconfig, NS)
        .on_nodes(&nodes.nodes)
        .start(&dir)?;
    Ok(Rig {
        _operator: operator,
        nodes,
        dir,
    })
}

/// How long [`wait_store_ready`] waits.
const STORE_WAIT: std::time::Duration = std::time::Duration::from_secs(180);

/// Waits until every Pod of the backend is Ready, after the engines (and probes) took their
/// share of the nodes: a store Pod the nodes cannot place (a `--leader-cpu` beside the rig's
/// engines) stops the bench here, its scheduler's message shown, instead of measuring a store
/// short of a member. The store was applied before the engines, so this waits at most
/// [`STORE_WAIT`] for a Pod the engines' start left restarting.
pub async fn wait_store_ready(client: &kube::Client) -> Result<(), kvcache_e2e::Error> {
    let store: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), NS);
    kvcache_e2e::pods::wait_pods(
        &store,
        &format!("app.kubernetes.io/instance={BACKEND}"),
        "every store Pod Ready",
        STORE_WAIT,
        |pods| {
            !pods.is_empty()
                && pods.iter().all(|p| {
                    kvcache_e2e::pods::is_ready(p) && p.metadata.deletion_timestamp.is_none()
                })
        },
    )
    .await
    .map(|_| ())
}

/// The CPU seconds a Pod's containers have used so far, read on this machine from its node's
/// cgroup: the harness's kubelets run the `cgroupfs` driver on cgroup v1 under a root named
/// after the node (`tests/src/nodes.rs`), so a Pod's account is
/// `/sys/fs/cgroup/cpuacct/<node>/kubepods[/<qos>]/pod<uid>/cpuacct.usage` (nanoseconds).
pub fn pod_cpu_seconds(pod: &k8s_openapi::api::core::v1::Pod) -> Result<f64, kvcache_e2e::Error> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let missing = |what: &str| kvcache_e2e::Error::Io {
        context: format!("reading the CPU account of Pod {name}"),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, what.to_owned()),
    };
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .ok_or_else(|| {
            missing(&format!(
                "the Pod has no node: {}",
                kvcache_e2e::pods::describe(std::slice::from_ref(pod))
            ))
        })?;
    let uid = pod
        .metadata
        .uid
        .as_deref()
        .ok_or_else(|| missing("no uid"))?;
    let root = std::path::Path::new("/sys/fs/cgroup/cpuacct")
        .join(node)
        .join("kubepods");
    let file = ["", "burstable", "besteffort"]
        .iter()
        .map(|qos| {
            root.join(qos)
                .join(format!("pod{uid}"))
                .join("cpuacct.usage")
        })
        .find(|f| f.exists())
        .ok_or_else(|| missing(&format!("no pod{uid} under {}", root.display())))?;
    let text = std::fs::read_to_string(&file).map_err(|source| kvcache_e2e::Error::Io {
        context: format!("reading {}", file.display()),
        source,
    })?;
    text.trim()
        .parse::<u64>()
        .map(|ns| ns as f64 / 1e9)
        .map_err(|e| missing(&format!("{}: {e}", file.display())))
}

/// Every engine's and store Pod's log (the master's and the members' account of the same
/// moments), written under `to`.
pub async fn keep_logs(client: &kube::Client, to: &std::path::Path) {
    let _ = std::fs::create_dir_all(to);
    for ns in [TEAM, NS] {
        let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(client.clone(), ns);
        let Ok(list) = api.list(&Default::default()).await else {
            continue;
        };
        for p in &list.items {
            let name = kvcache_e2e::pods::name_of(p).to_owned();
            let containers: Vec<String> = match &p.spec {
                Some(spec) => spec.containers.iter().map(|c| c.name.clone()).collect(),
                None => Vec::new(),
            };
            for container in containers {
                if let Ok(text) = kvcache_e2e::pods::logs(&api, &name, Some(&container)).await {
                    let _ = std::fs::write(to.join(format!("{name}-{container}.log")), text);
                }
            }
        }
    }
}

/// Checks a `--leader-cpu` value (a Kubernetes CPU quantity, as `500m` or `1`).
pub fn check_leader_cpu(cpu: &str) -> anyhow::Result<()> {
    kvcache_api::quantity::parse_millicores(cpu)
        .map(drop)
        .map_err(|e| anyhow::anyhow!("--leader-cpu {cpu:?}: {e}"))
}

/// Sets the backend's `leader.resources.requests.cpu` (`--leader-cpu`), the product's own field.
pub fn set_leader_cpu(backend: &mut serde_json::Value, cpu: String) {
    backend["spec"]["connection"]["managed"]["leader"]["resources"]["requests"]["cpu"] = cpu.into();
}
