//! The KVCacheBackend controller: fetch, call `kvcache-render` (objects, then status from what
//! was observed), write. Every decision is a pure function in `kvcache-render`; this module only
//! reads the cluster and the store, applies, prunes, carries out the member rollout's step
//! (drains through the master, annotations and deletions of member Pods) and writes status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalized, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use kvcache_api::backend::{BackendPhase, KVCacheBackendStatus};
use kvcache_api::relation::Relation;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};
use kvcache_render::members::maintenance::SchedulingFacts;
use kvcache_render::names::{self, label_value};
use kvcache_render::objects::backend::probe::PROBE_LABEL;
use kvcache_render::objects::backend::{BACKEND_TEARDOWN, OWNER_LABEL, leader_name};
use kvcache_render::objects::desired::DesiredSet;
use kvcache_render::observe::store::{DrainJob, ReadError, StoreReading};
use kvcache_render::plan::backend::{self as plan, BackendPlan, BackendRead};
use kvcache_render::status::backend::{Computed, Observation, backend_status};
use kvcache_render::status::events::{self, backend_events};
use tracing::{info, instrument, warn};

use super::applied::{AppliedSet, Sweep};
use super::members;
use crate::context::{Context, Figures, Polled};
use crate::error::{Error, kube as kerr};
use crate::watch::Pass;

/// Held while the backend's workloads are torn down.
pub const FINALIZER: &str = kvcache_render::names::TEARDOWN_FINALIZER;

const CONTROLLER: &str = "kvcachebackend";

/// How long a workload gets to go beyond its Pods' termination grace.
const TEARDOWN_SLACK: Duration = Duration::from_secs(120);

/// How soon the master is asked again while a drain runs or a replacement's mount is awaited
/// (neither is seen on a watch).
const DRAIN_POLL: Duration = Duration::from_secs(2);

/// The backends a labelled object (member Pod, Lease) belongs to.
fn by_instance_label(
    store: &Store<KVCacheBackend>,
    labels: &BTreeMap<String, String>,
) -> Vec<ObjectRef<KVCacheBackend>> {
    let Some(instance) = names::backend_of_labels(labels) else {
        return Vec::new();
    };
    store
        .state()
        .iter()
        .filter(|b| label_value(&b.name_any()) == instance)
        .map(|b| ObjectRef::from_obj(&**b))
        .collect()
}

/// The backend a workload's controller owner reference names, keyed as the primary watch keys
/// it (cluster-scoped: no namespace).
fn owning_backend(
    owners: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
) -> Option<ObjectRef<KVCacheBackend>> {
    owners
        .iter()
        .find(|o| {
            o.kind == "KVCacheBackend"
                && o.api_version.split('/').next() == Some(kvcache_api::GROUP)
                && o.controller == Some(true)
        })
        .map(|o| ObjectRef::new(&o.name))
}

/// Runs the controller until shutdown. Pools and Bindings wake the backend they lead to
/// through their shared caches' relation watches, once the cache the pass reads holds them.
pub async fn run(
    ctx: Arc<Context>,
    changes: crate::watch::Subscription<KVCacheBackend>,
    pools: crate::watch::Subscription<KVCachePool>,
    bindings: crate::watch::Subscription<KVCachePoolBinding>,
    nodes: crate::watch::Subscription<Node>,
) {
    let controller = if ctx.config.backend_selector.is_empty() {
        crate::watch::shared_controller(&changes, ctx.backends.clone())
    } else {
        // Scoped by a label selector: a watch of its own, filtered by the API server.
        crate::watch::controller(
            Api::all(ctx.client.clone()),
            watcher::Config::default().labels(&ctx.config.backend_selector),
        )
    };
    let controller = watch_signals(watch_workloads(controller, &ctx), &ctx);
    let binding_ctx = ctx.clone();
    let node_backends = ctx.backends.clone();
    let controller = controller
        // A pool names its backend (status.usedBy, deletion hold, the tenant policy).
        .watches_stream(pools.relation_changes(Pass::SpecChanges), |pool| {
            pool.spec
                .backend()
                .map(ObjectRef::new)
                .into_iter()
                .collect::<Vec<_>>()
        })
        // A Binding's ceiling or domain changes its backend's tenant policy seed; one made or
        // gone opens or closes its namespace in the store's NetworkPolicies.
        .watches_stream(
            bindings.relation_changes(Pass::SpecChanges),
            move |binding| {
                // The pools alone: a Binding's change costs a pass over the pools, not the World.
                Relation::of_pools(binding_ctx.pools.state())
                    .backend_name_of(&binding)
                    .filter(|n| !n.is_empty())
                    .map(ObjectRef::new)
            },
        )
        // A node cordoned, marked for deletion or relabelled: the members on it drain first
        // (docs/design.md#node-maintenance). Every managed backend looks; one with no member
        // there finds nothing to do.
        .watches_stream(scheduling_changes(nodes), move |_node| {
            backends_where(&node_backends, |b| b.spec.connection.managed.is_some())
        });
    super::shared::drive(
        controller,
        CONTROLLER,
        reconcile,
        Duration::from_secs(5),
        ctx,
    )
    .await;
}

/// The Nodes whose scheduling facts changed (`kvcache_render::members::maintenance::SchedulingFacts`:
/// a cordon, a taint, a label), each once the shared cache holds the change; their status
/// writes pass by.
fn scheduling_changes(
    nodes: crate::watch::Subscription<Node>,
) -> impl futures::Stream<Item = Result<Node, watcher::Error>> + Send + 'static {
    use futures::StreamExt;
    let mut seen: std::collections::HashMap<String, SchedulingFacts> = Default::default();
    nodes.relation_changes(Pass::Every).filter(move |n| {
        let changed = match n {
            Ok(node) => {
                let facts = SchedulingFacts::of(node);
                seen.insert(node.name_any(), facts.clone()) != Some(facts)
            }
            Err(_) => true,
        };
        futures::future::ready(changed)
    })
}

/// The backends of `store` that `keep` picks, as the primary watch keys them.
fn backends_where(
    store: &Store<KVCacheBackend>,
    keep: impl Fn(&KVCacheBackend) -> bool,
) -> Vec<ObjectRef<KVCacheBackend>> {
    store
        .state()
        .iter()
        .filter(|b| keep(b))
        .map(|b| ObjectRef::from_obj(&**b))
        .collect()
}

/// The leader and member workloads and a warm backend's etcd wake their backend, by their
/// owner reference. Not `owns`: kube-runtime keys an owner found that way under its child's
/// namespace, and a backend is cluster-scoped, so `owns` queued a second key for the same
/// backend and two passes could run at once (two drains of one member were seen asked in the
/// same instant).
fn watch_workloads(
    controller: Controller<KVCacheBackend>,
    ctx: &Context,
) -> Controller<KVCacheBackend> {
    let (client, ns) = (&ctx.client, &ctx.config.namespace);
    controller
        .watches(
            Api::<Deployment>::namespaced(client.clone(), ns),
            watcher::Config::default(),
            |d| owning_backend(d.owner_references()),
        )
        .watches(
            Api::<DaemonSet>::namespaced(client.clone(), ns),
            watcher::Config::default(),
            |d| owning_backend(d.owner_references()),
        )
        // A warm backend's etcd: its readiness is in the status.
        .watches(
            Api::<StatefulSet>::namespaced(client.clone(), ns),
            watcher::Config::default(),
            |s| owning_backend(s.owner_references()),
        )
}

/// What else wakes a backend: its store Pods (a change reads the store at once), its isolation
/// probe's Pods (their end is the result), its Lease, the leader Service's endpoints (they move
/// when the serving leader changes) and the settings (the backends that name no image of their
/// own).
fn watch_signals(
    controller: Controller<KVCacheBackend>,
    ctx: &Context,
) -> Controller<KVCacheBackend> {
    let (client, ns) = (&ctx.client, &ctx.config.namespace);
    let store = controller.store();
    let (pods, probes, leases, slices, settings) = (
        store.clone(),
        store.clone(),
        store.clone(),
        store.clone(),
        store,
    );
    controller
        .watches(
            Api::<Pod>::namespaced(client.clone(), ns),
            watcher::Config::default().labels(&names::store_objects()),
            move |pod| by_instance_label(&pods, pod.labels()),
        )
        .watches(
            Api::<Pod>::namespaced(client.clone(), ns),
            watcher::Config::default().labels(PROBE_LABEL),
            move |pod| {
                let of = pod.labels().get(PROBE_LABEL).cloned();
                backends_where(&probes, |b| Some(label_value(&b.name_any())) == of)
            },
        )
        .watches(
            Api::<Lease>::namespaced(client.clone(), ns),
            watcher::Config::default().labels(&names::store_objects()),
            move |lease| by_instance_label(&leases, lease.labels()),
        )
        .watches(
            Api::<EndpointSlice>::namespaced(client.clone(), ns),
            watcher::Config::default(),
            move |slice| {
                let service = slice.labels().get("kubernetes.io/service-name").cloned();
                backends_where(&slices, |b| Some(leader_name(&b.name_any())) == service)
            },
        )
        .watches(
            Api::<ConfigMap>::namespaced(client.clone(), ns),
            watcher::Config::default().fields(&format!(
                "metadata.name={}",
                kvcache_api::settings::SETTINGS_CONFIG_MAP
            )),
            move |_| backends_where(&settings, |b| b.spec.image.is_none()),
        )
}

#[instrument(skip(b, ctx), fields(backend = %b.name_any()))]
async fn reconcile(b: Arc<KVCacheBackend>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<KVCacheBackend> = Api::all(ctx.client.clone());
    finalizer(&api, FINALIZER, b, |event| async {
        match event {
            Finalized::Apply(b) => apply(&b, &ctx).await,
            Finalized::Cleanup(b) => cleanup(&b, &ctx).await,
        }
    })
    .await
    .map_err(crate::error::from_finalizer)
}

/// The applied set of the backend with uid `uid`: its objects carry [`OWNER_LABEL`].
fn applied_set(ctx: &Context, uid: &str) -> AppliedSet {
    AppliedSet::new(
        ctx.client.clone(),
        &ctx.config.namespace,
        uid,
        format!("{OWNER_LABEL}={uid}"),
    )
}

/// Writes the pass's objects through the backend's applied set, in the plan's order, and
/// sweeps the rest of its kinds.
async fn write_objects(ctx: &Context, uid: &str, desired: &DesiredSet) -> Result<(), Error> {
    let mut set = applied_set(ctx, uid);
    set.write(desired).await?;
    set.sweep(desired.kinds, Sweep::Prune).await?;
    Ok(())
}

/// What a pass reads for a backend before anything is decided (see [`BackendRead`]).
#[derive(Default)]
struct Reads {
    deployments: Vec<Deployment>,
    daemon_sets: Vec<DaemonSet>,
    stateful_sets: Vec<StatefulSet>,
    lease: Option<Lease>,
    store_pods: Vec<Pod>,
    store: Option<StoreReading>,
    jobs: BTreeMap<String, Result<DrainJob, ReadError>>,
    /// The Pods at each address of a segment no member Pod mounted (`namespace/name`).
    pods_at: BTreeMap<String, String>,
    /// The backend's isolation probe Pods.
    probe_pods: Vec<Pod>,
}

/// Lists the backend's objects of kind `K` by its owner label.
async fn owned<K: super::applied::Owned>(ctx: &Context, uid: &str) -> Result<Vec<K>, Error> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    Ok(api
        .list(&ListParams::default().labels(&format!("{OWNER_LABEL}={uid}")))
        .await
        .map_err(kerr("list", format!("{}s of backend {uid}", K::kind(&()))))?
        .items)
}

/// The pass's reads: a managed backend's live workloads, Lease and store Pods; the master's
/// answers (health, metrics, segments, and each drain job recorded on a member Pod).
async fn read_backend(ctx: &Context, b: &KVCacheBackend) -> Result<Reads, Error> {
    let name = b.name_any();
    let mut reads = Reads::default();
    if let Some(managed) = &b.spec.connection.managed {
        let uid = b.uid().unwrap_or_default();
        reads.deployments = owned(ctx, &uid).await?;
        reads.daemon_sets = owned(ctx, &uid).await?;
        reads.stateful_sets = owned(ctx, &uid).await?;
        let ns = &ctx.config.namespace;
        if managed.leader.elects() {
            let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), ns);
            reads.lease = leases
                .get_opt(&leader_name(&name))
                .await
                .map_err(kerr("get", format!("Lease {}", leader_name(&name))))?;
        }
        // Every backend's store Pods: a segment of another's on this master is a member
        // mounted on the wrong master.
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        reads.store_pods = pods
            .list(&ListParams::default().labels(&names::store_objects()))
            .await
            .map_err(kerr("list", format!("store Pods in {ns}")))?
            .items;
        reads.probe_pods = pods
            .list(&ListParams::default().labels(&format!("{PROBE_LABEL}={}", label_value(&name))))
            .await
            .map_err(kerr("list", format!("isolation probe Pods in {ns}")))?
            .items;
    }
    if let Some(admin) = ctx.admin_address(b) {
        reads.store = Some(read_store(ctx, &name, &admin).await);
        // On re-entry, the master is asked about each recorded job before another is created.
        for job in plan::drain_jobs(&name, &reads.store_pods) {
            let answer = ctx.store.drain_job(&admin, &job).await;
            reads.jobs.insert(job, answer);
        }
    } else {
        // Never read (an external backend without an Admin endpoint): no reads counted, no
        // series kept from an earlier address.
        ctx.metrics.store_not_read(&name);
    }
    let addresses = plan::unknown_addresses(b, &reads.store_pods, reads.store.as_ref());
    reads.pods_at = pods_at(ctx, addresses).await;
    Ok(reads)
}

/// At most this many unknown addresses are looked up a pass (a list call each).
const LOOKUPS: usize = 16;

/// The Pods that have each of `addresses` (`status.podIP`, in every namespace), named as a
/// status names them (`kvcache_render::members::mounts::pods_named`). A failed lookup leaves the address
/// unnamed (the segment is still reported) and is logged.
async fn pods_at(
    ctx: &Context,
    addresses: std::collections::BTreeSet<String>,
) -> BTreeMap<String, String> {
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let mut out = BTreeMap::new();
    for address in addresses.into_iter().take(LOOKUPS) {
        let found = pods
            .list(&ListParams::default().fields(&format!("status.podIP={address}")))
            .await;
        match found {
            Ok(list) => {
                let names: Vec<String> = list
                    .items
                    .iter()
                    .filter(|p| {
                        !matches!(
                            p.status.as_ref().and_then(|s| s.phase.as_deref()),
                            Some("Succeeded" | "Failed")
                        )
                    })
                    .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
                    .collect();
                if let Some(named) = kvcache_render::members::mounts::pods_named(&names) {
                    out.insert(address, named);
                }
            }
            Err(e) => {
                warn!(%address, error = %e, "could not look up the Pod at an unknown segment's address");
            }
        }
    }
    out
}

/// The backend's apply pass: read, plan (`kvcache_render::plan::backend`, pure), then act:
/// apply the objects through the applied set, carry out the member rollout's steps, restart
/// other backends' members mounted here, and write status, events and metrics.
async fn apply(b: &KVCacheBackend, ctx: &Context) -> Result<Action, Error> {
    let previous = b.status.clone().unwrap_or_default();
    let world = ctx.world();
    let chosen = ctx.settings();
    let reads = read_backend(ctx, b).await?;
    let read = BackendRead {
        backend: b,
        namespace: &ctx.config.namespace,
        access: &ctx.config.access,
        settings: chosen.settings.as_ref(),
        settings_refused: chosen.refused.as_ref().map(ToString::to_string),
        world: &world,
        deployments: &reads.deployments,
        daemon_sets: &reads.daemon_sets,
        stateful_sets: &reads.stateful_sets,
        lease: reads.lease.as_ref(),
        store_pods: &reads.store_pods,
        nodes: &ctx.nodes.state(),
        store: reads.store.clone(),
        jobs: reads.jobs.clone(),
        pods_at: &reads.pods_at,
        drain_unknown: ctx.config.drain_unknown,
        probe_pods: &reads.probe_pods,
        probe: ctx.config.isolation_probe,
        now: k8s_openapi::jiff::Timestamp::now(),
    };
    let plan = plan::plan(&read)?;
    if let Some(desired) = plan.desired() {
        write_objects(ctx, &b.uid().unwrap_or_default(), &desired).await?;
    }
    // After the policies: the probe checks what was just applied.
    probe(ctx, &plan).await?;
    let mut obs = plan.observation.clone();
    obs.rollout = members::roll_members(ctx, b, &read, &plan).await?;
    members::hand_over(ctx, b, &plan).await?;
    members::restart_foreign_members(ctx, b, &plan.foreign).await?;
    members::quarantine(ctx, b, &plan.quarantine).await;
    let soon = obs
        .rollout
        .iter()
        .any(|s| s.step.polls_store())
        .then_some(DRAIN_POLL);
    conclude(
        ctx,
        b,
        &previous,
        &obs,
        soon.into_iter().chain(plan.recheck).min(),
    )
    .await
}

/// Carries out the isolation probe's step (`kvcache_render::objects::backend::probe::decide`): deletes
/// the probe Pods it read or found stale, creates the new one (one that exists already, from a
/// pass whose answer was lost, is kept).
async fn probe(ctx: &Context, plan: &BackendPlan) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    for name in &plan.probe_delete {
        super::shared::delete(&pods, "Pod", name, &DeleteParams::background()).await?;
    }
    if let Some(pod) = &plan.probe_create {
        let name = pod.name_any();
        match pods.create(&PostParams::default(), pod).await {
            Ok(_) => info!(pod = %name, "probing that the store's NetworkPolicies are enforced"),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(kerr("create", format!("Pod {name}"))(e)),
        }
    }
    Ok(())
}

/// Reads the store through the backend's admin address, counts the read and keeps the
/// master's series for re-export (dropped when the read fails).
async fn read_store(ctx: &Context, backend: &str, admin: &str) -> StoreReading {
    let reading = ctx.store.read(admin).await;
    let result = if reading.health.is_ok() {
        "ok"
    } else {
        "error"
    };
    ctx.metrics
        .store_reads
        .get_or_create(&crate::telemetry::StoreLabels {
            backend: backend.to_owned(),
            result: result.into(),
        })
        .inc();
    ctx.metrics.store_series(
        backend,
        reading.metrics.as_ref().ok().map(|m| m.series.clone()),
    );
    reading
}

/// Computes the status from `obs`, records the backend's metrics, writes the status, and says
/// when to come back (within `soon` when given: [`DRAIN_POLL`] while the rollout polls the
/// store, or when an unknown segment's grace runs out).
async fn conclude(
    ctx: &Context,
    b: &KVCacheBackend,
    previous: &KVCacheBackendStatus,
    obs: &Observation,
    soon: Option<Duration>,
) -> Result<Action, Error> {
    let name = b.name_any();
    let computed = backend_status(b, obs, previous);
    let figures = Figures::Backend {
        capacity: computed.capacity.clone(),
        phase: computed.phase,
        members: computed.members.len(),
    };
    ctx.metrics.backend(
        &name,
        computed
            .capacity
            .as_ref()
            .and_then(|c| kvcache_api::quantity::parse_bytes(&c.total.0).ok()),
        obs.members
            .iter()
            .filter(|m| m.ready && !m.terminating)
            .count(),
        computed.members.len(),
        computed.phase == BackendPhase::Degraded,
    );
    ctx.metrics.unknown_segments(
        &name,
        obs.unknown_segments
            .as_ref()
            .map(|u| u.iter().filter(|u| u.confirmed).count()),
    );
    write_status(ctx, b, previous, computed, obs).await?;
    let next = ctx.next_poll(Polled::Backend(name), figures, ctx.config.poll_stable);
    Ok(Action::requeue(soon.map_or(next, |soon| next.min(soon))))
}

async fn write_status(
    ctx: &Context,
    b: &KVCacheBackend,
    previous: &KVCacheBackendStatus,
    computed: Computed,
    obs: &Observation,
) -> Result<(), Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut status = kvcache_render::status::backend::apply(previous, computed, obs, &now);
    if let Some(x) = &b.spec.connection.external {
        status.endpoints = x.endpoints.clone();
    }
    events(ctx, b, previous, &status).await;
    super::status::apply(
        &Api::<KVCacheBackend>::all(ctx.client.clone()),
        "KVCacheBackend",
        b.meta(),
        crate::context::MANAGER,
        &status,
    )
    .await
}

/// Records the events `kvcache_render::status::events` picks for the transition.
async fn events(
    ctx: &Context,
    b: &KVCacheBackend,
    before: &KVCacheBackendStatus,
    after: &KVCacheBackendStatus,
) {
    let reference = b.object_ref(&());
    for note in backend_events(before, after) {
        super::shared::publish(
            ctx,
            &reference,
            &super::shared::event_of(&note, "Reconcile", None),
        )
        .await;
    }
}

/// Teardown (docs/design.md#backend-teardown): held while a pool uses the backend; then the leader, its Service and
/// every member DaemonSet (found by the backend's ownership label) are deleted and awaited, each
/// within its Pods' termination grace plus a slack, after which it is abandoned with a warning.
async fn cleanup(b: &KVCacheBackend, ctx: &Context) -> Result<Action, Error> {
    let name = b.name_any();
    let world = ctx.world();
    let used_by = world.consumers(&name);
    if !used_by.is_empty() {
        let previous = b.status.clone().unwrap_or_default();
        let obs = Observation {
            deleting: true,
            used_by: used_by.clone(),
            bound_namespaces: world.bound_namespaces(&name),
            endpoint: previous.endpoint.clone(),
            ..Observation::empty(b.metadata.generation)
        };
        let mut computed = backend_status(b, &obs, &previous);
        computed.capacity = previous.capacity.clone();
        write_status(ctx, b, &previous, computed, &obs).await?;
        return Err(Error::BackendInUse {
            backend: name,
            used_by,
        });
    }
    ctx.metrics.backend_gone(&name);
    let Some(uid) = b.uid() else {
        return Ok(Action::await_change());
    };
    let started = b
        .metadata
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or_else(k8s_openapi::jiff::Timestamp::now);
    let elapsed = k8s_openapi::jiff::Timestamp::now()
        .duration_since(started)
        .try_into()
        .unwrap_or(Duration::ZERO);
    // The same sweep as a pass's, over an empty set.
    let swept = applied_set(ctx, &uid)
        .sweep(
            BACKEND_TEARDOWN,
            Sweep::Teardown {
                elapsed,
                slack: TEARDOWN_SLACK,
            },
        )
        .await?;
    for (object, kind, grace) in swept.abandoned {
        let name = object.name.clone().unwrap_or_default();
        let note = events::teardown_abandoned(&kind, &name, grace, TEARDOWN_SLACK);
        super::shared::publish(
            ctx,
            &object,
            &super::shared::event_of(&note, "Teardown", None),
        )
        .await;
    }
    if !swept.waiting.is_empty() {
        return Err(Error::TeardownWaiting {
            workloads: swept.waiting,
        });
    }
    // The rest (accounts, Roles, the Lease, the policy seed) go with their owner reference.
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    #[test]
    fn a_workload_maps_to_its_backend_under_the_primary_key() {
        let owner = |kind: &str, api_version: &str, controller| OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "mooncake-dram".into(),
            uid: "u".into(),
            controller: Some(controller),
            block_owner_deletion: None,
        };
        let backend: KVCacheBackend = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
            "metadata": {"name": "mooncake-dram"},
            "spec": {"connection": {"external": {"endpoints": []}}}
        }))
        .expect("a backend");
        let mapped = owning_backend(&[owner("KVCacheBackend", "worker.gpustack.ai/v1", true)]);
        // The same key as the backend's own watch: no namespace, so never a second queue entry.
        assert_eq!(mapped, Some(ObjectRef::from_obj(&backend)));
        assert_eq!(mapped.and_then(|r| r.namespace), None);
        assert_eq!(
            owning_backend(&[owner("KVCacheBackend", "worker.gpustack.ai/v1", false)]),
            None
        );
        assert_eq!(
            owning_backend(&[owner("ReplicaSet", "apps/v1", true)]),
            None
        );
    }
}
