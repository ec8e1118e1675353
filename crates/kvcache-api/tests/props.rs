//! Properties: admission never panics on any spec, and manifests round-trip losslessly.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvcache_api::Settings;
use kvcache_api::admission::Admission;
use kvcache_api::backend::*;
use kvcache_api::manifest::{self, Object};
use kvcache_api::pool::*;
use kvcache_api::{KVCacheBackend, Quantity};
use proptest::prelude::*;

fn quantity() -> impl Strategy<Value = Quantity> {
    prop_oneof![
        (0u64..1 << 40).prop_map(Quantity::from_bytes),
        "[0-9]{1,6}(Ki|Mi|Gi|Ti|k|M|G|m|e3|GB)?".prop_map(Quantity),
        ".{0,12}".prop_map(Quantity),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_=-]{0,24}",
        "/[a-z/. \t]{0,20}",
        ".{0,16}",
        Just("--enable_snapshot=true".to_string()),
        Just("/dev/infiniband".to_string()),
    ]
}

fn protocol() -> impl Strategy<Value = Protocol> {
    prop_oneof![
        Just(Protocol::Auto),
        Just(Protocol::Tcp),
        Just(Protocol::Rdma),
        Just(Protocol::Efa),
        Just(Protocol::Cann),
    ]
}

fn env() -> impl Strategy<Value = Vec<ExtraEnv>> {
    prop::collection::vec(
        prop_oneof![
            "[A-Z_]{1,12}",
            Just("MC_TE_METRIC".to_string()),
            Just("CUDA_VISIBLE_DEVICES".to_string())
        ]
        .prop_map(|name| ExtraEnv {
            name,
            value: Some("x".into()),
            value_from: None,
        }),
        0..3,
    )
}

fn local_disk() -> impl Strategy<Value = LocalDisk> {
    (
        text(),
        prop::option::of(quantity()),
        prop::option::of(any::<i64>()),
        prop::option::of((
            any::<bool>(),
            any::<bool>(),
            prop::option::of((-5i32..120, -5i32..120)),
        )),
        any::<bool>(),
    )
        .prop_map(|(path, capacity, key_limit, eviction, clean)| LocalDisk {
            path,
            capacity,
            key_limit,
            eviction: eviction.map(|(enabled, lru, wm)| Eviction {
                enabled,
                policy: lru.then_some(EvictionPolicy::Lru),
                watermark: wm.map(|(high, low)| Watermark { high, low }),
            }),
            clean_after_delete: clean,
        })
}

fn group() -> impl Strategy<Value = MemberGroup> {
    (
        any::<bool>(),
        quantity(),
        prop::option::of(quantity()),
        prop::option::of(protocol()),
        prop::option::of(-2i32..5),
        prop::collection::vec(text(), 0..3),
        env(),
        prop::collection::vec(local_disk(), 0..3),
        prop::collection::vec((text(), text()), 0..3),
    )
        .prop_map(
            |(vram, cap, buf, proto, fic, args, env, disks, hosts)| MemberGroup {
                node_selector: BTreeMap::from([("k".to_string(), "v".to_string())]),
                medium: if vram { Medium::Vram } else { Medium::Dram },
                capacity_per_member: cap,
                local_buffer_size: buf,
                image: None,
                transport: proto.map(|p| GroupTransport { protocol: Some(p) }),
                fabric_interface_count: fic,
                extra_args: args,
                extra_env: env,
                runtime_class_name: None,
                host_paths: hosts
                    .into_iter()
                    .map(|(path, mount_path)| HostPathMount {
                        path,
                        mount_path,
                        r#type: None,
                        read_only: false,
                    })
                    .collect(),
                security_context: None,
                local_disks: disks,
                resources: None,
            },
        )
}

fn backend() -> impl Strategy<Value = KVCacheBackend> {
    (
        -1i32..8,
        0u8..4,
        any::<bool>(),
        prop::collection::vec(text(), 0..4),
        env(),
        prop::collection::vec(group(), 0..4),
        prop::option::of(-10i32..4000),
        prop::option::of(text()),
        protocol(),
        any::<bool>(),
    )
        .prop_map(
            |(replicas, none, mt, args, env, members, grace, image, proto, external)| {
                let connection = if external {
                    Connection {
                        managed: None,
                        external: Some(External {
                            endpoints: vec![
                                ExternalEndpoint {
                                    name: EndpointName::Client,
                                    address: args.first().cloned().unwrap_or_default(),
                                },
                                ExternalEndpoint {
                                    name: EndpointName::Admin,
                                    address: "m:9003".into(),
                                },
                            ],
                        }),
                    }
                } else {
                    Connection {
                        managed: Some(Managed {
                            leader: Leader {
                                replicas,
                                election_backend: match none {
                                    0 => ElectionBackend::None,
                                    1 => ElectionBackend::Etcd,
                                    _ => ElectionBackend::Kubernetes,
                                },
                                etcd: None,
                                member_addressing: None,
                                allocation_strategy: AllocationStrategy::FreeRatioFirst,
                                multi_tenancy: mt,
                                extra_args: args,
                                extra_env: env,
                                resources: None,
                            },
                            members,
                            scale_in: grace.map(|g| ScaleIn {
                                grace_period_seconds: g,
                            }),
                            priority_class_name: None,
                        }),
                        external: None,
                    }
                };
                KVCacheBackend {
                    metadata: ObjectMeta {
                        name: Some("b".into()),
                        ..Default::default()
                    },
                    spec: KVCacheBackendSpec {
                        r#type: BackendType::Mooncake,
                        image,
                        image_pull_secrets: vec![],
                        image_pull_policy: None,
                        transport: Transport { protocol: proto },
                        connection,
                        tenancy: Default::default(),
                    },
                    status: None,
                }
            },
        )
}

fn binding() -> impl Strategy<Value = KVCachePoolBinding> {
    (text(), quantity(), text(), -3i32..100, text()).prop_map(|(pool, ceiling, name, bs, dtype)| {
        KVCachePoolBinding {
            metadata: ObjectMeta {
                name: Some("b".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: KVCachePoolBindingSpec {
                pool_ref: PoolRef { name: pool },
                quota: BindingQuota { ceiling },
                domain: Domain {
                    name,
                    block_size: bs,
                    dtype,
                },
            },
            status: None,
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn backend_admission_never_panics(new in backend(), old in backend()) {
        let s = Settings::default();
        let _ = new.validate_create(&s);
        let _ = new.validate_update(&old, &s);
        let _ = new.validate_create(&Settings { kv_cache_backend_image: None, kv_cache_dtype_owned: false, ..Settings::default() });
    }

    #[test]
    fn binding_admission_never_panics(new in binding(), old in binding()) {
        let s = Settings::default();
        let _ = new.validate_create(&s);
        let _ = new.validate_update(&old, &s);
    }

    #[test]
    fn backends_round_trip_through_yaml(b in backend()) {
        let yaml = serde_yaml::to_string(&b).expect("serializes");
        let parsed = manifest::parse("prop", &yaml).expect("parses back");
        prop_assert_eq!(parsed.len(), 1);
        prop_assert!(parsed[0].unknown_fields.is_empty());
        match &parsed[0].object {
            Object::Backend(back) => prop_assert_eq!(back.as_ref(), &b),
            other => prop_assert!(false, "parsed as {}", other.kind()),
        }
    }

    #[test]
    fn bindings_round_trip_through_yaml(b in binding()) {
        let yaml = serde_yaml::to_string(&b).expect("serializes");
        let parsed = manifest::parse("prop", &yaml).expect("parses back");
        match &parsed[0].object {
            Object::Binding(back) => prop_assert_eq!(back.as_ref(), &b),
            other => prop_assert!(false, "parsed as {}", other.kind()),
        }
    }

    #[test]
    fn manifest_parsing_never_panics(text in ".{0,200}") {
        let _ = manifest::parse("prop", &text);
    }
}
