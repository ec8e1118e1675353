//! The NetworkPolicies a managed backend renders (`kvcache_render::backend::access`): who
//! reaches the leader's RPC and admin ports and the members, and what the host network leaves
//! out.

use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvcache_api::KVCacheBackend;
use kvcache_render::backend::access::uncovered_groups;
use kvcache_render::backend::{ADMIN_PORT, BackendInputs, RPC_PORT, StoreAccess, render};

const NS: &str = "gpustack-system";

fn backend(members: &str) -> KVCacheBackend {
    serde_yaml::from_str(&format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: mooncake-dram, uid: u1}}\nspec:\n  connection:\n    managed:\n      members:\n{members}"
    ))
    .expect("a backend")
}

const DRAM: &str = "        - medium: DRAM\n          capacityPerMember: 1Gi\n";
const RDMA: &str = "        - medium: DRAM\n          capacityPerMember: 1Gi\n          transport: {protocol: RDMA}\n          fabricInterfaceCount: 1\n";

fn policies(
    b: &KVCacheBackend,
    bound: &[String],
    access: &StoreAccess,
) -> (Vec<NetworkPolicy>, Vec<String>) {
    let o = render(&BackendInputs {
        backend: b,
        store_image: "img:0.3.13.post1",
        namespace: NS,
        elector_image: "elector:1",
        etcd_image: "etcd:1",
        bound_namespaces: bound,
        policy: None,
        access,
    })
    .expect("renders");
    (o.network_policies, uncovered_groups(&o.daemon_sets))
}

fn named<'a>(ps: &'a [NetworkPolicy], name: &str) -> &'a NetworkPolicy {
    ps.iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no policy {name} in {ps:?}"))
}

/// The peers of the rule on `port` (`None`: the rule of every port).
fn peers(p: &NetworkPolicy, port: Option<i32>) -> Vec<NetworkPolicyPeer> {
    let spec = p.spec.as_ref().expect("a spec");
    assert_eq!(
        spec.policy_types.as_deref(),
        Some(&["Ingress".to_owned()][..])
    );
    spec.ingress
        .as_ref()
        .expect("ingress rules")
        .iter()
        .find(|r| {
            let ports: Option<Vec<i32>> = r.ports.as_ref().map(|ps| {
                ps.iter()
                    .filter_map(|p| match p.port {
                        Some(IntOrString::Int(n)) => Some(n),
                        _ => None,
                    })
                    .collect()
            });
            ports == port.map(|n| vec![n])
        })
        .and_then(|r| r.from.clone())
        .unwrap_or_else(|| panic!("no rule for port {port:?} in {p:?}"))
}

/// The namespaces a peer selects by name, and the Pod labels it selects.
fn describe(peer: &NetworkPolicyPeer) -> String {
    let names = peer
        .namespace_selector
        .as_ref()
        .and_then(|s| s.match_expressions.as_ref())
        .map(|e| {
            e.iter()
                .flat_map(|r| r.values.clone().unwrap_or_default())
                .collect::<Vec<_>>()
                .join(",")
        });
    let pods = peer
        .pod_selector
        .as_ref()
        .and_then(|s| s.match_labels.as_ref())
        .map(|l| {
            l.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        });
    let block = peer.ip_block.as_ref().map(|b| b.cidr.clone());
    format!(
        "ns[{}] pods[{}] ip[{}]",
        names.unwrap_or_default(),
        pods.unwrap_or_default(),
        block.unwrap_or_default()
    )
}

const OWN: &str = "ns[] pods[app.kubernetes.io/instance=mooncake-dram,app.kubernetes.io/name=kv-cache-backend] ip[]";

#[test]
fn the_leader_takes_rpc_from_its_backend_and_bound_namespaces_and_admin_from_the_operator_only() {
    let b = backend(DRAM);
    let bound = vec!["team-a".to_owned(), "team-b".to_owned()];
    let (ps, uncovered) = policies(&b, &bound, &StoreAccess::IN_CLUSTER);
    assert!(uncovered.is_empty());
    let leader = named(&ps, "mooncake-dram-leader");
    let selects = leader.spec.as_ref().and_then(|s| s.pod_selector.clone());
    assert_eq!(
        selects
            .and_then(|s| s.match_labels)
            .and_then(|l| l.get("app.kubernetes.io/component").cloned())
            .as_deref(),
        Some("leader")
    );
    let rpc: Vec<String> = peers(leader, Some(RPC_PORT)).iter().map(describe).collect();
    assert_eq!(rpc, [OWN, "ns[team-a,team-b] pods[] ip[]"]);
    let admin: Vec<String> = peers(leader, Some(ADMIN_PORT))
        .iter()
        .map(describe)
        .collect();
    assert_eq!(
        admin,
        [format!(
            "ns[{NS}] pods[app.kubernetes.io/name=kvcache-operator] ip[]"
        )],
        "the ledger and /metrics: the operator alone, not even the backend's members"
    );
    // Owned by the backend (swept with it).
    assert_eq!(
        leader
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(kvcache_render::backend::OWNER_LABEL))
            .map(String::as_str),
        Some("u1")
    );
}

#[test]
fn no_bound_namespace_leaves_the_store_to_its_own_pods() {
    let (ps, _) = policies(&backend(DRAM), &[], &StoreAccess::IN_CLUSTER);
    let rpc: Vec<String> = peers(named(&ps, "mooncake-dram-leader"), Some(RPC_PORT))
        .iter()
        .map(describe)
        .collect();
    assert_eq!(rpc, [OWN]);
    let members: Vec<String> = peers(named(&ps, "mooncake-dram-members"), None)
        .iter()
        .map(describe)
        .collect();
    assert_eq!(members, [OWN]);
}

#[test]
fn members_take_every_port_from_peers_and_a_host_network_group_is_named_not_covered() {
    let b = backend(&format!("{DRAM}{RDMA}"));
    let bound = vec!["team-a".to_owned()];
    let (ps, uncovered) = policies(&b, &bound, &StoreAccess::IN_CLUSTER);
    let members = named(&ps, "mooncake-dram-members");
    let from: Vec<String> = peers(members, None).iter().map(describe).collect();
    assert_eq!(from, [OWN, "ns[team-a] pods[] ip[]"]);
    let components: Vec<String> = members
        .spec
        .as_ref()
        .and_then(|s| s.pod_selector.as_ref())
        .and_then(|s| s.match_expressions.clone())
        .unwrap_or_default()
        .into_iter()
        .flat_map(|r| r.values.unwrap_or_default())
        .collect();
    assert_eq!(components, ["member-0"], "the fabric group is not selected");
    assert_eq!(uncovered, ["mooncake-dram-member-1"]);

    // Every group on the host network: no members policy at all.
    let (ps, uncovered) = policies(&backend(RDMA), &bound, &StoreAccess::IN_CLUSTER);
    assert_eq!(ps.len(), 1, "{ps:?}");
    assert_eq!(uncovered, ["mooncake-dram-member-0"]);
}

#[test]
fn an_operator_outside_a_pod_and_the_monitoring_namespace_reach_the_admin_port_only() {
    let access = StoreAccess {
        admin_from: vec!["10.200.0.2/32".into()],
        metrics_from: vec!["monitoring".into()],
    };
    let (ps, _) = policies(&backend(DRAM), &[], &access);
    let leader = named(&ps, "mooncake-dram-leader");
    let admin: Vec<String> = peers(leader, Some(ADMIN_PORT))
        .iter()
        .map(describe)
        .collect();
    assert_eq!(
        admin,
        [
            format!("ns[{NS}] pods[app.kubernetes.io/name=kvcache-operator] ip[]"),
            "ns[] pods[] ip[10.200.0.2/32]".to_owned(),
            "ns[monitoring] pods[] ip[]".to_owned(),
        ]
    );
    let rpc: Vec<String> = peers(leader, Some(RPC_PORT)).iter().map(describe).collect();
    assert_eq!(rpc, [OWN], "neither reaches the master's RPC port");
}
