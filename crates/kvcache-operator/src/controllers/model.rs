//! The ModelDeployment controller: read once (the caches, the settings, the objects bearing the
//! names its roles render, its role Deployments, its engines' counters), plan once
//! (`kvcache_render::plan::model::plan`: resolve `kvCache.poolRef` as a Binding in the
//! deployment's own namespace, its pool and backend; render each role through
//! `kvcache-render::objects::model`, which injects through `kvcache-inject`; the status and the
//! events), act once (write the ordered objects through the applied set, the status, the events).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use kvcache_api::model::InstanceType;
use kvcache_api::{KVCachePoolBinding, ModelDeployment};
use kvcache_render::names;
use kvcache_render::objects::desired::{DesiredSet, ObjectKind};
use kvcache_render::observe::read::{EnginePod, EngineSelection};
use kvcache_render::observe::shared_cache::{self, EngineReading, Engines, parse_engine_metrics};
use kvcache_render::plan::model::{self as model_plan, EngineFigures, ModelRead, RolesPlan};
use tracing::instrument;

use super::applied::{AppliedSet, Sweep};
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
                watcher::Config::default().labels(&names::model_objects()),
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
    super::shared::drive(controller, CONTROLLER, reconcile, crate::error::RETRY, ctx).await;
}

#[instrument(skip(md, ctx), fields(deployment = %id(&md)))]
async fn reconcile(md: Arc<ModelDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = md.namespace().unwrap_or_default();
    // Read (the caches, the settings, the cluster, the engines), plan (pure), act.
    let world = ctx.world();
    let chosen = ctx.settings();
    // What is read depends on what the roles render: rendered once, here, and planned on.
    let roles = model_plan::roles(
        &md,
        &world,
        chosen.settings.as_ref(),
        chosen.refused.as_ref().map(ToString::to_string),
        &ctx.config.namespace,
        &world.instance_type_map(),
    );
    let reads = read_deployment(&ctx, &md, &ns, &roles).await?;
    let plan = model_plan::plan(ModelRead {
        deployment: &md,
        world: &world,
        roles,
        existing: &reads.existing,
        owned: &reads.owned,
        engines: reads.figures,
        now: Time(k8s_openapi::jiff::Timestamp::now()),
    });
    if let Some(desired) = &plan.desired {
        write_roles(&ctx, &md, desired).await?;
    }
    let reference = md.object_ref(&());
    for note in &plan.written {
        let event = super::shared::event_of(note, "Reconcile", None);
        super::shared::publish(&ctx, &reference, &event).await;
    }
    super::status::apply(
        &Api::<ModelDeployment>::namespaced(ctx.client.clone(), &ns),
        "ModelDeployment",
        md.meta(),
        MANAGER,
        &plan.status,
    )
    .await?;
    for note in &plan.events {
        let event = super::shared::event_of(note, "Reconcile", None);
        super::shared::publish(&ctx, &reference, &event).await;
    }
    // A resync while nothing changes (`--model-resync`, 5 minutes): every input (the deployment,
    // its Deployments, its Binding and through it the store's figures, InstanceTypes)
    // re-triggers a reconcile by itself. A short interval here was the scale benchmark's
    // bottleneck: 2,000 deployments each re-read every 15 s kept the queue full.
    Ok(Action::requeue(match reads.engines {
        // The engines' counters move without any watched object changing.
        Engines::Counted { ready } if ready > 0 => ctx
            .config
            .engine_metrics_interval
            .min(ctx.config.model_resync),
        _ => ctx.config.model_resync,
    }))
}

/// What a pass reads for a deployment before anything is decided (see [`ModelRead`]).
struct Reads {
    existing: Vec<model_plan::Existing>,
    owned: Vec<Deployment>,
    engines: Engines,
    figures: EngineFigures,
}

/// The pass's reads: the objects bearing the names its roles render, its role Deployments, and
/// its engines' counters (recorded in its window).
async fn read_deployment(
    ctx: &Context,
    md: &ModelDeployment,
    ns: &str,
    roles: &RolesPlan,
) -> Result<Reads, Error> {
    let existing = existing_objects(ctx, ns, model_plan::object_names(roles)).await?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    let owned = owned_deployments(&deployments, md).await?;
    let engines = model_plan::engines(md, roles, &owned);
    let figures = observe_engines(ctx, md, ns, engines, &owned).await?;
    Ok(Reads {
        existing,
        owned,
        engines,
        figures,
    })
}

/// The objects of the namespace `ns` bearing the names the roles of `md` render, each with its
/// controller.
async fn existing_objects(
    ctx: &Context,
    ns: &str,
    names: Vec<(ObjectKind, String)>,
) -> Result<Vec<model_plan::Existing>, Error> {
    let mut out = Vec::new();
    for (kind, name) in names {
        let resource = super::applied::resource(&kind);
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &resource);
        let Some(o) = api
            .get_opt(&name)
            .await
            .map_err(kerr("get", format!("{} {ns}/{name}", kind.kind)))?
        else {
            continue;
        };
        let controller = o
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true));
        out.push(model_plan::Existing {
            kind: kind.kind,
            name,
            controller_uid: controller.map(|o| o.uid.clone()),
            controller: controller.map(|o| format!("{} {}", o.kind, o.name)),
        });
    }
    Ok(out)
}

/// Writes the planned role objects through the deployment's applied set; a role the render no
/// longer returns loses its objects in the sweep.
async fn write_roles(
    ctx: &Context,
    md: &ModelDeployment,
    desired: &DesiredSet,
) -> Result<(), Error> {
    let ns = md.namespace().unwrap_or_default();
    let mut set = AppliedSet::new(
        ctx.client.clone(),
        &ns,
        &md.uid().unwrap_or_default(),
        selector(md),
    );
    set.write(desired).await?;
    set.sweep(desired.kinds, Sweep::Prune).await?;
    Ok(())
}

/// The labels every object of the deployment's roles carries.
fn selector(md: &ModelDeployment) -> String {
    names::model_objects_of(&md.name_any())
}

/// Milliseconds on this process's monotonic clock (the windows' time axis).
fn now_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// How many engine `/metrics` one pass of a deployment reads at once: a quarter of the reads
/// the whole operator makes at once (the store client's 16 turns, which bound the engine bodies
/// it holds), so one deployment's slow Pods leave turns to the others; and a pass of
/// [`kvcache_render::observe::read::ENGINE_PODS_PER_PASS`] (32) Pods that all wait out the client's
/// 1.5 s timeout still ends within 8 rounds, 12 s, under the 15 s `--engine-metrics-interval`.
const ENGINE_SCRAPES_AT_ONCE: usize = 4;

/// Reads the `/metrics` of the deployment's ready engine Pods (chosen by ownership, at most
/// [`kvcache_render::observe::read::ENGINE_PODS_PER_PASS`], [`ENGINE_SCRAPES_AT_ONCE`] at a time),
/// records the readings in the deployment's window and returns `status.sharedCache` and the
/// `SharedCacheObserved` and (for engines that count) `SharedCacheHealthy` and `PrefillPriced`
/// conditions.
async fn observe_engines(
    ctx: &Context,
    md: &ModelDeployment,
    ns: &str,
    engines: Engines,
    owned: &[Deployment],
) -> Result<EngineFigures, Error> {
    let key = id(md);
    let Engines::Counted { ready } = engines else {
        lock(&ctx.engine_windows).remove(&key);
        return Ok(EngineFigures {
            shared_cache: None,
            conditions: vec![shared_cache::condition(engines, &[])],
        });
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
    Ok(EngineFigures {
        shared_cache: (!readings.is_empty()).then_some(summary),
        conditions: vec![condition, health, priced],
    })
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
/// ReplicaSets, chosen by ownership (`kvcache_render::observe::read::engine_pods`: its own Deployments'
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
    Ok(kvcache_render::observe::read::engine_pods(
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
