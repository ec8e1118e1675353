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
            walkthrough::ensure_namespace(&client, NAMESPACE).await?;
            // The store namespace under the restricted Pod Security Standard, enforced by the
            // API server's own admission: every store Pod of this binary (leader, members,
            // electors, the warm etcd) must meet it to start (docs/isolation.md#pod-security).
            let labels = serde_json::json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            }}});
            Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
                .patch(NAMESPACE, &PatchParams::default(), &Patch::Merge(&labels))
                .await?;
            Ok::<_, Error>(())
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

/// Two plain backends and their tenants, and a namespace with no Binding: what a team can
/// reach of a store it is bound to, of another team's, and what an unbound Pod reaches.
mod tenants {
    use super::*;
    use kvcache_e2e::reach::{self, Reach};

    /// (backend and pool, the namespace bound to it).
    const A: (&str, &str) = ("iso-a", "iso-team-a");
    const B: (&str, &str) = ("iso-b", "iso-team-b");
    const ATTACKER: &str = "iso-attacker";

    async fn apply_tenant(client: &Client, (backend, ns): (&str, &str)) -> Result<(), Error> {
        let pp = PatchParams::apply(walkthrough::MANAGER).force();
        let mut b = serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
            "metadata": {"name": backend},
            "spec": {
                "image": kvcache_api::settings::DEFAULT_BACKEND_IMAGE,
                "connection": {"managed": {"members": [{"medium": "DRAM", "capacityPerMember": "64Mi"}]}}
            }
        });
        walkthrough::fill_store_resources(&mut b, walkthrough::RIG_STORE_CPU);
        let b: KVCacheBackend = serde_json::from_value(b).expect("a KVCacheBackend");
        Api::<KVCacheBackend>::all(client.clone())
            .patch(backend, &pp, &Patch::Apply(&b))
            .await?;
        let pool: KVCachePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool",
            "metadata": {"name": backend},
            "spec": {"backends": [backend], "quota": {"total": "128Mi"}},
        }))
        .expect("a pool");
        Api::<KVCachePool>::all(client.clone())
            .patch(backend, &pp, &Patch::Apply(&pool))
            .await?;
        walkthrough::ensure_namespace(client, ns).await?;
        bind(client, backend, ns).await
    }

    async fn bind(client: &Client, pool: &str, ns: &str) -> Result<(), Error> {
        let binding: KVCachePoolBinding = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
            "metadata": {"name": ns, "namespace": ns},
            "spec": {"poolRef": {"name": pool}, "quota": {"ceiling": "64Mi"},
                     "domain": {"blockSize": 64, "dtype": "bfloat16"}},
        }))
        .expect("a Binding");
        Api::<KVCachePoolBinding>::namespaced(client.clone(), ns)
            .patch(
                ns,
                &PatchParams::apply(walkthrough::MANAGER).force(),
                &Patch::Apply(&binding),
            )
            .await?;
        Ok(())
    }

    /// What a store offers: its master's RPC port (by the Service's name and the Pod's
    /// address), its admin port, and every port its members listen on.
    struct Targets {
        rpc: Vec<String>,
        admin: String,
        members: Vec<String>,
        master: String,
    }

    async fn targets(client: &Client, backend: &str) -> Result<Targets, Error> {
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let leader = pods::wait_ready(&store, &backend_pods(backend, "leader"), 1, WAIT).await?;
        let ip = ip_of(&leader[0]).expect("the leader's address").to_owned();
        let master = format!("{backend}-leader.{NAMESPACE}.svc:50051");
        let mut members = Vec::new();
        for m in pods::wait_ready(&store, &backend_pods(backend, "member-0"), 2, WAIT).await? {
            let ports = reach::listening(&store, &m, None).await?;
            assert!(!ports.is_empty(), "{} listens on no port", name_of(&m));
            members.extend(ports);
        }
        Ok(Targets {
            rpc: vec![format!("{ip}:50051"), master.clone()],
            admin: format!("{ip}:9003"),
            members,
            master,
        })
    }

    /// Probes until what `pod` reaches of `targets` is `want` for every one; how long it took.
    async fn wait_reach(
        client: &Client,
        pod: &Pod,
        targets: &[String],
        want: bool,
        what: &str,
    ) -> Result<Duration, Error> {
        let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        reach::wait_reach(&api, name_of(pod), targets, want, WAIT, what).await
    }

    /// The targets `pod` reaches of `targets` now, and the answer of each.
    async fn seen(
        client: &Client,
        pod: &Pod,
        targets: &[String],
    ) -> Result<std::collections::BTreeMap<String, Reach>, Error> {
        let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        reach::probe(&api, name_of(pod), targets).await
    }

    /// No target connected: each was refused or dropped (kube-router rejects a denied
    /// connection, so the probe reads `Refused`). Every target here is known to listen: the
    /// members' ports and the master's RPC port connect from the bound namespace, the admin port
    /// answers the operator (the backend's capacity is read through it).
    fn all_closed(seen: &std::collections::BTreeMap<String, Reach>) -> bool {
        !seen.is_empty() && seen.values().all(|r| !r.open())
    }

    #[test]
    fn a_store_takes_its_bound_namespaces_alone_and_its_admin_port_the_operator_alone() {
        operator();
        let cluster = cluster();
        let kc = cluster.control_plane.kubeconfig.clone();
        block_on(async move {
            let client = client_from(&kc).await?;
            apply_tenant(&client, A).await?;
            apply_tenant(&client, B).await?;
            walkthrough::ensure_namespace(&client, ATTACKER).await?;
            // Ready with capacity: the operator read each master's admin port, and the members
            // mounted on it, through the policies.
            let backends: Api<KVCacheBackend> = Api::all(client.clone());
            for (backend, _) in [A, B] {
                wait_object(&backends, backend, "Ready with capacity, NetworkIsolated=True", WAIT, |b| {
                    phase(b) == Some(BackendPhase::Ready)
                        && b.status.as_ref().is_some_and(|s| s.capacity.is_some())
                        && has_condition(b, "NetworkIsolated=True/PoliciesApplied")
                })
                .await?;
            }
            let a = targets(&client, A.0).await?;
            let b = targets(&client, B.0).await?;
            let team_a = prober(&client, A.1).await?;
            let team_b = prober(&client, B.1).await?;
            let attacker = prober(&client, ATTACKER).await?;
            let store_of_a: Vec<String> = a.rpc.iter().chain(&a.members).cloned().collect();
            let store_of_b: Vec<String> = b.rpc.iter().chain(&b.members).cloned().collect();

            // Team A reaches its master and every member port: a put and a read through the
            // store's own client pass (the transfer engine dials the members).
            wait_reach(&client, &team_a, &store_of_a, true, "team A reaching its store").await?;
            let api_a: Api<Pod> = Api::namespaced(client.clone(), A.1);
            let code = pods::store_put(&api_a, name_of(&team_a), &a.master, "iso-secret", None, 4096).await?;
            assert_eq!(code, 0, "team A's put");
            assert_eq!(
                pods::store_get(&api_a, name_of(&team_a), &a.master, "iso-secret", None).await?,
                kvcache_e2e::store::Lookup::Hit(4096)
            );
            // Not the admin port: the tenant ledger is the operator's.
            let admin = seen(&client, &team_a, std::slice::from_ref(&a.admin)).await?;
            assert!(all_closed(&admin), "team A reaches the admin port: {admin:?}");

            // The attacker reaches nothing of either store: no master, no member, no ledger;
            // its store client cannot even set up.
            let everything: Vec<String> = store_of_a
                .iter()
                .chain(&store_of_b)
                .chain([&a.admin, &b.admin])
                .cloned()
                .collect();
            let attacked = seen(&client, &attacker, &everything).await?;
            assert!(all_closed(&attacked), "an unbound namespace: {attacked:?}");
            let api_x: Api<Pod> = Api::namespaced(client.clone(), ATTACKER);
            assert!(
                !reach::store_answers(&api_x, &attacker, &a.master, "iso-secret").await?,
                "the unbound namespace read through team A's master"
            );

            // Team B reaches its own store and nothing of team A's.
            wait_reach(&client, &team_b, &store_of_b, true, "team B reaching its store").await?;
            let crossed = seen(&client, &team_b, &store_of_a).await?;
            assert!(all_closed(&crossed), "team B reaching team A's store: {crossed:?}");

            // Team A's Binding deleted: its namespace is cut off from the master and members.
            Api::<KVCachePoolBinding>::namespaced(client.clone(), A.1)
                .delete(A.1, &DeleteParams::default())
                .await?;
            // Its release waits on the key team A still holds; the namespace is closed at once.
            let closed = wait_reach(&client, &team_a, &store_of_a, false, "team A cut off with its Binding").await?;
            println!(
                "store NetworkPolicies under kube-router: a deleted Binding's namespace cut off after {closed:.1?}"
            );
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    }
}
