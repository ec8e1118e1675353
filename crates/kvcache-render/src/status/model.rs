//! A ModelDeployment's status from what the operator observed: how `kvCache.poolRef` resolved,
//! the roles' Deployments, what the store charges the domain. Pure: one function per condition,
//! in the order they are written, and [`phase`] (docs/design.md#model-status); the shared-cache
//! figures and their condition come from [`crate::observe::shared_cache`].

use kvcache_api::condition::Cond;
use kvcache_api::model::ModelDeploymentPhase as Phase;
use kvcache_api::model::conditions::*;

pub use crate::observe::read::RoleObservation;
pub use crate::world::{Resolution, Unresolved};

/// Everything one ModelDeployment pass observed.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelObservation {
    /// How the cache reference resolved.
    pub resolution: Resolution,
    /// Why the roles could not be rendered (an injection refusal, a missing InstanceType):
    /// its CamelCase reason and message.
    pub refusal: Option<(&'static str, String)>,
    /// One per role of `spec.roles`, counted from the role's Deployment (zeros while it is
    /// missing).
    pub roles: Vec<RoleObservation>,
    /// Bytes the master charges the domain's tenant (`None`: not read).
    pub tenant_charged: Option<u64>,
    /// Rendered changes were held back (no cache connection resolved this pass).
    pub held: bool,
    /// Being deleted.
    pub deleting: bool,
    /// Roles whose InstanceType does not exist: (role, InstanceType).
    pub missing_instance_types: Vec<(String, String)>,
    /// Rendered objects left alone: an object of the same name is not this deployment's.
    pub foreign: Vec<ForeignObject>,
}

/// A rendered object left alone because an object of the same name is not this deployment's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignObject {
    /// `Deployment` or `Service`.
    pub kind: &'static str,
    /// Its name.
    pub name: String,
    /// Who controls the existing object (`Kind name`), or `None` when nothing does.
    pub controller: Option<String>,
}

/// A ModelDeployment's conditions and phase from what was observed (docs/design.md#model-status).
pub fn model_status(obs: &ModelObservation) -> (Phase, Option<String>, Vec<Cond>) {
    let conds = vec![
        domain_registered(&obs.resolution),
        cache_attached(obs),
        instance_types_resolved(&obs.missing_instance_types),
        replicas_up_to_date(obs),
        objects_owned(&obs.foreign),
    ];
    let (phase, message) = phase(obs);
    (phase, message, conds)
}

/// `DomainRegistered`: `kvCache.poolRef` reached a Binding, its pool and its domain.
fn domain_registered(resolution: &Resolution) -> Cond {
    match resolution {
        Resolution::NotApplicable => Cond::yes(
            DOMAIN_REGISTERED,
            "NotApplicable",
            "no kvCache: the replicas run without the shared cache",
        ),
        Resolution::BindingNotFound { binding, namespace } => Cond::no(
            DOMAIN_REGISTERED,
            "BindingNotFound",
            format!(
                "spec.kvCache.poolRef.name names {binding}, but there is no KVCachePoolBinding {namespace}/{binding}: name a Binding in this namespace (a pool's name, or another namespace's Binding, never attaches)"
            ),
        ),
        Resolution::BindingDeleted { binding } => {
            Cond::no(DOMAIN_REGISTERED, BINDING_DELETED, binding_deleted(binding))
        }
        Resolution::BindingNotReady { binding, why } => Cond::no(
            DOMAIN_REGISTERED,
            "BindingNotReady",
            format!("KVCachePoolBinding {binding}: {why}"),
        ),
        Resolution::Resolved {
            binding,
            pool,
            tenant,
        } => Cond::yes(
            DOMAIN_REGISTERED,
            "Registered",
            format!("domain {tenant} through KVCachePoolBinding {binding} on KVCachePool {pool}"),
        ),
    }
}

/// The reason a ModelDeployment whose Binding was deleted gets, on `DomainRegistered` and
/// `CacheAttached`, and as its phase's cause.
pub(crate) const BINDING_DELETED: &str = "BindingDeleted";

/// What a ModelDeployment whose Binding (`namespace/name`) was deleted is told: what it lost,
/// why the Binding is still listed, and what to do.
fn binding_deleted(binding: &str) -> String {
    format!(
        "KVCachePoolBinding {binding} was deleted: its namespace no longer reaches the store and the replicas run without the shared cache (docs/isolation.md#revocation); it stays, terminating, while this deployment names it. Point spec.kvCache.poolRef.name at another Binding of this namespace, remove spec.kvCache, or delete this deployment; or create the Binding again once it is gone (its cache starts empty: the deleted one's went with it)"
    )
}

/// `CacheAttached`: whether the store charges the domain, or why the replicas are not attached
/// (a refusal, an unresolved reference, roles that take over their command, none ready yet).
fn cache_attached(obs: &ModelObservation) -> Cond {
    let resolved = matches!(obs.resolution, Resolution::Resolved { .. });
    let managed_roles: Vec<&RoleObservation> = obs.roles.iter().filter(|r| !r.unmanaged).collect();
    let ready_replicas: i32 = managed_roles.iter().map(|r| r.ready).sum();
    match (&obs.resolution, &obs.refusal) {
        (Resolution::NotApplicable, _) => Cond::yes(CACHE_ATTACHED, "NotApplicable", "no kvCache"),
        (_, Some((reason, message))) => Cond::no(CACHE_ATTACHED, reason, message.clone()),
        (Resolution::BindingDeleted { binding }, _) => Cond::no(
            CACHE_ATTACHED,
            BINDING_DELETED,
            format!(
                "KVCachePoolBinding {binding} was deleted: the replicas no longer reach the store; see DomainRegistered"
            ),
        ),
        _ if !resolved => Cond::unknown(
            CACHE_ATTACHED,
            "NotResolved",
            "the cache reference does not resolve; see DomainRegistered",
        ),
        _ if managed_roles.is_empty() && !obs.roles.is_empty() => Cond::unknown(
            CACHE_ATTACHED,
            "Unmanaged",
            "every role takes over its command: the operator adds no cache settings",
        ),
        _ if obs.tenant_charged.is_some_and(|b| b > 0) => Cond::yes(
            CACHE_ATTACHED,
            "CacheActive",
            format!(
                "the store charges the domain {} bytes",
                obs.tenant_charged.unwrap_or(0)
            ),
        ),
        _ if ready_replicas == 0 => {
            Cond::unknown(CACHE_ATTACHED, "NoReplicaReady", "no replica is ready yet")
        }
        _ => Cond::unknown(
            CACHE_ATTACHED,
            "NoObservationAvailable",
            "the ready replicas reported no store operation and the domain holds no data: normal while idle",
        ),
    }
}

/// `InstanceTypesResolved`: every role's InstanceType exists (`missing`: (role, InstanceType)).
fn instance_types_resolved(missing: &[(String, String)]) -> Cond {
    if missing.is_empty() {
        Cond::yes(
            INSTANCE_TYPES_RESOLVED,
            "Resolved",
            "every role's InstanceType exists",
        )
    } else {
        Cond::no(
            INSTANCE_TYPES_RESOLVED,
            "InstanceTypeNotFound",
            missing
                .iter()
                .map(|(role, it)| {
                    format!(
                        "role {role} names InstanceType {it}, which does not exist: create it (kubectl get instancetypes lists them) or name another in roles[].instanceType"
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        )
    }
}

/// `ObjectsOwned`: no rendered object bears the name of one something else controls (those are
/// neither applied nor swept: docs/design.md#model-objects-owned).
fn objects_owned(foreign: &[ForeignObject]) -> Cond {
    if foreign.is_empty() {
        return Cond::yes(
            OBJECTS_OWNED,
            "Owned",
            "every Deployment and Service of the roles is this deployment's own",
        );
    }
    Cond::no(
        OBJECTS_OWNED,
        "NameTaken",
        foreign
            .iter()
            .map(|f| {
                let by = f
                    .controller
                    .as_deref()
                    .map_or_else(|| "nothing controls it".to_owned(), |c| format!("{c} controls it"));
                format!(
                    "{} {} exists and is not this deployment's ({by}): it is left as it is; delete or rename it, or rename the role",
                    f.kind, f.name
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    )
}

/// `ReplicasUpToDate`: every replica on the current template, or why the rollout waits.
fn replicas_up_to_date(obs: &ModelObservation) -> Cond {
    let behind: Vec<&RoleObservation> = obs
        .roles
        .iter()
        .filter(|r| !(r.observed && r.updated == r.desired && r.total == r.desired))
        .collect();
    if obs.held {
        Cond::no(
            REPLICAS_UP_TO_DATE,
            "RolloutHeldByCache",
            "no cache connection resolved this pass: replicas whose render differs are left in place until it does",
        )
    } else if obs.refusal.is_some() {
        Cond::no(
            REPLICAS_UP_TO_DATE,
            "RolloutHeldByCache",
            "the roles cannot be attached to the cache (see CacheAttached): no replica is started with a broken connector",
        )
    } else if obs.roles.iter().any(|r| !r.observed) {
        Cond::unknown(
            REPLICAS_UP_TO_DATE,
            "RolloutNotObserved",
            "a role's Deployment has not observed its current spec yet",
        )
    } else if behind.is_empty() {
        Cond::yes(
            REPLICAS_UP_TO_DATE,
            "UpToDate",
            "every replica runs the current template",
        )
    } else {
        Cond::no(
            REPLICAS_UP_TO_DATE,
            "RolloutInProgress",
            behind
                .iter()
                .map(|r| format!("{}: {} of {} updated", r.name, r.updated, r.desired))
                .collect::<Vec<_>>()
                .join("; "),
        )
    }
}

/// The phase and why it is not `Ready`: deletion, then a refusal (`Degraded`), then the roles'
/// ready replicas (`Starting` while none is ready).
pub fn phase(obs: &ModelObservation) -> (Phase, Option<String>) {
    let short: Vec<String> = obs
        .roles
        .iter()
        .filter(|r| r.ready < r.desired)
        .map(|r| format!("{} {}/{} ready", r.name, r.ready, r.desired))
        .collect();
    if obs.deleting {
        (Phase::Deleting, Some("being deleted".to_owned()))
    } else if let Some((_, m)) = &obs.refusal {
        (Phase::Degraded, Some(m.clone()))
    } else if let Resolution::BindingDeleted { binding } = &obs.resolution {
        (Phase::Degraded, Some(binding_deleted(binding)))
    } else if !obs.foreign.is_empty() {
        (Phase::Degraded, Some(objects_owned(&obs.foreign).message))
    } else if short.is_empty() && !obs.roles.is_empty() {
        (Phase::Ready, None)
    } else if obs.roles.iter().all(|r| r.ready == 0) {
        (
            Phase::Starting,
            Some(if short.is_empty() {
                "no role rendered yet".to_owned()
            } else {
                short.join(", ")
            }),
        )
    } else {
        (Phase::Degraded, Some(short.join(", ")))
    }
}

/// A ModelDeployment's whole status: [`model_status`]'s phase and conditions, then `extra` (the
/// shared-cache condition), the attachment as it resolved (`domain`: the reached Binding's), the
/// roles as observed and the shared-cache figures, its conditions merged with the stored ones at
/// `now` (a condition that did not change keeps its transition time).
pub fn model_deployment_status(
    md: &kvcache_api::ModelDeployment,
    obs: &ModelObservation,
    domain: Option<&kvcache_api::pool::Domain>,
    shared_cache: Option<kvcache_api::model::SharedCacheStatus>,
    extra: Vec<Cond>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> kvcache_api::model::ModelDeploymentStatus {
    use kvcache_api::model::{KvCacheStatus, ModelDeploymentStatus, RoleStatus};
    let (phase, message, mut conditions) = model_status(obs);
    conditions.extend(extra);
    let generation = md.metadata.generation;
    let stored = md.status.clone().unwrap_or_default();
    let kv_cache = match (&obs.resolution, domain) {
        (Resolution::Resolved { binding, pool, .. }, Some(domain)) => Some(KvCacheStatus {
            binding: binding.clone(),
            pool: Some(pool.clone()),
            domain: Some(domain.clone()),
        }),
        _ => md.spec.kv_cache.as_ref().map(|k| KvCacheStatus {
            binding: k.pool_ref.name.clone(),
            pool: None,
            domain: None,
        }),
    };
    ModelDeploymentStatus {
        observed_generation: generation,
        phase: Some(phase),
        phase_message: message,
        kv_cache,
        roles: md
            .spec
            .roles
            .iter()
            .zip(&obs.roles)
            .map(|(r, o)| RoleStatus {
                name: r.name.clone(),
                kind: r.kind,
                desired: r.replicas,
                ready: o.ready,
                unmanaged: o.unmanaged,
            })
            .collect(),
        shared_cache,
        conditions: kvcache_api::condition::merge(&stored.conditions, &conditions, now, generation),
    }
}
