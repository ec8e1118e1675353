//! The store's NetworkPolicies (docs/isolation.md, docs/warm-failover.md), enforced by a real
//! enforcer on the harness's two nodes (kube-router's firewall,
//! `Nodes::enforce_network_policy`): a warm backend's etcd answers the backend's own Pods alone
//! while its bound namespace stores through the leader Service, across a leader restart; a
//! store's master and members' transfer ports take its bound namespaces, its members' REST API
//! the operator alone, and nothing of it another namespace; a Lease-addressed member gets the
//! leader elector's identity; a backend dedicated to one namespace refuses every attack from a
//! namespace bound to another backend. One cluster and one operator for the binary.

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
use kvcache_e2e::store::Lookup;
use kvcache_e2e::volumes::{LOCAL_CLASS, local_volumes};
use kvcache_e2e::walkthrough::{self, backend_pods};
use kvcache_e2e::{Error, images, paths, reach};

const WAIT: Duration = Duration::from_secs(120);
const NAMESPACE: &str = "gpustack-system";
const BACKEND: &str = "warm-guarded";
/// A namespace with a Binding on the backend (which is dedicated to it), and one without.
const BOUND: &str = "team-bound";
const OTHER: &str = "team-other";
/// The domain (tenant id) of [`BOUND`]'s Binding.
const DOMAIN: &str = "bound-kv";

/// Held while a test needs the warm backend's leader to serve throughout (the dedicated
/// backend's attacks and their control); the etcd test takes it for its leader restart.
static WARM_LEADER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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

/// The warm backend (one leader, one etcd member on a local volume), dedicated to [`BOUND`],
/// its pool and the Binding of [`BOUND`] (domain [`DOMAIN`]).
async fn apply_store(client: &Client) -> Result<(), Error> {
    let pp = PatchParams::apply(walkthrough::MANAGER).force();
    let backend: KVCacheBackend = serde_json::from_value(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
        "metadata": {"name": BACKEND},
        "spec": {
            "image": kvcache_api::settings::DEFAULT_BACKEND_IMAGE,
            "tenancy": {"mode": "Dedicated", "namespace": BOUND},
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
                 "domain": {"name": DOMAIN, "blockSize": 64, "dtype": "bfloat16"}},
    }))
    .expect("a Binding");
    Api::<KVCachePoolBinding>::namespaced(client.clone(), BOUND)
        .patch(BOUND, &pp, &Patch::Apply(&binding))
        .await?;
    Ok(())
}

/// The warm backend serves: Ready, its etcd available, its election observed, its capacity read
/// (the masters elect through the etcd and the members mount through the leader Service: both
/// admitted by the policies).
fn warm_serving(b: &KVCacheBackend) -> bool {
    phase(b) == Some(BackendPhase::Ready)
        && has_condition(b, "EtcdAvailable=True")
        && has_condition(b, "ElectionObserved=True")
        && b.status.as_ref().is_some_and(|s| s.capacity.is_some())
}

/// Applies the warm backend (its local volumes, [`apply_store`]) and waits until it serves.
async fn warm_store(client: &Client, cluster: &NodeCluster) -> Result<KVCacheBackend, Error> {
    local_volumes(client, &cluster.nodes, BACKEND, 1).await?;
    apply_store(client).await?;
    wait_object(
        &Api::<KVCacheBackend>::all(client.clone()),
        BACKEND,
        "Ready, EtcdAvailable=True, elected, capacity read",
        WAIT,
        warm_serving,
    )
    .await
}

/// Connects to etcd's client port at argv[1] (3 s at most) and prints its `/health` answer.
const PROBE: &str = "import socket, sys\ns = socket.create_connection((sys.argv[1], 2379), 3)\ns.settimeout(3)\ns.sendall(b'GET /health HTTP/1.0\\r\\n\\r\\n')\nprint(s.recv(4096).decode(errors='replace'))";

/// A Pod of the store image (it has python3) in `ns` that only waits, Ready once running.
async fn prober(client: &Client, ns: &str) -> Result<Pod, Error> {
    prober_as(client, ns, "prober", serde_json::json!({"app": "prober"})).await
}

/// A waiting Pod of the store image named `name` in `ns` with `labels`, under the restricted
/// Pod Security Standard (the store's namespace enforces it), Ready once running.
async fn prober_as(
    client: &Client,
    ns: &str,
    name: &str,
    labels: serde_json::Value,
) -> Result<Pod, Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "main", "image": images::STORE.name, "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"],
                            "securityContext": {"allowPrivilegeEscalation": false,
                                                "capabilities": {"drop": ["ALL"]}}}]
        }
    }))
    .expect("a Pod");
    api.create(&PostParams::default(), &pod).await?;
    pods::wait_pod(&api, name, "Ready", WAIT, pods::is_ready).await
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
fn a_warm_backends_etcd_answers_its_own_pods_alone_and_a_bound_namespace_stores_through_the_leader_service()
 {
    operator();
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let b = warm_store(&client, cluster).await?;
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        let serving = warm_serving;
        // The entry engines are given: the leader Service, not the etcd.
        let master = format!("{BACKEND}-leader.{NAMESPACE}.svc:50051");
        assert_eq!(
            b.status.as_ref().and_then(|s| s.endpoint.as_deref()),
            Some(master.as_str()),
            "{}",
            describe(&b)
        );
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let etcd = pods::wait_ready(&store, &backend_pods(BACKEND, "etcd"), 1, WAIT).await?;
        let ip = ip_of(&etcd[0]).expect("the etcd Pod's address").to_owned();
        let members = pods::wait_ready(&store, &backend_pods(BACKEND, "member-0"), 2, WAIT).await?;

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
        // The backend's own Pods reach it (a member's probe answers: the policy lets the
        // backend's Pods in, the probes below are refused by it, not by a dead etcd).
        let own = wait_reach(
            &client,
            &members[0],
            &ip,
            true,
            &format!("a member of the backend reaching the etcd: {placed}"),
        )
        .await?;
        // Neither the bound namespace nor another one connects.
        wait_reach(
            &client,
            &bound,
            &ip,
            false,
            &format!("the bound namespace refused: {placed}"),
        )
        .await?;
        wait_reach(
            &client,
            &other,
            &ip,
            false,
            &format!("the unbound namespace refused: {placed}"),
        )
        .await?;
        for (pod, who) in [(&bound, "bound"), (&other, "unbound")] {
            assert!(
                !reaches(&client, pod, &ip).await?,
                "a Pod of the {who} namespace reaches the etcd: {placed}"
            );
        }

        // The bound namespace stores through the leader Service.
        let api: Api<Pod> = Api::namespaced(client.clone(), BOUND);
        let key = "warm-guarded-key";
        let code = pods::store_put(&api, name_of(&bound), &master, key, Some(DOMAIN), 4096).await?;
        assert_eq!(code, 0, "the bound namespace's put through {master}");
        assert_eq!(
            pods::store_get(&api, name_of(&bound), &master, key, Some(DOMAIN)).await?,
            Lookup::Hit(4096)
        );

        // A leader restart: a new leader Pod (a new address) is elected through the same etcd;
        // the members remount on it through the Service, and the bound namespace reads the key
        // back through the Service. Nobody outside the backend read the etcd to follow it.
        let view = |b: &KVCacheBackend| {
            b.status
                .as_ref()
                .and_then(|s| s.election.as_ref())
                .and_then(|e| e.view_version)
        };
        let first_view = view(&b);
        let _restart = WARM_LEADER.lock().await;
        let leader = pods::wait_ready(&store, &backend_pods(BACKEND, "leader"), 1, WAIT).await?;
        let restarted = Instant::now();
        store
            .delete(name_of(&leader[0]), &DeleteParams::default())
            .await?;
        wait_object(&backends, BACKEND, "serving in a new view", WAIT, |b| {
            serving(b) && view(b).is_some_and(|v| Some(v) != first_view)
        })
        .await?;
        let read_back = loop {
            match pods::store_get(&api, name_of(&bound), &master, key, Some(DOMAIN)).await {
                Ok(Lookup::Hit(n)) => break n,
                seen if restarted.elapsed() > WAIT => {
                    return Err(Error::Wait {
                        what: format!("{key} read back through {master} after the leader restart"),
                        reason: format!("last read: {seen:?}"),
                    });
                }
                _ => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        };
        assert_eq!(read_back, 4096);
        let after = restarted.elapsed();
        assert!(
            !reaches(&client, &bound, &ip).await?,
            "the bound namespace reaches the etcd after the restart"
        );
        println!(
            "etcd NetworkPolicy under kube-router: the backend's member reached it after {own:.1?}, the bound and the unbound namespace refused; the bound namespace put and got through {master}, and read the key back {after:.1?} after the leader Pod was deleted ({placed})"
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
    use kvcache_render::objects::backend::access::TRANSFER_PORTS;

    /// The first member group's REST port (`mc_store_rest_server`'s HTTP API).
    pub(super) const REST_PORT: u16 = 8080;

    /// `GET /api/exist/<argv[2]>` of the member REST API at argv[1] (`host:port`); prints
    /// `HTTP <status> <body>`.
    const REST_EXIST: &str = "import sys, urllib.request, urllib.error\ntry:\n    r = urllib.request.urlopen(f'http://{sys.argv[1]}/api/exist/{sys.argv[2]}', timeout=5)\n    print('HTTP', r.status, r.read().decode())\nexcept urllib.error.HTTPError as e:\n    print('HTTP', e.code, e.read().decode())";

    /// (backend and pool, the namespace bound to it).
    pub(super) const A: (&str, &str) = ("iso-a", "iso-team-a");
    pub(super) const B: (&str, &str) = ("iso-b", "iso-team-b");
    const ATTACKER: &str = "iso-attacker";

    pub(super) async fn apply_tenant(
        client: &Client,
        (backend, ns): (&str, &str),
    ) -> Result<(), Error> {
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
    /// address), its admin port, its members' transfer ports and their REST API.
    pub(super) struct Targets {
        pub(super) rpc: Vec<String>,
        pub(super) admin: String,
        pub(super) transfer: Vec<String>,
        pub(super) rest: Vec<String>,
        pub(super) master: String,
        pub(super) members: Vec<Pod>,
    }

    pub(super) async fn targets(client: &Client, backend: &str) -> Result<Targets, Error> {
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let leader = pods::wait_ready(&store, &backend_pods(backend, "leader"), 1, WAIT).await?;
        let ip = ip_of(&leader[0]).expect("the leader's address").to_owned();
        let master = format!("{backend}-leader.{NAMESPACE}.svc:50051");
        let (first, last) = TRANSFER_PORTS;
        let (mut transfer, mut rest) = (Vec::new(), Vec::new());
        let members = pods::wait_ready(&store, &backend_pods(backend, "member-0"), 2, WAIT).await?;
        for m in &members {
            let member = ip_of(m).expect("a member's address");
            let listening = reach::listening(&store, m, None).await?;
            let rest_port = format!("{member}:{REST_PORT}");
            // Every port the member listens on is its REST API or one of the transfer ports
            // the render pinned (the handshake and the TCP data listener).
            let pinned: Vec<String> = listening
                .iter()
                .filter(|t| **t != rest_port)
                .cloned()
                .collect();
            assert!(
                listening.contains(&rest_port)
                    && pinned.len() == 2
                    && pinned.iter().all(|t| {
                        t.rsplit_once(':')
                            .and_then(|(_, p)| p.parse::<i32>().ok())
                            .is_some_and(|p| (first..=last).contains(&p))
                    }),
                "{} listens on {listening:?}: the REST port {REST_PORT} and two ports of {first}..={last} expected",
                name_of(m)
            );
            transfer.extend(pinned);
            rest.push(rest_port);
        }
        Ok(Targets {
            rpc: vec![format!("{ip}:50051"), master.clone()],
            admin: format!("{ip}:9003"),
            transfer,
            rest,
            master,
            members,
        })
    }

    /// Probes until what `pod` reaches of `targets` is `want` for every one; how long it took.
    pub(super) async fn wait_reach(
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
    pub(super) async fn seen(
        client: &Client,
        pod: &Pod,
        targets: &[String],
    ) -> Result<std::collections::BTreeMap<String, Reach>, Error> {
        let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        reach::probe(&api, name_of(pod), targets).await
    }

    /// No target connected: each was refused or dropped (kube-router rejects a denied
    /// connection, so the probe reads `Refused`). Every target here is known to listen: the
    /// members' transfer ports and the master's RPC port connect from the bound namespace, the
    /// admin port answers the operator (the backend's capacity is read through it), the REST
    /// port the operator's Pod.
    pub(super) fn all_closed(seen: &std::collections::BTreeMap<String, Reach>) -> bool {
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
                        && has_condition(b, "NetworkIsolated=True/Enforced")
                })
                .await?;
            }
            let a = targets(&client, A.0).await?;
            let b = targets(&client, B.0).await?;
            let team_a = prober(&client, A.1).await?;
            let team_b = prober(&client, B.1).await?;
            let attacker = prober(&client, ATTACKER).await?;
            let store_of_a: Vec<String> = a.rpc.iter().chain(&a.transfer).cloned().collect();
            let store_of_b: Vec<String> = b.rpc.iter().chain(&b.transfer).cloned().collect();

            // Team A reaches its master and its members' transfer ports: a put and a read
            // through the store's own client pass (the transfer engine dials the members there).
            wait_reach(&client, &team_a, &store_of_a, true, "team A reaching its store").await?;
            let api_a: Api<Pod> = Api::namespaced(client.clone(), A.1);
            let code = pods::store_put(&api_a, name_of(&team_a), &a.master, "iso-secret", None, 4096).await?;
            assert_eq!(code, 0, "team A's put");
            assert_eq!(
                pods::store_get(&api_a, name_of(&team_a), &a.master, "iso-secret", None).await?,
                kvcache_e2e::store::Lookup::Hit(4096)
            );
            // Not the admin port (the tenant ledger is the operator's), not the members' REST
            // API (put, get and remove as the member's tenant, the tier's unmount).
            let operators: Vec<String> = std::iter::once(&a.admin).chain(&a.rest).cloned().collect();
            let closed = seen(&client, &team_a, &operators).await?;
            assert!(all_closed(&closed), "team A reaches the operator's ports: {closed:?}");

            // The operator reaches the members' REST API: a Pod with the operator's labels in
            // its namespace connects, and the member answers its HTTP.
            let operator_pod = prober_as(
                &client,
                NAMESPACE,
                "operator-prober",
                serde_json::json!({"app.kubernetes.io/name": "kvcache-operator"}),
            )
            .await?;
            let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
            reach::wait_reach(&store, name_of(&operator_pod), &a.rest, true, WAIT, "the operator reaching the members' REST API").await?;
            for rest in &a.rest {
                let out = exec(&store, name_of(&operator_pod), None, &["python3", "-c", REST_EXIST, rest, "iso-secret"]).await?;
                assert!(
                    out.success && out.stdout.starts_with("HTTP 200"),
                    "the member's REST API at {rest} answers the operator: {} {}",
                    out.stdout,
                    out.stderr
                );
            }
            // Not the backend's own Pods: a member does not reach another member's REST API.
            let member_store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
            let crossed = reach::probe(&member_store, name_of(&a.members[0]), &a.rest[1..]).await?;
            assert!(all_closed(&crossed), "a member reaches another member's REST API: {crossed:?}");

            // The attacker reaches nothing of either store: no master, no member, no ledger;
            // its store client cannot even set up.
            let everything: Vec<String> = store_of_a
                .iter()
                .chain(&store_of_b)
                .chain(&a.rest)
                .chain(&b.rest)
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
            let of_a: Vec<String> = store_of_a.iter().chain(&a.rest).cloned().collect();
            let crossed = seen(&client, &team_b, &of_a).await?;
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

/// A backend whose members follow the Lease (`memberAddressing: Lease`): before it mounts, a
/// member asks the elector beside the master at the Lease's address who it is
/// (`crates/kvcache-elector/src/member.rs`), on the leader elector's port, which the leader's
/// policy opens to the backend's own Pods.
mod identity {
    use super::*;

    const LEASED: &str = "iso-leased";

    /// The JSON lines of a member container's log (the elector logs JSON).
    async fn json_log(store: &Api<Pod>, pod: &str) -> Result<Vec<serde_json::Value>, Error> {
        Ok(pods::logs(store, pod, Some("member"))
            .await?
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .collect())
    }

    #[test]
    fn a_lease_addressed_member_gets_the_leader_electors_identity_under_the_enforcer() {
        operator();
        let cluster = cluster();
        let kc = cluster.control_plane.kubeconfig.clone();
        block_on(async move {
            let client = client_from(&kc).await?;
            let mut b = serde_json::json!({
                "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
                "metadata": {"name": LEASED},
                "spec": {
                    "image": kvcache_api::settings::DEFAULT_BACKEND_IMAGE,
                    "connection": {"managed": {
                        "leader": {"memberAddressing": "Lease", "multiTenancy": false},
                        "members": [{"medium": "DRAM", "capacityPerMember": "64Mi"}]
                    }}
                }
            });
            walkthrough::fill_store_resources(&mut b, walkthrough::RIG_STORE_CPU);
            let b: KVCacheBackend = serde_json::from_value(b).expect("a KVCacheBackend");
            let backends: Api<KVCacheBackend> = Api::all(client.clone());
            backends
                .patch(
                    LEASED,
                    &PatchParams::apply(walkthrough::MANAGER).force(),
                    &Patch::Apply(&b),
                )
                .await?;
            wait_object(&backends, LEASED, "Ready with capacity", WAIT, |b| {
                phase(b) == Some(BackendPhase::Ready)
                    && b.status.as_ref().is_some_and(|s| s.capacity.is_some())
            })
            .await?;
            let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
                Api::namespaced(client.clone(), NAMESPACE);
            let lease = leases
                .get(&kvcache_render::objects::backend::leader_name(LEASED))
                .await?;
            let address = lease
                .annotations()
                .get(kvcache_elector::lease::ADDRESS_ANNOTATION)
                .cloned()
                .expect("the leader's address on its Lease");
            let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
            let members = pods::wait_ready(&store, &backend_pods(LEASED, "member-0"), 2, WAIT).await?;
            for m in &members {
                let log = json_log(&store, name_of(m)).await?;
                let started: Vec<&serde_json::Value> = log
                    .iter()
                    .filter(|l| l["fields"]["message"] == "member started")
                    .collect();
                // Verified: the elector at the Lease's address answered `/identity` as this
                // backend's holder. Unverified (no answer: the port closed to the member) would
                // mount too, with the foreign-master guard silently off.
                assert!(
                    !started.is_empty()
                        && started.iter().all(|l| {
                            l["fields"]["master"] == address.as_str()
                                && l["fields"]["verified"] == true
                        }),
                    "{}: every start toward {address}, verified by the leader's identity: {started:#?}",
                    name_of(m)
                );
            }
            println!(
                "Lease-addressed members under kube-router: both verified the leader at {address} before mounting"
            );
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The operator's own check that something enforces the store's policies
/// (docs/isolation.md#enforcement-checked): under kube-router its probe Pod, in the operator's
/// namespace (restricted, which the Pod meets) that no Binding admits, is refused by the
/// master's RPC port, and a Binding made (new policies) is probed again. Its counterpart on
/// nodes without an enforcer is `operator_on_nodes`'s
/// `without_an_enforcer_the_same_probes_see_an_unbound_namespace_reach_the_store`.
mod probe {
    use super::*;
    use kvcache_render::objects::backend::probe::PROBE_LABEL;

    const PROBED: &str = "iso-probed";
    const TEAM: &str = "iso-probed-team";

    /// The backend's `status.isolationProbe`.
    fn record(b: &KVCacheBackend) -> Option<kvcache_api::backend::IsolationProbe> {
        b.status.as_ref().and_then(|s| s.isolation_probe.clone())
    }

    #[test]
    fn under_the_enforcer_the_operators_probe_is_refused_and_a_new_binding_is_probed_again() {
        operator();
        let cluster = cluster();
        let kc = cluster.control_plane.kubeconfig.clone();
        block_on(async move {
            let client = client_from(&kc).await?;
            let pp = PatchParams::apply(walkthrough::MANAGER).force();
            let mut b = serde_json::json!({
                "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
                "metadata": {"name": PROBED},
                "spec": {
                    "image": kvcache_api::settings::DEFAULT_BACKEND_IMAGE,
                    "connection": {"managed": {
                        "members": [{"medium": "DRAM", "capacityPerMember": "64Mi"}]
                    }}
                }
            });
            walkthrough::fill_store_resources(&mut b, walkthrough::RIG_STORE_CPU);
            let b: KVCacheBackend = serde_json::from_value(b).expect("a KVCacheBackend");
            let backends: Api<KVCacheBackend> = Api::all(client.clone());
            backends.patch(PROBED, &pp, &Patch::Apply(&b)).await?;
            let started = Instant::now();
            let b = wait_object(
                &backends,
                PROBED,
                "Ready, NetworkIsolated=True/Enforced",
                WAIT,
                |b| {
                    phase(b) == Some(BackendPhase::Ready)
                        && has_condition(b, "NetworkIsolated=True/Enforced")
                },
            )
            .await?;
            let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
            let leader = pods::wait_ready(&store, &backend_pods(PROBED, "leader"), 1, WAIT).await?;
            let ip = ip_of(&leader[0]).expect("the leader's address").to_owned();
            let why = b
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "NetworkIsolated"))
                .map(|c| c.message.clone())
                .unwrap_or_default();
            assert!(
                why.contains(&format!("master's RPC port at {ip}:50051 and was refused")),
                "names what it dialled: {}",
                describe(&b)
            );
            let first = record(&b).expect("status.isolationProbe");
            assert_eq!(first.result, kvcache_api::backend::ProbeResult::Enforced);
            println!(
                "probe of {PROBED} under kube-router: Enforced after {:.1}s ({})",
                started.elapsed().as_secs_f64(),
                first.message
            );
            // One Pod for the change, gone once read.
            let selector = format!("{PROBE_LABEL}={PROBED}");
            pods::wait_pods(&store, &selector, "the probe Pod deleted", WAIT, |p| {
                p.is_empty()
            })
            .await?;

            // A Binding made: the leader's policy admits its namespace, a new fingerprint, a
            // new probe, refused again.
            let pool: KVCachePool = serde_json::from_value(serde_json::json!({
                "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool",
                "metadata": {"name": PROBED},
                "spec": {"backends": [PROBED], "quota": {"total": "64Mi"}},
            }))
            .expect("a pool");
            Api::<KVCachePool>::all(client.clone())
                .patch(PROBED, &pp, &Patch::Apply(&pool))
                .await?;
            walkthrough::ensure_namespace(&client, TEAM).await?;
            let binding: KVCachePoolBinding = serde_json::from_value(serde_json::json!({
                "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
                "metadata": {"name": TEAM, "namespace": TEAM},
                "spec": {"poolRef": {"name": PROBED}, "quota": {"ceiling": "32Mi"},
                         "domain": {"blockSize": 64, "dtype": "bfloat16"}},
            }))
            .expect("a Binding");
            Api::<KVCachePoolBinding>::namespaced(client.clone(), TEAM)
                .patch(TEAM, &pp, &Patch::Apply(&binding))
                .await?;
            let again = wait_object(
                &backends,
                PROBED,
                "probed again for the new policies, Enforced",
                WAIT,
                |b| {
                    has_condition(b, "NetworkIsolated=True/Enforced")
                        && record(b).is_some_and(|r| r.policies != first.policies)
                },
            )
            .await?;
            let second = record(&again).expect("status.isolationProbe");
            assert_ne!(
                second.pod, first.pod,
                "a Pod of its own for the new policies"
            );
            pods::wait_pods(
                &store,
                &selector,
                "the second probe Pod deleted",
                WAIT,
                |p| p.is_empty(),
            )
            .await?;
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A backend dedicated to one namespace (the warm backend, `spec.tenancy: {mode: Dedicated,
/// namespace: team-bound}`) attacked from a namespace bound to another backend (team B's, of
/// [`tenants`]), as a co-tenant of a shared backend would attack it: a spoofed tenant id's read
/// and remove, a rogue segment's mount, a raw transfer-engine connection to a member, the
/// members' REST API, the etcd. Each fails, while the dedicated namespace stores and reads
/// (docs/isolation.md#tenancy). With the backend's policies left out of the render, every one
/// got through (seen once: the read got the key's 4096 bytes, the remove reached the master and
/// was refused only by the key's read lease, -706, the rogue segment mounted, and every port
/// connected).
mod dedicated {
    use super::*;
    use kvcache_e2e::reach::{self, StoreAttempt};

    /// The attacker: team B's namespace, bound to team B's backend.
    const ATTACKER: (&str, &str) = tenants::B;
    /// The key the dedicated namespace writes and the attacker goes after.
    const KEY: &str = "dedicated-secret";
    /// The segment the rogue mount offers (bytes).
    const ROGUE_SEGMENT: u64 = 16 << 20;

    /// The attacks that got through, one line each (empty: every one failed).
    fn through(attacks: &[(&str, String)]) -> Vec<String> {
        attacks
            .iter()
            .filter(|(_, seen)| !seen.starts_with("failed"))
            .map(|(attack, seen)| format!("{attack}: {seen}"))
            .collect()
    }

    /// What the store's client in the attacker's Pod got through the master.
    fn answered(attempt: Option<String>) -> String {
        match attempt {
            None => "failed: the client could not reach the master".into(),
            Some(result) => format!("the store answered {result:?}"),
        }
    }

    /// What TCP connections to `targets` got.
    fn connected(seen: &std::collections::BTreeMap<String, reach::Reach>) -> String {
        if tenants::all_closed(seen) {
            format!("failed: {seen:?}")
        } else {
            format!("connected: {seen:?}")
        }
    }

    #[test]
    fn a_dedicated_backend_refuses_every_attack_from_a_namespace_bound_to_another_backend() {
        operator();
        let cluster = cluster();
        let kc = cluster.control_plane.kubeconfig.clone();
        block_on(async move { attacked(&client_from(&kc).await?, cluster).await })
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// The attacks on the dedicated backend, its control before and after.
    async fn attacked(client: &Client, cluster: &NodeCluster) -> Result<(), Error> {
        tenants::apply_tenant(client, ATTACKER).await?;
        let victim = warm_store(client, cluster).await?;
        let started = Instant::now();
        // The attacker's namespace is bound, to its own backend; the dedicated backend lists
        // its one namespace.
        let listed = |b: &KVCacheBackend| {
            b.status
                .as_ref()
                .map(|s| s.bound_namespaces.clone())
                .unwrap_or_default()
        };
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        wait_object(
            &backends,
            ATTACKER.0,
            "boundNamespaces listing the attacker's namespace",
            WAIT,
            |b| listed(b).iter().any(|ns| ns == ATTACKER.1),
        )
        .await?;
        assert_eq!(listed(&victim), [BOUND], "{}", describe(&victim));

        // The leader serves throughout: no restart between the control and the attacks.
        let _serving = WARM_LEADER.lock().await;
        let t = tenants::targets(client, BACKEND).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let etcd = pods::wait_ready(&store, &backend_pods(BACKEND, "etcd"), 1, WAIT).await?;
        let etcd_ip = ip_of(&etcd[0]).expect("the etcd Pod's address").to_owned();
        let own = prober_as(
            client,
            BOUND,
            "victim",
            serde_json::json!({"app": "victim"}),
        )
        .await?;
        let attacker = prober_as(
            client,
            ATTACKER.1,
            "attacker",
            serde_json::json!({"app": "attacker"}),
        )
        .await?;

        // The control: the dedicated namespace reaches its master and its members' transfer
        // ports, puts and reads back as its domain (the transfer engine dials the members);
        // the backend's member reaches the etcd; the members listen on their REST port
        // (`tenants::targets`), which answers the operator (`tenants`).
        let store_of: Vec<String> = t.rpc.iter().chain(&t.transfer).cloned().collect();
        tenants::wait_reach(
            client,
            &own,
            &store_of,
            true,
            "the dedicated namespace reaching its store",
        )
        .await?;
        let api_own: Api<Pod> = Api::namespaced(client.clone(), BOUND);
        let code =
            pods::store_put(&api_own, name_of(&own), &t.master, KEY, Some(DOMAIN), 4096).await?;
        assert_eq!(code, 0, "the dedicated namespace's put as {DOMAIN}");
        assert_eq!(
            pods::store_get(&api_own, name_of(&own), &t.master, KEY, Some(DOMAIN)).await?,
            Lookup::Hit(4096),
            "the dedicated namespace's read as {DOMAIN}"
        );
        wait_reach(
            client,
            &t.members[0],
            &etcd_ip,
            true,
            "a member of the backend reaching the etcd",
        )
        .await?;

        // The attacks, each run to its end before any is judged (a broken policy shows
        // every one that gets through). The store client's three at once: each waits up to
        // a minute for a master that does not answer.
        let api_x: Api<Pod> = Api::namespaced(client.clone(), ATTACKER.1);
        let spoofed = |op| StoreAttempt {
            op,
            key: KEY,
            tenant: DOMAIN,
            segment: 0,
        };
        let (read, remove) = (spoofed("get"), spoofed("remove"));
        let rogue = StoreAttempt {
            op: "mount",
            key: "",
            tenant: "",
            segment: ROGUE_SEGMENT,
        };
        let (read, removed, mounted) = tokio::join!(
            reach::store_attempt(&api_x, &attacker, &t.master, &read),
            reach::store_attempt(&api_x, &attacker, &t.master, &remove),
            reach::store_attempt(&api_x, &attacker, &t.master, &rogue),
        );
        let etcd_target = vec![format!("{etcd_ip}:2379")];
        let mut master_ports = t.rpc.clone();
        master_ports.push(t.admin.clone());
        let attacks = [
            (
                "a read of the dedicated domain's key, the client's tenant id set to it",
                answered(read?),
            ),
            (
                "a remove of that key, the same tenant id",
                answered(removed?),
            ),
            (
                "a rogue segment mounted on the master (the client's setup with a 16 MiB global segment)",
                answered(mounted?),
            ),
            (
                "a raw transfer-engine connection to the members' transfer ports",
                connected(&tenants::seen(client, &attacker, &t.transfer).await?),
            ),
            (
                "the members' REST API",
                connected(&tenants::seen(client, &attacker, &t.rest).await?),
            ),
            (
                "the etcd's client port",
                connected(&tenants::seen(client, &attacker, &etcd_target).await?),
            ),
            (
                "the master's RPC and admin ports",
                connected(&tenants::seen(client, &attacker, &master_ports).await?),
            ),
        ];
        let got_through = through(&attacks);
        assert!(
            got_through.is_empty(),
            "attacks from {} (bound to {}) on {BACKEND} (dedicated to {BOUND}) got through:\n{}",
            ATTACKER.1,
            ATTACKER.0,
            got_through.join("\n")
        );
        // Nothing was removed: the dedicated namespace reads its key back.
        assert_eq!(
            pods::store_get(&api_own, name_of(&own), &t.master, KEY, Some(DOMAIN)).await?,
            Lookup::Hit(4096),
            "the dedicated namespace's key after the attacks"
        );
        println!(
            "dedicated backend {BACKEND} under kube-router, attacked from {} (bound to {}), {:.1}s:\n{}",
            ATTACKER.1,
            ATTACKER.0,
            started.elapsed().as_secs_f64(),
            attacks
                .iter()
                .map(|(attack, seen)| format!("  {attack}: {seen}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        Ok(())
    }
}

/// Revocation (docs/isolation.md#revocation): a Pod of a namespace whose Binding is deleted
/// holds a store client it opened before, as an engine does, and goes on putting and reading on
/// it; a ModelDeployment of the namespace still names the Binding. The enforcer refuses the
/// Pod's new connections at once but lets the open ones go on (seen: the client kept writing
/// and reading for 90 s after the deletion, before the operator revoked the tenant); the
/// tenant's revocation on the master ends both on the open client within [`REVOKED_WITHIN`],
/// the ModelDeployment holds neither the namespace open nor, once it stops naming the Binding,
/// its release, and its status says why.
mod revocation {
    use super::*;
    use kvcache_api::ModelDeployment;
    use kvcache_e2e::holder::{self, Holder};

    /// The namespace whose Binding is deleted, bound to team B's backend (shared with team B).
    const REVOKED: &str = "iso-revoked";
    const REVOKED_DOMAIN: &str = "revoked-kv";
    /// What docs/isolation.md#revocation states: the open client neither writes nor reads
    /// this long after the Binding's deletion.
    const REVOKED_WITHIN: Duration = Duration::from_secs(10);

    #[test]
    fn a_deleted_binding_ends_an_open_clients_writes_and_reads_and_a_deployment_naming_it_is_told()
    {
        operator();
        let cluster = cluster();
        let kc = cluster.control_plane.kubeconfig.clone();
        block_on(async move { revoked(&client_from(&kc).await?).await })
            .unwrap_or_else(|e| panic!("{e}"));
    }

    async fn revoked(client: &Client) -> Result<(), Error> {
        let (backend, _) = tenants::B;
        tenants::apply_tenant(client, tenants::B).await?;
        walkthrough::ensure_namespace(client, REVOKED).await?;
        let pp = PatchParams::apply(walkthrough::MANAGER).force();
        let binding: KVCachePoolBinding = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
            "metadata": {"name": REVOKED, "namespace": REVOKED},
            "spec": {"poolRef": {"name": backend}, "quota": {"ceiling": "32Mi"},
                     "domain": {"name": REVOKED_DOMAIN, "blockSize": 64, "dtype": "bfloat16"}},
        }))
        .expect("a Binding");
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), REVOKED);
        bindings
            .patch(REVOKED, &pp, &Patch::Apply(&binding))
            .await?;
        // A deployment naming the Binding (no replica: what counts is that it names it).
        let md: ModelDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "ModelDeployment",
            "metadata": {"name": "chat", "namespace": REVOKED},
            "spec": {"model": {"name": "m"}, "engine": {"name": "vLLM", "version": images::VLLM_VERSION},
                     "kvCache": {"poolRef": {"name": REVOKED}},
                     "roles": [{"name": "server", "replicas": 0, "instanceType": "cpu"}]},
        }))
        .expect("a ModelDeployment");
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), REVOKED);
        models.patch("chat", &pp, &Patch::Apply(&md)).await?;
        wait_object(
            &bindings,
            REVOKED,
            "QuotaGranted=True, used by chat",
            WAIT,
            |b| {
                has_condition(b, "QuotaGranted=True")
                    && b.status.as_ref().is_some_and(|s| !s.used_by.is_empty())
            },
        )
        .await?;
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        wait_object(
            &backends,
            backend,
            "Ready, admitting the namespace",
            WAIT,
            |b| {
                phase(b) == Some(BackendPhase::Ready)
                    && b.status
                        .as_ref()
                        .is_some_and(|s| s.bound_namespaces.iter().any(|n| n == REVOKED))
            },
        )
        .await?;
        let t = tenants::targets(client, backend).await?;

        // The held client, serving.
        let api: Api<Pod> = Api::namespaced(client.clone(), REVOKED);
        let mut held = Holder::start(
            &api,
            "holder",
            images::STORE.name,
            &t.master,
            REVOKED_DOMAIN,
        )
        .await?;
        held.serving(3, WAIT).await?;
        let pod = api.get("holder").await?;

        let deleted = holder::now();
        let uid = bindings
            .get(REVOKED)
            .await?
            .metadata
            .uid
            .unwrap_or_default();
        bindings.delete(REVOKED, &DeleteParams::default()).await?;
        // New connections: refused, although chat still names the Binding.
        let store_of: Vec<String> = t.rpc.iter().chain(&t.transfer).cloned().collect();
        let closed = tenants::wait_reach(
            client,
            &pod,
            &store_of,
            false,
            "the revoked namespace's new connections refused",
        )
        .await?;
        // The open client: neither writes nor reads.
        let cut = held.cut(deleted, 5, REVOKED_WITHIN).await?;
        let Some(cut) = cut else {
            panic!(
                "{REVOKED}'s open client still writes or reads {REVOKED_WITHIN:?} after its Binding's deletion: the last rounds {:?}",
                &held.rounds[held.rounds.len().saturating_sub(8)..]
            );
        };
        assert!(
            cut.writes <= REVOKED_WITHIN.as_secs_f64() && cut.reads <= REVOKED_WITHIN.as_secs_f64(),
            "{REVOKED}'s open client stopped writing {:.1} s and reading {:.1} s after the deletion, later than {REVOKED_WITHIN:?}",
            cut.writes,
            cut.reads
        );
        // The deployment is told why, and holds the release (not the namespace) while it names
        // the Binding.
        let told = kvcache_e2e::status::wait_condition(
            &models,
            "chat",
            "DomainRegistered=False/BindingDeleted",
            WAIT,
        )
        .await?;
        let why = kvcache_e2e::status::condition(&told, "DomainRegistered")
            .map(|c| c.message.clone())
            .unwrap_or_default();
        assert!(
            why.contains(&format!(
                "KVCachePoolBinding {REVOKED}/{REVOKED} was deleted"
            )),
            "{why}"
        );
        kvcache_e2e::status::wait_condition(
            &bindings,
            REVOKED,
            "Releasable=False/HeldByWorkloads",
            WAIT,
        )
        .await?;
        kvcache_e2e::status::wait_event(client, REVOKED, "TenantRevoked", REVOKED_DOMAIN, WAIT)
            .await?;
        models.delete("chat", &DeleteParams::default()).await?;
        kvcache_e2e::cluster::wait_deleted(
            &bindings,
            REVOKED,
            &uid,
            "the Binding released once chat is gone",
            WAIT,
        )
        .await?;
        api.delete("holder", &DeleteParams::default()).await?;
        println!(
            "revocation on {backend} under kube-router: new connections refused after {closed:.1?}; the open client's writes refused from {:.2} s and its reads from {:.2} s after the deletion (refusals {:?}; {} rounds read after it); chat told {}",
            cut.writes, cut.reads, cut.refusals, cut.rounds, why
        );
        Ok(())
    }
}

/// Waits until every `port` of `to` is reached (`open`) or refused from `from`.
async fn wait_ports(
    client: &Client,
    from: &Pod,
    to: &Pod,
    ports: &[String],
    open: bool,
) -> Result<(), Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &from.namespace().unwrap_or_default());
    let ip = ip_of(to).unwrap_or_default();
    let targets: Vec<String> = ports.iter().map(|p| format!("{ip}:{p}")).collect();
    let what = format!(
        "{} of {} {} {ports:?} of {} of {}",
        name_of(from),
        from.namespace().unwrap_or_default(),
        if open { "connecting to" } else { "refused at" },
        name_of(to),
        to.namespace().unwrap_or_default()
    );
    reach::wait_reach(&api, name_of(from), &targets, open, WAIT, &what)
        .await
        .map(drop)
}

/// The ports something listens on in `pod` but `declared`: its transfer engine's, for an
/// engine attached to the store (none would make the test below prove nothing).
async fn undeclared_listeners(
    client: &Client,
    pod: &Pod,
    declared: &str,
) -> Result<Vec<String>, Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let ports: Vec<String> = reach::listening(&api, pod, None)
        .await?
        .iter()
        .filter_map(|t| t.rsplit_once(':').map(|(_, p)| p.to_owned()))
        .filter(|p| p != declared)
        .collect();
    assert!(
        !ports.is_empty(),
        "{} listens on nothing but {declared}: its transfer engine's port is what the policy must close",
        name_of(pod)
    );
    Ok(ports)
}

#[test]
fn an_engines_transfer_port_takes_its_own_deployment_alone_and_its_declared_port_everyone() {
    use kvcache_api::ModelDeployment;
    use kvcache_api::model::InstanceType;
    use kvcache_render::objects::engine_access::ENGINE_POLICY_LABEL;
    let webhook = operator()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .webhook
        .clone()
        .expect("the operator serves its webhook");
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        // The engines store at start: the leader serves throughout.
        let _serving = WARM_LEADER.lock().await;
        warm_store(&client, cluster).await?;
        let pp = PatchParams::apply(walkthrough::MANAGER).force();
        let it: InstanceType = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "InstanceType",
            "metadata": {"name": "engine-policy"},
            "spec": {"nodeSelector": {"gpustack.ai/instance-type": "gpu-a10-24g"},
                     "accelerator": {"resourceName": "nvidia.com/gpu", "manufacturer": "nvidia"},
                     "resources": {"cpu": walkthrough::DEMO_ROLE_CPU, "memory": walkthrough::DEMO_ROLE_MEMORY}}
        }))
        .expect("an InstanceType");
        Api::<InstanceType>::all(client.clone())
            .patch("engine-policy", &pp, &Patch::Apply(&it))
            .await?;
        let model = |policy: &str| {
            serde_json::from_value::<ModelDeployment>(serde_json::json!({
                "apiVersion": "worker.gpustack.ai/v1", "kind": "ModelDeployment",
                "metadata": {"name": "chat", "namespace": BOUND},
                "spec": {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
                         "engine": {"name": "vLLM", "version": "0.29.0"},
                         "kvCache": {"poolRef": {"name": BOUND}},
                         "networkPolicy": policy,
                         "roles": [{"name": "server", "replicas": 2, "instanceType": "engine-policy",
                                    "resources": {"accelerator": 1}}]}
            }))
            .expect("a ModelDeployment")
        };
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), BOUND);
        models
            .patch("chat", &pp, &Patch::Apply(&model("DeclaredPorts")))
            .await?;
        let team: Api<Pod> = Api::namespaced(client.clone(), BOUND);
        let engines =
            pods::wait_ready(&team, &walkthrough::role_pods("chat", "server"), 2, WAIT).await?;
        let (a, b) = (&engines[0], &engines[1]);
        let serving = kvcache_render::objects::model::SERVING_PORT;
        let http = vec![serving.to_string()];
        let transfer = undeclared_listeners(&client, a, &http[0]).await?;
        let outsider =
            prober_as(&client, OTHER, "outsider", serde_json::json!({"app": "outsider"})).await?;

        // From another namespace: the declared port answers, the transfer engine's do not.
        wait_ports(&client, &outsider, a, &http, true).await?;
        wait_ports(&client, &outsider, a, &transfer, false).await?;
        // From the deployment's other replica: every port.
        wait_ports(&client, b, a, &transfer, true).await?;

        // A Pod opted in by label asks for the same through its annotation: its own policy,
        // owned by it, closing all but its declared port.
        kvcache_e2e::operator::register_webhooks(&client, NAMESPACE, &webhook, false).await?;
        kvcache_e2e::operator::wait_webhooks_trusted(&client, NAMESPACE).await?;
        let labelled: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "labelled", "namespace": BOUND,
                         "labels": {"app": "labelled", "kvcache.gpustack.ai/inject": "true"},
                         "annotations": {"kvcache.gpustack.ai/binding": BOUND,
                                         "kvcache.gpustack.ai/engine": "vLLM",
                                         "kvcache.gpustack.ai/network-policy": "DeclaredPorts"}},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "containers": [{
                "name": "engine", "image": "docker.io/gpustack/runner:cpu-vllm0.29.0",
                "imagePullPolicy": "Never",
                "command": ["vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct"],
                "ports": [{"containerPort": serving, "name": "http"}],
                "resources": {"requests": {"cpu": walkthrough::DEMO_ROLE_CPU, "memory": walkthrough::DEMO_ROLE_MEMORY},
                              "limits": {"memory": walkthrough::DEMO_ROLE_MEMORY}},
                "readinessProbe": {"httpGet": {"path": "/health", "port": serving}}
            }]}
        }))
        .expect("a Pod");
        team.create(&PostParams::default(), &labelled).await?;
        let labelled = pods::wait_pod(&team, "labelled", "Ready", WAIT, pods::is_ready).await?;
        let token = labelled
            .labels()
            .get(ENGINE_POLICY_LABEL)
            .cloned()
            .expect("the webhook labelled the Pod for its policy");
        let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
            Api::namespaced(client.clone(), BOUND);
        let policy = wait_object(
            &policies,
            &format!("engine-{token}"),
            "the labelled Pod's policy",
            WAIT,
            |_| true,
        )
        .await?;
        assert_eq!(
            policy
                .metadata
                .owner_references
                .as_ref()
                .and_then(|o| o.first())
                .map(|o| o.uid.as_str()),
            labelled.metadata.uid.as_deref(),
            "owned by the Pod"
        );
        let its_transfer = undeclared_listeners(&client, &labelled, &http[0]).await?;
        wait_ports(&client, &outsider, &labelled, &http, true).await?;
        wait_ports(&client, &outsider, &labelled, &its_transfer, false).await?;
        // Gone with its Pod (the garbage collector follows the owner).
        team.delete("labelled", &DeleteParams::default()).await?;
        kvcache_e2e::cluster::wait_deleted(
            &policies,
            &format!("engine-{token}"),
            policy.metadata.uid.as_deref().unwrap_or_default(),
            "the labelled Pod's policy collected with the Pod",
            WAIT,
        )
        .await?;

        // Turned off: the policy goes, and the transfer port answers anyone (what the policy
        // closed above; an enforcer that admitted everything would have failed there).
        models
            .patch("chat", &pp, &Patch::Apply(&model("Unmanaged")))
            .await?;
        wait_ports(&client, &outsider, a, &transfer, true).await?;

        walkthrough::remove_model(&client, BOUND, "chat", WAIT).await?;
        Api::<Pod>::namespaced(client.clone(), OTHER)
            .delete(name_of(&outsider), &DeleteParams::default())
            .await?;
        Api::<InstanceType>::all(client.clone())
            .delete("engine-policy", &DeleteParams::default())
            .await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
