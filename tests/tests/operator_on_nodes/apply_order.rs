//! The walkthrough applied as a user would, file by file: in creation order every reference
//! resolves and the workload writes to the store; in reverse order each object first says what
//! it is missing, then everything converges.

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kvcache_api::{KVCachePool, KVCachePoolBinding, ModelDeployment};
use kvcache_e2e::cluster::{block_on, client_from, wait_object};
use kvcache_e2e::paths;
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::status::{has_condition, wait_condition};
use kvcache_e2e::walkthrough::{self, backend_pods};

use crate::{
    GPUS, MIB, NAMESPACE, PINNED_IMAGE, WAIT, cluster, effective, remove_model, wait_backend_ready,
};

#[test]
fn the_walkthrough_applied_in_creation_order_converges_on_real_pods() {
    let _gpus = GPUS.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let dir = paths::scratch("walkthrough-in-order")?;
        // The backend's image pinned: the settings test of this binary rolls every backend that
        // follows the cluster setting while it runs.
        let manifests = walkthrough::demo_manifests(&walkthrough::examples("walkthrough"), &dir, |v| {
            if v["kind"].as_str() == Some("KVCacheBackend") {
                v["spec"]["image"] = PINNED_IMAGE.into();
            }
            true
        })?;
        // Each file in turn, as `kubectl apply -f 00-… -f 01-… …` would.
        for f in walkthrough::manifest_files(&manifests)? {
            walkthrough::apply(&client, &walkthrough::read_objects(&f)?).await?;
        }

        // The store: Ready with what its two members mounted.
        wait_backend_ready(&client, "mooncake-dram", 512 * MIB).await?;
        // The Binding: granted what the master recut (its ceiling is 8Gi, the store 512Mi).
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-a");
        // The master recuts as members mount: a grant read while one of the two had mounted is
        // 256Mi, and the pool reads the ledger again on its interval (15 s), so wait for the
        // figure of both.
        let binding = wait_object(&bindings, "team-a", "QuotaGranted=True/Recut at 512Mi (8Gi asked of 512Mi)", WAIT, |b| {
            has_condition(b, "QuotaGranted=True/Recut") && effective(b) == Some(512 * MIB)
        })
        .await?;
        let granted = effective(&binding).expect("a figure");
        assert_eq!(granted, 512 * MIB, "the only tenant: the master recuts its 8Gi to all 512Mi");
        // The master's own ledger says the same.
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let members = pods::wait_ready(&store, &backend_pods("mooncake-dram", "member-0"), 2, WAIT).await?;
        let out = pods::exec(&store, name_of(&members[0]), None, &[
            "python3", "-c",
            "import sys, json, urllib.request; d = json.load(urllib.request.urlopen(sys.argv[1], timeout=3)); print([t['effective_quota_bytes'] for t in d['data'] if t['tenant_id'] == 'default'][0])",
            &format!("http://mooncake-dram-leader.{NAMESPACE}.svc:9003/api/v1/tenant_quotas"),
        ]).await?;
        assert_eq!(out.stdout.trim(), granted.to_string(), "{out:?}");

        // The workload: its Pods (the stand-in as vLLM) write under tenant default, and the
        // deployment reports the cache attached from what the store charged.
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), "team-a");
        wait_object(&models, "qwen-chat", "CacheAttached=True/CacheActive, InstanceTypesResolved=True/Resolved", WAIT, |m| {
            has_condition(m, "CacheAttached=True/CacheActive")
                && has_condition(m, "InstanceTypesResolved=True/Resolved")
        })
        .await?;
        let team: Api<Pod> = Api::namespaced(client.clone(), "team-a");
        for e in pods::wait_ready(&team, &walkthrough::role_pods("qwen-chat", "server"), 2, WAIT).await? {
            let log = pods::wait_log(&team, name_of(&e), None, "get key=", WAIT).await?;
            assert!(log.contains("tenant default") && log.contains("exist=1"), "{log}");
        }
        remove_model(&client, "team-a", "qwen-chat").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_walkthrough_applied_in_reverse_order_reports_what_is_missing_then_converges() {
    let _gpus = GPUS.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let dir = paths::scratch("walkthrough-reversed")?;
        // Its own names, beside the creation-order run: backend, pool, namespace and Binding.
        let manifests =
            walkthrough::demo_manifests(&walkthrough::examples("walkthrough"), &dir, |v| {
                match v["kind"].as_str() {
                    Some("Namespace") => v["metadata"]["name"] = "team-b".into(),
                    Some("KVCacheBackend") => {
                        v["metadata"]["name"] = "mooncake-rev".into();
                        v["spec"]["image"] = PINNED_IMAGE.into();
                    }
                    Some("KVCachePool") => {
                        v["metadata"]["name"] = "shared-rev".into();
                        v["spec"]["backends"] = serde_json::json!(["mooncake-rev"]);
                    }
                    Some("KVCachePoolBinding") => {
                        v["metadata"]["name"] = "team-b".into();
                        v["metadata"]["namespace"] = "team-b".into();
                        v["spec"]["poolRef"]["name"] = "shared-rev".into();
                    }
                    Some("ModelDeployment") => {
                        v["metadata"]["namespace"] = "team-b".into();
                        v["spec"]["kvCache"]["poolRef"]["name"] = "team-b".into();
                        v["spec"]["roles"][0]["instanceType"] = "gpu-a10-24g-rev".into();
                    }
                    Some("InstanceType") => v["metadata"]["name"] = "gpu-a10-24g-rev".into(),
                    _ => {}
                }
                true
            })?;
        let mut files = walkthrough::manifest_files(&manifests)?;
        files.reverse();
        let apply_file = |f: std::path::PathBuf| {
            let client = client.clone();
            async move { walkthrough::apply(&client, &walkthrough::read_objects(&f)?).await }
        };
        let models: Api<ModelDeployment> = Api::namespaced(client.clone(), "team-b");
        let bindings: Api<KVCachePoolBinding> = Api::namespaced(client.clone(), "team-b");
        let pools: Api<KVCachePool> = Api::all(client.clone());
        // 05 the ModelDeployment: no InstanceType and no Binding yet.
        apply_file(files[0].clone()).await?;
        wait_object(
            &models,
            "qwen-chat",
            "DomainRegistered=False/BindingNotFound, InstanceTypesResolved=False/InstanceTypeNotFound",
            WAIT,
            |m| {
                has_condition(m, "DomainRegistered=False/BindingNotFound")
                    && has_condition(m, "InstanceTypesResolved=False/InstanceTypeNotFound")
            },
        )
        .await?;
        // 04 the InstanceType.
        apply_file(files[1].clone()).await?;
        wait_condition(&models, "qwen-chat", "InstanceTypesResolved=True/Resolved", WAIT).await?;
        // 03 the Binding: no pool yet.
        apply_file(files[2].clone()).await?;
        wait_condition(&bindings, "team-b", "QuotaObserved=False/PoolNotFound", WAIT).await?;
        // 02 the pool: no backend yet.
        apply_file(files[3].clone()).await?;
        wait_condition(&pools, "shared-rev", "BackendResolved=False/BackendNotFound", WAIT).await?;
        // 01 the backend (00 the namespace exists already): everything converges.
        apply_file(files[4].clone()).await?;
        apply_file(files[5].clone()).await?;
        wait_backend_ready(&client, "mooncake-rev", 512 * MIB).await?;
        wait_condition(&bindings, "team-b", "QuotaGranted=True", WAIT).await?;
        wait_condition(&models, "qwen-chat", "CacheAttached=True/CacheActive", WAIT).await?;
        remove_model(&client, "team-b", "qwen-chat").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
