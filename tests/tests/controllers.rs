//! kube-controller-manager and kube-scheduler run: a Deployment and a DaemonSet get Pods, and the
//! scheduler places them on a registered Node (no kubelet here; the Pods stay unstarted).

use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kvcache_e2e::shared;

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("test object")
}

async fn placed_pods(pods: &Api<Pod>, selector: &str) -> Vec<Pod> {
    for _ in 0..300 {
        let list = pods
            .list(&ListParams::default().labels(selector))
            .await
            .expect("list pods");
        let placed: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("node-a"))
            .collect();
        if !placed.is_empty() {
            return placed;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Vec::new()
}

#[tokio::test]
async fn deployments_and_daemonsets_get_placed_pods() {
    let cluster = shared();
    let client = cluster.client().await.expect("client");
    let ns = cluster
        .namespace(&client, "controllers")
        .await
        .expect("namespace");

    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &from(serde_json::json!({
            "metadata": {"name": "node-a", "labels": {"kubernetes.io/os": "linux", "kubernetes.io/hostname": "node-a"}}
        })))
        .await
        .expect("node");
    let status = serde_json::json!({"status": {
        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "local test node"}]
    }});
    nodes
        .patch_status("node-a", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("node status");
    // The API server taints a new Node not-ready; the node lifecycle controller (not run: no
    // kubelet sends heartbeats here) would lift it. Lift it by hand.
    nodes
        .patch(
            "node-a",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"spec": {"taints": null}})),
        )
        .await
        .expect("untaint");

    let pod_template = serde_json::json!({
        "metadata": {"labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "example.invalid/none:1"}]}
    });
    Api::<Deployment>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &from(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "x"}}, "template": pod_template}
        })))
        .await
        .expect("deployment");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    assert_eq!(
        placed_pods(&pods, "app=x").await.len(),
        1,
        "the Deployment's Pod is created and scheduled"
    );

    let ds_template = serde_json::json!({
        "metadata": {"labels": {"app": "member"}},
        "spec": {"nodeSelector": {"kubernetes.io/os": "linux"}, "containers": [{"name": "member", "image": "example.invalid/none:1"}]}
    });
    Api::<DaemonSet>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &from(serde_json::json!({
                "metadata": {"name": "members"},
                "spec": {"selector": {"matchLabels": {"app": "member"}}, "template": ds_template}
            })),
        )
        .await
        .expect("daemonset");
    assert_eq!(
        placed_pods(&pods, "app=member").await.len(),
        1,
        "one member Pod on the one matching node"
    );
}
