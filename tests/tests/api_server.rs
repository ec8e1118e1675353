//! The CRDs in the real API server: they install and become Established, the seed manifests are
//! admitted, and the API server itself refuses what the CEL rules forbid, with the CRD's message.

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kvcache_e2e::shared;

const WALKTHROUGH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/walkthrough");

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("worker.gpustack.ai", "v1", kind),
        plural,
    )
}

fn yaml(text: &str) -> DynamicObject {
    serde_yaml::from_str(text).expect("test manifest parses")
}

/// The API for one of our kinds (their plurals are the kind, lowercased, plus `s`).
fn api_for(client: &Client, ns: Option<&str>, obj: &DynamicObject) -> Api<DynamicObject> {
    let kind = obj
        .types
        .as_ref()
        .map(|t| t.kind.clone())
        .unwrap_or_default();
    let ar = resource(&kind, &format!("{}s", kind.to_lowercase()));
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

async fn create(
    client: &Client,
    ns: Option<&str>,
    obj: &DynamicObject,
) -> Result<DynamicObject, String> {
    api_for(client, ns, obj)
        .create(&PostParams::default(), obj)
        .await
        .map_err(|e| e.to_string())
}

async fn apply(
    client: &Client,
    ns: Option<&str>,
    obj: &DynamicObject,
) -> Result<DynamicObject, String> {
    let api = api_for(client, ns, obj);
    let name = obj.metadata.name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply("kvcache-e2e").force(),
        &Patch::Apply(obj),
    )
    .await
    .map_err(|e| e.to_string())
}

#[tokio::test]
async fn crds_are_established_and_the_walkthrough_is_admitted() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let mut files: Vec<_> = std::fs::read_dir(WALKTHROUGH)
        .expect("examples")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        let obj = yaml(&text);
        // The examples ship the namespaces they use, first in creation order.
        if obj
            .types
            .as_ref()
            .is_some_and(|t| t.api_version == "v1" && t.kind == "Namespace")
        {
            let ns: Namespace = serde_yaml::from_str(&text).expect("a Namespace");
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &ns)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            continue;
        }
        let ns = obj.metadata.namespace.clone();
        let stored = create(&client, ns.as_deref(), &obj)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        // Defaults are applied by the API server.
        if stored
            .types
            .as_ref()
            .is_some_and(|t| t.kind == "KVCacheBackend")
        {
            let leader = &stored.data["spec"]["connection"]["managed"]["leader"];
            assert_eq!(leader["replicas"], 1, "{leader}");
            assert_eq!(leader["multiTenancy"], true);
            assert_eq!(leader["electionBackend"], "Kubernetes");
        }
        if stored
            .types
            .as_ref()
            .is_some_and(|t| t.kind == "KVCachePoolBinding")
        {
            assert_eq!(stored.data["spec"]["domain"]["name"], "default");
        }
    }
    let disk = yaml(include_str!("../../examples/disk-heavy/01-backend.yaml"));
    create(&client, None, &disk)
        .await
        .expect("the disk-heavy backend is admitted");
}

#[tokio::test]
async fn every_domain_field_is_immutable_a_pool_names_one_backend_and_unknown_fields_are_pruned() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let ns = cluster
        .namespace(&client, "refusals")
        .await
        .expect("namespace");

    // The domain is immutable.
    let binding = format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata: {{name: b, namespace: {ns}}}\nspec:\n  poolRef: {{name: p}}\n  quota: {{ceiling: 1Gi}}\n  domain: {{name: chat, blockSize: 64, dtype: bfloat16}}\n"
    );
    create(&client, Some(&ns), &yaml(&binding))
        .await
        .expect("binding");
    let err = apply(
        &client,
        Some(&ns),
        &yaml(&binding.replace("blockSize: 64", "blockSize: 16")),
    )
    .await
    .expect_err("refused");
    assert!(err.contains("spec.domain is immutable"), "{err}");
    apply(
        &client,
        Some(&ns),
        &yaml(&binding.replace("ceiling: 1Gi", "ceiling: 2Gi")),
    )
    .await
    .expect("ceiling editable");

    // Exactly one backend per pool: refused as Invalid with a cause on spec.backends.
    let two = yaml(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: two}\nspec: {backends: [a, b], quota: {total: 1Gi}}\n",
    );
    let refused = api_for(&client, None, &two)
        .create(&PostParams::default(), &two)
        .await
        .expect_err("two backends refused");
    let kube::Error::Api(status) = &refused else {
        panic!("not an API refusal: {refused}");
    };
    assert_eq!(
        (status.code, status.reason.as_str()),
        (422, "Invalid"),
        "{status:?}"
    );
    assert!(
        status
            .message
            .contains("spec.backends: Too many: 2: must have at most 1 item"),
        "{}",
        status.message
    );

    // Unknown fields are pruned, not stored: the object is admitted without them.
    let surplus = yaml(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: pruned}\nspec: {backends: [a], quota: {total: 1Gi, burst: 2Gi}, colour: blue}\n",
    );
    create(&client, None, &surplus).await.expect("admitted");
    let stored = api_for(&client, None, &surplus)
        .get("pruned")
        .await
        .expect("read back");
    let spec = stored.data["spec"].as_object().expect("spec");
    let keys: Vec<&str> = spec.keys().map(String::as_str).collect();
    assert_eq!(keys, ["backends", "quota"], "colour pruned: {spec:?}");
    assert_eq!(
        stored.data["spec"]["quota"],
        serde_json::json!({"total": "1Gi"}),
        "quota.burst pruned"
    );
}

/// A backend in YAML with `leader` and one member group's extra fields.
fn managed(name: &str, leader: &str, group: &str) -> DynamicObject {
    yaml(&format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: {name}}}\nspec:\n  connection:\n    managed:\n      leader: {{{leader}}}\n      members: [{{medium: DRAM, capacityPerMember: 1Gi{group}}}]\n"
    ))
}

#[tokio::test]
async fn snapshot_flags_in_leader_extra_args_are_refused_at_apply() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    // Every spelling of the snapshot family, and the allocator the snapshot path needs.
    for (i, flag) in [
        "--enable_snapshot=true",
        "-enable_snapshot_restore=true",
        "enable_snapshot=1",
        "--snapshot_interval_seconds=60",
        "--memory_allocator=offset",
    ]
    .into_iter()
    .enumerate()
    {
        let b = managed(
            &format!("snapshot-{i}"),
            &format!("extraArgs: ['{flag}']"),
            "",
        );
        let err = create(&client, None, &b).await.expect_err(flag);
        assert!(
            err.contains("leader.extraArgs") && err.contains("is refused"),
            "{flag}: {err}"
        );
    }
    let err = create(
        &client,
        None,
        &managed(
            "snapshot-named",
            "extraArgs: ['--enable_snapshot=true']",
            "",
        ),
    )
    .await
    .expect_err("refused");
    assert!(
        err.contains(
            "leader.extraArgs: --enable_snapshot=true is refused: snapshots are not offered"
        ),
        "{err}"
    );
    // A flag of the store's that is not derived nor refused passes.
    create(
        &client,
        None,
        &managed(
            "snapshot-none",
            "extraArgs: ['--default_kv_lease_ttl=500']",
            "",
        ),
    )
    .await
    .expect("an ordinary leader flag is admitted");
}

#[tokio::test]
async fn a_tier_cannot_be_added_removed_or_repathed_and_its_other_settings_stay_editable() {
    const CHOSEN: &str = "localDisks is chosen when the group is created";
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let tier = ", localDisks: [{path: /var/lib/kvcache, capacity: 1Ti}]";

    // Added to a running group: refused.
    create(&client, None, &managed("tier-add", "", ""))
        .await
        .expect("a group without a tier");
    let err = apply(&client, None, &managed("tier-add", "", tier))
        .await
        .expect_err("adding a tier is refused");
    assert!(err.contains(CHOSEN), "{err}");

    // Removed or repathed: refused.
    create(&client, None, &managed("tier", "", tier))
        .await
        .expect("a group with a tier");
    let err = apply(&client, None, &managed("tier", "", ""))
        .await
        .expect_err("removing the tier is refused");
    assert!(err.contains(CHOSEN), "{err}");
    let err = apply(
        &client,
        None,
        &managed(
            "tier",
            "",
            &tier.replace("/var/lib/kvcache", "/mnt/elsewhere"),
        ),
    )
    .await
    .expect_err("repathing the tier is refused");
    assert!(err.contains(CHOSEN), "{err}");

    // Its other settings, and the group's, stay editable.
    let edited = ", localDisks: [{path: /var/lib/kvcache, capacity: 2Ti, keyLimit: 100000, eviction: {enabled: true, policy: LRU}}]";
    let stored = apply(&client, None, &managed("tier", "", edited))
        .await
        .expect("capacity, keyLimit and eviction are editable");
    let disk = &stored.data["spec"]["connection"]["managed"]["members"][0]["localDisks"][0];
    assert_eq!(
        (
            disk["capacity"].as_str(),
            disk["keyLimit"].as_i64(),
            disk["eviction"]["policy"].as_str()
        ),
        (Some("2Ti"), Some(100000), Some("LRU")),
        "{disk}"
    );
    let err = apply(
        &client,
        None,
        &yaml(
            &serde_yaml::to_string(&managed("tier", "", edited))
                .expect("YAML")
                .replace("medium: DRAM", "medium: VRAM"),
        ),
    )
    .await
    .expect_err("refused");
    assert!(err.contains("medium is immutable"), "{err}");
    apply(
        &client,
        None,
        &yaml(
            &serde_yaml::to_string(&managed("tier", "", edited))
                .expect("YAML")
                .replace("capacityPerMember: 1Gi", "capacityPerMember: 2Gi"),
        ),
    )
    .await
    .expect("capacityPerMember is editable");
}

#[tokio::test]
async fn the_tiers_own_ceilings_carry_a_one_bucket_floor() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let err = create(
        &client,
        None,
        &managed(
            "tier-small",
            "",
            ", localDisks: [{path: /var/lib/kvcache, capacity: 8Mi}]",
        ),
    )
    .await
    .expect_err("a tier below one bucket is refused");
    assert!(
        err.contains("localDisks[].capacity must hold one bucket (16Mi)"),
        "{err}"
    );
    let err = create(
        &client,
        None,
        &managed(
            "tier-few-keys",
            "",
            ", localDisks: [{path: /var/lib/kvcache, keyLimit: 1}]",
        ),
    )
    .await
    .expect_err("a key limit below one bucket's keys is refused");
    assert!(
        err.contains("localDisks[].keyLimit must hold one bucket's worth of keys"),
        "{err}"
    );
    // Unset, the store's own ceilings apply; at the floor, admitted.
    create(
        &client,
        None,
        &managed(
            "tier-floor",
            "",
            ", localDisks: [{path: /var/lib/kvcache, capacity: 16Mi}]",
        ),
    )
    .await
    .expect("one bucket of tier is admitted");
    create(
        &client,
        None,
        &managed("tier-unset", "", ", localDisks: [{path: /var/lib/kvcache}]"),
    )
    .await
    .expect("a tier without ceilings is admitted");
}
