//! A member template change keeps the cache: the members of a memory group are replaced one at a
//! time, each one's segment drained to the other first (docs/design.md#member-rollout).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::BackendPhase;
use kvcache_e2e::cluster::{block_on, client_from, wait_object};
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::rollout::{ConditionWatch, MemberWatch, keys};
use kvcache_e2e::status::{describe, has_condition, phase};
use kvcache_e2e::walkthrough::backend_pods;
use kvcache_render::objects::backend::{RPC_PORT, leader_name};

use crate::{
    MIB, NAMESPACE, WAIT, apply, backend, capacity, cluster, remove_backend, wait_backend_ready,
};

/// Keys written before the change: 120 of 1 MiB, about half on each 256 MiB member, all of them
/// fitting on one.
const KEYS: usize = 120;
const SIZE: usize = 1 << 20;
/// Two drains, two replacements and their mounts.
const ROLLOUT: Duration = Duration::from_secs(300);

/// The events recorded on the backend, by reason.
pub(crate) async fn event_reasons(
    client: &kube::Client,
    backend: &str,
) -> Result<Vec<String>, kvcache_e2e::Error> {
    Ok(Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(backend))
        .filter_map(|e| {
            let reason = e.reason?;
            Some(format!("{reason}: {}", e.note.unwrap_or_default()))
        })
        .collect())
}

#[test]
fn a_member_template_change_drains_each_member_first_and_keeps_the_keys() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-drain";
        // One tenant-less store: the default tenant writes without a pool or Binding.
        let single = |v: &mut serde_json::Value| {
            v["spec"]["connection"]["managed"]["leader"] = serde_json::json!({"multiTenancy": false});
        };
        apply(&client, &backend(name, single)).await?;
        wait_backend_ready(&client, name, 512 * MIB).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let selector = backend_pods(name, "member-0");
        let before: Vec<String> = pods::wait_ready(&store, &selector, 2, WAIT)
            .await?
            .iter()
            .map(|p| p.uid().unwrap_or_default())
            .collect();
        let master = format!("{}.{NAMESPACE}.svc:{RPC_PORT}", leader_name(name));
        let writer = pods::wait_ready(&store, &selector, 2, WAIT).await?;
        let wrote = keys(&store, name_of(&writer[0]), &master, "put", name, KEYS, SIZE).await?;
        assert_eq!(wrote.ok, KEYS, "every key written: {wrote:?}");

        // A member template change (one more variable): every member Pod is to be replaced.
        let watch = MemberWatch::start(store.clone(), &selector);
        watch.listed(WAIT).await?;
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        let said = ConditionWatch::start(backends.clone(), name, "RolloutComplete");
        let edited = Instant::now();
        apply(
            &client,
            &backend(name, |v| {
                single(v);
                v["spec"]["connection"]["managed"]["members"][0]["extraEnv"] =
                    serde_json::json!([{"name": "KVCACHE_ROLLOUT_TEST", "value": "drained"}]);
            }),
        )
        .await?;
        let replaced = pods::wait_pods(
            &store,
            &selector,
            "2 Ready member Pods, none of the earlier ones",
            ROLLOUT,
            |p| {
                p.len() == 2
                    && p.iter().all(|p| {
                        pods::is_ready(p) && !before.contains(&p.uid().unwrap_or_default())
                    })
            },
        )
        .await?;
        wait_object(
            &backends,
            name,
            "the edit observed, RolloutComplete=True, Ready with 512Mi",
            ROLLOUT,
            |b| {
                b.status.as_ref().and_then(|s| s.observed_generation) == b.metadata.generation
                    && has_condition(b, "RolloutComplete=True")
                    && phase(b) == Some(BackendPhase::Ready)
                    && capacity(b) == Some(512 * MIB)
            },
        )
        .await?;
        let took = edited.elapsed();

        let read = keys(&store, name_of(&replaced[0]), &master, "get", name, KEYS, SIZE).await?;
        let timeline = watch.timeline().join("\n  ");
        let events = event_reasons(&client, name).await?;
        let rollout = said.seen();
        println!(
            "drained rollout of 2 members: {} of {} keys read back with their bytes ({:.1}%; {} wrong, {} missing, {} failed), RolloutComplete=True {:.1}s after the edit\nmember Pods:\n  {timeline}\nRolloutComplete:\n  {}\nevents:\n  {}",
            read.ok,
            read.of,
            read.percent(),
            read.wrong,
            read.missing,
            read.failed,
            took.as_secs_f64(),
            rollout.join("\n  "),
            events.join("\n  ")
        );
        assert!(
            read.percent() >= 95.0,
            "at least 95% of the keys read back after the rollout, got {read:?}"
        );
        assert_eq!(read.wrong, 0, "no key reads back other bytes");
        // One member at a time: never both member Pods out of service at once.
        assert_eq!(
            watch.fewest_serving(),
            Some(1),
            "the fewest member Pods serving at once during the rollout:\n  {timeline}"
        );
        let drained = events.iter().filter(|e| e.starts_with("MemberDrained:")).count();
        assert_eq!(drained, 2, "each member drained before it went: {events:#?}");
        assert!(
            !events.iter().any(|e| e.starts_with("MemberRolledWithoutDrain:")),
            "no member went without a drain: {events:#?}"
        );
        // The condition said a drained rollout was under way, and never that one went without.
        assert!(
            rollout.iter().any(|c| c.starts_with("False/MembersDraining: ")),
            "RolloutComplete said MembersDraining during the rollout: {rollout:#?}"
        );
        assert!(
            !rollout.iter().any(|c| c.contains("MembersRolledWithoutDrain")),
            "{rollout:#?}"
        );
        let b = backends.get(name).await?;
        assert!(has_condition(&b, "RolloutComplete=True"), "{}", describe(&b));
        remove_backend(&client, name).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
