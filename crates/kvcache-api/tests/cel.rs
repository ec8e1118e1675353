//! The CRDs' CEL rules, evaluated offline with kube's CEL validator against the generated
//! schema, agree with the pure validators: the same manifests are refused with the same words.
//! (The real API server judges them again in the end-to-end suite.)

mod support;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::core::cel::Validator;
use kvcache_api::Settings;
use kvcache_api::admission::Admission;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment};
use serde::Serialize;
use support::*;

/// The schema as installed, less the rules kube's offline evaluator cannot run: it binds
/// `oldSelf` as a plain value where `optionalOldSelf: true` asks for an optional. Those rules
/// (the ratcheting 16Mi segment floor) are judged by the real API server in the end-to-end suite.
fn schema(crd: &CustomResourceDefinition) -> serde_json::Value {
    let mut schema = serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("schema"),
    )
    .expect("schema serializes");
    drop_optional_old_self(&mut schema);
    schema
}

fn drop_optional_old_self(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::Array(rules)) = map.get_mut("x-kubernetes-validations") {
                rules.retain(|r| r.get("optionalOldSelf") != Some(&serde_json::Value::Bool(true)));
            }
            map.values_mut().for_each(drop_optional_old_self);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_optional_old_self),
        _ => {}
    }
}

/// CEL messages for `new` (as an update of `old` when given).
fn cel<T: CustomResourceExt + Serialize>(new: &T, old: Option<&T>) -> Vec<String> {
    let object = serde_json::to_value(new).expect("object serializes");
    let old = old.map(|o| serde_json::to_value(o).expect("old serializes"));
    match Validator::new().validate(&schema(&T::crd()), &object, old.as_ref()) {
        Ok(()) => Vec::new(),
        Err(errors) => errors
            .as_slice()
            .iter()
            .map(|e| format!("{}: {}", e.field_path, e.message))
            .collect(),
    }
}

#[track_caller]
fn assert_cel_refuses(messages: &[String], fragment: &str) {
    assert!(
        messages.iter().any(|m| m.contains(fragment)),
        "expected a CEL refusal containing {fragment:?}, got {messages:#?}"
    );
}

#[test]
fn only_the_segment_floor_needs_the_api_server() {
    let mut schema = serde_json::to_value(KVCacheBackend::crd()).expect("crd serializes");
    let before = schema.to_string().matches("optionalOldSelf").count();
    drop_optional_old_self(&mut schema);
    assert_eq!(
        before, 1,
        "exactly one rule is left to the end-to-end suite"
    );
    assert!(!schema.to_string().contains("optionalOldSelf"));
}

#[test]
fn the_seed_manifests_pass_every_rule() {
    // A rule that failed to compile would surface here as an error too.
    assert_eq!(
        cel(&backend(WALKTHROUGH_BACKEND), None),
        Vec::<String>::new()
    );
    assert_eq!(
        cel(&backend(DISK_HEAVY_BACKEND), None),
        Vec::<String>::new()
    );
    assert_eq!(cel(&pool(WALKTHROUGH_POOL), None), Vec::<String>::new());
    assert_eq!(
        cel(&binding(WALKTHROUGH_BINDING), None),
        Vec::<String>::new()
    );
    assert_eq!(
        cel(&model_deployment(WALKTHROUGH_MD), None),
        Vec::<String>::new()
    );
    let b = backend(WALKTHROUGH_BACKEND);
    assert_eq!(
        cel(&b, Some(&b)),
        Vec::<String>::new(),
        "a no-op update passes"
    );
}

/// Create-time cases: CEL and the pure validator both refuse, naming the same thing.
#[test]
fn create_rules_agree_with_the_pure_validator() {
    let cases: Vec<(KVCacheBackend, &str)> = vec![
        (
            managed(
                "leader: {extraArgs: ['--enable_snapshot=true']}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
            ),
            "another key's bytes",
        ),
        (
            managed(
                "leader: {extraArgs: ['etcd_endpoints=x:2379']}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
            ),
            "electionBackend: Etcd",
        ),
        (
            managed(
                "leader: {extraArgs: ['-enable_offload=true']}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
            ),
            "members[].localDisks",
        ),
        (
            managed(
                "leader: {replicas: 3, electionBackend: None}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
            ),
            "needs leader.electionBackend: Kubernetes",
        ),
        (
            managed(
                "leader: {resources: {requests: {cpu: 500m}, limits: {cpu: 250m}}}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
            ),
            "raise the limit",
        ),
        (
            managed(
                "leader: {resources: {requests: {memory: 2Gi}, limits: {memory: 1Gi}}}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
            ),
            "raise the limit",
        ),
        (
            managed(
                "members: [{medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /proc/kvcache}]}]\n",
            ),
            "/proc, /sys, /dev or /etc",
        ),
        (
            managed(
                "members: [{medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /var/lib/kvcache/}]}]\n",
            ),
            "normal form",
        ),
        (
            managed(
                "priorityClassName: Kv_Cache\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
            ),
            "must be the name of a PriorityClass",
        ),
        (
            managed(
                "leader: {extraEnv: [{name: POD_IP, value: x}]}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
            ),
            "POD_IP is refused",
        ),
        (
            managed(
                "members: [{medium: DRAM, capacityPerMember: 1Gi, extraEnv: [{name: MC_TE_METRIC, value: '0'}]}]\n",
            ),
            "MC_TE_METRIC is refused",
        ),
        (
            managed(
                "members: [{medium: DRAM, capacityPerMember: 1Gi, extraEnv: [{name: CUDA_VISIBLE_DEVICES, value: '0'}]}]\n",
            ),
            "refused on a DRAM group",
        ),
        (
            managed("members: [{medium: DRAM, capacityPerMember: 1Gi, extraArgs: [novalue]}]\n"),
            "key=value",
        ),
        (
            managed(
                "members: [{medium: DRAM, capacityPerMember: 1Gi, hostPaths: [{path: /x, mountPath: /dev/infiniband}]}]\n",
            ),
            "must not be /dev/infiniband",
        ),
        (
            managed(
                "members: [{medium: DRAM, capacityPerMember: 1Gi, hostPaths: [{path: /x, mountPath: /t}], localDisks: [{path: /t}]}]\n",
            ),
            "own localDisks[].path",
        ),
        (
            managed(
                "members:\n  - {medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /a}]}\n  - {medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /b}]}\n",
            ),
            "at most one member group",
        ),
        (
            tiered("1Gi", "capacity: 8Mi"),
            "must hold one bucket (16Mi)",
        ),
        (tiered("1Gi", "keyLimit: 4"), "16Mi bucket"),
        (
            tiered("1Gi", "eviction: {enabled: false, policy: LRU}"),
            "eviction.enabled: false",
        ),
        (
            tiered("1Gi", "eviction: {watermark: {high: 90, low: 80}}"),
            "needs localDisks[].capacity",
        ),
        (
            tiered(
                "1Gi",
                "capacity: 1Ti\neviction: {watermark: {high: 80, low: 90}}",
            ),
            "must be below",
        ),
        (
            managed(
                "members: [{medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: relative}]}]\n",
            ),
            "must be absolute",
        ),
        (
            managed("members: [{medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /}]}]\n"),
            "must not be /",
        ),
        (
            managed(
                "members: [{medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /a/../b}]}]\n",
            ),
            "..",
        ),
        (
            managed(
                "members: [{medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: '/a '}]}]\n",
            ),
            "spaces or tabs",
        ),
        (
            managed(
                "members: [{medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /dev}]}]\n",
            ),
            "/dev/infiniband",
        ),
        (
            managed("members: [{medium: DRAM, capacityPerMember: 8GB}]\n"),
            "quantity",
        ),
    ];
    for (b, fragment) in cases {
        let messages = cel(&b, None);
        assert_cel_refuses(&messages, fragment);
        let v = b.validate_create(&Settings::default());
        assert!(
            v.violations.iter().any(|x| x.message.contains(fragment))
                || (fragment == "quantity" && !v.allowed()),
            "pure validator disagrees for {fragment:?}: {:#?}",
            v.violations
        );
    }
    // Deliberately allowed flags and a sibling of /etc pass CEL as well.
    let ok = managed(
        "leader: {extraArgs: ['metrics_host=::', 'default_kv_lease_ttl=10s']}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /etcetera}]}]\n",
    );
    assert_eq!(cel(&ok, None), Vec::<String>::new());
}

#[test]
fn external_endpoint_addresses() {
    let ext = |a: &str| {
        backend(&format!(
            "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: b}}\nspec:\n  connection:\n    external:\n      endpoints:\n        - {{name: Client, address: '{a}'}}\n        - {{name: Admin, address: 'm:9003'}}\n"
        ))
    };
    assert_cel_refuses(&cel(&ext("m"), None), "host:port");
    assert_eq!(cel(&ext("[::1]:50051"), None), Vec::<String>::new());
    assert_eq!(cel(&ext("m.store.svc:50051"), None), Vec::<String>::new());
}

/// Transition rules (`oldSelf`).
#[test]
fn update_rules_agree_with_the_pure_validator() {
    let plain = managed("members:\n  - {medium: DRAM, capacityPerMember: 1Gi}\n");
    let vram = managed("members:\n  - {medium: VRAM, capacityPerMember: 1Gi}\n");
    assert_cel_refuses(&cel(&vram, Some(&plain)), "medium is immutable");
    let with_tier = tiered("1Gi", "");
    assert_cel_refuses(
        &cel(&with_tier, Some(&plain)),
        "chosen when the group is created",
    );
    assert_cel_refuses(
        &cel(&plain, Some(&with_tier)),
        "chosen when the group is created",
    );
    let repath = managed(
        "members: [{medium: DRAM, capacityPerMember: 1Gi, localDisks: [{path: /elsewhere}]}]\n",
    );
    assert_cel_refuses(
        &cel(&repath, Some(&with_tier)),
        "chosen when the group is created",
    );
    let edited = tiered("1Gi", "capacity: 1Ti\nkeyLimit: 100");
    assert_eq!(cel(&edited, Some(&with_tier)), Vec::<String>::new());
    // Appending a group and dropping the last one pass.
    let appended = managed(
        "members:\n  - {medium: DRAM, capacityPerMember: 1Gi}\n  - {medium: VRAM, capacityPerMember: 1Gi}\n",
    );
    assert_eq!(cel(&appended, Some(&plain)), Vec::<String>::new());
    assert_eq!(cel(&plain, Some(&appended)), Vec::<String>::new());

    let warm = |replicas: i32| {
        managed(&format!(
            "leader: {{replicas: {replicas}, electionBackend: Etcd}}\nmembers: [{{medium: DRAM, capacityPerMember: 1Gi}}]\n"
        ))
    };
    let lease =
        managed("leader: {replicas: 2}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n");
    assert_cel_refuses(&cel(&warm(2), Some(&lease)), "cannot move to or from Etcd");
    assert_cel_refuses(&cel(&lease, Some(&warm(2))), "cannot move to or from Etcd");
    assert_cel_refuses(&cel(&warm(2), Some(&warm(1))), "not changed in place");
    assert_cel_refuses(&cel(&warm(1), Some(&warm(3))), "not changed in place");
    assert_eq!(cel(&warm(3), Some(&warm(2))), Vec::<String>::new());
    assert_eq!(cel(&warm(2), None), Vec::<String>::new());
    let sized = managed(
        "leader: {electionBackend: Etcd, etcd: {storageSize: 2Gi}}\nmembers: [{medium: DRAM, capacityPerMember: 1Gi}]\n",
    );
    assert_cel_refuses(&cel(&sized, Some(&warm(1))), "claim templates");
    assert_cel_refuses(&cel(&warm(1), Some(&sized)), "claim templates");
    assert_eq!(cel(&sized, Some(&sized)), Vec::<String>::new());

    let p = pool(WALKTHROUGH_POOL);
    let repointed: KVCachePool = pool(&WALKTHROUGH_POOL.replace("- mooncake-dram", "- other"));
    assert_cel_refuses(&cel(&repointed, Some(&p)), "cannot be re-pointed");
    let two: KVCachePool =
        pool(&WALKTHROUGH_POOL.replace("- mooncake-dram", "- mooncake-dram\n    - other"));
    assert_cel_refuses(&cel(&two, None), "exactly one KVCacheBackend");

    let b = binding(WALKTHROUGH_BINDING);
    let redomained: KVCachePoolBinding =
        binding(&WALKTHROUGH_BINDING.replace("blockSize: 64", "blockSize: 16"));
    assert_cel_refuses(&cel(&redomained, Some(&b)), "spec.domain is immutable");
    let moved: KVCachePoolBinding =
        binding(&WALKTHROUGH_BINDING.replace("name: shared-dram", "name: x"));
    assert_cel_refuses(&cel(&moved, Some(&b)), "spec.poolRef is immutable");
    let bad_name: KVCachePoolBinding =
        binding(&WALKTHROUGH_BINDING.replace("blockSize: 64", "blockSize: 64\n    name: Team_A"));
    assert_cel_refuses(&cel(&bad_name, None), "DNS-1123 label");

    let md = model_deployment(WALKTHROUGH_MD);
    let other_model: ModelDeployment =
        model_deployment(&WALKTHROUGH_MD.replace("Qwen2.5-7B-Instruct", "Qwen3-8B"));
    assert_cel_refuses(&cel(&other_model, Some(&md)), "spec.model cannot be edited");
    let renamed_role: ModelDeployment =
        model_deployment(&WALKTHROUGH_MD.replace("name: server", "name: chat"));
    assert_cel_refuses(&cel(&renamed_role, Some(&md)), "role set");
    let more: ModelDeployment =
        model_deployment(&WALKTHROUGH_MD.replace("replicas: 2", "replicas: 4"));
    assert_eq!(cel(&more, Some(&md)), Vec::<String>::new());
}

/// `spec.tenancy` (docs/isolation.md#tenancy): a namespace with `Dedicated` and only then, a
/// name a namespace can have; CEL and the pure validator refuse the same, in the same words.
#[test]
fn tenancy_rules_agree_with_the_pure_validator() {
    use kvcache_api::backend::{Tenancy, TenancyMode};
    let with = |mode: TenancyMode, namespace: Option<&str>| {
        let mut b = backend(WALKTHROUGH_BACKEND);
        b.spec.tenancy = Tenancy {
            mode,
            namespace: namespace.map(str::to_owned),
        };
        b
    };
    let refused = [
        (
            with(TenancyMode::Dedicated, None),
            "spec.tenancy",
            "mode: Dedicated needs spec.tenancy.namespace",
        ),
        (
            with(TenancyMode::Shared, Some("team-a")),
            "spec.tenancy",
            "is read only with mode: Dedicated",
        ),
        (
            with(TenancyMode::Dedicated, Some("Team_A")),
            "spec.tenancy.namespace",
            "must be a namespace name",
        ),
        (
            with(TenancyMode::Dedicated, Some("-team")),
            "spec.tenancy.namespace",
            "must be a namespace name",
        ),
    ];
    for (b, field, fragment) in refused {
        assert_cel_refuses(&cel(&b, None), fragment);
        let v = b.validate_create(&Settings::default());
        assert!(
            v.refuses(field, fragment),
            "pure validator disagrees at {field} for {fragment:?}: {:#?}",
            v.violations
        );
    }
    let shared = with(TenancyMode::Shared, None);
    let dedicated = with(TenancyMode::Dedicated, Some("team-a"));
    for ok in [&shared, &dedicated] {
        assert_eq!(cel(ok, None), Vec::<String>::new(), "{:?}", ok.spec.tenancy);
        assert!(ok.validate_create(&Settings::default()).allowed());
    }
    // Either way is an edit the schema allows; who already binds it is judged by admission.
    assert_eq!(cel(&dedicated, Some(&shared)), Vec::<String>::new());
    assert_eq!(cel(&shared, Some(&dedicated)), Vec::<String>::new());
    // A backend written without the field reads as Shared.
    assert_eq!(
        backend(WALKTHROUGH_BACKEND).spec.tenancy.dedicated_to(),
        None
    );
}
