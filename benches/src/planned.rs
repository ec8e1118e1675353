//! `cargo xtask bench planned-changes`: the planned changes a platform team makes most often,
//! one row each on a backend of its own, on two real nodes with the operator (as from a Pod):
//! a member's node cordoned and then shut down, a member group narrowed to one node, the
//! leader's resources, image and arguments edited, the members' segment size changed, and the
//! operator restarted. Each backend holds 160 keys of 1 MiB written through the store's Python
//! client before the change. Measured per row: the keys read back with their bytes after it,
//! the time from the edit to settled, and the longest time no master served (a probe of the
//! leader Service every 200 ms, [`probe`]). The leader rows run the warm election
//! (`electionBackend: Etcd`, two leader replicas), the rest the default Lease with one leader.
//! Method and figures in benches/README.md ("planned-changes").

mod changes;
mod probe;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::BackendPhase;
use kvcache_e2e::cluster::{self, client_from};
use kvcache_e2e::images::{STORE, STORE_NEXT};
use kvcache_e2e::rollout::{KeyCount, MemberWatch, keys};
use kvcache_e2e::status::{describe, has_condition, phase};
use kvcache_e2e::volumes::{LOCAL_CLASS, local_volumes};
use kvcache_e2e::{Error, pods, walkthrough};
use kvcache_render::objects::backend::{RPC_PORT, leader_name};

use crate::rollout::{apply, rollout_complete};

const NS: &str = "gpustack-system";
const KEYS: usize = 160;
const SIZE: usize = 1 << 20;
const MIB: u64 = 1 << 20;
/// A backend coming up, a Pod going.
const WAIT: Duration = Duration::from_secs(180);
/// A change settling: a leader rollout, a member rollout with its drains, or both.
const CHANGE: Duration = Duration::from_secs(600);
/// The label the narrowed group selects (given to one node for that row).
const KEEP_LABEL: &str = "kvcache-bench/planned-keep";
/// A flag the 0.3.13.post1 master takes (`mooncake_master --help`), at its default value:
/// `tests/tests/operator_on_nodes/leader_edits.rs` edits the same.
const EXTRA_ARG: &str = "--eviction_high_watermark_ratio=0.95";

/// One planned change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    NodeDrained,
    GroupNarrowed,
    LeaderResources,
    LeaderImage,
    LeaderArg,
    SegmentSize,
    OperatorUpgrade,
}

impl Change {
    const ALL: [Change; 7] = [
        Change::NodeDrained,
        Change::GroupNarrowed,
        Change::LeaderResources,
        Change::LeaderImage,
        Change::LeaderArg,
        Change::SegmentSize,
        Change::OperatorUpgrade,
    ];

    /// Its name on the command line, and its backend's name after `planned-`.
    fn name(self) -> &'static str {
        match self {
            Change::NodeDrained => "node-drained",
            Change::GroupNarrowed => "group-narrowed",
            Change::LeaderResources => "leader-resources",
            Change::LeaderImage => "leader-image",
            Change::LeaderArg => "leader-arg",
            Change::SegmentSize => "segment-size",
            Change::OperatorUpgrade => "operator-upgrade",
        }
    }

    /// What the table calls it.
    fn label(self) -> &'static str {
        match self {
            Change::NodeDrained => "node drained: a member's node cordoned, then its Pod deleted",
            Change::GroupNarrowed => "member group narrowed to one node (`nodeSelector`)",
            Change::LeaderResources => "leader resources (memory request 128Mi to 160Mi)",
            Change::LeaderImage => "leader image (a second tag of the same store image)",
            Change::LeaderArg => "leader arg (an extra `extraArgs` flag)",
            Change::SegmentSize => "member segment size (`capacityPerMember` 256Mi to 384Mi)",
            Change::OperatorUpgrade => "operator upgrade (its process restarted)",
        }
    }

    /// The leader rows run the warm election.
    fn warm(self) -> bool {
        matches!(
            self,
            Change::LeaderResources | Change::LeaderImage | Change::LeaderArg
        )
    }

    fn backend(self) -> String {
        format!("planned-{}", self.name())
    }

    /// The backend before the change.
    fn before(self) -> Spec {
        Spec {
            warm: self.warm(),
            ..BASE
        }
    }

    /// The backend after it (the same for a change that is no edit of the backend).
    fn after(self) -> Spec {
        let before = self.before();
        match self {
            Change::LeaderResources => Spec {
                leader_memory: "160Mi",
                ..before
            },
            Change::LeaderImage => Spec {
                image: STORE_NEXT,
                ..before
            },
            Change::LeaderArg => Spec {
                leader_args: &[EXTRA_ARG],
                ..before
            },
            Change::SegmentSize => Spec {
                member_mib: 384,
                ..before
            },
            Change::GroupNarrowed => Spec {
                selector: (KEEP_LABEL, "keep"),
                members: 1,
                ..before
            },
            Change::NodeDrained | Change::OperatorUpgrade => before,
        }
    }
}

/// The changes to run, named on the command line (all of them by default).
pub struct Selection(Vec<Change>);

impl Selection {
    /// The changes named (`node-drained`, `group-narrowed`, `leader-resources`, `leader-image`,
    /// `leader-arg`, `segment-size`, `operator-upgrade`), in the table's order; none named: all.
    pub fn new(names: &[String]) -> anyhow::Result<Selection> {
        if let Some(unknown) = names
            .iter()
            .find(|n| !Change::ALL.iter().any(|c| c.name() == n.as_str()))
        {
            anyhow::bail!(
                "--changes: no change named {unknown:?}; the changes are {}",
                Change::ALL.map(Change::name).join(", ")
            );
        }
        Ok(Selection(
            Change::ALL
                .into_iter()
                .filter(|c| names.is_empty() || names.iter().any(|n| n == c.name()))
                .collect(),
        ))
    }
}

/// A backend as the bench writes it: one DRAM group, no tenants.
#[derive(Clone, Copy, Debug)]
struct Spec {
    warm: bool,
    member_mib: u64,
    /// The group's `nodeSelector` (one label).
    selector: (&'static str, &'static str),
    /// Member Pods expected (one per node the selector admits).
    members: usize,
    leader_memory: &'static str,
    leader_args: &'static [&'static str],
    /// `spec.image`: the store image every store Pod runs.
    image: &'static str,
}

const BASE: Spec = Spec {
    warm: false,
    member_mib: 256,
    selector: ("kubernetes.io/os", "linux"),
    members: 2,
    leader_memory: "128Mi",
    leader_args: &[],
    image: STORE.name,
};

impl Spec {
    /// Leader Pods: two with the warm election (one serves, one stands by), else one.
    fn leaders(&self) -> usize {
        if self.warm { 2 } else { 1 }
    }

    /// The capacity the master reports with every member mounted.
    fn capacity(&self) -> u64 {
        self.members as u64 * self.member_mib * MIB
    }

    fn election(&self) -> &'static str {
        if self.warm {
            "Etcd, 2 leader replicas (warm)"
        } else {
            "Lease, 1 leader"
        }
    }
}

fn manifest(name: &str, spec: &Spec) -> Result<KVCacheBackend, Error> {
    let mut leader = serde_json::json!({
        "multiTenancy": false,
        "resources": {"requests": {"cpu": "100m", "memory": spec.leader_memory}},
    });
    if spec.warm {
        leader["replicas"] = 2.into();
        leader["electionBackend"] = "Etcd".into();
        leader["etcd"] =
            serde_json::json!({"storageClassName": LOCAL_CLASS, "storageSize": "64Mi"});
    }
    if !spec.leader_args.is_empty() {
        leader["extraArgs"] = spec.leader_args.into();
    }
    let mut selector = serde_json::Map::new();
    selector.insert(spec.selector.0.into(), spec.selector.1.into());
    let v = serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1",
        "kind": "KVCacheBackend",
        "metadata": {"name": name},
        "spec": {
            "type": "Mooncake",
            "image": spec.image,
            "connection": {"managed": {
                "leader": leader,
                "members": [{
                    "nodeSelector": selector,
                    "medium": "DRAM",
                    "capacityPerMember": format!("{}Mi", spec.member_mib),
                    "resources": {"requests": {"cpu": "100m"}},
                }],
            }},
        },
    });
    serde_json::from_value(v).map_err(|e| Error::Invalid {
        path: name.into(),
        what: "backend",
        reason: e.to_string(),
    })
}

/// The backend settled on `spec`: its generation observed, `RolloutComplete=True`, Ready with
/// every member's capacity, and with the warm election, a master elected and the etcd in quorum.
fn settled(b: &KVCacheBackend, spec: &Spec) -> bool {
    let status = b.status.as_ref();
    status.and_then(|s| s.observed_generation) == b.metadata.generation
        && rollout_complete(b)
        && phase(b) == Some(BackendPhase::Ready)
        && status
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| kvcache_api::quantity::parse_bytes(&c.total.0).ok())
            == Some(spec.capacity())
        && (!spec.warm
            || has_condition(b, "ElectionObserved=True") && has_condition(b, "EtcdAvailable=True"))
}

/// What one change's row holds.
struct Row {
    wrote: KeyCount,
    read: KeyCount,
    settled: changes::Settled,
    outage: probe::Outage,
    fewest: Option<usize>,
}

/// One backend's shared handles.
struct Cx {
    client: Client,
    store: Api<Pod>,
    backends: Api<KVCacheBackend>,
    name: String,
    change: Change,
}

impl Cx {
    fn master(&self) -> String {
        format!("{}.{NS}.svc:{RPC_PORT}", leader_name(&self.name))
    }

    fn members(&self) -> String {
        walkthrough::backend_pods(&self.name, "member-0")
    }

    async fn wait_backend(
        &self,
        what: &str,
        ok: impl Fn(&KVCacheBackend) -> bool,
    ) -> Result<KVCacheBackend, Error> {
        cluster::wait_object(&self.backends, &self.name, what, CHANGE, ok).await
    }
}

/// Up, settled, the keys written: what a change starts from.
async fn prepare(cx: &Cx, nodes: &kvcache_e2e::nodes::Nodes) -> Result<KeyCount, Error> {
    let spec = cx.change.before();
    if spec.warm {
        // Three etcd members, at most two on a node; a tag of its own (a released local
        // volume is not bound again).
        local_volumes(&cx.client, nodes, &cx.name, 2).await?;
    }
    apply(&cx.client, &manifest(&cx.name, &spec)?).await?;
    let b = cx
        .wait_backend("settled before the change", |b| settled(b, &spec))
        .await?;
    let members = pods::wait_ready(&cx.store, &cx.members(), spec.members, WAIT).await?;
    let wrote = keys(
        &cx.store,
        pods::name_of(&members[0]),
        &cx.master(),
        "put",
        &cx.name,
        KEYS,
        SIZE,
    )
    .await?;
    println!(
        "{}: wrote {} of {} keys of {SIZE} bytes; {}",
        cx.name,
        wrote.ok,
        wrote.of,
        describe(&b)
    );
    Ok(wrote)
}

/// One change on its backend, from the backend's creation to its keys read back.
async fn row(
    client: &Client,
    rig: &mut crate::operator::WithOperator,
    change: Change,
) -> Result<Row, Error> {
    let cx = Cx {
        client: client.clone(),
        store: Api::namespaced(client.clone(), NS),
        backends: Api::all(client.clone()),
        name: change.backend(),
        change,
    };
    let wrote = prepare(&cx, &rig.nodes.nodes).await?;
    let probe = probe::Probe::start(
        client.clone(),
        probe::Target::Service {
            namespace: NS.into(),
            name: leader_name(&cx.name),
        },
    );
    let masters = probe::Probe::start(
        client.clone(),
        probe::Target::Pods {
            namespace: NS.into(),
            selector: walkthrough::backend_pods(&cx.name, "leader"),
        },
    );
    probe.answered(WAIT).await?;
    masters.answered(WAIT).await?;
    let watch = MemberWatch::start(cx.store.clone(), &cx.members());
    watch.listed(WAIT).await?;
    let settled = match change {
        Change::NodeDrained => changes::node_drained(&cx).await?,
        Change::GroupNarrowed => changes::narrowed(&cx).await?,
        Change::OperatorUpgrade => changes::restart_operator(&cx, &mut rig.operator).await?,
        _ => changes::edit(&cx).await?,
    };
    let outage = probe.outage(settled.edited);
    let own_word = masters.outage(settled.edited);
    drop((probe, masters));
    let spec = change.after();
    let members = pods::wait_ready(&cx.store, &cx.members(), spec.members, WAIT).await?;
    let read = keys(
        &cx.store,
        pods::name_of(&members[0]),
        &cx.master(),
        "get",
        &cx.name,
        KEYS,
        SIZE,
    )
    .await?;
    println!(
        "{}: read back {read:?}; member Pods:\n  {}",
        cx.name,
        watch.timeline().join("\n  ")
    );
    let mut settled = settled;
    settled.notes.push(format!(
        "a leader Pod reporting service_ready, asked Pod by Pod: longest none {}{}",
        own_word.cell(),
        if own_word.unanswered > 0 {
            format!("; unanswered: {}", own_word.why())
        } else {
            String::new()
        }
    ));
    Ok(Row {
        wrote,
        read,
        settled,
        outage,
        fewest: watch.fewest_serving(),
    })
}

/// Leaves the cluster as the next row needs it: every node uncordoned and without
/// [`KEEP_LABEL`], the backend and its Pods gone.
async fn clean(client: &Client, name: &str) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    for node in nodes.list(&ListParams::default()).await? {
        let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
        if cordoned || node.labels().contains_key(KEEP_LABEL) {
            let undo = serde_json::json!({
                "metadata": {"labels": {KEEP_LABEL: null}},
                "spec": {"unschedulable": null},
            });
            nodes
                .patch(
                    &node.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&undo),
                )
                .await?;
        }
    }
    let backends: Api<KVCacheBackend> = Api::all(client.clone());
    if let Some(b) = backends.get_opt(name).await? {
        backends.delete(name, &DeleteParams::default()).await?;
        let uid = b.uid().unwrap_or_default();
        cluster::wait_deleted(&backends, name, &uid, "the backend deleted", WAIT).await?;
    }
    let store: Api<Pod> = Api::namespaced(client.clone(), NS);
    let all = format!("app.kubernetes.io/name=kv-cache-backend,app.kubernetes.io/instance={name}");
    pods::wait_pods(&store, &all, "none of its Pods left", WAIT, |p| {
        p.is_empty()
    })
    .await?;
    Ok(())
}

/// `cargo xtask bench planned-changes`.
pub fn planned_changes(selection: Selection) -> anyhow::Result<()> {
    let mut rig = crate::operator::with_operator("bench-planned", NS)?;
    let kc = rig.nodes.control_plane.kubeconfig.clone();
    // Several threads: the probe keeps its pace while the operator's restart blocks this one.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let rows = runtime.block_on(async {
        let client = client_from(&kc).await?;
        let mut rows = Vec::new();
        for change in &selection.0 {
            let started = Instant::now();
            let row = row(&client, &mut rig, *change).await;
            if let Err(e) = &row {
                println!("{}: not measured: {e}", change.backend());
            }
            clean(&client, &change.backend()).await?;
            println!(
                "{}: done in {:.0} s",
                change.backend(),
                started.elapsed().as_secs_f64()
            );
            rows.push((*change, row));
        }
        Ok::<_, Error>(rows)
    })?;
    print_table(&rows);
    drop(rig);
    Ok(())
}

fn print_table(rows: &[(Change, Result<Row, Error>)]) {
    println!();
    println!(
        "| planned change, {KEYS} keys of 1 MiB on 2 members of 256 MiB | election | keys read back with their bytes | edit to settled | settled when | longest no master served (probe every {:.1} s) | fewest members serving |",
        probe::EVERY.as_secs_f64()
    );
    println!("|---|---|---|---|---|---|---|");
    let mut notes = Vec::new();
    for (change, row) in rows {
        let election = change.before().election();
        let Ok(r) = row else {
            let why = row.as_ref().err().map(Error::to_string).unwrap_or_default();
            println!(
                "| {} | {election} | not measured: {} | | | | |",
                change.label(),
                why.replace('|', "/").replace('\n', " ")
            );
            continue;
        };
        let short = if r.wrote.ok < KEYS {
            format!(" (only {} written)", r.wrote.ok)
        } else {
            String::new()
        };
        println!(
            "| {} | {election} | {} of {} ({:.1} %){short} | {:.1} s | {} | {} | {} of {} |",
            change.label(),
            r.read.ok,
            r.read.of,
            r.read.percent(),
            r.settled.took.as_secs_f64(),
            r.settled.when,
            r.outage.cell(),
            r.fewest.map_or("?".to_owned(), |f| f.to_string()),
            change.before().members,
        );
        if r.outage.unanswered > 0 {
            notes.push(format!(
                "- {}: probes unanswered: {}",
                change.name(),
                r.outage.why()
            ));
        }
        notes.extend(
            r.settled
                .notes
                .iter()
                .map(|n| format!("- {}: {n}", change.name())),
        );
    }
    println!();
    for n in notes {
        println!("{n}");
    }
}
