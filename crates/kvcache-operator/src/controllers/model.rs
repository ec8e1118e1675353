//! The ModelDeployment controller: read (the caches, the settings), plan
//! (`kvcache_render::model_plan`: resolve `kvCache.poolRef` as a Binding in the deployment's own
//! namespace, its pool and backend; render each role through `kvcache-render::model`, which
//! injects through `kvcache-inject`), act (apply through the applied set; observe the roles'
//! Deployments and what the store charges the domain; write status,
//! `kvcache-render::status::model`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use kvcache_api::model::{InstanceType, SharedCacheStatus};
use kvcache_api::{KVCachePoolBinding, ModelDeployment};
use kvcache_render::events::{Kind, Note};
use kvcache_render::model::ModelObjects;
use kvcache_render::model_plan;
use kvcache_render::read::{EnginePod, EngineSelection};
use kvcache_render::shared_cache::{self, EngineReading, Engines, parse_engine_metrics};
use kvcache_render::status::model::{
    ModelObservation, Resolution, RoleObservation, model_deployment_status,
};
use tracing::instrument;

use super::applied::{AppliedSet, OwnedKind, Sweep};
use crate::context::{Context, MANAGER, lock};
use crate::error::{Error, kube as kerr};
use crate::watch::{Pass, Subscription};

const CONTROLLER: &str = "modeldeployment";

fn id(md: &ModelDeployment) -> String {
    format!("{}/{}", md.namespace().unwrap_or_default(), md.name_any())
}

/// Runs the controller until shutdown.
pub async fn run(
    ctx: Arc<Context>,
    changes: Subscription<ModelDeployment>,
    bindings: Subscription<KVCachePoolBinding>,
    instance_types: Subscription<InstanceType>,
) {
    let client = ctx.client.clone();
    let controller = crate::watch::shared_controller(&changes, ctx.models.clone());
    let store = controller.store();
    let (by_binding, by_it) = (store.clone(), store);
    let controller = controller
        // The roles' Deployments: their metadata is enough to map them to their owner (the
        // reconcile lists them live).
        .owns_stream(
            watcher(
                Api::<kube::core::PartialObjectMeta<Deployment>>::all(client.clone()),
                watcher::Config::default().labels("app.kubernetes.io/name=model-deployment"),
            )
            .default_backoff()
            .touched_objects(),
        )
        // A Binding (and through it the pool and backend) changes what the roles attach to;
        // its status, what the tenant is charged. Both this and the next are told once the
        // World's cache, which the reconcile reads, holds the change.
        .watches_stream(bindings.relation_changes(Pass::Every), move |b| {
            let ns = b.namespace();
            let name = b.name_any();
            by_binding
                .state()
                .iter()
                .filter(|md| {
                    md.namespace() == ns
                        && md.spec.kv_cache.as_ref().map(|k| k.pool_ref.name.as_str())
                            == Some(name.as_str())
                })
                .map(|md| ObjectRef::from_obj(&**md))
                .collect::<Vec<_>>()
        })
        .watches_stream(
            instance_types.relation_changes(Pass::SpecChanges),
            move |it| {
                let name = it.name_any();
                by_it
                    .state()
                    .iter()
                    .filter(|md| md.spec.roles.iter().any(|r| r.instance_type == name))
                    .map(|md| ObjectRef::from_obj(&**md))
                    .collect::<Vec<_>>()
            },
        );
    super::drive(controller, CONTROLLER, reconcile, crate::error::RETRY, ctx).await;
}

#[instrument(skip(md, ctx), fields(deployment = %id(&md)))]
async fn reconcile(md: Arc<ModelDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = md.namespace().unwrap_or_default();
    // Read (the caches, the settings), plan (pure), act.
    let world = ctx.world();
    let instance_types = world.instance_type_map();
    let chosen = ctx.settings();
    let plan = model_plan::plan(
        &md,
        &world,
        chosen.settings.as_ref(),
        chosen.refused.as_ref().map(ToString::to_string),
        &ctx.config.namespace,
        &instance_types,
    );
    let mut foreign = Vec::new();
    if let Some(mut objects) = plan.objects.clone() {
        // Never over what is someone else's: an object of a rendered name that this deployment
        // does not control is left alone and named (docs/design.md#model-objects-owned).
        let existing = existing_objects(&ctx, &ns, &objects).await?;
        foreign = model_plan::leave_foreign(&mut objects, &existing, &md.uid().unwrap_or_default());
        apply_roles(&ctx, &md, &objects).await?;
        if !foreign.is_empty() {
            name_taken_event(&ctx, &md, &foreign).await;
        }
    }
    let resolution = plan.resolution.clone();
    let domain = match &resolution {
        Resolution::Resolved { .. } => md
            .spec
            .kv_cache
            .as_ref()
            .and_then(|k| world.binding(&ns, &k.pool_ref.name))
            .map(|b| &b.spec.domain),
        _ => None,
    };
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let owned = owned_deployments(&deployments, &md).await?;
    let roles = role_observations(&md, &owned);
    let obs = ModelObservation {
        resolution: resolution.clone(),
        refusal: plan.refusal.clone(),
        roles: roles.clone(),
        tenant_charged: tenant_charged(&world, &md, &resolution),
        held: plan.held,
        deleting: md.meta().deletion_timestamp.is_some(),
        missing_instance_types: md
            .spec
            .roles
            .iter()
            .filter(|r| !instance_types.contains_key(&r.instance_type))
            .map(|r| (r.name.clone(), r.instance_type.clone()))
            .collect(),
        foreign,
    };
    let engines = shared_cache::engines(md.spec.engine.name, &resolution, &roles);
    let (shared_cache, observed) = observe_engines(&ctx, &md, &ns, engines, &owned).await?;
    let status = model_deployment_status(
        &md,
        &obs,
        domain,
        shared_cache,
        observed,
        &Time(k8s_openapi::jiff::Timestamp::now()),
    );
    super::status::apply(
        &Api::<ModelDeployment>::namespaced(ctx.client.clone(), &ns),
        "ModelDeployment",
        md.meta(),
        MANAGER,
        &status,
    )
    .await?;
    let before = md.status.clone().unwrap_or_default();
    for note in kvcache_render::events::model_events(&before, &status) {
        super::publish(
            &ctx,
            &md.object_ref(&()),
            &super::event_of(&note, "Reconcile", None),
        )
        .await;
    }
    // A resync while nothing changes (`--model-resync`, 5 minutes): every input (the deployment,
    // its Deployments, its Binding and through it the store's figures, InstanceTypes)
    // re-triggers a reconcile by itself. A short interval here was the scale benchmark's
    // bottleneck: 2,000 deployments each re-read every 15 s kept the queue full.
    Ok(Action::requeue(match engines {
        // The engines' counters move without any watched object changing.
        Engines::Counted { ready } if ready > 0 => ctx
            .config
            .engine_metrics_interval
            .min(ctx.config.model_resync),
        _ => ctx.config.model_resync,
    }))
}

/// The objects of the namespace `ns` bearing the names of the rendered `objects`, each with its
/// controller.
async fn existing_objects(
    ctx: &Context,
    ns: &str,
    objects: &ModelObjects,
) -> Result<Vec<model_plan::Existing>, Error> {
    fn existing<K: Resource>(kind: &'static str, object: &K) -> model_plan::Existing {
        let controller = object
            .meta()
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true));
        model_plan::Existing {
            kind,
            name: object.meta().name.clone().unwrap_or_default(),
            controller_uid: controller.map(|o| o.uid.clone()),
            controller: controller.map(|o| format!("{} {}", o.kind, o.name)),
        }
    }
    /// Each of `objects` that exists already, as `existing` puts it.
    async fn found<K>(
        ctx: &Context,
        ns: &str,
        kind: &'static str,
        objects: &[K],
    ) -> Result<Vec<model_plan::Existing>, Error>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
        let mut out = Vec::new();
        for name in objects.iter().filter_map(|o| o.meta().name.as_ref()) {
            if let Some(o) = api
                .get_opt(name)
                .await
                .map_err(kerr("get", format!("{kind} {ns}/{name}")))?
            {
                out.push(existing(kind, &o));
            }
        }
        Ok(out)
    }
    let mut found_all = found(ctx, ns, "Deployment", &objects.deployments).await?;
    found_all.extend(found(ctx, ns, "Service", &objects.services).await?);
    found_all.extend(found(ctx, ns, "NetworkPolicy", &objects.network_policies).await?);
    Ok(found_all)
}

/// A warning on the deployment naming each object it left alone.
async fn name_taken_event(
    ctx: &Context,
    md: &ModelDeployment,
    foreign: &[kvcache_render::status::model::ForeignObject],
) {
    let note = Note {
        kind: Kind::Warning,
        reason: "NameTaken",
        message: foreign
            .iter()
            .map(|f| {
                format!(
                    "{} {} exists and is not this deployment's: left as it is",
                    f.kind, f.name
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    };
    super::publish(
        ctx,
        &md.object_ref(&()),
        &super::event_of(&note, "Reconcile", None),
    )
    .await;
}

/// Applies the planned role objects through the deployment's applied set; a role the render no
/// longer returns loses its Deployment and Service in the sweep.
async fn apply_roles(
    ctx: &Context,
    md: &ModelDeployment,
    objects: &ModelObjects,
) -> Result<(), Error> {
    let ns = md.namespace().unwrap_or_default();
    let mut set = AppliedSet::new(
        ctx.client.clone(),
        &ns,
        &md.uid().unwrap_or_default(),
        selector(md),
    );
    // The policies first: a role's Pods never run before what closes them.
    for p in &objects.network_policies {
        set.apply(p).await?;
    }
    for d in &objects.deployments {
        set.apply(d).await?;
    }
    for s in &objects.services {
        set.apply(s).await?;
    }
    set.sweep(
        &[
            OwnedKind::of::<Deployment>(),
            OwnedKind::of::<Service>(),
            OwnedKind::of::<NetworkPolicy>(),
        ],
        Sweep::Prune,
    )
    .await?;
    Ok(())
}

/// The labels every object of the deployment's roles carries.
fn selector(md: &ModelDeployment) -> String {
    format!(
        "app.kubernetes.io/name=model-deployment,app.kubernetes.io/instance={}",
        kvcache_render::names::label_value(&md.name_any())
    )
}

/// Each role as its Deployment (among `owned`) reports it.
fn role_observations(md: &ModelDeployment, owned: &[Deployment]) -> Vec<RoleObservation> {
    md.spec
        .roles
        .iter()
        .map(|r| {
            let d = owned.iter().find(|d| {
                d.labels()
                    .get("app.kubernetes.io/component")
                    .map(String::as_str)
                    == Some(kvcache_render::names::label_value(&r.name).as_str())
            });
            let counts = d.map(kvcache_render::read::replicas).unwrap_or_default();
            RoleObservation {
                name: r.name.clone(),
                desired: r.replicas,
                ready: counts.ready,
                updated: counts.updated,
                total: counts.total,
                observed: counts.observed,
                unmanaged: !r.command.is_empty(),
            }
        })
        .collect()
}

/// What the store charges the domain, as the pool's last reading of the master's ledger put it
/// on the Binding (`status.usage`): observed, never inferred from rendered flags. A change of
/// the Binding's status re-triggers the reconcile (the watch on Bindings), so no deployment
/// polls the store itself.
fn tenant_charged(
    world: &kvcache_render::world::World,
    md: &ModelDeployment,
    resolution: &Resolution,
) -> Option<u64> {
    let Resolution::Resolved { .. } = resolution else {
        return None;
    };
    let ns = md.namespace().unwrap_or_default();
    md.spec
        .kv_cache
        .as_ref()
        .and_then(|k| world.binding(&ns, &k.pool_ref.name))
        .and_then(|b| {
            b.status
                .as_ref()
                .and_then(|s| s.usage.as_ref())
                .and_then(|q| kvcache_api::quantity::parse_bytes(&q.0).ok())
        })
}

/// Milliseconds on this process's monotonic clock (the windows' time axis).
fn now_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// How many engine `/metrics` one pass of a deployment reads at once: a quarter of the reads
/// the whole operator makes at once (the store client's 16 turns, which bound the engine bodies
/// it holds), so one deployment's slow Pods leave turns to the others; and a pass of
/// [`kvcache_render::read::ENGINE_PODS_PER_PASS`] (32) Pods that all wait out the client's
/// 1.5 s timeout still ends within 8 rounds, 12 s, under the 15 s `--engine-metrics-interval`.
const ENGINE_SCRAPES_AT_ONCE: usize = 4;

/// Reads the `/metrics` of the deployment's ready engine Pods (chosen by ownership, at most
/// [`kvcache_render::read::ENGINE_PODS_PER_PASS`], [`ENGINE_SCRAPES_AT_ONCE`] at a time),
/// records the readings in the deployment's window and returns `status.sharedCache` and the
/// `SharedCacheObserved` and (for engines that count) `SharedCacheHealthy` and `PrefillPriced`
/// conditions.
async fn observe_engines(
    ctx: &Context,
    md: &ModelDeployment,
    ns: &str,
    engines: Engines,
    owned: &[Deployment],
) -> Result<(Option<SharedCacheStatus>, Vec<kvcache_api::condition::Cond>), Error> {
    let key = id(md);
    let Engines::Counted { ready } = engines else {
        lock(&ctx.engine_windows).remove(&key);
        return Ok((None, vec![shared_cache::condition(engines, &[])]));
    };
    let chosen = if ready > 0 {
        engine_pods(ctx, md, ns, owned).await?
    } else {
        EngineSelection::default()
    };
    let readings: Vec<EngineReading> = futures::stream::iter(chosen.pods)
        .map(
            |EnginePod {
                 name,
                 uid,
                 ip,
                 port,
             }| async move {
                let url = format!("http://{ip}:{port}/metrics");
                let counters = ctx
                    .store
                    .engine_metrics(&url)
                    .await
                    .and_then(|text| parse_engine_metrics(md.spec.engine.name, &url, &text));
                EngineReading {
                    pod: name,
                    uid,
                    counters,
                }
            },
        )
        .buffer_unordered(ENGINE_SCRAPES_AT_ONCE)
        .collect()
        .await;
    let window = ctx.config.shared_cache_window;
    let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
    let now = now_ms();
    let (summary, health, priced) = {
        let mut windows = lock(&ctx.engine_windows);
        sweep(ctx, &mut windows, now);
        let uid = md.uid().unwrap_or_default();
        let entry = windows.entry(key).or_default();
        // A deployment deleted and created again under the same name starts afresh.
        if entry.0 != uid {
            *entry = (uid, shared_cache::Window::default());
        }
        entry.1.record(now, window_ms, &readings);
        (
            entry.1.summary(now, window_ms, &window_text(window)),
            entry.1.health(now, window_ms, &readings),
            shared_cache::price_condition(&entry.1.price()),
        )
    };
    let condition = shared_cache::condition(
        Engines::Counted {
            ready: chosen.ready,
        },
        &readings,
    );
    Ok((
        (!readings.is_empty()).then_some(summary),
        vec![condition, health, priced],
    ))
}

/// A window as a user reads it: `5m`, `90s`.
fn window_text(d: std::time::Duration) -> String {
    let s = d.as_secs();
    if s >= 60 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// Drops, at most once a minute, the windows of deployments no longer in the cache (a deleted
/// deployment is never reconciled again to drop its own).
fn sweep(ctx: &Context, windows: &mut crate::context::EngineWindows, now: u64) {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let last = LAST.load(std::sync::atomic::Ordering::Relaxed);
    if now.saturating_sub(last) < 60_000 {
        return;
    }
    LAST.store(now, std::sync::atomic::Ordering::Relaxed);
    windows.retain(|key, _| {
        key.split_once('/')
            .is_some_and(|(ns, name)| ctx.models.get(&ObjectRef::new(name).within(ns)).is_some())
    });
}

/// The engine Pods of the deployment's managed roles a pass reads: listed with its
/// ReplicaSets, chosen by ownership (`kvcache_render::read::engine_pods`: its own Deployments'
/// ReplicaSets' Pods, never a Pod that only wears its labels). The labels only narrow the lists.
async fn engine_pods(
    ctx: &Context,
    md: &ModelDeployment,
    ns: &str,
    owned: &[Deployment],
) -> Result<EngineSelection, Error> {
    let managed: BTreeSet<String> = md
        .spec
        .roles
        .iter()
        .filter(|r| r.command.is_empty())
        .map(|r| kvcache_render::names::label_value(&r.name))
        .collect();
    let listed = ListParams::default().labels(&selector(md));
    let replica_sets = Api::<ReplicaSet>::namespaced(ctx.client.clone(), ns)
        .list(&listed)
        .await
        .map_err(kerr("list", format!("engine ReplicaSets of {}", id(md))))?;
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .list(&listed)
        .await
        .map_err(kerr("list", format!("engine Pods of {}", id(md))))?;
    Ok(kvcache_render::read::engine_pods(
        &md.uid().unwrap_or_default(),
        &managed,
        owned,
        &replica_sets.items,
        &pods.items,
    ))
}

/// The role Deployments this ModelDeployment owns (by its uid, not by labels alone).
async fn owned_deployments(
    api: &Api<Deployment>,
    md: &ModelDeployment,
) -> Result<Vec<Deployment>, Error> {
    let uid = md.uid().unwrap_or_default();
    Ok(api
        .list(&ListParams::default().labels(&selector(md)))
        .await
        .map_err(kerr("list", format!("Deployments of {}", id(md))))?
        .into_iter()
        .filter(|d| d.owner_references().iter().any(|o| o.uid == uid))
        .collect())
}
