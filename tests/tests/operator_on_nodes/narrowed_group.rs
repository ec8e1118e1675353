//! A member group narrowed by an edit keeps the cache (docs/design.md#node-maintenance): its
//! `nodeSelector` edited to leave one node, the member there is drained through the master
//! before the DaemonSet's new template is applied (the DaemonSet controller deletes it then).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::BackendPhase;
use kvcache_e2e::cluster::{block_on, client_from, wait_object};
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::rollout::{ConditionWatch, keys};
use kvcache_e2e::status::{describe, has_condition, phase};
use kvcache_e2e::walkthrough::backend_pods;
use kvcache_render::objects::backend::{RPC_PORT, leader_name};

use crate::drained_rollout::event_reasons;
use crate::{
    MIB, NAMESPACE, WAIT, apply, backend, capacity, cluster, remove_backend, wait_backend_ready,
};

/// Keys written before the edit: 120 of 1 MiB, about half on each member, all fitting on one.
const KEYS: usize = 120;
const SIZE: usize = 1 << 20;
/// One drain and the DaemonSet's deletion.
const NARROWED: Duration = Duration::from_secs(300);

/// Sets (or with `None` removes) the label `key` on `node`.
async fn label(
    nodes: &Api<Node>,
    node: &str,
    key: &str,
    value: Option<&str>,
) -> Result<(), kvcache_e2e::Error> {
    let patch = serde_json::json!({"metadata": {"labels": {key: value}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[test]
fn a_group_narrowed_off_a_node_drains_its_member_there_before_the_template_goes_out() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-narrowed";
        let single = |v: &mut serde_json::Value| {
            v["spec"]["connection"]["managed"]["leader"] = serde_json::json!({"multiTenancy": false});
        };
        apply(&client, &backend(name, single)).await?;
        wait_backend_ready(&client, name, 512 * MIB).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let selector = backend_pods(name, "member-0");
        let members = pods::wait_ready(&store, &selector, 2, WAIT).await?;
        let node_of = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let (kept, left) = (&members[0], &members[1]);
        let master = format!("{}.{NAMESPACE}.svc:{RPC_PORT}", leader_name(name));
        let wrote = keys(&store, name_of(kept), &master, "put", name, KEYS, SIZE).await?;
        assert_eq!(wrote.ok, KEYS, "every key written: {wrote:?}");

        // The group keeps the node of one member only: a label of this test's own.
        let key = format!("kvcache-test/{name}");
        let nodes: Api<Node> = Api::all(client.clone());
        label(&nodes, &node_of(kept), &key, Some("keep")).await?;
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        let drained = ConditionWatch::start(backends.clone(), name, "Drained");
        let narrowed = async {
            apply(
                &client,
                &backend(name, |v| {
                    single(v);
                    v["spec"]["connection"]["managed"]["members"][0]["nodeSelector"][&key] =
                        "keep".into();
                }),
            )
            .await?;
            pods::wait_pods(
                &store,
                &selector,
                &format!("the member on {} gone, the other kept", node_of(left)),
                NARROWED,
                |p| p.len() == 1 && p[0].metadata.uid == kept.metadata.uid,
            )
            .await?;
            let b = wait_object(&backends, name, "the edit observed, Ready with 256Mi", NARROWED, |b| {
                b.status.as_ref().and_then(|s| s.observed_generation) == b.metadata.generation
                    && phase(b) == Some(BackendPhase::Ready)
                    && capacity(b) == Some(256 * MIB)
            })
            .await?;
            let read = keys(&store, name_of(kept), &master, "get", name, KEYS, SIZE).await?;
            Ok::<_, kvcache_e2e::Error>((b, read))
        }
        .await;
        // The label goes after the backend (without it, the group would leave this node too).
        if narrowed.is_ok() {
            remove_backend(&client, name).await?;
        }
        label(&nodes, &node_of(kept), &key, None).await?;
        let (b, read) = narrowed?;
        let said = drained.seen();
        let events = event_reasons(&client, name).await?;
        println!(
            "group narrowed off {}: {} of {} keys read back ({:.1}%); Drained said:\n  {}\nevents:\n  {}",
            node_of(left),
            read.ok,
            read.of,
            read.percent(),
            said.join("\n  "),
            events.join("\n  ")
        );
        assert!(
            read.percent() >= 95.0,
            "at least 95% of the keys read back after the group was narrowed, got {read:?}"
        );
        assert_eq!(read.wrong, 0, "no key reads back other bytes");
        assert!(
            said.iter().any(|c| c.starts_with("True/MembersDrained: ") && c.contains(name_of(left))),
            "Drained named the member drained before its node was left: {said:#?}"
        );
        assert!(
            events.iter().any(|e| e.starts_with("MemberDraining:") && e.contains(name_of(left))),
            "the member was drained first: {events:#?}"
        );
        assert!(has_condition(&b, "MembersMounted=True"), "{}", describe(&b));
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
