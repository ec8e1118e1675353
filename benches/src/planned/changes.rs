//! Each planned change as an admin makes it, and what "settled" means for it; every one starts
//! its clock at the edit ([`Settled::edited`]) and returns once the backend settled.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::BackendPhase;
use kvcache_e2e::cluster::wait_object;
use kvcache_e2e::operator::Operator;
use kvcache_e2e::rollout::ConditionWatch;
use kvcache_e2e::status::{condition, has_condition, phase};
use kvcache_e2e::{Error, pods, walkthrough};
use kvcache_render::objects::backend::leader_name;

use super::{CHANGE, Cx, KEEP_LABEL, NS, Spec, WAIT, manifest, settled};
use crate::rollout::{apply, events};

/// When a change began and how long it took to settle.
pub(super) struct Settled {
    /// The edit (the cordon, the apply, the operator's stop).
    pub(super) edited: Instant,
    /// From the edit to settled.
    pub(super) took: Duration,
    /// What settled means for this change.
    pub(super) when: &'static str,
    /// What else was seen, for the notes under the table.
    pub(super) notes: Vec<String>,
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The node of the backend's serving (Ready) leader Pod.
async fn serving_leader_node(cx: &Cx) -> Result<String, Error> {
    let leaders = pods::wait_pods(
        &cx.store,
        &walkthrough::backend_pods(&cx.name, "leader"),
        "one Ready leader Pod",
        WAIT,
        |p| p.iter().filter(|p| pods::is_ready(p)).count() == 1,
    )
    .await?;
    Ok(leaders
        .iter()
        .find(|p| pods::is_ready(p))
        .and_then(pods::node_of)
        .unwrap_or_default()
        .to_owned())
}

/// Whether a Pod runs `image` in one of its containers.
fn runs(p: &Pod, image: &str) -> bool {
    p.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .any(|c| c.image.as_deref() == Some(image))
    })
}

/// The store Pods settled on `spec`: its leader Pods (one Ready: standbys are not) and its
/// member Pods all Ready, none terminating, each running the spec's image, and no member Pod
/// whose uid is in `gone` (the ones a member rollout replaces).
async fn pods_settled(cx: &Cx, spec: &Spec, gone: &[String]) -> Result<(), Error> {
    let live = |p: &Pod| p.metadata.deletion_timestamp.is_none() && runs(p, spec.image);
    pods::wait_pods(
        &cx.store,
        &walkthrough::backend_pods(&cx.name, "leader"),
        &format!(
            "{} leader Pods running {}, one Ready, none terminating",
            spec.leaders(),
            spec.image
        ),
        CHANGE,
        |p| {
            p.len() == spec.leaders()
                && p.iter().all(live)
                && p.iter().filter(|p| pods::is_ready(p)).count() == 1
        },
    )
    .await?;
    pods::wait_pods(
        &cx.store,
        &cx.members(),
        &format!(
            "{} Ready member Pods running {}, none terminating, none of the {} replaced",
            spec.members,
            spec.image,
            gone.len()
        ),
        CHANGE,
        |p| {
            p.len() == spec.members
                && p.iter().all(|p| {
                    live(p) && pods::is_ready(p) && !gone.contains(&p.uid().unwrap_or_default())
                })
        },
    )
    .await?;
    Ok(())
}

/// The leader Deployment rolled past `generation`: observed, every replica updated, none old.
fn rolled(d: &Deployment, generation: i64, replicas: usize) -> bool {
    let s = d.status.clone().unwrap_or_default();
    let replicas = i32::try_from(replicas).ok();
    d.metadata.generation > Some(generation)
        && s.observed_generation == d.metadata.generation
        && s.updated_replicas == replicas
        && s.replicas == replicas
}

/// The backend's drain events so far, counted by reason.
async fn drain_events(cx: &Cx) -> Result<String, Error> {
    let mut counts = Vec::new();
    for reason in [
        "MemberDrained",
        "MembersDrained",
        "MemberNotDrained",
        "MemberRolledWithoutDrain",
    ] {
        counts.push(format!(
            "{reason} {}",
            events(&cx.client, &cx.name, reason).await?.len()
        ));
    }
    Ok(format!("events: {}", counts.join(", ")))
}

/// The warm election's view and the keys the operator last read.
fn election(b: &KVCacheBackend) -> String {
    b.status.as_ref().and_then(|s| s.election.as_ref()).map_or(
        "no election status".to_owned(),
        |e| {
            format!(
                "view {:?}, keys the status last read {:?}",
                e.view_version, e.keys
            )
        },
    )
}

/// An edit of the backend: the leader's resources, image or arguments, or the members'
/// segment size. Settled: the leader Deployment rolled (when its template changed), the store
/// Pods settled on the new spec (the members replaced when their template changed), the backend
/// settled.
pub(super) async fn edit(cx: &Cx) -> Result<Settled, Error> {
    let (before, after) = (cx.change.before(), cx.change.after());
    let deployments: Api<Deployment> = Api::namespaced(cx.client.clone(), NS);
    let leader = leader_name(&cx.name);
    let generation = deployments
        .get(&leader)
        .await?
        .metadata
        .generation
        .unwrap_or_default();
    let rolls_leader = after.leader_memory != before.leader_memory
        || after.image != before.image
        || after.leader_args != before.leader_args;
    let rolls_members = after.member_mib != before.member_mib || after.image != before.image;
    let members: Vec<String> = if rolls_members {
        cx.store
            .list(&ListParams::default().labels(&cx.members()))
            .await?
            .iter()
            .map(|p| p.uid().unwrap_or_default())
            .collect()
    } else {
        Vec::new()
    };
    let was = election(&cx.backends.get(&cx.name).await?);
    let edited = Instant::now();
    apply(&cx.client, &manifest(&cx.name, &after)?).await?;
    if rolls_leader {
        wait_object(
            &deployments,
            &leader,
            "the leader Deployment rolled (observedGeneration, every replica updated, none old)",
            CHANGE,
            move |d| rolled(d, generation, after.leaders()),
        )
        .await?;
    }
    pods_settled(cx, &after, &members).await?;
    let b = cx
        .wait_backend("settled on the edit", |b| settled(b, &after))
        .await?;
    let took = edited.elapsed();
    let mut notes = vec![drain_events(cx).await?];
    if after.warm {
        notes.push(format!("election: {was} before, {} after", election(&b)));
    }
    Ok(Settled {
        edited,
        took,
        when: match (rolls_leader, rolls_members) {
            (true, true) => {
                "leader and members rolled; generation observed, RolloutComplete, Ready, full, elected"
            }
            (true, false) => {
                "leader rolled; generation observed, RolloutComplete, Ready, full, elected"
            }
            _ => "members replaced; generation observed, RolloutComplete, Ready, full (768 MiB)",
        },
        notes,
    })
}

/// `Drained=True`'s message.
fn drained_message(b: &KVCacheBackend) -> Option<String> {
    condition(b, "Drained")
        .filter(|c| c.status == "True")
        .map(|c| c.message.clone())
}

/// Cordons (as `kubectl cordon`) or uncordons `node`.
async fn cordon(nodes: &Api<Node>, node: &str, on: bool) -> Result<(), Error> {
    let patch = serde_json::json!({"spec": {"unschedulable": if on { Some(true) } else { None }}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// A member's node (not the serving leader's) cordoned; settled: `Drained=True` naming the
/// member and its node, the backend Ready. Then, as the node's shutdown would, the member Pod
/// deleted (until the master dropped its segment and the DaemonSet's new Pod is mounted), and
/// the node uncordoned (until the backend settled again with no `Drained` condition): in the
/// notes, and inside the probe's window.
pub(super) async fn node_drained(cx: &Cx) -> Result<Settled, Error> {
    let spec = cx.change.after();
    let leader_node = serving_leader_node(cx).await?;
    let member = pods::wait_ready(&cx.store, &cx.members(), spec.members, WAIT)
        .await?
        .into_iter()
        .find(|p| pods::node_of(p).is_some_and(|n| n != leader_node))
        .ok_or_else(|| Error::Wait {
            what: format!(
                "a member of {} on a node other than the leader's ({leader_node})",
                cx.name
            ),
            reason: "every member runs beside the leader".into(),
        })?;
    let node = pods::node_of(&member).unwrap_or_default().to_owned();
    let pod = pods::name_of(&member).to_owned();
    let ip = pods::ip_of(&member).unwrap_or_default().to_owned();
    let watch = ConditionWatch::start(cx.backends.clone(), &cx.name, "Drained");
    let nodes: Api<Node> = Api::all(cx.client.clone());
    let edited = Instant::now();
    cordon(&nodes, &node, true).await?;
    let b = cx
        .wait_backend(
            &format!("Drained=True naming {pod} on {node}, Ready"),
            |b| {
                drained_message(b).is_some_and(|m| m.contains(&pod) && m.contains(&node))
                    && phase(b) == Some(BackendPhase::Ready)
            },
        )
        .await?;
    let took = edited.elapsed();
    let said = drained_message(&b).unwrap_or_default();

    let shutdown = Instant::now();
    cx.store.delete(&pod, &DeleteParams::default()).await?;
    cx.wait_backend(
        &format!("the master listing no segment at {ip}, two members mounted"),
        |b| {
            has_condition(b, "MembersMounted=True")
                && b.status.as_ref().is_some_and(|s| {
                    s.members.len() == spec.members
                        && s.members
                            .iter()
                            .all(|m| m.segment_name.split(':').next() != Some(ip.as_str()))
                })
        },
    )
    .await?;
    let gone = shutdown.elapsed();

    let uncordoned = Instant::now();
    cordon(&nodes, &node, false).await?;
    pods_settled(cx, &spec, &[]).await?;
    cx.wait_backend("uncordoned: settled, no Drained condition", |b| {
        settled(b, &spec) && condition(b, "Drained").is_none()
    })
    .await?;
    let back = uncordoned.elapsed();
    Ok(Settled {
        edited,
        took,
        when: "Drained=True naming the member and its node, Ready",
        notes: vec![
            format!("cordoned {node} (the serving leader on {leader_node}); Drained said: {said}"),
            format!(
                "member Pod {pod} then deleted as the node's shutdown would: the master dropped its segment and the DaemonSet's new Pod on the cordoned node was mounted {} later",
                secs(gone)
            ),
            format!(
                "uncordoned: settled again (full capacity, RolloutComplete, no Drained) {} later",
                secs(back)
            ),
            format!("Drained went: {}", watch.seen().join(" -> ")),
            drain_events(cx).await?,
        ],
    })
}

/// The group's `nodeSelector` edited to a label only the serving leader's node has; settled:
/// one member left, the backend settled with its capacity.
pub(super) async fn narrowed(cx: &Cx) -> Result<Settled, Error> {
    let after = cx.change.after();
    let keep = serving_leader_node(cx).await?;
    let nodes: Api<Node> = Api::all(cx.client.clone());
    let label = serde_json::json!({"metadata": {"labels": {KEEP_LABEL: "keep"}}});
    nodes
        .patch(&keep, &PatchParams::default(), &Patch::Merge(&label))
        .await?;
    let watch = ConditionWatch::start(cx.backends.clone(), &cx.name, "Drained");
    let edited = Instant::now();
    apply(&cx.client, &manifest(&cx.name, &after)?).await?;
    pods_settled(cx, &after, &[]).await?;
    cx.wait_backend("settled on the narrowed group", |b| settled(b, &after))
        .await?;
    let took = edited.elapsed();
    Ok(Settled {
        edited,
        took,
        when: "one member left; generation observed, RolloutComplete, Ready, full (256 MiB)",
        notes: vec![
            format!("kept node {keep} (the serving leader's)"),
            format!("Drained went: {}", watch.seen().join(" -> ")),
            drain_events(cx).await?,
        ],
    })
}

/// Each store Pod's uid and its containers' restarts.
async fn store_pods(cx: &Cx) -> Result<BTreeMap<String, i32>, Error> {
    let all = format!(
        "app.kubernetes.io/name=kv-cache-backend,app.kubernetes.io/instance={}",
        cx.name
    );
    Ok(cx
        .store
        .list(&ListParams::default().labels(&all))
        .await?
        .iter()
        .map(|p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |c| c.iter().map(|c| c.restart_count).sum());
            (p.uid().unwrap_or_default(), restarts)
        })
        .collect())
}

/// Whether the operator's `/metrics` counts a finished reconcile of a backend.
fn reconciled(text: &str) -> bool {
    kvcache_e2e::store::samples(text, "kvcache_operator_reconciles_total")
        .iter()
        .any(|(labels, v)| {
            labels.get("controller").map(String::as_str) == Some("kvcachebackend") && *v > 0.0
        })
}

/// The operator's process stopped (SIGTERM) and started again with the same arguments, as a
/// new version's Pod takes over; settled: the new process ready with a backend reconcile
/// counted, the backend settled. The store Pods' uids and restarts are compared.
pub(super) async fn restart_operator(cx: &Cx, op: &mut Operator) -> Result<Settled, Error> {
    let spec = cx.change.after();
    let before = store_pods(cx).await?;
    let edited = Instant::now();
    // This thread blocks; the probe and the watches run on the runtime's workers.
    tokio::task::block_in_place(|| {
        op.restart()?;
        op.wait_metrics("a backend reconcile counted", WAIT, reconciled)
            .map(drop)
    })?;
    let up = edited.elapsed();
    pods_settled(cx, &spec, &[]).await?;
    cx.wait_backend("settled after the restart", |b| settled(b, &spec))
        .await?;
    let took = edited.elapsed();
    let after = store_pods(cx).await?;
    let replaced = before.keys().filter(|u| !after.contains_key(*u)).count();
    let restarted: i32 = after
        .iter()
        .filter_map(|(u, r)| before.get(u).map(|b| r - b))
        .sum();
    Ok(Settled {
        edited,
        took,
        when: "the new process reconciled; generation observed, RolloutComplete, Ready, full",
        notes: vec![format!(
            "the new process ready with a reconcile counted {} after the stop began; store Pods replaced {replaced} of {}, containers restarted {restarted}",
            secs(up),
            before.len()
        )],
    })
}
