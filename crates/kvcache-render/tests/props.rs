//! Properties of the backend render: never panics, deterministic, valid names, honest memory
//! requests, a Service that selects exactly the leader, and fingerprints that only move when a
//! member's Pod really changes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvcache_api::KVCacheBackend;
use kvcache_api::Quantity;
use kvcache_api::backend::*;
use kvcache_render::objects::backend::{BackendInputs, render};
use proptest::prelude::*;

/// An operator in a Pod (a `static`: the inputs borrow it beyond one expression).
static IN_CLUSTER: kvcache_render::objects::backend::StoreAccess =
    kvcache_render::objects::backend::StoreAccess::IN_CLUSTER;

fn group() -> impl Strategy<Value = MemberGroup> {
    (
        any::<bool>(),
        1u64..(1 << 36),
        prop::option::of(1u64..(1 << 28)),
        any::<bool>(),
        prop::option::of(prop_oneof![
            Just(Protocol::Rdma),
            Just(Protocol::Efa),
            Just(Protocol::Tcp)
        ]),
        0usize..3,
    )
        .prop_map(|(vram, seg, buf, tier, proto, selectors)| MemberGroup {
            node_selector: (0..selectors)
                .map(|i| (format!("k{i}"), "v".to_string()))
                .collect(),
            medium: if vram { Medium::Vram } else { Medium::Dram },
            capacity_per_member: Quantity::from_bytes(seg),
            local_buffer_size: buf.map(Quantity::from_bytes),
            image: None,
            transport: proto.map(|p| GroupTransport { protocol: Some(p) }),
            fabric_interface_count: None,
            extra_args: vec![],
            extra_env: vec![],
            runtime_class_name: None,
            host_paths: vec![],
            security_context: None,
            local_disks: if tier {
                vec![LocalDisk {
                    path: "/var/lib/kvcache".into(),
                    capacity: None,
                    key_limit: None,
                    eviction: None,
                    clean_after_delete: false,
                }]
            } else {
                vec![]
            },
            resources: None,
        })
}

fn backend() -> impl Strategy<Value = KVCacheBackend> {
    (
        // Object names may start with a digit; a Service name may not.
        "[a-z0-9][a-z0-9.-]{0,90}",
        1i32..6,
        0u8..4,
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(group(), 1..5),
    )
        .prop_map(
            |(name, replicas, none, lease, mt, members)| KVCacheBackend {
                metadata: ObjectMeta {
                    name: Some(name),
                    ..Default::default()
                },
                spec: KVCacheBackendSpec {
                    r#type: BackendType::Mooncake,
                    image: None,
                    image_pull_secrets: vec![],
                    image_pull_policy: None,
                    transport: Transport::default(),
                    connection: Connection {
                        managed: Some(Managed {
                            leader: Leader {
                                replicas,
                                election_backend: match none {
                                    0 => ElectionBackend::None,
                                    1 => ElectionBackend::Etcd,
                                    _ => ElectionBackend::Kubernetes,
                                },
                                etcd: None,
                                member_addressing: lease.then_some(MemberAddressing::Lease),
                                allocation_strategy: AllocationStrategy::FreeRatioFirst,
                                multi_tenancy: mt,
                                extra_args: vec![],
                                extra_env: vec![],
                                resources: None,
                            },
                            members,
                            scale_in: None,
                            priority_class_name: None,
                        }),
                        external: None,
                    },
                    tenancy: Default::default(),
                },
                status: None,
            },
        )
}

fn inputs(b: &KVCacheBackend) -> BackendInputs<'_> {
    BackendInputs {
        backend: b,
        store_image: "gpustack/mirrored-mooncake:0.3.13.post1-cpu",
        namespace: "gpustack-system",
        elector_image: "elector:1",
        etcd_image: "etcd:1",
        bound_namespaces: &[],
        policy: None,
        access: &IN_CLUSTER,
    }
}

fn hashes(b: &KVCacheBackend) -> Vec<String> {
    render(&inputs(b))
        .expect("renders")
        .daemon_sets
        .iter()
        .map(kvcache_render::objects::backend::pod_spec_hash)
        .collect()
}

fn subset(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> bool {
    a.iter().all(|(k, v)| b.get(k) == Some(v))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn render_properties(b in backend()) {
        let first = render(&inputs(&b)).expect("renders");
        let again = render(&inputs(&b)).expect("renders");
        prop_assert_eq!(serde_json::to_string(&first.daemon_sets).expect("json"), serde_json::to_string(&again.daemon_sets).expect("json"), "deterministic");
        prop_assert_eq!(&first, &again);

        let mut names: Vec<String> = first.daemon_sets.iter().filter_map(|d| d.metadata.name.clone()).collect();
        names.extend(first.deployment.iter().filter_map(|d| d.metadata.name.clone()));
        names.extend(first.service.iter().filter_map(|s| s.metadata.name.clone()));
        names.extend(first.service_accounts.iter().filter_map(|s| s.metadata.name.clone()));
        names.extend(first.config_map.iter().filter_map(|c| c.metadata.name.clone()));
        for n in &names {
            // names::object promises DNS-1035 labels (the leader's name is also its Service's).
            prop_assert!(kvcache_api::names::is_dns1035_label(n), "{} is not a DNS-1035 label", n);
        }
        // Objects of one kind never share a name (the leader's Deployment, Service and
        // ServiceAccount are one name on purpose).
        let daemon_sets: std::collections::BTreeSet<_> = first.daemon_sets.iter().filter_map(|d| d.metadata.name.clone()).collect();
        prop_assert_eq!(daemon_sets.len(), first.daemon_sets.len(), "member DaemonSet names collide");

        let managed = b.spec.connection.managed.as_ref().expect("managed");
        for (g, ds) in managed.members.iter().zip(&first.daemon_sets) {
            let c = &ds.spec.as_ref().expect("spec").template.spec.as_ref().expect("pod").containers[0];
            let req = c.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get("memory")).expect("memory request");
            let req = kvcache_api::quantity::parse_bytes(&req.0).expect("a byte quantity");
            let segment = g.capacity_per_member.bytes("").expect("segment");
            if g.medium == Medium::Dram {
                prop_assert!(req >= segment, "request {} below segment {}", req, segment);
            }
        }

        let selector = first.service.as_ref().and_then(|s| s.spec.as_ref()).and_then(|s| s.selector.clone()).expect("selector");
        let leader_labels = first.deployment.as_ref().and_then(|d| d.spec.as_ref()).and_then(|s| s.template.metadata.as_ref()).and_then(|m| m.labels.clone()).expect("labels");
        prop_assert!(subset(&selector, &leader_labels), "the Service selects the leader Pods");
        for ds in &first.daemon_sets {
            let member = ds.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).and_then(|m| m.labels.clone()).expect("labels");
            prop_assert!(!subset(&selector, &member), "the Service never selects a member");
        }
        let replicas = first.deployment.as_ref().and_then(|d| d.spec.as_ref()).and_then(|s| s.replicas).expect("replicas");
        if managed.leader.election_backend == ElectionBackend::None {
            prop_assert_eq!(replicas, 1, "clamped without election");
        }
    }

    #[test]
    fn replicas_and_wider_selectors_change_no_fingerprint(b in backend(), replicas in 1i32..6) {
        let before = hashes(&b);
        let mut scaled = b.clone();
        let m = scaled.spec.connection.managed.as_mut().expect("managed");
        // With Etcd the etcd's size follows whether standbys are asked for, a move admission
        // refuses: scale on the same side of one.
        let was = m.leader.replicas;
        m.leader.replicas = if m.leader.warm() && (replicas > 1) != (was > 1) { was } else { replicas };
        for g in &mut m.members {
            g.node_selector.insert("widened".into(), "yes".into());
        }
        prop_assert_eq!(&before, &hashes(&scaled));
        let before_template = render(&inputs(&b)).expect("renders").deployment.and_then(|d| d.spec).map(|s| s.template);
        let after_template = render(&inputs(&scaled)).expect("renders").deployment.and_then(|d| d.spec).map(|s| s.template);
        prop_assert_eq!(before_template, after_template, "scaling the leader changes no Pod template");
        let mut changed = b.clone();
        let m = changed.spec.connection.managed.as_mut().expect("managed");
        m.members[0].extra_args.push("k=v".into());
        prop_assert_ne!(&before[0], &hashes(&changed)[0], "a real change moves the fingerprint");
    }
}
