//! What the admission webhook answers, decided without I/O.
//!
//! `/validate` judges the five kinds with `kvcache-render::review` (the judgement the offline
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

use k8s_openapi::api::core::v1::Pod;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::core::response::{Status, StatusCause, StatusDetails};
use kvcache_api::manifest::{Manifest, Object};
use kvcache_api::{GROUP, Settings};
use kvcache_render::review::{Review, review};
pub use kvcache_render::world::World;

use crate::error::Unjudgeable;

/// The objects `object` is judged beside, cloned: every backend, pool and InstanceType (few),
/// and of the Bindings only those the claims can read (docs/design.md#domain-claims): for a
/// Binding, those on its backend with its tenant (a duplicate) plus one with another tenant (a
/// second domain); for a ModelDeployment every Binding of `world` (the live world holds only its
/// own); for the other kinds none (their rules read no Binding). A request thus costs the same
/// with 2,000 Bindings stored as with 2.
fn related(world: &World, object: &Object) -> Vec<Object> {
    let backends = world
        .backends()
        .map(|b| Object::Backend(Box::new(b.clone())));
    let pools = world.pools().map(|p| Object::Pool(Box::new(p.clone())));
    let instance_types = world
        .instance_types()
        .map(|i| Object::InstanceType(Box::new(i.clone())));
    let mut bindings = Vec::new();
    if let Object::ModelDeployment(_) = object {
        bindings.extend(
            world
                .bindings()
                .map(|b| Object::Binding(Box::new(b.clone()))),
        );
    } else if let Object::Binding(candidate) = object
        && let Some(backend) = world
            .pool(&candidate.spec.pool_ref.name)
            .and_then(|p| p.spec.backend())
    {
        let tenant = kvcache_api::admission::tenant_of(candidate);
        let mut other_tenant = false;
        // A Binding being deleted still holds its name: until its finalizer is gone the
        // master keeps its tenant's data, which a new claim would inherit.
        for b in world.bindings_on(backend) {
            let same = kvcache_api::admission::tenant_of(b) == tenant;
            if same || !other_tenant {
                other_tenant |= !same;
                bindings.push(Object::Binding(Box::new(b.clone())));
            }
        }
    }
    backends
        .chain(pools)
        .chain(bindings)
        .chain(instance_types)
        .collect()
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
    let binding_name = kvcache_render::pod::binding_named(&pod.metadata).unwrap_or_default();
    let env = kvcache_render::resolve::Environment {
        namespace,
        settings,
    };
    let chain = world.chain(&pod_ns, binding_name);
    match kvcache_render::pod::inject_pod(&pod, &pod_ns, chain, &env) {
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
            match kvcache_render::pod::frozen_edit(&old, &new) {
                Some(why) => response.deny(why),
                None => response,
            }
        }
        _ => response,
    }
}

/// Whether `world` holds the Binding a Pod names, its pool and backend.
#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::admission::AdmissionReview;
    use kvcache_api::{KVCachePool, KVCachePoolBinding};
    use std::sync::Arc;

    fn request(
        kind: &str,
        operation: &str,
        object: serde_json::Value,
    ) -> AdmissionRequest<DynamicObject> {
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "1", "kind": {"group": GROUP, "version": "v1", "kind": kind},
                "resource": {"group": GROUP, "version": "v1", "resource": "x"},
                "name": object["metadata"]["name"], "namespace": object["metadata"]["namespace"],
                "operation": operation, "userInfo": {}, "object": object
            }
        }))
        .expect("a review");
        review.try_into().expect("a request")
    }

    fn binding(ns: &str, domain: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
            "metadata": {"name": "team", "namespace": ns},
            "spec": {"poolRef": {"name": "shared"}, "quota": {"ceiling": "1Gi"},
                     "domain": {"name": domain, "blockSize": 64, "dtype": "bfloat16"}}
        })
    }

    fn world() -> World {
        let pool: KVCachePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": "shared"},
            "spec": {"backends": ["m"], "quota": {"total": "1Gi"}}
        }))
        .expect("pool");
        let first: KVCachePoolBinding =
            serde_json::from_value(binding("team-a", "qwen")).expect("binding");
        World::new([], [Arc::new(pool)], [Arc::new(first)], [], [])
    }

    #[test]
    fn a_duplicate_domain_is_a_422_naming_the_field_as_a_duplicate() {
        let r = validate(
            &request("KVCachePoolBinding", "CREATE", binding("team-b", "qwen")),
            &Settings::default(),
            &world(),
        );
        assert!(!r.allowed);
        assert_eq!(r.result.code, 422);
        assert_eq!(r.result.reason, "Invalid");
        assert!(
            r.result.message.starts_with("KVCachePoolBinding.worker.gpustack.ai \"team\" is invalid: spec.domain.name: Duplicate: domain \"qwen\" is already held on backend m by KVCachePoolBinding team-a/team"),
            "{}",
            r.result.message
        );
        let details = r.result.details.expect("details");
        assert_eq!(details.causes[0].field, "spec.domain.name");
        assert_eq!(details.causes[0].reason, "FieldValueDuplicate");
        // Another domain passes (with the unproven-ledger warning: no pool observed it).
        let r = validate(
            &request("KVCachePoolBinding", "CREATE", binding("team-b", "llama")),
            &Settings::default(),
            &world(),
        );
        assert!(r.allowed, "{:?}", r.result);
        assert!(
            r.warnings
                .is_some_and(|w| w.iter().any(|w| w.contains("is unproven")))
        );
    }

    #[test]
    fn an_update_is_judged_by_the_single_object_rules_only_and_a_delete_passes() {
        let mut req = request("KVCachePoolBinding", "UPDATE", binding("team-b", "qwen"));
        req.old_object = req.object.clone();
        assert!(validate(&req, &Settings::default(), &world()).allowed);
        let req = request("KVCachePoolBinding", "DELETE", binding("team-b", "qwen"));
        assert!(validate(&req, &Settings::default(), &world()).allowed);
    }

    #[test]
    fn an_object_that_does_not_decode_is_refused_saying_so_not_a_panic() {
        let mut broken = binding("team-b", "qwen");
        broken["spec"]["quota"] = serde_json::json!("lots");
        let r = validate(
            &request("KVCachePoolBinding", "CREATE", broken),
            &Settings::default(),
            &world(),
        );
        assert!(!r.allowed);
        assert!(
            r.result.message.contains("does not decode"),
            "{}",
            r.result.message
        );
        let mut pod = request("Pod", "CREATE", binding("team-b", "qwen"));
        pod.kind.group = String::new();
        let r = validate(&pod, &Settings::default(), &world());
        assert!(
            !r.allowed && r.result.message.contains("not judged"),
            "{}",
            r.result.message
        );
    }
}
