//! What the admission webhook answers, decided without I/O.
//!
//! `/validate` judges the five kinds with `kvcache-render::admission::review` (the judgement the offline
//! `kvcache-operator validate` makes too): single-object rules with the cluster's settings,
//! cross-object claims, owned keys on attached roles, unknown fields. What a request gets back
//! is decided by [`validate`], a pure function of the request and a snapshot of the related
//! objects; the handler only takes the snapshot and encodes the answer.
//!
//! Where lookups come from (docs/design.md#live-reads: live reads where a rule needs them):
//! - settings, pools, backends, Bindings: the operator's reflector stores. A Binding created in
//!   the same instant as another one on the same domain can pass both checks; that race is
//!   what `DomainExclusive=False/DomainClaimedByMultipleBindings` reports afterwards
//!   (docs/design.md#raced-claims).
//! - what a request names that the stores lack (yet): read live first, as [`live_read`] decides.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::core::response::{Status, StatusCause, StatusDetails};
use kvcache_api::manifest::{Manifest, Object};
use kvcache_api::{GROUP, KVCachePoolBinding, Settings};
use kvcache_quota::tenancy::NAMED;
use kvcache_render::admission::review::{Review, review};
pub use kvcache_render::world::World;

use crate::error::Unjudgeable;

/// The world `object` is judged beside, narrowed from `world` (the objects are shared, not
/// cloned): every backend, pool and InstanceType (few), and of the Bindings only those the
/// claims and tenancy can read (docs/design.md#domain-claims, docs/isolation.md#tenancy): for a
/// Binding, those on its backend with its tenant (a duplicate), one with another tenant (a
/// second domain), and one of each namespace on the backend up to what a warning names (its
/// own, and `NAMED + 1` others); for a backend dedicated to a namespace, the Bindings of other
/// namespaces on it up to what a refusal names; for a ModelDeployment every Binding of `world`
/// (the live world holds only its own); for the other kinds none (their rules read no
/// Binding). A request thus costs the same with 2,000 Bindings stored as with 2.
fn related(world: &World, object: &Object) -> World {
    match object {
        Object::ModelDeployment(_) => world.narrowed(|_| true),
        Object::Binding(candidate) => {
            match world.backend_name_of(candidate).filter(|n| !n.is_empty()) {
                Some(backend) => world.narrowed(claims_beside(world, candidate, backend)),
                None => world.narrowed(|_| false),
            }
        }
        Object::Backend(b) => match b.spec.tenancy.dedicated_to() {
            Some(admits) => {
                let name = b.metadata.name.as_deref().unwrap_or_default();
                let mut named = 0;
                world.narrowed(|x| {
                    let keep = named <= NAMED
                        && world.backend_name_of(x).filter(|n| !n.is_empty()) == Some(name)
                        && x.metadata.namespace.as_deref() != Some(admits);
                    named += usize::from(keep);
                    keep
                })
            }
            None => world.narrowed(|_| false),
        },
        _ => world.narrowed(|_| false),
    }
}

/// Which Bindings a Binding `candidate` on `backend` is judged beside, asked in namespace/name
/// order ([`related`]). A Binding being deleted still holds its name: until its finalizer is
/// gone the master keeps its tenant's data, which a new claim would inherit.
fn claims_beside<'a>(
    world: &'a World,
    candidate: &'a KVCachePoolBinding,
    backend: &'a str,
) -> impl FnMut(&KVCachePoolBinding) -> bool + 'a {
    let tenant = kvcache_api::admission::tenant_of(candidate);
    let own = candidate.metadata.namespace.clone();
    let mut other_tenant = false;
    let mut namespaces: BTreeSet<String> = BTreeSet::new();
    let mut others = 0;
    move |b| {
        if world.backend_name_of(b) != Some(backend) {
            return false;
        }
        let same = kvcache_api::admission::tenant_of(b) == tenant;
        let ns = b.metadata.namespace.clone().unwrap_or_default();
        let mine = own.as_deref() == Some(ns.as_str());
        let new_namespace = !namespaces.contains(&ns) && (mine || others <= NAMED);
        if !(same || !other_tenant || new_namespace) {
            return false;
        }
        other_tenant |= !same;
        if namespaces.insert(ns) && !mine {
            others += 1;
        }
        true
    }
}

/// An object a request names that the caches do not hold (yet), to be read from the API server
/// before the request is judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LiveRead {
    /// A Binding, its pool and that pool's backend; what the read finds replaces what the caches
    /// hold, and a Binding it does not find is gone.
    Binding {
        /// The Binding's namespace (the Pod's).
        namespace: String,
        /// The Binding's name.
        name: String,
    },
    /// A pool and its backend.
    Pool(String),
    /// A backend.
    Backend(String),
}

impl std::fmt::Display for LiveRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LiveRead::Binding { namespace, name } => {
                write!(f, "KVCachePoolBinding {namespace}/{name}")
            }
            LiveRead::Pool(name) => write!(f, "KVCachePool {name}"),
            LiveRead::Backend(name) => write!(f, "KVCacheBackend {name}"),
        }
    }
}

/// What to read live before judging `req` against `world` (the caches), so that nothing is
/// judged missing only because a cache lags behind a write a moment earlier (a pool and its
/// Binding in one `kubectl apply`): for a Binding, its pool when the caches lack the pool or the
/// pool's backend; for a pool, its backend when the caches lack it; for a Pod, the Binding it
/// names when the caches lack the Binding, its pool or its backend. Nothing for a deletion, for
/// other kinds, or for a name no object can have (read, `other/chat` would even reach the
/// subresource `chat` of the Binding `other`).
pub fn live_read(req: &AdmissionRequest<DynamicObject>, world: &World) -> Option<LiveRead> {
    let object = req.object.as_ref()?;
    let named = |pointer: &str| {
        object
            .data
            .get("spec")?
            .pointer(pointer)?
            .as_str()
            .filter(|n| kvcache_api::admission::is_dns_subdomain(n))
            .map(str::to_owned)
    };
    let writes = matches!(req.operation, Operation::Create | Operation::Update);
    match (req.kind.group.as_str(), req.kind.kind.as_str()) {
        (GROUP, "KVCachePoolBinding") if writes => {
            let pool = named("/poolRef/name")?;
            // A pool that names no backend is complete as it is (admission refuses it).
            let complete = world
                .pool(&pool)
                .is_some_and(|p| p.spec.backend().is_none_or(|b| world.backend(b).is_some()));
            (!complete).then_some(LiveRead::Pool(pool))
        }
        (GROUP, "KVCachePool") if writes => {
            let backend = named("/backends/0")?;
            world
                .backend(&backend)
                .is_none()
                .then_some(LiveRead::Backend(backend))
        }
        ("", "Pod") if matches!(req.operation, Operation::Create) => {
            let name = kvcache_render::admission::pod::binding_named(&object.metadata)
                .filter(|n| kvcache_api::admission::is_dns_subdomain(n))?;
            let namespace = req.namespace.clone().unwrap_or_default();
            world
                .reach(&namespace, name)
                .is_err()
                .then(|| LiveRead::Binding {
                    name: name.to_owned(),
                    namespace,
                })
        }
        _ => None,
    }
}

/// One object of a request, decoded strictly (unknown fields listed).
fn manifest(o: &DynamicObject) -> Result<Manifest, Unjudgeable> {
    let text = serde_json::to_string(o).map_err(Unjudgeable::Encode)?;
    let mut parsed =
        kvcache_api::manifest::parse("admission request", &text).map_err(Unjudgeable::Decode)?;
    match parsed.pop() {
        Some(m) if parsed.is_empty() => Ok(m),
        _ => Err(Unjudgeable::NotOurs),
    }
}

/// The judgement of one request of one of our kinds (`None`: nothing to judge, a DELETE).
pub fn verdict(
    req: &AdmissionRequest<DynamicObject>,
    settings: &Settings,
    world: &World,
) -> Result<Option<Review>, Unjudgeable> {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Ok(None);
    }
    if req.kind.group != GROUP {
        return Err(Unjudgeable::ForeignKind {
            kind: req.kind.kind.clone(),
            group: req.kind.group.clone(),
        });
    }
    let new = req
        .object
        .as_ref()
        .ok_or(Unjudgeable::NoObject)
        .and_then(manifest)?;
    let old = match (&req.operation, &req.old_object) {
        (Operation::Update, Some(o)) => Some(manifest(o)?),
        _ => None,
    };
    Ok(Some(review(
        &new.object,
        old.as_ref().map(|m| &m.object),
        &related(world, &new.object),
        &new.unknown_fields,
        settings,
    )))
}

/// The answer to a request: admitted with warnings, or refused with a 422 `Invalid` status
/// whose causes name each field (as the API server's own validation does).
pub fn validate(
    req: &AdmissionRequest<DynamicObject>,
    settings: &Settings,
    world: &World,
) -> AdmissionResponse {
    let mut response = AdmissionResponse::from(req);
    let v = match verdict(req, settings, world) {
        Ok(Some(v)) => v,
        Ok(None) => return response,
        Err(why) => return response.deny(why.to_string()),
    };
    if !v.warnings.is_empty() {
        response.warnings = Some(v.warnings.clone());
    }
    if v.allowed() {
        return response;
    }
    let kind = req.kind.kind.clone();
    let name = req
        .object
        .as_ref()
        .and_then(|o| o.metadata.name.clone())
        .unwrap_or_else(|| req.name.clone());
    let message = format!(
        "{kind}.{GROUP} \"{name}\" is invalid: {}",
        v.refusals
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let causes = v
        .refusals
        .iter()
        .map(|r| StatusCause {
            reason: r.cause.cause_type().into(),
            message: r.message.clone(),
            field: r.field.clone(),
        })
        .collect();
    response.allowed = false;
    response.result = Status::failure(&message, "Invalid")
        .with_code(422)
        .with_details(StatusDetails {
            name,
            group: GROUP.into(),
            kind,
            uid: String::new(),
            causes,
            retry_after_seconds: 0,
        });
    response
}

/// The answer to a Pod CREATE (the injection, docs/design.md#pod-injection): the store settings as a JSON patch, or a
/// refusal whose message starts with its reason. `namespace` is the operator's.
pub fn mutate_pod(
    req: &AdmissionRequest<DynamicObject>,
    namespace: &str,
    settings: &Settings,
    world: &World,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(req);
    if !matches!(req.operation, Operation::Create) {
        return response;
    }
    let pod: Pod = match req
        .object
        .as_ref()
        .map(|o| serde_json::to_value(o).and_then(serde_json::from_value::<Pod>))
    {
        Some(Ok(p)) => p,
        Some(Err(e)) => return response.deny(format!("the Pod does not decode: {e}")),
        None => return response.deny("the request carries no Pod"),
    };
    let pod_ns = req.namespace.clone().unwrap_or_default();
    let binding_name =
        kvcache_render::admission::pod::binding_named(&pod.metadata).unwrap_or_default();
    let env = kvcache_render::plan::resolve::Environment {
        namespace,
        settings,
    };
    let chain = world.chain(&pod_ns, binding_name);
    match kvcache_render::admission::pod::inject_pod(&pod, &pod_ns, &req.uid, chain, &env) {
        Ok(injected) => {
            let before = serde_json::to_value(&pod);
            let after = serde_json::to_value(&injected.pod);
            let (Ok(before), Ok(after)) = (before, after) else {
                return response.deny("the injected Pod does not encode");
            };
            let mut response = match response.with_patch(json_patch::diff(&before, &after)) {
                Ok(r) => r,
                Err(e) => {
                    return AdmissionResponse::from(req)
                        .deny(format!("the patch does not encode: {e}"));
                }
            };
            if !injected.warnings.is_empty() {
                response.warnings = Some(injected.warnings);
            }
            response
        }
        Err(refusal) => {
            let mut r = response.deny(format!("{}: {}", refusal.reason, refusal.message));
            r.result.reason = refusal.reason.to_owned();
            r.result.code = 403;
            r
        }
    }
}

/// The answer to a Pod UPDATE (the freeze, docs/design.md#post-create-freeze).
pub fn freeze_pod(req: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let response = AdmissionResponse::from(req);
    let decode = |o: Option<&DynamicObject>| {
        o.and_then(|o| serde_json::to_value(o).ok())
            .and_then(|v| serde_json::from_value::<Pod>(v).ok())
    };
    match (
        &req.operation,
        decode(req.old_object.as_ref()),
        decode(req.object.as_ref()),
    ) {
        (Operation::Update, Some(old), Some(new)) => {
            match kvcache_render::admission::pod::frozen_edit(&old, &new) {
                Some(why) => response.deny(why),
                None => response,
            }
        }
        _ => response,
    }
}

#[cfg(test)]
mod tests;
