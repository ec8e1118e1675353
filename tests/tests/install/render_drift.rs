//! `kvcache-operator render` prints what the controllers write: the walkthrough's objects, read
//! back from the cluster with the cluster's settings, are rendered offline
//! (`kvcache_render::plan::resolve::render_all`), and every rendered object, applied server-side in a
//! dry run under the operator's field manager, changes nothing the operator wrote.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::pinned_kind;
use kube::{Client, ResourceExt};
use kvcache_api::manifest::Object;
use kvcache_api::model::InstanceType;
use kvcache_api::settings::{SETTINGS_CONFIG_MAP, Settings};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment};
use kvcache_e2e::Error;
use kvcache_e2e::cluster::block_on;
use kvcache_render::plan::resolve::{Environment, render_all};

use super::support::*;

/// The operator's field manager (`crates/kvcache-operator/src/context.rs`).
const OPERATOR_MANAGER: &str = "kvcache-operator";

/// The user's objects as the cluster holds them, statuses included (a backend's store version
/// reaches the injection through its status).
async fn user_objects(client: &Client) -> Result<Vec<Object>, Error> {
    let mut out = Vec::new();
    let lp = ListParams::default();
    for b in Api::<KVCacheBackend>::all(client.clone()).list(&lp).await? {
        out.push(Object::Backend(Box::new(b)));
    }
    for p in Api::<KVCachePool>::all(client.clone()).list(&lp).await? {
        out.push(Object::Pool(Box::new(p)));
    }
    for b in Api::<KVCachePoolBinding>::all(client.clone())
        .list(&lp)
        .await?
    {
        out.push(Object::Binding(Box::new(b)));
    }
    for m in Api::<ModelDeployment>::all(client.clone())
        .list(&lp)
        .await?
    {
        out.push(Object::ModelDeployment(Box::new(m)));
    }
    for i in Api::<InstanceType>::all(client.clone()).list(&lp).await? {
        out.push(Object::InstanceType(Box::new(i)));
    }
    Ok(out)
}

/// The cluster's settings, as the operator reads them.
async fn settings(client: &Client) -> Result<Settings, Error> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get_opt(SETTINGS_CONFIG_MAP)
        .await?;
    let data = cm.and_then(|c| c.data).unwrap_or_default();
    Ok(Settings::from_data(SETTINGS_CONFIG_MAP, &data).expect("the cluster's settings parse"))
}

/// An object as compared: without what the API server and other writers keep moving.
fn comparable(o: &DynamicObject) -> serde_json::Value {
    let mut v = serde_json::to_value(o).expect("an object");
    if let Some(m) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        for k in ["managedFields", "resourceVersion", "generation"] {
            m.remove(k);
        }
    }
    if let Some(m) = v.as_object_mut() {
        m.remove("status");
    }
    v
}

/// Each rendered object the dry run shows differing from the live one: `Kind namespace/name`.
async fn drifted(client: &Client, docs: &[serde_yaml::Value]) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    for doc in docs {
        let rendered: DynamicObject =
            serde_json::from_value(serde_json::to_value(doc).expect("a rendered document"))
                .expect("a rendered object");
        let types = rendered.types.clone().expect("apiVersion and kind");
        // The Lease is created once; its holder fields are the elector's and move every renewal.
        if types.kind == "Lease" {
            continue;
        }
        let (resource, _) = pinned_kind(client, &types.try_into().expect("a kind")).await?;
        let ns = rendered.namespace().unwrap_or_default();
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
        let name = rendered.name_any();
        let what = format!("{} {ns}/{name}", resource.kind);
        let Some(live) = api.get_opt(&name).await? else {
            out.push(format!("{what} (not in the cluster)"));
            continue;
        };
        let dry = api
            .patch(
                &name,
                &PatchParams::apply(OPERATOR_MANAGER).force().dry_run(),
                &Patch::Apply(&rendered),
            )
            .await?;
        if comparable(&dry) != comparable(&live) {
            out.push(what);
        }
    }
    Ok(out)
}

#[test]
fn the_offline_render_of_the_walkthrough_is_what_the_controllers_wrote() {
    let _turn = installed().lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    block_on(async {
        let client = cluster.client().await?;
        converged(&client).await?;
        // The operator may still be writing the walkthrough's last change: compare until
        // nothing differs, for at most WAIT.
        let start = Instant::now();
        loop {
            let objects = user_objects(&client).await?;
            let settings = settings(&client).await?;
            let env = Environment {
                namespace: NS,
                settings: &settings,
            };
            let docs = render_all(&objects, &env).unwrap_or_else(|e| {
                panic!(
                    "the walkthrough as the cluster holds it does not render: {:?}",
                    e.iter().map(ToString::to_string).collect::<Vec<_>>()
                )
            });
            assert!(
                docs.iter().any(|d| d["kind"] == "DaemonSet")
                    && docs.iter().any(|d| d["kind"] == "Deployment"
                        && d["metadata"]["labels"]["app.kubernetes.io/name"] == "model-deployment"),
                "the render holds the backend's members and the deployment's roles"
            );
            let differ = drifted(&client, &docs).await?;
            if differ.is_empty() {
                return Ok::<_, Error>(());
            }
            assert!(
                start.elapsed() < WAIT,
                "within {WAIT:?}, the offline render still differs from what the operator wrote: {differ:?}"
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
