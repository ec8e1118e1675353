//! The 16Mi segment floor ratchets in the real API server, as the seed describes: an object stored
//! before the bound existed stays editable; moving its value is judged.
//! (Own test binary: it replaces the cluster-wide CRD.)

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kvcache_api::KVCacheBackend;
use kvcache_e2e::cluster::apply_crds;
use kvcache_e2e::shared;

/// The floor rule's message (as the CRD states it).
const FLOOR_MESSAGE: &str = "members[].capacityPerMember must hold one bucket (16Mi)";

fn without_floor(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let mut v = serde_json::to_value(&crd).expect("crd json");
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::Array(rules)) =
                    map.get_mut("x-kubernetes-validations")
                {
                    rules.retain(|r| !r["message"].as_str().unwrap_or("").contains(FLOOR_MESSAGE));
                }
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    crd = serde_json::from_value(v).expect("crd back");
    crd
}

#[tokio::test]
async fn the_segment_floor_is_judged_only_when_the_value_moves() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let current = kvcache_api::crd::for_explain(KVCacheBackend::crd());
    apply_crds(&client, &[without_floor(current.clone())])
        .await
        .expect("old CRD");

    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("worker.gpustack.ai", "v1", "KVCacheBackend"),
        "kvcachebackends",
    );
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let pp = PatchParams::apply("kvcache-e2e").force();
    let manifest = |capacity: &str, selector: &str| -> DynamicObject {
        serde_yaml::from_str(&format!(
            "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: legacy}}\nspec:\n  connection:\n    managed:\n      members:\n        - medium: DRAM\n          capacityPerMember: {capacity}\n          nodeSelector: {{tier: '{selector}'}}\n          localDisks: [{{path: /var/lib/kvcache}}]\n"
        )).expect("manifest")
    };
    // A changed schema reaches the API server's handlers a moment after the CRD is written:
    // wait until a dry-run probe is judged by the schema in question.
    let probe = |capacity: &str| -> DynamicObject {
        let mut m = manifest(capacity, "probe");
        m.metadata.name = Some("probe".into());
        m
    };
    let schema_in_force = |floor: bool| {
        let api = api.clone();
        let probe = probe("8Mi");
        async move {
            let dry = kube::api::PostParams {
                dry_run: true,
                ..Default::default()
            };
            // Only the floor rule's own refusal counts as "refused": a connection error or a 5xx
            // says nothing about the schema.
            let mut last = String::from("no answer yet");
            for _ in 0..300 {
                let judged = match api.create(&dry, &probe).await {
                    Ok(_) => Some(false),
                    Err(kube::Error::Api(s))
                        if s.code == 422 && s.message.contains(FLOOR_MESSAGE) =>
                    {
                        Some(true)
                    }
                    Err(e) => {
                        last = e.to_string();
                        None
                    }
                };
                if judged == Some(floor) {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            panic!(
                "waited 30s for the {} CRD schema to judge a dry-run 8Mi probe (last other answer: {last})",
                if floor { "current" } else { "old" }
            );
        }
    };
    schema_in_force(false).await;
    api.patch("legacy", &pp, &Patch::Apply(manifest("8Mi", "a")))
        .await
        .expect("8Mi admitted before the floor existed");

    apply_crds(&client, &[current]).await.expect("current CRD");
    schema_in_force(true).await;
    api.patch("legacy", &pp, &Patch::Apply(manifest("8Mi", "b")))
        .await
        .expect("an unrelated edit (in the same group) of the stored object is admitted");
    let err = api
        .patch("legacy", &pp, &Patch::Apply(manifest("12Mi", "b")))
        .await
        .expect_err("refused");
    assert!(err.to_string().contains(FLOOR_MESSAGE), "{err}");
    api.patch("legacy", &pp, &Patch::Apply(manifest("16Mi", "b")))
        .await
        .expect("at the floor");
}
