//! Node maintenance keeps the cache (docs/design.md#node-maintenance): a node drained as an
//! admin drains it (`kubectl drain --ignore-daemonsets`, which leaves the member's DaemonSet
//! Pod running) has its member's segment drained through the master first; the member Pod then
//! deleted as the node's shutdown would, the master still holds the keys and a prompt a real
//! engine wrote before still hits.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::BackendPhase;
use kvcache_e2e::cluster::{block_on, client_from, wait_object};
use kvcache_e2e::pods::{self, name_of};
use kvcache_e2e::status::{describe, has_condition, phase};
use kvcache_e2e::walkthrough::backend_pods;
use kvcache_e2e::{Error, engine, paths};

use crate::{
    BACKEND, CHAT, NAMESPACE, PROMPT_TOKENS, TEAM_A, WAIT, ask, cluster, deploy, master_keys,
    operator, ready_engines, serving_leader, turn, undeploy, write_through,
};

/// Runs `kubectl` with `args` against the binary's cluster; its output, or what it said.
pub(crate) fn kubectl(args: &[&str]) -> Result<String, Error> {
    let out = paths::kubectl(&cluster().control_plane.kubeconfig)
        .args(args)
        .output()
        .map_err(|source| Error::Spawn {
            what: "kubectl".into(),
            source,
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Wait {
            what: format!("kubectl {}", args.join(" ")),
            reason: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// The node whose member goes: one the serving leader does not run on (a drain of the leader's
/// node restarts the master, which `DisruptionBudget` states; not what this test is about).
async fn member_node_without_the_leader(store: &Api<Pod>) -> Result<(String, Pod), Error> {
    let leader = serving_leader_node(store).await?;
    let members = pods::wait_ready(store, &backend_pods(BACKEND, "member-0"), 2, WAIT).await?;
    members
        .into_iter()
        .find_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            (node != leader).then_some((node, p))
        })
        .ok_or_else(|| Error::Wait {
            what: format!("a member of {BACKEND} on a node other than the leader's ({leader})"),
            reason: "every member runs beside the leader".into(),
        })
}

async fn serving_leader_node(store: &Api<Pod>) -> Result<String, Error> {
    let client = store.clone().into_client();
    let leader = serving_leader(&client).await?;
    Ok(leader.spec.and_then(|s| s.node_name).unwrap_or_default())
}

/// `Drained=True`'s message, once the backend says its leaving members are drained.
fn drained_message(b: &KVCacheBackend) -> Option<String> {
    b.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Drained" && c.status == "True")
        .map(|c| c.message.clone())
}

#[test]
fn a_drained_node_has_its_member_drained_first_and_a_prompt_written_before_still_hits() {
    let _turn = turn();
    operator();
    let kc = cluster().control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let backends: Api<KVCacheBackend> = Api::all(client.clone());
        let writer = deploy(&client, TEAM_A, CHAT, 1).await?.remove(0);
        let p = engine::prompt(11, PROMPT_TOKENS);
        write_through(&client, TEAM_A, &writer, &p).await?;
        let before = master_keys(&client).await?;
        let (node, member) = member_node_without_the_leader(&store).await?;

        // As an admin does: cordon and evict all but DaemonSet Pods, the member left running;
        // then the node shuts down and its member Pod goes. Uncordoned whatever happened, for
        // the tests after this one.
        let maintenance = async {
            kubectl(&[
                "drain",
                &node,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=300s",
            ])?;
            let b = wait_object(
                &backends,
                BACKEND,
                &format!("Drained=True naming {} on node {node}", name_of(&member)),
                WAIT,
                |b| drained_message(b).is_some_and(|m| m.contains(name_of(&member)) && m.contains(&node)),
            )
            .await?;
            store
                .delete(name_of(&member), &DeleteParams::default())
                .await?;
            let ip = member
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .unwrap_or_default();
            // The master dropped its segment (and whatever it still held).
            wait_object(
                &backends,
                BACKEND,
                &format!("the master listing no segment at {ip}, two members mounted"),
                WAIT,
                |b| {
                    has_condition(b, "MembersMounted=True")
                        && b.status.as_ref().is_some_and(|s| {
                            s.members.len() == 2
                                && s.members.iter().all(|m| m.segment_name.split(':').next() != Some(ip.as_str()))
                        })
                },
            )
            .await?;
            Ok::<_, Error>((drained_message(&b).unwrap_or_default(), master_keys(&client).await?))
        }
        .await;
        kubectl(&["uncordon", &node])?;
        let (said, after) = maintenance?;

        // The engine (on the other node now, if it ran on the drained one) asks again with its
        // own cache emptied: the blocks come from the store.
        let reader = ready_engines(&client, TEAM_A, CHAT, 1).await?.remove(0);
        let engines: Api<Pod> = Api::namespaced(client.clone(), TEAM_A);
        engine::reset_local_cache(&engines, name_of(&reader)).await?;
        let (_, added) = ask(&client, TEAM_A, &reader, &p).await?;
        println!(
            "node {node} drained: the master held {before} keys before, {after} after its member Pod went ({:.1}%); Drained said: {said}; the prompt asked again: {added:?}",
            100.0 * after / before.max(1.0)
        );
        assert!(
            after >= 0.95 * before,
            "at least 95% of the {before} keys kept after the member Pod went, got {after}"
        );
        assert!(
            added.hit_tokens > 0 && added.tokens_from_store > 0,
            "the prompt written before the drain still hits through the store: {added:?}"
        );
        // Uncordoned, the held member takes objects again: replaced, mounted, Drained gone.
        let b = wait_object(
            &backends,
            BACKEND,
            "Ready with no Drained condition, every member mounted",
            WAIT,
            |b| {
                phase(b) == Some(BackendPhase::Ready)
                    && has_condition(b, "MembersMounted=True")
                    && !b
                        .status
                        .as_ref()
                        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Drained"))
            },
        )
        .await?;
        println!("after the uncordon: {}", describe(&b));
        undeploy(&client, TEAM_A, CHAT).await
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
