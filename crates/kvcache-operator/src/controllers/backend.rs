//! The KVCacheBackend controller: fetch, call `kvcache-render` (objects, then status from what
//! was observed), write. Every decision is a pure function in `kvcache-render`; this module only
//! reads the cluster and the store, applies, prunes, carries out the member rollout's step
//! (drains through the master, annotations and deletions of member Pods) and writes status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Pod, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as Finalized, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use kvcache_api::backend::{
    BackendPhase, EndpointName, KVCacheBackendStatus, Managed, ObjectRef as Consumer,
};
use kvcache_api::settings::Settings;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};
use kvcache_inject::versions::store_version_of_image;
use kvcache_quota::policy;
use kvcache_render::backend::{
    BackendInputs, BackendObjects, OWNER_LABEL, client_endpoint, leader_name,
};
use kvcache_render::events::{Kind, backend_events};
use kvcache_render::mounts::{OtherMember, foreign_mounts};
use kvcache_render::names::label_value;
use kvcache_render::read::{self, DRAIN_JOB_ANNOTATION, DRAIN_STARTED_ANNOTATION};
use kvcache_render::resolve::{ceilings_on, store_image};
use kvcache_render::rollout::{
    GroupFacts, GroupStep, RolloutInput, Step, hold_standbys, member_rollout, step_event,
};
use kvcache_render::status::backend::{Computed, Observation, backend_status};
use kvcache_render::store::{DrainRequest, ReadError};
use serde::de::DeserializeOwned;
use tracing::{info, instrument, warn};

use crate::context::{Context, Figures, Polled};
use crate::error::{Error, kube as kerr};

/// Held while the backend's workloads are torn down.
pub const FINALIZER: &str = "kvcache.gpustack.ai/teardown";

const CONTROLLER: &str = "kvcachebackend";

/// How long a workload gets to go beyond its Pods' termination grace.
const TEARDOWN_SLACK: Duration = Duration::from_secs(120);

/// How long a member's drain may run before the member is replaced without it: longer than the
/// master's read lease (`-default_kv_lease_ttl=5m`, crates/kvcache-render/src/backend/leader.rs),
/// during which an object read just before the drain cannot move.
const DRAIN_DEADLINE: Duration = Duration::from_secs(600);

/// How soon the master is asked again while a drain runs or a replacement's mount is awaited
/// (neither is seen on a watch).
const DRAIN_POLL: Duration = Duration::from_secs(2);

/// The backends a labelled object (member Pod, Lease) belongs to.
fn by_instance_label(
    store: &Store<KVCacheBackend>,
    labels: &BTreeMap<String, String>,
) -> Vec<ObjectRef<KVCacheBackend>> {
    if labels.get("app.kubernetes.io/name").map(String::as_str) != Some("kv-cache-backend") {
        return Vec::new();
    }
    let Some(instance) = labels.get("app.kubernetes.io/instance") else {
        return Vec::new();
    };
    store
        .state()
        .iter()
        .filter(|b| label_value(&b.name_any()) == *instance)
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

/// Runs the controller until shutdown.
pub async fn run(ctx: Arc<Context>, changes: crate::watch::Subscription<KVCacheBackend>) {
    let client = ctx.client.clone();
    let ns = ctx.config.namespace.clone();
    let backends: Api<KVCacheBackend> = Api::all(client.clone());
    let controller = if ctx.config.backend_selector.is_empty() {
        crate::watch::shared_controller(&changes, ctx.backends.clone())
    } else {
        // Scoped by a label selector: a watch of its own, filtered by the API server.
        crate::watch::controller(
            backends,
            watcher::Config::default().labels(&ctx.config.backend_selector),
        )
    };
    let store = controller.store();
    let (pod_store, lease_store, settings_store, slice_store) =
        (store.clone(), store.clone(), store.clone(), store.clone());
    let binding_ctx = ctx.clone();
    controller
        // The leader and member workloads, by their owner reference. Not `owns`: kube-runtime
        // keys an owner found that way under its child's namespace, and a backend is
        // cluster-scoped, so `owns` queued a second key for the same backend and two passes
        // could run at once (two drains of one member were seen asked in the same instant).
        .watches(
            Api::<Deployment>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
            |d| owning_backend(d.owner_references()),
        )
        .watches(
            Api::<DaemonSet>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
            |d| owning_backend(d.owner_references()),
        )
        // A warm backend's etcd: its readiness is in the status.
        .watches(
            Api::<StatefulSet>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
            |s| owning_backend(s.owner_references()),
        )
        // Member and leader Pods: a change reads the store at once.
        .watches(
            Api::<Pod>::namespaced(client.clone(), &ns),
            watcher::Config::default().labels("app.kubernetes.io/name=kv-cache-backend"),
            move |pod| by_instance_label(&pod_store, pod.labels()),
        )
        .watches(
            Api::<Lease>::namespaced(client.clone(), &ns),
            watcher::Config::default().labels("app.kubernetes.io/name=kv-cache-backend"),
            move |lease| by_instance_label(&lease_store, lease.labels()),
        )
        // The leader Service's endpoints move when the serving leader changes.
        .watches(
            Api::<EndpointSlice>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
            move |slice| {
                let service = slice.labels().get("kubernetes.io/service-name").cloned();
                slice_store
                    .state()
                    .iter()
                    .filter(|b| Some(leader_name(&b.name_any())) == service)
                    .map(|b| ObjectRef::from_obj(&**b))
                    .collect::<Vec<_>>()
            },
        )
        // The settings: exactly the backends that name no image of their own.
        .watches(
            Api::<ConfigMap>::namespaced(client.clone(), &ns),
            watcher::Config::default().fields(&format!(
                "metadata.name={}",
                kvcache_api::settings::SETTINGS_CONFIG_MAP
            )),
            move |_| {
                settings_store
                    .state()
                    .iter()
                    .filter(|b| b.spec.image.is_none())
                    .map(|b| ObjectRef::from_obj(&**b))
                    .collect::<Vec<_>>()
            },
        )
        // A pool names its backend (status.usedBy, deletion hold, the tenant policy).
        .watches_stream(
            crate::watch::spec_changes(Api::<KVCachePool>::all(client.clone())),
            |pool| {
                pool.spec
                    .backend()
                    .map(ObjectRef::new)
                    .into_iter()
                    .collect::<Vec<_>>()
            },
        )
        // A Binding's ceiling or domain changes its backend's tenant policy seed.
        .watches_stream(
            crate::watch::spec_changes(Api::<KVCachePoolBinding>::all(client.clone())),
            move |binding| {
                binding_ctx
                    .pools
                    .get(&ObjectRef::new(&binding.spec.pool_ref.name))
                    .and_then(|p| p.spec.backend().map(ObjectRef::new))
            },
        )
        .shutdown_on_signal()
        .run(
            super::traced(CONTROLLER, reconcile),
            super::error_policy(Duration::from_secs(5)),
            ctx.clone(),
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile outcome");
            }
        })
        .await;
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

/// The pools that draw on `backend`.
fn consumers(ctx: &Context, backend: &str) -> Vec<Consumer> {
    let mut out: Vec<Consumer> = ctx
        .pools
        .state()
        .iter()
        .filter(|p| p.spec.backend() == Some(backend))
        .map(|p| Consumer {
            kind: "KVCachePool".into(),
            namespace: None,
            name: p.name_any(),
        })
        .collect();
    out.sort();
    out
}

/// What applying a backend's objects found of the live ones.
struct Applied {
    /// The live leader Deployment.
    leader: Option<Deployment>,
    /// Whether standbys are held back (docs/design.md#two-step-election).
    held: bool,
    /// On how many nodes each member DaemonSet runs a Pod.
    desired: Vec<Option<i32>>,
    /// The live etcd StatefulSet of a warm backend.
    etcd: Option<StatefulSet>,
}

/// Applies every rendered object and prunes the rest.
async fn apply_objects(
    ctx: &Context,
    uid: &str,
    mut objects: BackendObjects,
    write_policy: bool,
) -> Result<Applied, Error> {
    let c = ctx.client.clone();
    let ns = &ctx.config.namespace;
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), ns);
    let mut held = false;
    if let Some(d) = objects.deployment.as_mut() {
        let live = deployments
            .get_opt(&d.name_any())
            .await
            .map_err(kerr("get", format!("Deployment {}", d.name_any())))?;
        held = hold_standbys(live.as_ref(), d);
        if held && let Some(spec) = d.spec.as_mut() {
            spec.replicas = Some(1);
        }
    }
    let sa: Api<ServiceAccount> = Api::namespaced(c.clone(), ns);
    let roles: Api<Role> = Api::namespaced(c.clone(), ns);
    let bindings: Api<RoleBinding> = Api::namespaced(c.clone(), ns);
    let leases: Api<Lease> = Api::namespaced(c.clone(), ns);
    let maps: Api<ConfigMap> = Api::namespaced(c.clone(), ns);
    let services: Api<Service> = Api::namespaced(c.clone(), ns);
    let daemons: Api<DaemonSet> = Api::namespaced(c.clone(), ns);
    let sets: Api<StatefulSet> = Api::namespaced(c.clone(), ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(c.clone(), ns);
    for o in &objects.service_accounts {
        super::apply(&sa, o).await?;
    }
    for o in &objects.roles {
        super::apply(&roles, o).await?;
    }
    for o in &objects.role_bindings {
        super::apply(&bindings, o).await?;
    }
    // The Lease is created once; its holder fields belong to the elector.
    if let Some(l) = &objects.lease
        && leases
            .get_opt(&l.name_any())
            .await
            .map_err(kerr("get", format!("Lease {}", l.name_any())))?
            .is_none()
    {
        super::apply(&leases, l).await?;
    }
    if write_policy && let Some(m) = &objects.config_map {
        super::apply(&maps, m).await?;
    }
    let mut live = None;
    if let Some(d) = &objects.deployment {
        live = Some(super::apply(&deployments, d).await?);
    }
    if let Some(s) = &objects.service {
        super::apply(&services, s).await?;
    }
    // The etcd (its policy first: it is never reachable unguarded) before the members that dial
    // it.
    if let Some(p) = &objects.etcd_policy {
        super::apply(&policies, p).await?;
    }
    if let Some(s) = &objects.etcd_service {
        super::apply(&services, s).await?;
    }
    let mut etcd = None;
    if let Some(s) = &objects.etcd {
        etcd = Some(super::apply(&sets, s).await?);
    }
    let mut desired = Vec::new();
    for d in &objects.daemon_sets {
        let live = super::apply(&daemons, d).await?;
        desired.push(live.status.map(|s| s.desired_number_scheduled));
    }
    super::prune(&sa, uid, &super::names(&objects.service_accounts)).await?;
    super::prune(&roles, uid, &super::names(&objects.roles)).await?;
    super::prune(&bindings, uid, &super::names(&objects.role_bindings)).await?;
    super::prune(&leases, uid, &super::names(objects.lease.as_slice())).await?;
    if write_policy {
        super::prune(&maps, uid, &super::names(objects.config_map.as_slice())).await?;
    }
    super::prune(
        &deployments,
        uid,
        &super::names(objects.deployment.as_slice()),
    )
    .await?;
    let services_kept: std::collections::BTreeSet<String> = objects
        .service
        .iter()
        .chain(objects.etcd_service.iter())
        .map(|s| s.name_any())
        .collect();
    super::prune(&services, uid, &services_kept).await?;
    super::prune(&daemons, uid, &super::names(&objects.daemon_sets)).await?;
    super::prune(&sets, uid, &super::names(objects.etcd.as_slice())).await?;
    super::prune(
        &policies,
        uid,
        &super::names(objects.etcd_policy.as_slice()),
    )
    .await?;
    Ok(Applied {
        leader: live,
        held,
        desired,
        etcd,
    })
}

/// The backend's apply pass: observes (and, for a managed backend, renders and applies its
/// objects), reads the store, carries out the member rollout, then writes status and metrics.
async fn apply(b: &KVCacheBackend, ctx: &Context) -> Result<Action, Error> {
    let name = b.name_any();
    let previous = b.status.clone().unwrap_or_default();
    let used_by = consumers(ctx, &name);
    let mut obs = Observation {
        used_by,
        ..Observation::empty(b.metadata.generation)
    };
    let mut render_problem = None;
    let mut groups = Vec::new();
    if let Some(managed) = &b.spec.connection.managed {
        (render_problem, groups) = observe_managed(ctx, b, managed, &mut obs).await?;
    } else if let Some(x) = &b.spec.connection.external {
        obs.endpoint = x.address(EndpointName::Client).map(str::to_owned);
    }
    read_store(ctx, b, &mut obs).await;
    // The member rollout, one member at a time per group, each drained first where it can be.
    if b.spec.connection.managed.is_some() {
        obs.rollout = roll_members(ctx, b, &obs, &groups).await?;
    }
    restart_foreign_members(ctx, b, &obs).await?;
    let soon = obs.rollout.iter().any(|s| s.step.polls_store());
    obs.render_refused = render_problem.map(|p| (p.reason(), p.to_string()));
    conclude(ctx, b, &previous, &obs, soon).await
}

/// A managed backend's part of the pass: its endpoint and settings, its objects rendered and
/// applied (when the settings and the store image allow), its Lease and the store Pods. Returns
/// why nothing was rendered (no store image) and each member group's facts for the rollout.
async fn observe_managed(
    ctx: &Context,
    b: &KVCacheBackend,
    managed: &Managed,
    obs: &mut Observation,
) -> Result<(Option<kvcache_render::Error>, Vec<GroupFacts>), Error> {
    let name = b.name_any();
    obs.endpoint = Some(client_endpoint(
        &name,
        &ctx.config.namespace,
        &managed.leader,
    ));
    let chosen = ctx.settings();
    obs.settings_refused = chosen
        .refused
        .as_ref()
        .map(|e| (e.to_string(), chosen.settings.is_some()));
    let unsettled = chosen.settings.is_none();
    let settings = chosen.settings.unwrap_or_default();
    let image = store_image(b, &settings);
    let mut render_problem = None;
    let mut groups = Vec::new();
    match image {
        // Refused settings and none read before: what runs stays as it is.
        _ if unsettled => {}
        None => {
            render_problem = Some(kvcache_render::Error::NoStoreImage {
                backend: name.clone(),
            })
        }
        Some(image) => groups = render_and_apply(ctx, b, managed, image, &settings, obs).await?,
    }
    if managed.leader.elects() {
        observe_lease(ctx, &name, image, obs).await?;
    }
    observe_store_pods(ctx, &name, obs).await?;
    Ok((render_problem, groups))
}

/// Renders the managed backend's objects with the store image `image` and the tenant policy of
/// the pools on it, and applies them ([`apply_objects`]). Returns each member group's facts.
async fn render_and_apply(
    ctx: &Context,
    b: &KVCacheBackend,
    managed: &Managed,
    image: &str,
    settings: &Settings,
    obs: &mut Observation,
) -> Result<Vec<GroupFacts>, Error> {
    let name = b.name_any();
    let uid = b.uid().unwrap_or_default();
    let pools = ctx.pools.state();
    let bindings = ctx.bindings.state();
    let (ceilings, _) = ceilings_on(
        &name,
        pools.iter().map(|p| &**p),
        bindings.iter().map(|b| &**b),
    );
    // A refused policy keeps the document already written (never a partial one).
    let doc = policy::render(&name, &ceilings).ok();
    let bound = kvcache_render::backend::bound_namespaces(
        &name,
        pools.iter().map(|p| &**p),
        bindings.iter().map(|b| &**b),
    );
    let objects = kvcache_render::backend::render(&BackendInputs {
        backend: b,
        store_image: image,
        namespace: &ctx.config.namespace,
        elector_image: settings.elector_image(),
        etcd_image: settings.etcd_image(),
        bound_namespaces: &bound,
        policy: doc.as_ref(),
    })?;
    obs.rendered_hashes = objects
        .daemon_sets
        .iter()
        .map(kvcache_render::backend::pod_spec_hash)
        .collect();
    let applied = apply_objects(
        ctx,
        &uid,
        objects,
        doc.is_some() || !managed.leader.multi_tenancy,
    )
    .await?;
    obs.standbys_held = applied.held;
    obs.leader = applied.leader.as_ref().map(read::replicas);
    obs.etcd = applied
        .etcd
        .as_ref()
        .map(|s| read::etcd(s, &name, &ctx.config.namespace, &managed.leader));
    Ok(managed
        .members
        .iter()
        .zip(applied.desired)
        .map(|(g, desired)| GroupFacts {
            tier: g.tier().is_some(),
            desired,
        })
        .collect())
}

/// Reads the backend's leader Lease: its holder, and the store version the running master
/// published on it beside the one the store image `image` names.
async fn observe_lease(
    ctx: &Context,
    name: &str,
    image: Option<&str>,
    obs: &mut Observation,
) -> Result<(), Error> {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let lease = leases
        .get_opt(&leader_name(name))
        .await
        .map_err(kerr("get", format!("Lease {}", leader_name(name))))?;
    // What the running master says it is, published by the elector.
    let tagged = image.and_then(store_version_of_image);
    obs.store_version = lease
        .as_ref()
        .and_then(|l| {
            l.annotations()
                .get(kvcache_api::STORE_VERSION_ANNOTATION)
                .cloned()
        })
        .map(|running| (running, tagged));
    obs.lease_holder = lease.map(|l| {
        l.spec
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty())
    });
    Ok(())
}

/// Every backend's store Pods: this backend's members, and the others' (a segment of one of
/// those on this master is a member mounted on the wrong master).
async fn observe_store_pods(ctx: &Context, name: &str, obs: &mut Observation) -> Result<(), Error> {
    let ns = &ctx.config.namespace;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let listed = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=kv-cache-backend"))
        .await
        .map_err(kerr("list", format!("store Pods in {ns}")))?;
    let own = label_value(name);
    for p in listed.iter() {
        let Some(member) = read::member_pod(p) else {
            continue;
        };
        match p.labels().get("app.kubernetes.io/instance") {
            Some(instance) if *instance == own => obs.members.push(member),
            Some(instance) => obs.other_members.push(OtherMember {
                backend: instance.clone(),
                pod: member,
            }),
            None => {}
        }
    }
    Ok(())
}

/// Reads the store through the backend's admin address, when it has one, and counts the read.
async fn read_store(ctx: &Context, b: &KVCacheBackend, obs: &mut Observation) {
    let Some(admin) = ctx.admin_address(b) else {
        return;
    };
    let reading = ctx.store.read(&admin).await;
    let result = if reading.health.is_ok() {
        "ok"
    } else {
        "error"
    };
    ctx.metrics
        .store_reads
        .get_or_create(&crate::telemetry::StoreLabels {
            backend: b.name_any(),
            result: result.into(),
        })
        .inc();
    obs.store = Some(reading);
}

/// Computes the status from `obs`, records the backend's metrics, writes the status, and says
/// when to come back (within [`DRAIN_POLL`] while the rollout polls the store: `soon`).
async fn conclude(
    ctx: &Context,
    b: &KVCacheBackend,
    previous: &KVCacheBackendStatus,
    obs: &Observation,
    soon: bool,
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
    write_status(ctx, b, previous, computed, obs).await?;
    let next = ctx.next_poll(Polled::Backend(name), figures, ctx.config.poll_stable);
    Ok(Action::requeue(if soon {
        next.min(DRAIN_POLL)
    } else {
        next
    }))
}

/// Restarts each member of another backend that this backend's master lists
/// (`kvcache_render::mounts::foreign_mounts`), so that it mounts on its own master again, with
/// a Warning event on this backend naming it.
async fn restart_foreign_members(
    ctx: &Context,
    b: &KVCacheBackend,
    obs: &Observation,
) -> Result<(), Error> {
    let Some(Ok(segments)) = obs.store.as_ref().map(|s| &s.segments) else {
        return Ok(());
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    for m in foreign_mounts(segments, &obs.members, &obs.other_members) {
        warn!(pod = %m.pod.name, of = %m.backend, "a member of another backend is mounted on this master; restarting it");
        pods.delete(&m.pod.name, &DeleteParams::default())
            .await
            .map_err(kerr("delete", format!("Pod {}", m.pod.name)))?;
        let event = Event {
            type_: EventType::Warning,
            reason: "ForeignMemberRestarted".into(),
            note: Some(format!(
                "member Pod {} of backend {} ({}) was mounted on this backend's master; it was deleted to mount on its own",
                m.pod.name, m.backend, m.pod.ip
            )),
            action: "Reconcile".into(),
            secondary: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(m.pod.name.clone()),
                namespace: Some(ctx.config.namespace.clone()),
                ..Default::default()
            }),
        };
        if let Err(e) = ctx.recorder.publish(&event, &b.object_ref(&())).await {
            warn!(error = %e, "could not record an event");
        }
    }
    Ok(())
}

/// Decides the member rollout's step per group ([`member_rollout`], docs/design.md#member-rollout)
/// from what `obs` saw and what the master says of each drain recorded on a member Pod, and
/// carries it out. Returns the steps for the status.
async fn roll_members(
    ctx: &Context,
    b: &KVCacheBackend,
    obs: &Observation,
    groups: &[GroupFacts],
) -> Result<Vec<GroupStep>, Error> {
    let admin = ctx.admin_address(b);
    // On re-entry, the master is asked about each recorded job before another is created.
    let mut jobs = BTreeMap::new();
    if let Some(admin) = &admin {
        for job in obs
            .members
            .iter()
            .filter_map(|p| p.drain.as_ref().and_then(|d| d.job.clone()))
        {
            let answer = ctx.store.drain_job(admin, &job).await;
            jobs.insert(job, answer);
        }
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    let decide = |refused: &BTreeMap<String, ReadError>| {
        member_rollout(&RolloutInput {
            members: &obs.members,
            rendered: &obs.rendered_hashes,
            groups,
            store: obs.store.as_ref(),
            jobs: &jobs,
            refused,
            now,
            deadline: DRAIN_DEADLINE,
        })
    };
    let mut refused = BTreeMap::new();
    let mut steps = decide(&refused);
    for (i, step) in steps.iter_mut().enumerate() {
        if let Some((pod, refusal)) = carry_out(ctx, b, obs, admin.as_deref(), step).await? {
            // The master refused the drain: decided again, the member goes without one.
            refused.insert(pod, refusal);
            if let Some(again) = decide(&refused).into_iter().nth(i) {
                carry_out(ctx, b, obs, admin.as_deref(), &again).await?;
                *step = again;
            }
        }
    }
    Ok(steps)
}

/// Carries out one group's step: a drain asked of the master and recorded on the Pod, or the
/// Pod deleted (a running job cancelled first), each with its event. Returns the master's
/// refusal of a drain (the Pod's name and the answer), for the step to be decided again.
async fn carry_out(
    ctx: &Context,
    b: &KVCacheBackend,
    obs: &Observation,
    admin: Option<&str>,
    step: &GroupStep,
) -> Result<Option<(String, ReadError)>, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    match &step.step {
        Step::StartDrain {
            pod,
            segment,
            targets,
            ..
        } => {
            let Some(admin) = admin else {
                return Ok(None);
            };
            // The start is written first: the drain is bounded even if the answer is lost.
            let started = obs
                .members
                .iter()
                .find(|p| p.name == *pod)
                .and_then(|p| p.drain.as_ref())
                .and_then(|d| d.started);
            if started.is_none() {
                let now = k8s_openapi::jiff::Timestamp::now().to_string();
                annotate(&pods, pod, DRAIN_STARTED_ANNOTATION, &now).await?;
            }
            match ctx
                .store
                .create_drain(admin, &DrainRequest::new(segment, targets))
                .await
            {
                Ok(job) => {
                    info!(pod = %pod, job = %job, "draining a member's segment before replacing it");
                    annotate(&pods, pod, DRAIN_JOB_ANNOTATION, &job).await?;
                    publish(ctx, b, pod, step, Some(&job)).await;
                }
                Err(e @ (ReadError::Status { .. } | ReadError::Refused { .. })) => {
                    return Ok(Some((pod.clone(), e)));
                }
                // No answer: the next pass finds the start recorded and asks again.
                Err(e) => warn!(pod = %pod, error = %e, "the master did not answer a drain"),
            }
        }
        Step::Replace { pod, .. } => {
            if let (Some(admin), Some(job)) = (admin, step.step.cancel())
                && let Err(e) = ctx.store.cancel_drain(admin, job).await
            {
                warn!(pod = %pod, job, error = %e, "could not cancel a drain past its deadline");
            }
            info!(pod = %pod, "replacing a member Pod whose template changed");
            if super::delete(&pods, pod, &DeleteParams::default()).await? {
                publish(ctx, b, pod, step, None).await;
            }
        }
        Step::UpToDate | Step::Wait { .. } | Step::AwaitDrain { .. } => {}
    }
    Ok(None)
}

/// Sets one annotation on a member Pod.
async fn annotate(pods: &Api<Pod>, pod: &str, key: &str, value: &str) -> Result<(), Error> {
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kerr("annotate", format!("Pod {pod}")))?;
    Ok(())
}

/// Records the event of a carried-out step on the backend, naming the member Pod.
async fn publish(
    ctx: &Context,
    b: &KVCacheBackend,
    pod: &str,
    step: &GroupStep,
    job: Option<&str>,
) {
    let Some(note) = step_event(step, job) else {
        return;
    };
    let event = Event {
        type_: match note.kind {
            Kind::Normal => EventType::Normal,
            Kind::Warning => EventType::Warning,
        },
        reason: note.reason.into(),
        note: Some(note.message.chars().take(1000).collect()),
        action: "Rollout".into(),
        secondary: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.to_owned()),
            namespace: Some(ctx.config.namespace.clone()),
            ..Default::default()
        }),
    };
    if let Err(e) = ctx.recorder.publish(&event, &b.object_ref(&())).await {
        warn!(error = %e, reason = note.reason, "could not record an event");
    }
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

/// Records the events `kvcache_render::events` picks for the transition.
async fn events(
    ctx: &Context,
    b: &KVCacheBackend,
    before: &KVCacheBackendStatus,
    after: &KVCacheBackendStatus,
) {
    let reference = b.object_ref(&());
    for note in backend_events(before, after) {
        let event = Event {
            type_: match note.kind {
                Kind::Normal => EventType::Normal,
                Kind::Warning => EventType::Warning,
            },
            reason: note.reason.into(),
            note: Some(note.message.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&event, &reference).await {
            warn!(error = %e, reason = note.reason, "could not record an event");
        }
    }
}

/// Teardown (docs/design.md#backend-teardown): held while a pool uses the backend; then the leader, its Service and
/// every member DaemonSet (found by the backend's ownership label) are deleted and awaited, each
/// within its Pods' termination grace plus a slack, after which it is abandoned with a warning.
async fn cleanup(b: &KVCacheBackend, ctx: &Context) -> Result<Action, Error> {
    let name = b.name_any();
    let used_by = consumers(ctx, &name);
    if !used_by.is_empty() {
        let previous = b.status.clone().unwrap_or_default();
        let obs = Observation {
            deleting: true,
            used_by: used_by.clone(),
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
    let c = ctx.client.clone();
    let ns = &ctx.config.namespace;
    let selector = ListParams::default().labels(&format!("{OWNER_LABEL}={uid}"));
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), ns);
    let daemons: Api<DaemonSet> = Api::namespaced(c.clone(), ns);
    let services: Api<Service> = Api::namespaced(c.clone(), ns);
    let mut waiting = Vec::new();
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
    teardown(&deployments, &selector, elapsed, &mut waiting, ctx).await?;
    teardown(&daemons, &selector, elapsed, &mut waiting, ctx).await?;
    // A warm backend's etcd last of the workloads (its claims go with it, by the StatefulSet's
    // retention policy).
    let sets: Api<StatefulSet> = Api::namespaced(c.clone(), ns);
    teardown(&sets, &selector, elapsed, &mut waiting, ctx).await?;
    for s in services
        .list(&selector)
        .await
        .map_err(kerr("list", "leader Services"))?
    {
        services
            .delete(&s.name_any(), &DeleteParams::default())
            .await
            .map_err(kerr("delete", format!("Service {}", s.name_any())))?;
    }
    if !waiting.is_empty() {
        return Err(Error::TeardownWaiting { workloads: waiting });
    }
    // The rest (accounts, Roles, the Lease, the policy seed) go with their owner reference.
    Ok(Action::await_change())
}

/// A workload the teardown awaits: its Pods' termination grace bounds the wait.
trait Workload: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug {
    fn pod_spec(&self) -> Option<&k8s_openapi::api::core::v1::PodSpec>;
}

impl Workload for Deployment {
    fn pod_spec(&self) -> Option<&k8s_openapi::api::core::v1::PodSpec> {
        self.spec.as_ref().and_then(|s| s.template.spec.as_ref())
    }
}

impl Workload for DaemonSet {
    fn pod_spec(&self) -> Option<&k8s_openapi::api::core::v1::PodSpec> {
        self.spec.as_ref().and_then(|s| s.template.spec.as_ref())
    }
}

impl Workload for StatefulSet {
    fn pod_spec(&self) -> Option<&k8s_openapi::api::core::v1::PodSpec> {
        self.spec.as_ref().and_then(|s| s.template.spec.as_ref())
    }
}

/// Deletes (in the foreground) every workload of one kind the selector finds and notes those
/// still going; one past its Pods' termination grace plus the slack is abandoned with a warning.
async fn teardown<K: Workload>(
    api: &Api<K>,
    selector: &ListParams,
    elapsed: Duration,
    waiting: &mut Vec<String>,
    ctx: &Context,
) -> Result<(), Error> {
    let kind = K::kind(&()).to_string();
    for w in api
        .list(selector)
        .await
        .map_err(kerr("list", format!("{kind}s to tear down")))?
    {
        let name = w.name_any();
        let grace = Duration::from_secs(
            w.pod_spec()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30)
                .max(0)
                .unsigned_abs(),
        );
        if elapsed > grace + TEARDOWN_SLACK {
            let event = Event {
                type_: EventType::Warning,
                reason: "TeardownAbandoned".into(),
                note: Some(format!(
                    "{kind} {name} did not go within its Pods' termination grace ({}s) plus {}s; the backend is released anyway and its Pods are left to the garbage collector",
                    grace.as_secs(),
                    TEARDOWN_SLACK.as_secs()
                )),
                action: "Teardown".into(),
                secondary: None,
            };
            let _ = ctx.recorder.publish(&event, &w.object_ref(&())).await;
            continue;
        }
        match api.delete(&name, &DeleteParams::foreground()).await {
            Ok(_) => waiting.push(format!("{kind} {name}")),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(kerr("delete", format!("{kind} {name}"))(e)),
        }
    }
    Ok(())
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
