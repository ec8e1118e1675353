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
async fn the_api_server_refuses_with_the_crd_message() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let ns = cluster
        .namespace(&client, "refusals")
        .await
        .expect("namespace");

    // A banned leader flag.
    let err = create(&client, None, &yaml(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: banned-flag}\nspec:\n  connection:\n    managed:\n      leader: {extraArgs: ['--enable_snapshot=true']}\n      members: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    )).await.expect_err("refused");
    assert!(
        err.contains(
            "leader.extraArgs: --enable_snapshot=true is refused: snapshots are not offered"
        ),
        "{err}"
    );

    // capacityPerMember below one bucket on a disk group, on create.
    let err = create(&client, None, &yaml(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: thin}\nspec:\n  connection:\n    managed:\n      members: [{medium: DRAM, capacityPerMember: 8Mi, localDisks: [{path: /var/lib/kvcache}]}]\n",
    )).await.expect_err("refused");
    assert!(err.contains("must hold one bucket (16Mi)"), "{err}");

    // The tier path is chosen once.
    let tiered = "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: tier}\nspec:\n  connection:\n    managed:\n      members: [{medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /var/lib/kvcache}]}]\n";
    create(&client, None, &yaml(tiered))
        .await
        .expect("tiered backend");
    let err = apply(
        &client,
        None,
        &yaml(&tiered.replace("/var/lib/kvcache", "/mnt/elsewhere")),
    )
    .await
    .expect_err("refused");
    assert!(
        err.contains("localDisks is chosen when the group is created"),
        "{err}"
    );
    let err = apply(
        &client,
        None,
        &yaml(&tiered.replace("medium: DRAM", "medium: VRAM")),
    )
    .await
    .expect_err("refused");
    assert!(err.contains("medium is immutable"), "{err}");
    apply(
        &client,
        None,
        &yaml(&tiered.replace("capacityPerMember: 1Gi", "capacityPerMember: 2Gi")),
    )
    .await
    .expect("editable");

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
