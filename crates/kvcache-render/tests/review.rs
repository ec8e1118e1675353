//! The admission judgement's own rules (`kvcache_render::admission::review`), without an API server.

use kvcache_api::Settings;
use kvcache_api::manifest::{Object, parse};
use kvcache_render::admission::review::Review;
use kvcache_render::world::World;

/// The judgement of `object` beside `others` (in the order given), as `validate` makes it.
fn review(
    object: &Object,
    old: Option<&Object>,
    others: &[Object],
    unknown_fields: &[String],
    settings: &Settings,
) -> Review {
    let world = World::from_objects(others);
    kvcache_render::admission::review::review(object, old, &world, unknown_fields, settings)
}

fn backend(image: Option<&str>, multi_tenancy: bool) -> Object {
    let mut v = serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "m"},
        "spec": {"connection": {"managed": {"leader": {"multiTenancy": multi_tenancy},
                 "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}]}}}
    });
    if let Some(i) = image {
        v["spec"]["image"] = i.into();
    }
    parse("test", &v.to_string())
        .expect("parses")
        .remove(0)
        .object
}

#[test]
fn a_master_older_than_0_3_12_must_declare_multi_tenancy_off() {
    let settings = Settings::default();
    let old = backend(Some("kvcacheai/mooncake:0.3.11.post1"), true);
    let r = review(&old, None, &[], &[], &settings);
    assert!(
        r.refusals
            .iter()
            .any(|f| f.field == "spec.connection.managed.leader.multiTenancy"
                && f.message.contains("0.3.11.post1")
                && f.message.contains("unknown command line flag")),
        "{r:?}"
    );
    // Declared off: admitted. On 0.3.12 or later: admitted. A tag naming no version: not judged.
    for ok in [
        backend(Some("kvcacheai/mooncake:0.3.11.post1"), false),
        backend(Some("kvcacheai/mooncake:0.3.12.post1"), true),
        backend(Some("gpustack/mirrored-mooncake:0.3.13.post1-cpu"), true),
        backend(Some("example.local/store:latest"), true),
    ] {
        let r = review(&ok, None, &[], &[], &settings);
        assert!(r.allowed(), "{r:?}");
    }
    // Ratchet: a stored backend whose image and field stay is not judged again.
    let r = review(&old, Some(&old), &[], &[], &settings);
    assert!(r.allowed(), "{r:?}");
    // Turning it on, or moving the image onto an old line, is.
    let off = backend(Some("kvcacheai/mooncake:0.3.11.post1"), false);
    assert!(!review(&old, Some(&off), &[], &[], &settings).allowed());
    let new = backend(Some("kvcacheai/mooncake:0.3.13.post1"), true);
    assert!(!review(&old, Some(&new), &[], &[], &settings).allowed());
}

#[test]
fn the_etcd_election_needs_a_master_with_the_operation_log() {
    let settings = Settings::default();
    let warm = |image: &str| {
        object(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "m"},
            "spec": {"image": image, "connection": {"managed": {
                "leader": {"electionBackend": "Etcd", "multiTenancy": false},
                "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}]}}}
        }))
    };
    let old = warm("kvcacheai/mooncake:0.3.11.post1");
    let r = review(&old, None, &[], &[], &settings);
    assert!(
        r.refusals.iter().any(
            |f| f.field == "spec.connection.managed.leader.electionBackend"
                && f.message.contains("0.3.11.post1")
                && f.message.contains("--enable_oplog")
        ),
        "{r:?}"
    );
    for ok in [
        warm("gpustack/mirrored-mooncake:0.3.13.post1-cpu"),
        warm("example.local/store:latest"),
    ] {
        let r = review(&ok, None, &[], &[], &settings);
        assert!(r.allowed(), "{r:?}");
    }
    // Ratchet: the image unchanged is not judged again.
    assert!(review(&old, Some(&old), &[], &[], &settings).allowed());
}

fn object(v: serde_json::Value) -> Object {
    parse("test", &v.to_string())
        .expect("parses")
        .remove(0)
        .object
}

/// A backend whose groups use `protocols`, its pool, a Binding, an InstanceType by `maker`.
fn world(protocols: &[&str], maker: &str) -> Vec<Object> {
    let members: Vec<serde_json::Value> = protocols
        .iter()
        .map(|p| serde_json::json!({"medium": "DRAM", "capacityPerMember": "1Gi", "transport": {"protocol": p}}))
        .collect();
    vec![
        object(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "m"},
            "spec": {"image": "gpustack/mirrored-mooncake:0.3.13.post1-cpu",
                     "connection": {"managed": {"leader": {}, "members": members}}}
        })),
        object(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": "p"},
            "spec": {"backends": ["m"], "quota": {"total": "1Gi"}}
        })),
        object(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
            "metadata": {"name": "b", "namespace": "team"},
            "spec": {"poolRef": {"name": "p"}, "quota": {"ceiling": "1Gi"},
                     "domain": {"blockSize": 64, "dtype": "bfloat16"}}
        })),
        object(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "InstanceType", "metadata": {"name": "it"},
            "spec": {"accelerator": {"resourceName": "x.com/acc", "manufacturer": maker},
                     "resources": {"cpu": "1", "memory": "1Gi"}}
        })),
    ]
}

fn model(engine: &str) -> Object {
    object(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "ModelDeployment",
        "metadata": {"name": "chat", "namespace": "team"},
        "spec": {"model": {"name": "m"}, "engine": {"name": engine, "version": "0.29.0"},
                 "kvCache": {"poolRef": {"name": "b"}},
                 "roles": [{"name": "server", "instanceType": "it", "resources": {"accelerator": 1}}]}
    }))
}

#[test]
fn a_new_deployment_on_a_pool_of_mixed_or_unusable_protocols_is_refused_naming_every_offer() {
    let settings = Settings::default();
    let r = review(
        &model("vLLM"),
        None,
        &world(&["TCP", "RDMA"], "nvidia"),
        &[],
        &settings,
    );
    assert!(
        r.refusals.iter().any(|f| f.field == "spec.roles[0]"
            && f.message.contains("mixed protocols")
            && f.message.contains("tcp")
            && f.message.contains("rdma")),
        "{r:?}"
    );
    // vLLM-Ascend (the role's InstanceType is made by ascend) on a TCP pool: set CANN.
    let r = review(
        &model("vLLM"),
        None,
        &world(&["TCP"], "ascend"),
        &[],
        &settings,
    );
    assert!(
        r.refusals.iter().any(|f| f.message.contains("CANN")),
        "{r:?}"
    );
    // One usable protocol: admitted.
    let r = review(
        &model("vLLM"),
        None,
        &world(&["TCP"], "nvidia"),
        &[],
        &settings,
    );
    assert!(r.allowed(), "{r:?}");
    // An unchanged binding stays editable when the backend became mixed later (ratcheting:
    // docs/design.md#rejudged-roles).
    let md = model("vLLM");
    let r = review(
        &md,
        Some(&md),
        &world(&["TCP", "RDMA"], "nvidia"),
        &[],
        &settings,
    );
    assert!(r.allowed(), "{r:?}");
    // Without the Binding among the objects, nothing is judged (creation order is free).
    let r = review(&model("vLLM"), None, &[], &[], &settings);
    assert!(r.allowed(), "{r:?}");
}

/// A vLLM deployment on Binding `b` whose one role is `role`.
fn model_with_role(role: serde_json::Value) -> Object {
    object(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "ModelDeployment",
        "metadata": {"name": "chat", "namespace": "team"},
        "spec": {"model": {"name": "m"}, "engine": {"name": "vLLM", "version": "0.29.0"},
                 "kvCache": {"poolRef": {"name": "b"}},
                 "roles": [role]}
    }))
}

fn model_with_interfaces(n: i64) -> Object {
    model_with_role(serde_json::json!({"name": "server", "instanceType": "it",
                                       "resources": {"accelerator": 1, "interface": n}}))
}

#[test]
fn fabric_interfaces_need_one_managed_rdma_or_efa_protocol_across_the_pool() {
    let settings = Settings::default();
    let refused = |protocols: &[&str], n: i64| {
        review(
            &model_with_interfaces(n),
            None,
            &world(protocols, "nvidia"),
            &[],
            &settings,
        )
        .refusals
        .into_iter()
        .filter(|f| f.field == "spec.roles[0].resources.interface")
        .map(|f| f.message)
        .collect::<Vec<_>>()
    };
    assert!(refused(&["RDMA"], 2).is_empty());
    assert!(refused(&["EFA", "EFA"], 1).is_empty());
    // Zero interfaces ask for nothing.
    assert!(refused(&["TCP"], 0).is_empty());
    let tcp = refused(&["TCP"], 2);
    assert!(
        tcp.len() == 1 && tcp[0].contains("offer TCP and no RDMA/EFA leg"),
        "{tcp:?}"
    );
    let mixed = refused(&["RDMA", "EFA"], 1);
    assert!(
        mixed.len() == 1 && mixed[0].contains("mix RDMA and EFA"),
        "{mixed:?}"
    );
    let differing = refused(&["RDMA", "TCP"], 1);
    assert!(
        differing.len() == 1 && differing[0].contains("differing protocols (RDMA, TCP)"),
        "{differing:?}"
    );
    // An external store has no managed leg.
    let mut external = world(&["RDMA"], "nvidia");
    external[0] = object(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "m"},
        "spec": {"transport": {"protocol": "RDMA"},
                 "connection": {"external": {"endpoints": [
                     {"name": "Client", "address": "10.0.0.1:50051"},
                     {"name": "Admin", "address": "10.0.0.1:9003"}]}}}
    }));
    let r = review(&model_with_interfaces(1), None, &external, &[], &settings);
    assert!(
        r.refusals.iter().any(|f| f
            .message
            .contains("external store has no managed RDMA/EFA leg")),
        "{r:?}"
    );
    // Re-judged only when the interface request moved (docs/design.md#rejudged-roles): an unchanged
    // request stays editable on a pool that became TCP, a new count on it is refused.
    let stored = model_with_interfaces(2);
    let r = review(
        &stored,
        Some(&stored),
        &world(&["TCP"], "nvidia"),
        &[],
        &settings,
    );
    assert!(r.allowed(), "{r:?}");
    let r = review(
        &model_with_interfaces(4),
        Some(&stored),
        &world(&["TCP"], "nvidia"),
        &[],
        &settings,
    );
    assert!(!r.allowed(), "{r:?}");
}

fn model_computing_in(dtype: &str) -> Object {
    model_with_role(serde_json::json!({"name": "server", "instanceType": "it",
                                       "extraArgs": ["--dtype", dtype]}))
}

#[test]
fn a_role_computing_in_another_dtype_than_its_domain_is_admitted_with_a_warning() {
    let settings = Settings::default();
    let world = world(&["TCP"], "nvidia");
    let r = review(&model_computing_in("float32"), None, &world, &[], &settings);
    assert!(r.allowed(), "{r:?}");
    assert!(
        r.warnings
            .iter()
            .any(|w| w.starts_with("spec.roles[0].extraArgs: ")
                && w.contains("computes in float32")
                && w.contains("--kv-cache-dtype bfloat16")),
        "{r:?}"
    );
    // The domain's dtype: no warning. No Binding among the objects: not judged.
    let r = review(
        &model_computing_in("bfloat16"),
        None,
        &world,
        &[],
        &settings,
    );
    assert!(r.warnings.is_empty(), "{r:?}");
    let r = review(&model_computing_in("float32"), None, &[], &[], &settings);
    assert!(r.warnings.is_empty(), "{r:?}");
}

/// An external backend `ext` with `tenancy`, a pool `p` on it and one Binding per namespace.
fn tenancy_world(tenancy: serde_json::Value, namespaces: &[&str]) -> Vec<Object> {
    let mut all = vec![
        object(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "ext"},
            "spec": {"tenancy": tenancy, "connection": {"external": {"endpoints": [
                {"name": "Client", "address": "m:50051"}, {"name": "Admin", "address": "m:9003"}]}}}
        })),
        object(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": "p"},
            "spec": {"backends": ["ext"], "quota": {"total": "1Gi"}}
        })),
    ];
    all.extend(namespaces.iter().map(|ns| tenant_binding(ns)));
    all
}

fn tenant_binding(ns: &str) -> Object {
    object(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
        "metadata": {"name": "cache", "namespace": ns},
        "spec": {"poolRef": {"name": "p"}, "quota": {"ceiling": "1Gi"},
                 "domain": {"name": ns, "blockSize": 64, "dtype": "bfloat16"}}
    }))
}

#[test]
fn a_binding_sharing_a_backend_is_warned_and_one_on_a_backend_dedicated_elsewhere_refused() {
    let settings = Settings::default();
    let shared = tenancy_world(serde_json::json!({}), &["team-a", "team-c"]);
    let r = review(&tenant_binding("team-b"), None, &shared, &[], &settings);
    assert!(r.allowed(), "{r:?}");
    assert!(
        r.warnings.iter().any(|w| w.starts_with(
            "namespace team-b will share KVCacheBackend ext with namespaces team-a, team-c: "
        )),
        "{:#?}",
        r.warnings
    );
    // Alone on it: no word.
    let alone = tenancy_world(serde_json::json!({}), &[]);
    let r = review(&tenant_binding("team-b"), None, &alone, &[], &settings);
    assert!(r.allowed() && r.warnings.is_empty(), "{r:?}");
    // An update (its finalizer removed, say) is not judged again.
    let b = tenant_binding("team-b");
    let r = review(&b, Some(&b), &shared, &[], &settings);
    assert!(r.warnings.is_empty(), "{r:?}");

    let dedicated = tenancy_world(
        serde_json::json!({"mode": "Dedicated", "namespace": "team-a"}),
        &["team-a"],
    );
    let r = review(&tenant_binding("team-b"), None, &dedicated, &[], &settings);
    assert!(
        r.refusals.iter().any(|f| f.field == "spec.poolRef.name"
            && f.cause.cause_type() == "FieldValueForbidden"
            && f.message
                .contains("whose spec.tenancy (mode: Dedicated) admits namespace team-a only")),
        "{r:?}"
    );
    let r = review(&tenant_binding("team-a"), None, &dedicated, &[], &settings);
    assert!(r.allowed() && r.warnings.is_empty(), "{r:?}");
}

#[test]
fn a_backend_is_dedicated_only_while_no_other_namespace_binds_it() {
    let settings = Settings::default();
    let objects = tenancy_world(serde_json::json!({}), &["team-a", "team-b"]);
    let shared = objects[0].clone();
    let dedicated = |ns: &str| {
        tenancy_world(
            serde_json::json!({"mode": "Dedicated", "namespace": ns}),
            &[],
        )
        .remove(0)
    };
    // Changed to Dedicated while team-b's Binding uses it: refused, naming it.
    let r = review(
        &dedicated("team-a"),
        Some(&shared),
        &objects,
        &[],
        &settings,
    );
    assert!(
        r.refusals.iter().any(|f| f.field == "spec.tenancy"
            && f.cause.cause_type() == "FieldValueForbidden"
            && f.message.contains("(team-b/cache)")
            && !f.message.contains("team-a/cache")),
        "{r:?}"
    );
    // Created so, too.
    assert!(!review(&dedicated("team-a"), None, &objects, &[], &settings).allowed());
    // Only its own namespace's Bindings: admitted.
    let own = tenancy_world(serde_json::json!({}), &["team-a"]);
    let r = review(&dedicated("team-a"), Some(&own[0]), &own, &[], &settings);
    assert!(r.allowed(), "{r:?}");
    // A stored dedicated backend whose tenancy stays is not judged again (a raced Binding
    // cannot hold its edits hostage); back to Shared always passes.
    let stored = dedicated("team-a");
    assert!(review(&stored, Some(&stored), &objects, &[], &settings).allowed());
    assert!(review(&shared, Some(&stored), &objects, &[], &settings).allowed());
}
