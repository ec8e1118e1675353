//! The workloads that use the store: a ModelDeployment without `kvCache` runs with no shared
//! cache, one whose engine carries another store line is refused before a Pod starts, and any
//! Deployment labelled for injection gets the store settings and writes under its Binding.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kvcache_api::backend::BackendPhase;
use kvcache_api::quantity::parse_bytes;
use kvcache_api::{KVCachePool, KVCachePoolBinding, ModelDeployment};
use kvcache_e2e::cluster::{block_on, client_from, wait_object};
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::status::{HasStatus, has_condition, phase, wait_condition};
use kvcache_e2e::walkthrough;
use kvcache_e2e::{Error, paths};

use crate::{
    GPUS, NAMESPACE, WAIT, cluster, operator, remove_model, remove_walkthrough, wait_backend,
    walkthrough_as,
};

/// The walkthrough's workload (its namespace, instance type and ModelDeployment) under `tag`
/// with `kvCache` left out, written to the scratch folder `scratch`.
fn workload_without_cache(tag: &str, scratch: &str) -> Result<std::path::PathBuf, Error> {
    let dir = paths::scratch(scratch)?;
    walkthrough::demo_manifests(&walkthrough::examples("walkthrough"), &dir, |v| {
        walkthrough_as(v, tag);
        if v["kind"] == "ModelDeployment"
            && let Some(spec) = v["spec"].as_object_mut()
        {
            spec.remove("kvCache");
        }
        matches!(
            v["kind"].as_str(),
            Some("Namespace" | "InstanceType" | "ModelDeployment")
        )
    })
}

#[test]
fn a_model_deployment_without_kv_cache_runs_with_no_shared_cache() {
    let _gpus = GPUS.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let manifests = workload_without_cache("nocache", "walkthrough-no-cache")?;
        for f in walkthrough::manifest_files(&manifests)? {
            walkthrough::apply(&client, &walkthrough::read_objects(&f)?).await?;
        }
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), "team-nocache");
        wait_condition(
            &models,
            "qwen-chat",
            "CacheAttached=True/NotApplicable",
            WAIT,
        )
        .await?;
        // The replicas run (Ready) with nothing of the store's handed to them.
        let team: Api<Pod> = Api::namespaced(client.clone(), "team-nocache");
        let replicas = pods::wait_ready(
            &team,
            &walkthrough::role_pods("qwen-chat", "server"),
            2,
            WAIT,
        )
        .await?;
        for p in &replicas {
            let c = &p.spec.as_ref().expect("a spec").containers[0];
            let env: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
            assert!(
                env.iter().all(|e| !e.starts_with("MOONCAKE_")),
                "{}: {env:?}",
                name_of(p)
            );
            let argv: Vec<&String> = c
                .command
                .iter()
                .flatten()
                .chain(c.args.iter().flatten())
                .collect();
            assert!(
                argv.iter().all(|a| !a.contains("kv-transfer-config")),
                "{}: {argv:?}",
                name_of(p)
            );
            let log = pods::wait_log(&team, name_of(p), None, "serving /health", WAIT).await?;
            assert!(log.contains("without the shared cache"), "{log}");
        }
        remove_model(&client, "team-nocache", "qwen-chat").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_service_the_user_made_under_a_role_objects_name_is_left_alone_and_named() {
    let _gpus = GPUS.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let manifests = workload_without_cache("taken", "walkthrough-name-taken")?;
        let files = walkthrough::manifest_files(&manifests)?;
        let (namespace, rest): (Vec<_>, Vec<_>) = files.iter().partition(|f| {
            walkthrough::read_objects(f).is_ok_and(|o| {
                o.iter()
                    .all(|v| v.types.as_ref().is_some_and(|t| t.kind == "Namespace"))
            })
        });
        for f in namespace {
            walkthrough::apply(&client, &walkthrough::read_objects(f)?).await?;
        }
        // The user's own Service, under the name the serving role's Service takes.
        let name = kvcache_render::names::object("qwen-chat", "");
        let services: Api<Service> = Api::namespaced(client.clone(), "team-taken");
        let mine: Service = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "team-taken"},
            "spec": {"selector": {"app": "mine"}, "ports": [{"port": 1234}]}
        }))
        .map_err(|e| Error::Invalid {
            path: name.clone(),
            what: "Service",
            reason: e.to_string(),
        })?;
        services.create(&PostParams::default(), &mine).await?;
        for f in rest {
            walkthrough::apply(&client, &walkthrough::read_objects(f)?).await?;
        }
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), "team-taken");
        wait_condition(&models, "qwen-chat", "ObjectsOwned=False/NameTaken", WAIT).await?;
        kvcache_e2e::status::wait_event(&client, "qwen-chat", "NameTaken", &name, WAIT).await?;
        // Left as the user made it: not applied over, not swept.
        let after = services.get(&name).await?;
        let spec = after.spec.clone().unwrap_or_default();
        assert_eq!(
            spec.selector,
            Some([("app".to_owned(), "mine".to_owned())].into()),
            "{after:?}"
        );
        assert_eq!(
            spec.ports
                .iter()
                .flatten()
                .map(|p| p.port)
                .collect::<Vec<_>>(),
            [1234]
        );
        assert!(after.metadata.owner_references.is_none(), "{after:?}");
        // Once the user's Service is gone, the role gets its own.
        services.delete(&name, &DeleteParams::default()).await?;
        wait_condition(&models, "qwen-chat", "ObjectsOwned=True/Owned", WAIT).await?;
        let own = services.get(&name).await?;
        assert!(
            own.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "ModelDeployment" && o.controller == Some(true)),
            "{own:?}"
        );
        remove_model(&client, "team-taken", "qwen-chat").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn an_sglang_deployment_on_another_store_line_is_refused_and_no_pod_starts() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let dir = paths::scratch("walkthrough-sglang")?;
        // The walkthrough with SGLang 0.5.18 (its runner carries the 0.3.12.post1 client) against
        // the 0.3.13.post1 store, under names of its own.
        let manifests =
            walkthrough::demo_manifests(&walkthrough::examples("walkthrough"), &dir, |v| {
                walkthrough_as(v, "sgl");
                if v["kind"] == "ModelDeployment" {
                    v["spec"]["engine"] =
                        serde_json::json!({"name": "SGLang", "version": "0.5.18"});
                }
                true
            })?;
        let mut objects = Vec::new();
        for f in walkthrough::manifest_files(&manifests)? {
            objects.extend(walkthrough::read_objects(&f)?);
        }
        walkthrough::apply(&client, &objects).await?;
        wait_backend(
            &client,
            "mooncake-sgl",
            "Ready with the store's version observed",
            |b| {
                phase(b) == Some(BackendPhase::Ready)
                    && b.status.as_ref().and_then(|s| s.store_version.as_deref())
                        == Some("0.3.13.post1")
            },
        )
        .await?;
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), "team-sgl");
        // Whichever condition carries the refusal.
        let refused = wait_object(
            &models,
            "qwen-chat",
            "a False condition StoreVersionMismatch",
            WAIT,
            |m| {
                m.conditions()
                    .iter()
                    .any(|c| c.status == "False" && c.reason == "StoreVersionMismatch")
            },
        )
        .await?;
        let message = refused
            .conditions()
            .iter()
            .find(|c| c.reason == "StoreVersionMismatch")
            .map(|c| c.message.clone())
            .unwrap_or_default();
        assert!(
            message.contains("0.3.13") && message.contains("0.3.12"),
            "{message}"
        );
        // Nothing runs with a connector that would fail every write.
        let team: Api<Pod> = Api::namespaced(client.clone(), "team-sgl");
        let running = team.list(&ListParams::default()).await?.items;
        assert!(
            running.is_empty(),
            "no Pod starts: {}",
            pods::describe(&running)
        );
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), "team-sgl");
        assert!(
            deployments
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
        );
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_deployment_labelled_for_injection_gets_the_store_settings_and_its_pods_write_under_the_binding()
 {
    let _up = crate::OPERATOR_UP.read().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    let webhook = operator()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .webhook
        .clone()
        .expect("the operator serves its webhook");
    block_on(async move {
        let client = client_from(&kc).await?;
        // The Pod webhooks only: our kinds stay judged by the schema in this binary.
        kvcache_e2e::operator::register_webhooks(&client, NAMESPACE, &webhook, false).await?;
        let dir = paths::scratch("walkthrough-injected")?;
        let manifests =
            walkthrough::demo_manifests(&walkthrough::examples("walkthrough"), &dir, |v| {
                walkthrough_as(v, "inj");
                if v["kind"] == "KVCachePoolBinding" {
                    v["spec"]["domain"]["name"] = "chat".into();
                }
                !matches!(v["kind"].as_str(), Some("ModelDeployment" | "InstanceType"))
            })?;
        for f in walkthrough::manifest_files(&manifests)? {
            walkthrough::apply(&client, &walkthrough::read_objects(&f)?).await?;
        }
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-inj");
        wait_condition(&bindings, "team-inj", "QuotaGranted=True", WAIT).await?;
        let pools: Api<KVCachePool> = Api::all(client.clone());
        wait_object(&pools, "shared-inj", "a client endpoint and the ledger read", WAIT, |p| {
            has_condition(p, "QuotaLedgerAvailable=True")
                && p.status.as_ref().is_some_and(|s| s.client_endpoint.is_some())
        })
        .await?;
        // Any workload, not a ModelDeployment: the engine stand-in as vLLM, opted in by label.
        let deployment: Deployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "chat", "namespace": "team-inj"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "chat"}},
                "template": {
                    "metadata": {
                        "labels": {"app": "chat", "kvcache.gpustack.ai/inject": "true"},
                        "annotations": {"kvcache.gpustack.ai/binding": "team-inj", "kvcache.gpustack.ai/engine": "vLLM"}
                    },
                    "spec": {"containers": [{
                        "name": "engine",
                        "image": "docker.io/gpustack/runner:cpu-vllm0.29.0",
                        "imagePullPolicy": "Never",
                        "command": ["vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct"],
                        "resources": {"requests": {"cpu": walkthrough::DEMO_ROLE_CPU, "memory": walkthrough::DEMO_ROLE_MEMORY},
                                      "limits": {"memory": walkthrough::DEMO_ROLE_MEMORY}},
                        "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}}
                    }]}
                }
            }
        }))
        .map_err(|e| Error::Invalid { path: "chat".into(), what: "Deployment", reason: e.to_string() })?;
        Api::<Deployment>::namespaced(client.clone(), "team-inj")
            .patch("chat", &PatchParams::apply(walkthrough::MANAGER).force(), &Patch::Apply(&deployment))
            .await?;
        let team: Api<Pod> = Api::namespaced(client.clone(), "team-inj");
        let ready = pods::wait_ready(&team, "app=chat", 1, WAIT).await?;
        let p = &ready[0];
        let record: serde_json::Value = serde_json::from_str(
            p.metadata.annotations.as_ref().and_then(|a| a.get("kvcache.gpustack.ai/injected")).expect("the record"),
        )
        .map_err(|e| Error::Invalid { path: name_of(p).into(), what: "record", reason: e.to_string() })?;
        assert_eq!(record["binding"], "team-inj");
        assert_eq!(record["domain"], "chat");
        assert_eq!(record["tenantInjected"], true);
        let log = pods::wait_log(&team, name_of(p), None, "get key=", WAIT).await?;
        assert!(log.contains("tenant chat") && log.contains(" rc=0") && log.contains("exist=1"), "{log}");
        // The store charges the Binding's domain: its usage shows on the Binding.
        wait_object(&bindings, "team-inj", "usage charged to the domain", WAIT, |b| {
            b.status
                .as_ref()
                .and_then(|s| s.usage.as_ref())
                .and_then(|q| parse_bytes(&q.0).ok())
                .is_some_and(|u| u > 0)
        })
        .await?;
        Api::<Deployment>::namespaced(client.clone(), "team-inj")
            .delete("chat", &DeleteParams::default())
            .await?;
        pods::wait_pods(&team, "app=chat", "no Pods left", WAIT, |p| p.is_empty()).await?;
        remove_walkthrough(&client, "inj").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
