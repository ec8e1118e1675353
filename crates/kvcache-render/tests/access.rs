//! The NetworkPolicies a managed backend renders (`kvcache_render::objects::backend::access`): who
//! reaches the leader's RPC, admin and elector ports, the members' transfer and REST ports, and
//! a warm backend's etcd; what the host network leaves out.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvcache_api::KVCacheBackend;
use kvcache_render::objects::backend::access::{
    EPHEMERAL_PORTS, TRANSFER_PORT_ENV, TRANSFER_PORTS, member_ports, uncovered_groups,
};
use kvcache_render::objects::backend::{
    ADMIN_PORT, BackendInputs, BackendObjects, RPC_PORT, StoreAccess, client_endpoint, render,
};

const NS: &str = "gpustack-system";
/// The leader elector's port, where it answers `/identity`.
const ELECTOR_PORT: i32 = 8090;
/// The first member group's REST port.
const REST: i32 = 8080;

fn backend_with(leader: &str, members: &str) -> KVCacheBackend {
    serde_yaml::from_str(&format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: mooncake-dram, uid: u1}}\nspec:\n  connection:\n    managed:\n      leader: {{{leader}}}\n      members:\n{members}"
    ))
    .expect("a backend")
}

fn backend(members: &str) -> KVCacheBackend {
    backend_with("", members)
}

const DRAM: &str = "        - medium: DRAM\n          capacityPerMember: 1Gi\n";
const RDMA: &str = "        - medium: DRAM\n          capacityPerMember: 1Gi\n          transport: {protocol: RDMA}\n          fabricInterfaceCount: 1\n";
const TIERED: &str = "        - medium: DRAM\n          capacityPerMember: 1Gi\n          localDisks: [{path: /var/lib/kvcache, capacity: 10Gi}]\n";

fn objects(b: &KVCacheBackend, bound: &[String], access: &StoreAccess) -> BackendObjects {
    render(&BackendInputs {
        backend: b,
        store_image: "img:0.3.13.post1",
        namespace: NS,
        elector_image: "elector:1",
        etcd_image: "etcd:1",
        bound_namespaces: bound,
        policy: None,
        access,
    })
    .expect("renders")
}

fn policies(
    b: &KVCacheBackend,
    bound: &[String],
    access: &StoreAccess,
) -> (Vec<NetworkPolicy>, Vec<String>) {
    let o = objects(b, bound, access);
    (o.network_policies, uncovered_groups(&o.daemon_sets))
}

fn named<'a>(ps: &'a [NetworkPolicy], name: &str) -> &'a NetworkPolicy {
    ps.iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no policy {name} in {ps:?}"))
}

/// The ports a rule names, each as `(port, endPort)`.
type Ports = Vec<(i32, Option<i32>)>;

/// Each ingress rule of `p`: the ports it names and its peers, described.
fn rules(p: &NetworkPolicy) -> Vec<(Ports, Vec<String>)> {
    let spec = p.spec.as_ref().expect("a spec");
    assert_eq!(
        spec.policy_types.as_deref(),
        Some(&["Ingress".to_owned()][..])
    );
    spec.ingress
        .as_ref()
        .expect("ingress rules")
        .iter()
        .map(|r| {
            let ports = r
                .ports
                .as_ref()
                .unwrap_or_else(|| panic!("a rule of every port in {p:?}"))
                .iter()
                .map(|p| {
                    assert_eq!(p.protocol.as_deref(), Some("TCP"));
                    match p.port {
                        Some(IntOrString::Int(n)) => (n, p.end_port),
                        ref other => panic!("a port by number: {other:?}"),
                    }
                })
                .collect();
            let from = r
                .from
                .as_ref()
                .expect("peers")
                .iter()
                .map(describe)
                .collect();
            (ports, from)
        })
        .collect()
}

/// Who reaches `port` of the Pods `p` selects (every rule naming it, its peers described).
fn peers(p: &NetworkPolicy, port: i32) -> Vec<String> {
    rules(p)
        .into_iter()
        .filter(|(ports, _)| {
            ports
                .iter()
                .any(|&(first, last)| (first..=last.unwrap_or(first)).contains(&port))
        })
        .flat_map(|(_, from)| from)
        .collect()
}

/// Ports one by one, as a policy names them.
fn each(first: i32, last: i32) -> Ports {
    (first..=last).map(|n| (n, None)).collect()
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
const OPERATOR: &str = "ns[gpustack-system] pods[app.kubernetes.io/name=kvcache-operator] ip[]";

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
    assert_eq!(
        peers(leader, RPC_PORT),
        [OWN, "ns[team-a,team-b] pods[] ip[]"]
    );
    assert_eq!(
        peers(leader, ADMIN_PORT),
        [OPERATOR],
        "the ledger and /metrics: the operator alone, not even the backend's members"
    );
    assert_eq!(
        rules(leader)
            .into_iter()
            .map(|(ports, _)| ports)
            .collect::<Vec<_>>(),
        [vec![(RPC_PORT, None)], vec![(ADMIN_PORT, None)]],
        "members find the master by the Service: no elector port to open"
    );
    // Owned by the backend (swept with it).
    assert_eq!(
        leader
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(kvcache_render::objects::backend::OWNER_LABEL))
            .map(String::as_str),
        Some("u1")
    );
}

#[test]
fn lease_addressed_members_reach_the_leader_electors_identity_and_nobody_else_does() {
    let b = backend_with("replicas: 2, memberAddressing: Lease", DRAM);
    let bound = vec!["team-a".to_owned()];
    let access = StoreAccess {
        admin_from: vec!["10.200.0.2/32".into()],
        metrics_from: vec!["monitoring".into()],
    };
    let (ps, _) = policies(&b, &bound, &access);
    let leader = named(&ps, "mooncake-dram-leader");
    assert_eq!(peers(leader, ELECTOR_PORT), [OWN]);
    // The same elector with Service addressing: nobody asks it, the port stays closed.
    let (ps, _) = policies(&backend_with("replicas: 2", DRAM), &bound, &access);
    assert!(peers(named(&ps, "mooncake-dram-leader"), ELECTOR_PORT).is_empty());
}

#[test]
fn no_bound_namespace_leaves_the_store_to_its_own_pods() {
    let (ps, _) = policies(&backend(DRAM), &[], &StoreAccess::IN_CLUSTER);
    assert_eq!(peers(named(&ps, "mooncake-dram-leader"), RPC_PORT), [OWN]);
    assert_eq!(
        peers(named(&ps, "mooncake-dram-members"), TRANSFER_PORTS.0),
        [OWN]
    );
}

#[test]
fn members_take_their_transfer_ports_from_peers_and_their_rest_port_from_the_operator_alone() {
    let b = backend(&format!("{DRAM}{RDMA}"));
    let bound = vec!["team-a".to_owned()];
    let access = StoreAccess {
        admin_from: vec!["10.200.0.2/32".into()],
        metrics_from: vec!["monitoring".into()],
    };
    let (ps, uncovered) = policies(&b, &bound, &access);
    let members = named(&ps, "mooncake-dram-members");
    let (first, last) = TRANSFER_PORTS;
    assert_eq!(
        rules(members),
        [
            (
                each(first, last),
                vec![OWN.to_owned(), "ns[team-a] pods[] ip[]".to_owned()]
            ),
            (
                vec![(REST, None)],
                vec![
                    OPERATOR.to_owned(),
                    "ns[] pods[] ip[10.200.0.2/32]".to_owned()
                ]
            ),
        ],
        "the REST API: neither a bound namespace, the monitoring grant, nor the backend's own Pods"
    );
    // Nothing else of the member is open: not a port beside the range.
    for port in [first - 1, last + 1, REST + 1, EPHEMERAL_PORTS.0] {
        assert!(peers(members, port).is_empty(), "port {port}");
    }
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

/// The member container's literal environment value of `name`.
fn env_of(ds: &DaemonSet, name: &str) -> Vec<String> {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| p.containers[0].env.clone().unwrap_or_default())
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.name == name)
        .filter_map(|e| e.value)
        .collect()
}

#[test]
fn the_member_pins_the_ports_the_policy_names_and_a_host_network_group_keeps_the_stores_range() {
    let o = objects(
        &backend(&format!("{DRAM}{RDMA}")),
        &[],
        &StoreAccess::IN_CLUSTER,
    );
    let (first, last) = TRANSFER_PORTS;
    let pinned = &o.daemon_sets[0];
    assert_eq!(env_of(pinned, TRANSFER_PORT_ENV[0]), [first.to_string()]);
    assert_eq!(env_of(pinned, TRANSFER_PORT_ENV[1]), [last.to_string()]);
    let ports = member_ports(pinned).expect("a member container");
    assert_eq!(
        (ports.rest, ports.transfer, ports.offload_rpc),
        (REST, TRANSFER_PORTS, false)
    );
    // The fabric group shares its node's ports with the node's other store processes.
    let fabric = &o.daemon_sets[1];
    assert!(env_of(fabric, TRANSFER_PORT_ENV[0]).is_empty());
    assert_eq!(
        member_ports(fabric).map(|p| p.transfer),
        Some((15000, 17000))
    );
}

#[test]
fn a_groups_own_transfer_range_is_what_its_policy_names() {
    let group = "        - medium: DRAM\n          capacityPerMember: 1Gi\n          extraEnv: [{name: MC_MIN_RPC_PORT, value: \"20000\"}, {name: MC_MAX_RPC_PORT, value: \"20001\"}]\n";
    let b = backend(&format!("{DRAM}{group}"));
    let bound = vec!["team-a".to_owned()];
    let o = objects(&b, &bound, &StoreAccess::IN_CLUSTER);
    // One entry of each name: the group's.
    assert_eq!(env_of(&o.daemon_sets[1], "MC_MIN_RPC_PORT"), ["20000"]);
    assert_eq!(env_of(&o.daemon_sets[1], "MC_MAX_RPC_PORT"), ["20001"]);
    let members = named(&o.network_policies, "mooncake-dram-members");
    let (first, last) = TRANSFER_PORTS;
    let mut transfer = each(first, last);
    transfer.extend(each(20000, 20001));
    assert_eq!(rules(members)[0].0, transfer);
    assert_eq!(rules(members)[1].0, [(REST, None), (REST + 1, None)]);
    assert_eq!(peers(members, 20001), [OWN, "ns[team-a] pods[] ip[]"]);
}

#[test]
fn a_disk_tier_opens_the_kernels_ephemeral_ports_to_peers_and_still_not_the_rest_port() {
    let bound = vec!["team-a".to_owned()];
    let (ps, _) = policies(&backend(TIERED), &bound, &StoreAccess::IN_CLUSTER);
    let members = named(&ps, "mooncake-dram-members");
    let (first, last) = TRANSFER_PORTS;
    let mut transfer = each(first, last);
    transfer.push((EPHEMERAL_PORTS.0, Some(EPHEMERAL_PORTS.1)));
    assert_eq!(rules(members)[0].0, transfer);
    assert_eq!(peers(members, 46435), [OWN, "ns[team-a] pods[] ip[]"]);
    assert_eq!(peers(members, REST), [OPERATOR]);
}

#[test]
fn an_operator_outside_a_pod_and_the_monitoring_namespace_reach_the_admin_port_only() {
    let access = StoreAccess {
        admin_from: vec!["10.200.0.2/32".into()],
        metrics_from: vec!["monitoring".into()],
    };
    let (ps, _) = policies(&backend(DRAM), &[], &access);
    let leader = named(&ps, "mooncake-dram-leader");
    assert_eq!(
        peers(leader, ADMIN_PORT),
        [
            OPERATOR.to_owned(),
            "ns[] pods[] ip[10.200.0.2/32]".to_owned(),
            "ns[monitoring] pods[] ip[]".to_owned(),
        ]
    );
    assert_eq!(
        peers(leader, RPC_PORT),
        [OWN],
        "neither reaches the master's RPC port"
    );
}

#[test]
fn a_warm_backends_etcd_answers_its_own_pods_alone_and_clients_dial_the_leader_service() {
    let b = backend_with("electionBackend: Etcd, replicas: 2", DRAM);
    let bound = vec!["team-a".to_owned()];
    let o = objects(&b, &bound, &StoreAccess::IN_CLUSTER);
    let etcd = o.etcd_policy.as_ref().expect("the etcd's policy");
    assert_eq!(etcd.metadata.name.as_deref(), Some("mooncake-dram-etcd"));
    assert_eq!(
        rules(etcd),
        [
            (vec![(2379, None)], vec![OWN.to_owned()]),
            (
                vec![(2380, None)],
                vec![
                    "ns[] pods[app.kubernetes.io/component=etcd,app.kubernetes.io/instance=mooncake-dram,app.kubernetes.io/name=kv-cache-backend] ip[]"
                        .to_owned()
                ]
            ),
        ],
        "no bound namespace reaches the etcd: none needs it"
    );
    // Members and engines find the serving master through the leader Service.
    let service = "mooncake-dram-leader.gpustack-system.svc:50051";
    assert_eq!(client_endpoint("mooncake-dram", NS), service);
    assert_eq!(env_of(&o.daemon_sets[0], "MOONCAKE_MASTER"), [service]);
    assert_eq!(
        peers(named(&o.network_policies, "mooncake-dram-leader"), RPC_PORT),
        [OWN, "ns[team-a] pods[] ip[]"]
    );
}
