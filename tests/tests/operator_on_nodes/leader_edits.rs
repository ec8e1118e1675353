//! Leader edits on a warm backend (docs/high-availability.md#leader-edits): each of the edits a
//! platform team makes to a running leader (its resources, its image tag, an extra argument,
//! the priority class) rolls the leader Deployment, and the master that serves afterwards
//! replayed the metadata operation log from the backend's etcd: the keys written before read
//! back after each edit, those that roll the members in the same pass (the image, the priority
//! class) included, whose members wait for the leader's rollout to settle and are then drained
//! first (`crates/kvcache-render/src/plan/backend.rs`); no edit is warned of
//! (`crates/kvcache-render/src/admission/leader_edit.rs`). Each
//! edit writes 40 keys of its own before, through the store's own client dialling
//! `status.endpoint` ([`super::warm_failover`]'s helpers), and reads them back after.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kvcache_api::KVCacheBackend;
use kvcache_e2e::Error;
use kvcache_e2e::cluster::{block_on, client_from, wait_object};
use kvcache_e2e::images::STORE_NEXT;
use kvcache_e2e::pods;
use kvcache_e2e::status::{describe, has_condition};
use kvcache_e2e::volumes::local_volumes;
use kvcache_e2e::walkthrough::{self, backend_pods};
use kvcache_render::objects::backend::leader_name;

use kvcache_e2e::pods::name_of;
use kvcache_e2e::rollout::keys;

use super::warm_failover::{KEYS, election, serving, warm, write_keys};
use crate::{NAMESPACE, WAIT, apply, cluster, remove_backend};

/// A leader rollout, a member rollout (the image and the priority class reach the members too,
/// each drained first) and an etcd rollout (the priority class) in one edit.
const ROLLOUT: Duration = Duration::from_secs(420);
/// Leader Pods: one serves, one replays the log and stands by.
const LEADERS: i32 = 2;
/// Each key's size: 40 keys of 1 MiB per edit, spread over both 256 MiB members.
const SIZE: usize = 1 << 20;
/// The PriorityClass the last edit names.
const PRIORITY: &str = "kvcache-leader-edits";
/// A flag the 0.3.13.post1 master takes (`mooncake_master --help`), at its default value.
const EXTRA_ARG: &str = "--eviction_high_watermark_ratio=0.95";
/// The leader's memory request after the resources edit (the rig's is 64Mi).
const EDITED_MEMORY: &str = "96Mi";

/// One leader edit: what it writes into the backend's JSON, and how its Pod template shows it.
struct Edit {
    what: &'static str,
    /// Whether the warm backend keeps the keys through it (and the admission warns of it when
    /// not).
    keeps: bool,
    write: fn(&mut serde_json::Value),
    shows: fn(&PodSpec) -> bool,
}

fn leader_of(v: &mut serde_json::Value) -> &mut serde_json::Value {
    &mut v["spec"]["connection"]["managed"]["leader"]
}

fn master(spec: &PodSpec) -> Option<&k8s_openapi::api::core::v1::Container> {
    spec.containers.iter().find(|c| c.name == "master")
}

/// The four edits, in the order applied (each on top of the ones before).
fn edits() -> [Edit; 4] {
    [
        Edit {
            what: "leader resources",
            keeps: true,
            write: |v| {
                leader_of(v)["resources"] =
                    serde_json::json!({"requests": {"cpu": "30m", "memory": EDITED_MEMORY}});
            },
            shows: |s| {
                master(s)
                    .and_then(|c| c.resources.as_ref())
                    .and_then(|r| r.requests.as_ref())
                    .and_then(|r| r.get("memory"))
                    .is_some_and(|m| m.0 == EDITED_MEMORY)
            },
        },
        Edit {
            what: "image tag",
            keeps: true,
            write: |v| v["spec"]["image"] = STORE_NEXT.into(),
            shows: |s| master(s).and_then(|c| c.image.as_deref()) == Some(STORE_NEXT),
        },
        Edit {
            what: "extra arg",
            keeps: true,
            write: |v| leader_of(v)["extraArgs"] = serde_json::json!([EXTRA_ARG]),
            shows: |s| {
                let flag = format!("-{}", EXTRA_ARG.trim_start_matches('-'));
                master(s)
                    .and_then(|c| c.command.as_ref())
                    .is_some_and(|cmd| cmd.contains(&flag))
            },
        },
        Edit {
            what: "priority class",
            keeps: true,
            write: |v| {
                v["spec"]["connection"]["managed"]["priorityClassName"] = PRIORITY.into();
            },
            shows: |s| s.priority_class_name.as_deref() == Some(PRIORITY),
        },
    ]
}

/// The warm backend `name` with the first `n` edits written.
fn edited(name: &str, n: usize) -> KVCacheBackend {
    let mut v = serde_json::to_value(warm(name, LEADERS)).expect("a backend's JSON");
    for e in &edits()[..n] {
        (e.write)(&mut v);
    }
    serde_json::from_value(v).expect("a KVCacheBackend")
}

/// The leader Deployment's rollout settled on a template that `shows` the edit: its new
/// generation observed, every replica updated, no old one left, one serving (standbys are
/// deliberately not Ready, docs/high-availability.md).
fn settled(d: &Deployment, after: i64, shows: fn(&PodSpec) -> bool) -> bool {
    let s = d.status.clone().unwrap_or_default();
    let template = d.spec.as_ref().and_then(|s| s.template.spec.as_ref());
    d.metadata.generation > Some(after)
        && s.observed_generation == d.metadata.generation
        && s.updated_replicas == Some(LEADERS)
        && s.replicas == Some(LEADERS)
        && s.ready_replicas == Some(1)
        && template.is_some_and(shows)
}

/// The PriorityClass the last edit names (cluster-wide, kept for a rerun).
async fn priority_class(client: &kube::Client) -> Result<(), Error> {
    let pc: PriorityClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": PRIORITY},
        "value": 1000,
        "description": "tests/tests/operator_on_nodes/leader_edits.rs",
    }))
    .expect("a PriorityClass");
    Api::<PriorityClass>::all(client.clone())
        .patch(
            PRIORITY,
            &PatchParams::apply(walkthrough::MANAGER).force(),
            &Patch::Apply(&pc),
        )
        .await?;
    Ok(())
}

/// What one edit kept.
struct Kept {
    what: &'static str,
    ok: usize,
    line: String,
}

/// Applies edit `n` (1-based, on top of the earlier ones), waits for the leader's rollout and
/// a new serving view, and reads the keys back.
async fn one_edit(
    client: &kube::Client,
    store: &Api<Pod>,
    name: &str,
    master: &str,
    n: usize,
) -> Result<Kept, Error> {
    let edit = &edits()[n - 1];
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let leader = leader_name(name);
    let before = deployments.get(&leader).await?;
    let generation = before.metadata.generation.unwrap_or_default();
    let backends: Api<KVCacheBackend> = Api::all(client.clone());
    let (view, _) = election(&backends.get(name).await?);
    // Keys of this edit's own: what an earlier edit lost does not count against this one.
    let prefix = format!("{name}-{n}");
    let members = pods::wait_ready(store, &backend_pods(name, "member-0"), 2, WAIT).await?;
    let wrote = keys(
        store,
        name_of(&members[0]),
        master,
        "put",
        &prefix,
        KEYS,
        SIZE,
    )
    .await?;
    assert_eq!(
        wrote.ok, KEYS,
        "{}: every key written: {wrote:?}",
        edit.what
    );
    let started = Instant::now();
    apply(client, &edited(name, n)).await?;
    let shows = edit.shows;
    wait_object(
        &deployments,
        &leader,
        &format!(
            "{}: the leader Deployment rolled (observedGeneration, {LEADERS} updated, none old, 1 Ready)",
            edit.what
        ),
        ROLLOUT,
        move |d| settled(d, generation, shows),
    )
    .await?;
    let rolled = started.elapsed();
    pods::wait_pods(
        store,
        &backend_pods(name, "leader"),
        &format!(
            "{}: {LEADERS} leader Pods of the new template, none terminating",
            edit.what
        ),
        ROLLOUT,
        |p| {
            p.len() == LEADERS as usize
                && p.iter().all(|p| {
                    p.metadata.deletion_timestamp.is_none() && p.spec.as_ref().is_some_and(shows)
                })
        },
    )
    .await?;
    let after = wait_object(
        &backends,
        name,
        &format!(
            "{}: the edit observed, RolloutComplete=True, serving with 512Mi in a new view",
            edit.what
        ),
        ROLLOUT,
        |b| {
            b.status.as_ref().and_then(|s| s.observed_generation) == b.metadata.generation
                && has_condition(b, "RolloutComplete=True")
                && serving(b)
                && election(b).0.is_some_and(|v| Some(v) != view)
        },
    )
    .await?;
    let served = started.elapsed();
    let members = pods::wait_ready(store, &backend_pods(name, "member-0"), 2, WAIT).await?;
    let read = keys(
        store,
        name_of(&members[0]),
        master,
        "get",
        &prefix,
        KEYS,
        SIZE,
    )
    .await?;
    let line = format!(
        "{}: {} of {} keys read back ({:.1}%; {} wrong, {} missing, {} failed), leader rolled {:.1}s and serving {:.1}s after the edit, view {:?} -> {:?}; {}",
        edit.what,
        read.ok,
        read.of,
        read.percent(),
        read.wrong,
        read.missing,
        read.failed,
        rolled.as_secs_f64(),
        served.as_secs_f64(),
        view,
        election(&after).0,
        describe(&after)
    );
    println!("{line}");
    Ok(Kept {
        what: edit.what,
        ok: read.ok,
        line,
    })
}

#[test]
fn a_warm_backend_keeps_its_keys_through_each_leader_edit() {
    let cluster = cluster();
    let kc = cluster.control_plane.kubeconfig.clone();
    block_on(async move {
        let client = client_from(&kc).await?;
        let name = "dram-warm-edits";
        // Three etcd members (standbys asked for), at most two on a node.
        local_volumes(&client, &cluster.nodes, name, 2).await?;
        priority_class(&client).await?;
        apply(&client, &edited(name, 0)).await?;
        let store: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        pods::wait_ready(&store, &backend_pods(name, "etcd"), 3, WAIT).await?;
        let (_, master) = write_keys(&client, &store, name).await?;
        let mut kept = Vec::new();
        for n in 1..=edits().len() {
            kept.push(one_edit(&client, &store, name, &master, n).await?);
        }
        // Where keys were lost, the admission said so before the edit was applied.
        for (n, (k, e)) in kept.iter().zip(edits()).enumerate() {
            let warned = kvcache_render::admission::leader_edit::leader_edit_warning(
                &edited(name, n + 1),
                &edited(name, n),
                &kvcache_api::Settings::default(),
            );
            assert_eq!(
                warned.is_some(),
                !e.keeps,
                "{}: the admission's warning: {warned:?}",
                k.what
            );
        }
        let short: Vec<&str> = kept
            .iter()
            .zip(edits())
            .filter(|(k, e)| e.keeps && k.ok * 100 < KEYS * 95)
            .map(|(k, _)| k)
            .map(|k| k.line.as_str())
            .collect();
        assert!(
            short.is_empty(),
            "every leader edit keeps at least 95% of its {KEYS} keys; short:\n  {}",
            short.join("\n  ")
        );
        println!(
            "leader edits kept: {}",
            kept.iter()
                .map(|k| format!("{} {}/{KEYS}", k.what, k.ok))
                .collect::<Vec<_>>()
                .join(", ")
        );
        remove_backend(&client, name).await?;
        Api::<PriorityClass>::all(client.clone())
            .delete(PRIORITY, &DeleteParams::default())
            .await?;
        Ok::<_, Error>(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
