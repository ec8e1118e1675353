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
//! - what a request names that the stores lack (yet): read live first, as [`live_read`] decides.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::core::response::{Status, StatusCause, StatusDetails};
use kvcache_api::manifest::{Manifest, Object};
use kvcache_api::{GROUP, Settings};
use kvcache_quota::tenancy::NAMED;
use kvcache_render::review::{Review, review};
pub use kvcache_render::world::World;

use crate::error::Unjudgeable;

/// The objects `object` is judged beside, cloned: every backend, pool and InstanceType (few),
/// and of the Bindings only those the claims and tenancy can read (docs/design.md#domain-claims,
/// docs/isolation.md#tenancy): for a Binding, those on its backend with its tenant (a
/// duplicate), one with another tenant (a second domain), and one of each namespace on the
/// backend up to what a warning names (its own, and `NAMED + 1` others); for a backend
/// dedicated to a namespace, the Bindings of other namespaces on it up to what a refusal names;
/// for a ModelDeployment every Binding of `world` (the live world holds only its own); for the
/// other kinds none (their rules read no Binding). A request thus costs the same with 2,000
/// Bindings stored as with 2.
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
        let own = candidate.metadata.namespace.as_deref();
        let mut other_tenant = false;
        let mut namespaces: BTreeSet<&str> = BTreeSet::new();
        let mut others = 0;
        // A Binding being deleted still holds its name: until its finalizer is gone the
        // master keeps its tenant's data, which a new claim would inherit.
        for b in world.bindings_on(backend) {
            let same = kvcache_api::admission::tenant_of(b) == tenant;
            let ns = b.metadata.namespace.as_deref().unwrap_or_default();
            let new_namespace = !namespaces.contains(ns) && (Some(ns) == own || others <= NAMED);
            if same || !other_tenant || new_namespace {
                other_tenant |= !same;
                if namespaces.insert(ns) && Some(ns) != own {
                    others += 1;
                }
                bindings.push(Object::Binding(Box::new(b.clone())));
            }
        }
    } else if let Object::Backend(b) = object
        && let Some(admits) = b.spec.tenancy.dedicated_to()
    {
        let name = b.metadata.name.as_deref().unwrap_or_default();
        bindings.extend(
            world
                .bindings_on(name)
                .filter(|x| x.metadata.namespace.as_deref() != Some(admits))
                .take(NAMED + 1)
                .map(|x| Object::Binding(Box::new(x.clone()))),
        );
    }
    backends
        .chain(pools)
        .chain(bindings)
        .chain(instance_types)
        .collect()
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
            let name = kvcache_render::pod::binding_named(&object.metadata)
                .filter(|n| kvcache_api::admission::is_dns_subdomain(n))?;
            let namespace = req.namespace.clone().unwrap_or_default();
            world
                .chain(&namespace, name)
                .backend
                .is_none()
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
    let binding_name = kvcache_render::pod::binding_named(&pod.metadata).unwrap_or_default();
    let env = kvcache_render::resolve::Environment {
        namespace,
        settings,
    };
    let chain = world.chain(&pod_ns, binding_name);
    match kvcache_render::pod::inject_pod(&pod, &pod_ns, &req.uid, chain, &env) {
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

    /// `world()` with the backend `m` its pool draws on.
    fn world_with_backend() -> World {
        let mut w = world();
        let backend: kvcache_api::KVCacheBackend = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "m"},
            "spec": {"connection": {"external": {"endpoints": [
                {"name": "Client", "address": "m:50051"}, {"name": "Admin", "address": "m:9003"}]}}}
        }))
        .expect("backend");
        w.add_backend(Arc::new(backend));
        w
    }

    fn binding_on(pool: &str) -> serde_json::Value {
        let mut b = binding("team-b", "qwen");
        b["spec"]["poolRef"]["name"] = pool.into();
        b
    }

    fn pool_on(backend: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": "new"},
            "spec": {"backends": [backend], "quota": {"total": "1Gi"}}
        })
    }

    fn pod_request(operation: &str, binding: Option<&str>) -> AdmissionRequest<DynamicObject> {
        let mut pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "engine", "namespace": "team-a", "annotations": {}},
            "spec": {"containers": [{"name": "engine", "image": "engine"}]}
        });
        if let Some(b) = binding {
            pod["metadata"]["annotations"]["kvcache.gpustack.ai/binding"] = b.into();
        }
        let mut req = request("Pod", operation, pod);
        req.kind.group = String::new();
        req
    }

    #[test]
    fn a_binding_reads_its_pool_live_when_the_caches_lack_it_or_its_backend() {
        let read = |req: &AdmissionRequest<DynamicObject>, w: &World| live_read(req, w);
        let create = |o| request("KVCachePoolBinding", "CREATE", o);
        // Pool and backend cached: nothing to read.
        assert_eq!(
            read(&create(binding_on("shared")), &world_with_backend()),
            None
        );
        // The pool missing: read it (and its backend).
        assert_eq!(
            read(&create(binding_on("new")), &world_with_backend()),
            Some(LiveRead::Pool("new".into()))
        );
        // The pool cached but its backend not: the pool is read again, with its backend.
        assert_eq!(
            read(&create(binding_on("shared")), &world()),
            Some(LiveRead::Pool("shared".into()))
        );
        let mut update = create(binding_on("new"));
        update.operation = Operation::Update;
        assert_eq!(read(&update, &world()), Some(LiveRead::Pool("new".into())));
        // A deletion, a Binding without a spec, a name no pool can have: nothing.
        let delete = request("KVCachePoolBinding", "DELETE", binding_on("new"));
        assert_eq!(read(&delete, &world()), None);
        let mut bare = binding_on("new");
        bare.as_object_mut().expect("object").remove("spec");
        assert_eq!(read(&create(bare), &world()), None);
        assert_eq!(read(&create(binding_on("other/new")), &world()), None);
        assert_eq!(read(&create(binding_on("New")), &world()), None);
    }

    #[test]
    fn a_pool_reads_its_backend_live_when_the_caches_lack_it_and_other_kinds_read_nothing() {
        let create = |kind: &str, o| request(kind, "CREATE", o);
        assert_eq!(
            live_read(
                &create("KVCachePool", pool_on("elsewhere")),
                &world_with_backend()
            ),
            Some(LiveRead::Backend("elsewhere".into()))
        );
        assert_eq!(
            live_read(&create("KVCachePool", pool_on("m")), &world_with_backend()),
            None
        );
        let delete = request("KVCachePool", "DELETE", pool_on("elsewhere"));
        assert_eq!(live_read(&delete, &world()), None);
        assert_eq!(
            live_read(&create("KVCachePool", pool_on("a_b")), &world()),
            None
        );
        // A backend or a ModelDeployment names no pool or backend this reads.
        let backend = serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "n"},
            "spec": {"connection": {"external": {"endpoints": [{"name": "Client", "address": "m:1"}]}}, "backends": ["x"]}
        });
        assert_eq!(
            live_read(&create("KVCacheBackend", backend), &world()),
            None
        );
        let md = serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "ModelDeployment",
            "metadata": {"name": "chat", "namespace": "team-a"}, "spec": {"kvCache": {"poolRef": {"name": "x"}}}
        });
        assert_eq!(live_read(&create("ModelDeployment", md), &world()), None);
        // The same kind name in another group is not ours.
        let mut foreign = create("KVCachePool", pool_on("elsewhere"));
        foreign.kind.group = "example.com".into();
        assert_eq!(live_read(&foreign, &world()), None);
    }

    #[test]
    fn a_pod_reads_its_binding_live_unless_the_whole_chain_is_cached() {
        // team-a/team, its pool and backend cached: nothing.
        assert_eq!(
            live_read(&pod_request("CREATE", Some("team")), &world_with_backend()),
            None
        );
        let live = Some(LiveRead::Binding {
            namespace: "team-a".into(),
            name: "team".into(),
        });
        // The backend missing: the whole chain is read again.
        assert_eq!(
            live_read(&pod_request("CREATE", Some("team")), &world()),
            live
        );
        assert_eq!(
            live_read(&pod_request("CREATE", Some("new")), &world_with_backend()),
            Some(LiveRead::Binding {
                namespace: "team-a".into(),
                name: "new".into(),
            })
        );
        // No Binding named, another namespace's, an update: nothing.
        for req in [
            pod_request("CREATE", None),
            pod_request("CREATE", Some("")),
            pod_request("CREATE", Some("other/team")),
            pod_request("UPDATE", Some("new")),
        ] {
            assert_eq!(live_read(&req, &world()), None, "{:?}", req.object);
        }
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

    /// `world_with_backend()` with the backend `m` dedicated to `ns` (`None`: shared), and a
    /// Binding `team` of tenant `t-<ns>` in each of `namespaces`.
    fn tenancy_world(dedicated: Option<&str>, namespaces: &[&str]) -> World {
        let mut w = world_with_backend();
        if let Some(ns) = dedicated {
            let mut b = w.backend("m").expect("backend").clone();
            b.spec.tenancy = kvcache_api::backend::Tenancy {
                mode: kvcache_api::backend::TenancyMode::Dedicated,
                namespace: Some(ns.into()),
            };
            w.add_backend(Arc::new(b));
        }
        for ns in namespaces {
            let b: KVCachePoolBinding =
                serde_json::from_value(binding(ns, &format!("t-{ns}"))).expect("binding");
            w.add_binding(Arc::new(b));
        }
        w
    }

    #[test]
    fn a_binding_bringing_a_namespace_to_a_shared_backend_is_admitted_with_the_warning() {
        let r = validate(
            &request("KVCachePoolBinding", "CREATE", binding("team-b", "llama")),
            &Settings::default(),
            &tenancy_world(None, &[]),
        );
        assert!(r.allowed, "{:?}", r.result);
        let warnings = r.warnings.unwrap_or_default();
        assert!(
            warnings.iter().any(|w| w.starts_with(
                "namespace team-b will share KVCacheBackend m with namespaces team-a: "
            )),
            "{warnings:#?}"
        );
        // A further Binding of a namespace already there: no such warning.
        let r = validate(
            &request("KVCachePoolBinding", "CREATE", binding("team-a", "llama")),
            &Settings::default(),
            &tenancy_world(None, &[]),
        );
        assert!(
            r.warnings
                .unwrap_or_default()
                .iter()
                .all(|w| !w.contains("will share")),
            "team-a is on the backend already"
        );
    }

    #[test]
    fn many_namespaces_on_a_backend_are_judged_from_a_bounded_few_and_named_five_and_others() {
        let many: Vec<String> = (0..40).map(|i| format!("ns-{i:02}")).collect();
        let names: Vec<&str> = many.iter().map(String::as_str).collect();
        let w = tenancy_world(None, &names);
        let candidate = request("KVCachePoolBinding", "CREATE", binding("team-b", "llama"));
        let new = manifest(candidate.object.as_ref().expect("object")).expect("decodes");
        let judged = related(&w, &new.object)
            .iter()
            .filter(|o| matches!(o, Object::Binding(_)))
            .count();
        assert!(
            judged <= NAMED + 3,
            "{judged} Bindings cloned for 41 on the backend"
        );
        let r = validate(&candidate, &Settings::default(), &w);
        let warnings = r.warnings.unwrap_or_default();
        assert!(
            warnings
                .iter()
                .any(|w| w
                    .contains("with namespaces ns-00, ns-01, ns-02, ns-03, ns-04, and others:")),
            "{warnings:#?}"
        );
    }

    #[test]
    fn a_binding_on_a_backend_dedicated_elsewhere_is_a_422_naming_the_tenancy() {
        let r = validate(
            &request("KVCachePoolBinding", "CREATE", binding("team-b", "llama")),
            &Settings::default(),
            &tenancy_world(Some("team-a"), &[]),
        );
        assert!(!r.allowed);
        assert_eq!(r.result.code, 422);
        let details = r.result.details.expect("details");
        assert_eq!(details.causes[0].field, "spec.poolRef.name");
        assert_eq!(details.causes[0].reason, "FieldValueForbidden");
        assert!(
            details.causes[0]
                .message
                .contains("KVCacheBackend m, whose spec.tenancy (mode: Dedicated) admits namespace team-a only"),
            "{}",
            details.causes[0].message
        );
        let r = validate(
            &request("KVCachePoolBinding", "CREATE", binding("team-a", "llama")),
            &Settings::default(),
            &tenancy_world(Some("team-a"), &[]),
        );
        assert!(r.allowed, "its own namespace: {:?}", r.result);
    }

    #[test]
    fn a_backend_another_namespace_binds_cannot_be_made_dedicated() {
        let w = tenancy_world(None, &["team-c"]);
        let shared = serde_json::to_value(w.backend("m").expect("backend")).expect("json");
        let mut dedicated = shared.clone();
        dedicated["spec"]["tenancy"] =
            serde_json::json!({"mode": "Dedicated", "namespace": "team-a"});
        let mut req = request("KVCacheBackend", "UPDATE", dedicated);
        req.old_object = Some(serde_json::from_value(shared).expect("old"));
        let r = validate(&req, &Settings::default(), &w);
        assert!(!r.allowed);
        let details = r.result.details.expect("details");
        assert_eq!(details.causes[0].field, "spec.tenancy");
        assert!(
            details.causes[0].message.contains("(team-c/team)")
                && !details.causes[0].message.contains("team-a/team"),
            "{}",
            details.causes[0].message
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
