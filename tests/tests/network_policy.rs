//! The NetworkPolicy the operator renders for a warm backend's etcd (docs/warm-failover.md),
//! enforced by a real enforcer on the harness's two nodes (kube-router's firewall,
//! `Nodes::enforce_network_policy`): the etcd answers the backend's own Pods (its members
//! mount through it) and the Pods of a namespace holding a Binding on the backend (their
//! engines find the master through `etcd://`), and nothing from another namespace connects;
//! deleting the Binding closes its namespace. One cluster and one operator for the binary.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kvcache_api::backend::BackendPhase;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};
use kvcache_e2e::cluster::{block_on, client_from, crds_dir, install_crds, wait_object};
use kvcache_e2e::nodes::NodeCluster;
use kvcache_e2e::operator::Operator;
use kvcache_e2e::pods::{self, exec, ip_of, name_of};
use kvcache_e2e::status::{describe, has_condition, phase};
use kvcache_e2e::volumes::{LOCAL_CLASS, local_volumes};
use kvcache_e2e::walkthrough::{self, backend_pods};
use kvcache_e2e::{Error, images, paths};

const WAIT: Duration = Duration::from_secs(120);
const NAMESPACE: &str = "gpustack-system";
const BACKEND: &str = "warm-guarded";
/// A namespace with a Binding on the backend, and one without.
const BOUND: &str = "team-bound";
const OTHER: &str = "team-other";

fn cluster() -> &'static NodeCluster {
    static CLUSTER: OnceLock<Result<NodeCluster, String>> = OnceLock::new();
    let c = CLUSTER.get_or_init(|| {
        let dir = paths::scratch("network-policy").map_err(|e| e.to_string())?;
        let mut c = NodeCluster::start(&dir, 2, images::NODE_DEFAULT).map_err(|e| e.to_string())?;
        c.nodes
            .enforce_network_policy()
            .map_err(|e| e.to_string())?;
        Ok(c)
    });
    match c {
        Ok(c) => c,
        Err(e) => panic!("the cluster with an enforcer could not start: {e}"),
    }
}

fn operator() -> &'static Mutex<Operator> {
    static OPERATOR: OnceLock<Result<Mutex<Operator>, String>> = OnceLock::new();
    let op = OPERATOR.get_or_init(|| {
        let cluster = cluster();
        let kc = cluster.control_plane.kubeconfig.clone();
        block_on(async move {
            let client = client_from(&kc).await?;
            install_crds(&client, &crds_dir()).await?;
            walkthrough::ensure_namespace(&client, NAMESPACE).await
        })
        .map_err(|e| e.to_string())?;
        let dir = paths::scratch("network-policy-operator").map_err(|e| e.to_string())?;
        Operator::builder(&cluster.nodes.kubeconfig, NAMESPACE)
            .on_nodes(&cluster.nodes)
            .start(&dir)
            .map(Mutex::new)
            .map_err(|e| e.to_string())
    });
    match op {
        Ok(op) => op,
        Err(e) => panic!("the operator could not start on the nodes: {e}"),
    }
}

/// The warm backend (one leader, one etcd member on a local volume), its pool and the Binding
/// of [`BOUND`].
async fn apply_store(client: &Client) -> Result<(), Error> {
    let pp = PatchParams::apply(walkthrough::MANAGER).force();
    let backend: KVCacheBackend = serde_json::from_value(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
        "metadata": {"name": BACKEND},
        "spec": {
            "image": kvcache_api::settings::DEFAULT_BACKEND_IMAGE,
            "connection": {"managed": {
                "leader": {"electionBackend": "Etcd",
                           "etcd": {"storageClassName": LOCAL_CLASS, "storageSize": "64Mi"},
                           "resources": {"requests": {"cpu": walkthrough::RIG_STORE_CPU.leader,
                                                      "memory": walkthrough::RIG_LEADER_MEMORY}}},
                "members": [{"medium": "DRAM",
                             "capacityPerMember": walkthrough::DEMO_CAPACITY_PER_MEMBER,
                             "resources": {"requests": {"cpu": walkthrough::RIG_STORE_CPU.member}}}]
            }}
        }
    }))
    .expect("a KVCacheBackend");
    Api::<KVCacheBackend>::all(client.clone())
        .patch(BACKEND, &pp, &Patch::Apply(&backend))
        .await?;
    let pool: KVCachePool = serde_json::from_value(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool",
        "metadata": {"name": BACKEND},
        "spec": {"backends": [BACKEND], "quota": {"total": "256Mi"}},
    }))
    .expect("a pool");
    Api::<KVCachePool>::all(client.clone())
        .patch(BACKEND, &pp, &Patch::Apply(&pool))
        .await?;
    for ns in [BOUND, OTHER] {
        walkthrough::ensure_namespace(client, ns).await?;
    }
    let binding: KVCachePoolBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
        "metadata": {"name": BOUND, "namespace": BOUND},
        "spec": {"poolRef": {"name": BACKEND}, "quota": {"ceiling": "64Mi"},
                 "domain": {"blockSize": 64, "dtype": "bfloat16"}},
    }))
    .expect("a Binding");
    Api::<KVCachePoolBinding>::namespaced(client.clone(), BOUND)
        .patch(BOUND, &pp, &Patch::Apply(&binding))
        .await?;
    Ok(())
}

/// Connects to etcd's client port at argv[1] (3 s at most) and prints its `/health` answer.
const PROBE: &str = "import socket, sys\ns = socket.create_connection((sys.argv[1], 2379), 3)\ns.settimeout(3)\ns.sendall(b'GET /health HTTP/1.0\\r\\n\\r\\n')\nprint(s.recv(4096).decode(errors='replace'))";

/// A Pod of the store image (it has python3) in `ns` that only waits, Ready once running.
async fn prober(client: &Client, ns: &str) -> Result<Pod, Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "prober", "namespace": ns, "labels": {"app": "prober"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": images::STORE.name, "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"]}]
        }
    }))
    .expect("a Pod");
    api.create(&PostParams::default(), &pod).await?;
    let ready = pods::wait_ready(&api, "app=prober", 1, WAIT).await?;
    Ok(ready[0].clone())
}

/// Whether `pod` gets an answer from etcd's `/health` at `ip` within 3 s.
async fn reaches(client: &Client, pod: &Pod, ip: &str) -> Result<bool, Error> {
    let ns = pod.namespace().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let out = exec(&api, name_of(pod), None, &["python3", "-c", PROBE, ip]).await?;
    Ok(out.success && out.stdout.contains("health"))
}

/// Waits until `pod` reaching the etcd is `want`; how long it took.
async fn wait_reach(
    client: &Client,
    pod: &Pod,
    ip: &str,
    want: bool,
    what: &str,
) -> Result<Duration, Error> {
    let started = Instant::now();
    loop {
        if reaches(client, pod, ip).await? == want {
            return Ok(started.elapsed());
        }
        if started.elapsed() > WAIT {
            return Err(Error::Wait {
                what: what.to_owned(),
                reason: format!(
                    "{} in {} still {} the etcd at {ip}",
                    name_of(pod),
                    pod.namespace().unwrap_or_default(),
                    if want { "does not reach" } else { "reaches" }
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[test]
fn a_warm_backends_etcd_answers_its_own_pods_and_bound_namespaces_and_nothing_else() {
    operator();
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        local_volumes(&client, &cluster.nodes, BACKEND, 1).await?;
        apply_store(&client).await?;
        // The members mount through the etcd: Ready with capacity is their own connection
        // admitted by the policy.
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        let b = wait_object(
            &backends,
            BACKEND,
            "Ready, EtcdAvailable=True, capacity read",
            WAIT,
            |b| {
                phase(b) == Some(BackendPhase::Ready)
                    && has_condition(b, "EtcdAvailable=True")
                    && b.status.as_ref().is_some_and(|s| s.capacity.is_some())
            },
        )
        .await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let etcd = pods::wait_ready(&store, &backend_pods(BACKEND, "etcd"), 1, WAIT).await?;
        let ip = ip_of(&etcd[0]).expect("the etcd Pod's address").to_owned();

        let bound = prober(&client, BOUND).await?;
        let other = prober(&client, OTHER).await?;
        let placed = format!(
            "etcd {ip} on {:?}; bound prober {:?} on {:?}; other prober {:?} on {:?}; {}",
            pods::node_of(&etcd[0]),
            ip_of(&bound),
            pods::node_of(&bound),
            ip_of(&other),
            pods::node_of(&other),
            describe(&b)
        );
        let opened = wait_reach(
            &client,
            &bound,
            &ip,
            true,
            &format!("the bound namespace reaching the etcd (its engines need it): {placed}"),
        )
        .await?;
        let refused = wait_reach(
            &client,
            &other,
            &ip,
            false,
            &format!("the unbound namespace refused: {placed}"),
        )
        .await?;
        assert!(
            !reaches(&client, &other, &ip).await?,
            "a Pod of a namespace without a Binding does not reach the etcd"
        );

        // The Binding deleted: its namespace is closed too.
        Api::<KVCachePoolBinding>::namespaced(client.clone(), BOUND)
            .delete(BOUND, &DeleteParams::default())
            .await?;
        let closed =
            wait_reach(&client, &bound, &ip, false, "the namespace closed with its Binding")
                .await?;
        println!(
            "etcd NetworkPolicy under kube-router: bound namespace reached after {opened:.1?}, unbound namespace refused after {refused:.1?}; a deleted Binding's namespace closed after {closed:.1?} ({placed})"
        );
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
