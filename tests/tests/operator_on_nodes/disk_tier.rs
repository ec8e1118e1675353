//! The disk tier: the leader's offload flags follow from the tier declaration, and a tier that
//! fills shows in the tier figure and never in CAPACITY.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::BackendPhase;
use kvcache_api::quantity::parse_bytes;
use kvcache_e2e::cluster::{block_on, client_from};
use kvcache_e2e::nodes::NodeCluster;
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::status::phase;
use kvcache_e2e::walkthrough::{self, backend_pods};

use crate::{
    MIB, NAMESPACE, WAIT, apply, backend, capacity, cluster, pool_with_bindings, remove_backend,
    remove_pool_and_backend, wait_backend, wait_granted,
};

/// A demo-size disk tier on the backend: a 32Mi segment, 1Gi of tier per member at `path` (made
/// on each node, owned by the store image's user), the store's 500 ms object lease (so a second
/// round of writes evicts, and so offloads, the first) and a one-second member heartbeat.
fn with_tier(cluster: &NodeCluster, path: &str) -> impl Fn(&mut serde_json::Value) + use<> {
    for n in &cluster.nodes.nodes {
        let dir = n.host_root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).expect("the tier folder");
        std::os::unix::fs::chown(&dir, Some(65532), Some(0)).expect("chown");
    }
    let path = path.to_owned();
    move |v: &mut serde_json::Value| walkthrough::demo_tier(v, &path)
}

/// The store's flags as the running leader Pod's container has them.
fn leader_args(p: &Pod) -> Vec<String> {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| {
            c.command
                .iter()
                .flatten()
                .chain(c.args.iter().flatten())
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_leaders_offload_flags_are_derived_from_the_tier_declaration() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    let tier = with_tier(cluster, "/var/lib/kvcache/claim-offload");
    block_on(async move {
        let client = client_from(&kc).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let offload = ["-enable_offload=true", "-offload_on_evict=true"];
        for (name, tiered) in [("claim-offload", true), ("claim-no-offload", false)] {
            apply(
                &client,
                &backend(name, |v| {
                    if tiered {
                        tier(v);
                    } else {
                        v["spec"]["connection"]["managed"]["members"][0]["capacityPerMember"] =
                            "32Mi".into();
                    }
                }),
            )
            .await?;
            // The master runs with what was derived: Ready, with its members' segments.
            wait_backend(&client, name, "Ready with 64Mi of segments", |b| {
                phase(b) == Some(BackendPhase::Ready)
                    && b.status
                        .as_ref()
                        .and_then(|s| s.capacity.as_ref())
                        .and_then(|c| c.memory.as_ref())
                        .and_then(|q| parse_bytes(&q.0).ok())
                        == Some(64 * MIB)
            })
            .await?;
            let leader = pods::wait_ready(&store, &backend_pods(name, "leader"), 1, WAIT).await?;
            let args = leader_args(&leader[0]);
            for flag in offload {
                assert_eq!(
                    args.iter().any(|a| a.as_str() == flag),
                    tiered,
                    "{name}: {flag} in {args:?}"
                );
            }
        }
        remove_backend(&client, "claim-offload").await?;
        remove_backend(&client, "claim-no-offload").await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_filling_tier_shows_in_the_tier_figure_and_not_in_capacity() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    let tier = with_tier(cluster, "/var/lib/kvcache/claim-fill");
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "claim-fill";
        apply(&client, &backend(name, tier)).await?;
        // A Binding for the store's default tenant, which the writes below name.
        pool_with_bindings(&client, name, "64Mi", &[("fill-default", None, "64Mi")]).await?;
        wait_granted(&client, "fill-default", "Granted", 64 * MIB).await?;
        // CAPACITY: two 32Mi segments plus the two members' declared 1Gi of tier.
        let total = 64 * MIB + (2u64 << 30);
        let ready = wait_backend(&client, name, "Ready with 2112Mi (segments + declared tier)", |b| {
            phase(b) == Some(BackendPhase::Ready) && capacity(b) == Some(total)
        })
        .await?;
        let before = ready.status.and_then(|s| s.capacity).expect("a capacity");
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let members = pods::wait_ready(&store, &backend_pods(name, "member-0"), 2, WAIT).await?;
        let member = name_of(&members[0]);
        let admin = format!("{name}-leader.{NAMESPACE}.svc:{}", kvcache_render::objects::backend::ADMIN_PORT);
        let figure = |text: &str| kvcache_e2e::store::metric_value(text, "master_allocated_file_size_bytes").unwrap_or(0.0);
        let empty = figure(&pods::master_page(&store, member, &admin, "metrics").await?);
        assert_eq!(empty, 0.0, "an empty tier");

        // Two rounds of 56 MiB into 64 MiB of segments: the second evicts the first to the tier.
        let master = format!("{name}-leader.{NAMESPACE}.svc:50051");
        let ip = pods::ip_of(&members[0]).expect("an address").to_owned();
        let out = pods::exec(&store, member, None, &[
            "python3", "-c", pods::PUT_MANY, &master, &ip, "2", "56", "1048576",
        ]).await?;
        assert!(out.success, "{out:?}");
        // The tier figure moves (buckets close on the members' heartbeat; the master has no
        // watch, so it is read again every half second).
        let deadline = tokio::time::Instant::now() + WAIT;
        let filled = loop {
            let f = figure(&pods::master_page(&store, member, &admin, "metrics").await?);
            if f > 0.0 {
                break f;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "master_allocated_file_size_bytes stayed 0 for {WAIT:?} after the writes ({out:?})"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        // CAPACITY does not: every status the backend shows over the next two capacity reads
        // of the operator (15 s apart) has the same figures.
        let api: Api<KVCacheBackend> = Api::all(client.clone());
        let watched = {
            use futures::StreamExt;
            let stream = kube::runtime::watcher::watch_object(api, name);
            let window = tokio::time::sleep(Duration::from_secs(35));
            tokio::pin!(window);
            let mut stream = Box::pin(stream);
            let mut seen = Vec::new();
            loop {
                tokio::select! {
                    _ = &mut window => break seen,
                    next = stream.next() => match next {
                        Some(Ok(Some(b))) => seen.push(b.status.and_then(|s| s.capacity)),
                        Some(Ok(None)) | None => break seen,
                        Some(Err(_)) => {}
                    },
                }
            }
        };
        assert!(!watched.is_empty());
        assert!(
            watched.iter().all(|c| c.as_ref() == Some(&before)),
            "the tier filled to {filled} bytes; CAPACITY over the window: {watched:?}, before {before:?}"
        );
        remove_pool_and_backend(&client, name, &["fill-default"]).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
