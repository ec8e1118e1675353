//! The webhook's answers, judged against small worlds.

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
        warnings.iter().any(|w| w
            .starts_with("namespace team-b will share KVCacheBackend m with namespaces team-a: ")),
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
    let judged = related(&w, &new.object).bindings().count();
    assert!(
        judged <= NAMED + 3,
        "{judged} Bindings cloned for 41 on the backend"
    );
    let r = validate(&candidate, &Settings::default(), &w);
    let warnings = r.warnings.unwrap_or_default();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("with namespaces ns-00, ns-01, ns-02, ns-03, ns-04, and others:")),
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
        details.causes[0].message.contains(
            "KVCacheBackend m, whose spec.tenancy (mode: Dedicated) admits namespace team-a only"
        ),
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
    dedicated["spec"]["tenancy"] = serde_json::json!({"mode": "Dedicated", "namespace": "team-a"});
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
