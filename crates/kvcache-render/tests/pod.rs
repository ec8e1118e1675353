//! The Pod injection decision (docs/design.md#injection-refusals): every refusal the webhook
//! makes itself, and an injected Pod, without an API server.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kvcache_api::Settings;
use kvcache_api::backend::KVCacheBackend;
use kvcache_api::pool::{KVCachePool, KVCachePoolBinding};
use kvcache_render::admission::pod::{frozen_edit, inject_pod};
use kvcache_render::plan::resolve::Environment;
use kvcache_render::world::Chain;

fn binding() -> KVCachePoolBinding {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
        "metadata": {"name": "team-a", "namespace": "team-a"},
        "spec": {"poolRef": {"name": "shared"}, "quota": {"ceiling": "1Gi"},
                 "domain": {"name": "chat", "blockSize": 64, "dtype": "bfloat16"}}
    }))
    .expect("binding")
}

fn pool(ledger: Option<(&str, &str)>, endpoint: Option<&str>) -> KVCachePool {
    let mut v = serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": "shared"},
        "spec": {"backends": ["mooncake"], "quota": {"total": "1Gi"}},
        "status": {"conditions": []}
    });
    if let Some((status, reason)) = ledger {
        v["status"]["conditions"] = serde_json::json!([{"type": "QuotaLedgerAvailable", "status": status,
            "reason": reason, "message": "read", "lastTransitionTime": "2026-01-01T00:00:00Z"}]);
    }
    if let Some(e) = endpoint {
        v["status"]["clientEndpoint"] = e.into();
    }
    serde_json::from_value(v).expect("pool")
}

fn backend() -> KVCacheBackend {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "mooncake"},
        "spec": {"image": "gpustack/mirrored-mooncake:0.3.13.post1-cpu",
                 "connection": {"managed": {"leader": {}, "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}]}}}
    }))
    .expect("backend")
}

fn pod(edit: impl FnOnce(&mut serde_json::Value)) -> Pod {
    let mut v = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "engine", "namespace": "team-a",
            "labels": {"kvcache.gpustack.ai/inject": "true"},
            "annotations": {"kvcache.gpustack.ai/binding": "team-a", "kvcache.gpustack.ai/engine": "vLLM"}},
        "spec": {"containers": [{"name": "engine", "image": "gpustack/runner:cpu-vllm0.29.0",
            "command": ["vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct"]}]}
    });
    edit(&mut v);
    serde_json::from_value(v).expect("pod")
}

/// What the webhook found; `None` fields are the defaults (everything present and ready).
#[derive(Default)]
struct Found {
    binding: Option<Option<KVCachePoolBinding>>,
    pool: Option<Option<KVCachePool>>,
    backend: Option<Option<KVCacheBackend>>,
}

fn decide(p: &Pod, found: Found) -> Result<Pod, (String, String)> {
    let b = found.binding.unwrap_or_else(|| Some(binding()));
    let pl = found.pool.unwrap_or_else(|| {
        Some(pool(
            Some(("True", "LedgerRead")),
            Some("mooncake-leader.gpustack-system.svc:50051"),
        ))
    });
    let be = found.backend.unwrap_or_else(|| Some(backend()));
    let settings = Settings::default();
    let env = Environment {
        namespace: "gpustack-system",
        settings: &settings,
    };
    let r = Chain {
        binding: b.as_ref(),
        pool: pl.as_ref(),
        backend: be.as_ref(),
    };
    inject_pod(p, "team-a", "5f1c-2d", r, &env)
        .map(|i| i.pod)
        .map_err(|e| (e.reason.to_owned(), e.message))
}

fn reason(p: &Pod) -> String {
    decide(p, Found::default()).expect_err("refused").0
}

#[test]
fn an_opted_in_vllm_pod_gets_the_file_the_variable_and_the_records() {
    let out = decide(&pod(|_| {}), Found::default()).expect("injected");
    let a = out.metadata.annotations.clone().unwrap_or_default();
    let config: serde_json::Value =
        serde_json::from_str(&a["kvcache.gpustack.ai/client-config"]).expect("JSON");
    assert_eq!(
        config["master_server_address"],
        "mooncake-leader.gpustack-system.svc:50051"
    );
    assert_eq!(config["tenant_id"], "chat");
    let record: serde_json::Value =
        serde_json::from_str(&a["kvcache.gpustack.ai/injected"]).expect("JSON");
    assert_eq!(record["binding"], "team-a");
    assert_eq!(record["engine"], "vllm");
    let c = &out.spec.as_ref().expect("spec").containers[0];
    assert!(
        c.args.iter().flatten().any(|a| a == "--kv-transfer-config"),
        "{:?}",
        c.args
    );
    assert!(
        c.env
            .iter()
            .flatten()
            .any(|e| e.name == "MOONCAKE_CONFIG_PATH")
    );
    assert!(
        out.spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .is_some_and(|v| !v.is_empty())
    );
}

#[test]
fn a_pool_without_a_ledger_gives_no_tenant_and_an_unready_ledger_refuses() {
    let p = pod(|_| {});
    let plain = pool(Some(("False", "MultiTenancyDisabled")), Some("m:50051"));
    let out = decide(
        &p,
        Found {
            pool: Some(Some(plain.clone())),
            ..Found::default()
        },
    )
    .expect("injected");
    let a = out.metadata.annotations.unwrap_or_default();
    let config: serde_json::Value =
        serde_json::from_str(&a["kvcache.gpustack.ai/client-config"]).expect("JSON");
    assert!(config.get("tenant_id").is_none(), "{config}");
    let unreachable = pool(Some(("False", "LedgerUnreachable")), Some("m:50051"));
    let e = decide(
        &p,
        Found {
            pool: Some(Some(unreachable.clone())),
            ..Found::default()
        },
    )
    .expect_err("refused");
    assert_eq!(e.0, "LedgerNotReady");
    assert!(e.1.contains("LedgerUnreachable"), "{}", e.1);
    let silent = pool(None, Some("m:50051"));
    assert_eq!(
        decide(
            &p,
            Found {
                pool: Some(Some(silent.clone())),
                ..Found::default()
            }
        )
        .expect_err("refused")
        .0,
        "LedgerNotReady"
    );
    let no_endpoint = pool(Some(("True", "LedgerRead")), None);
    assert_eq!(
        decide(
            &p,
            Found {
                pool: Some(Some(no_endpoint.clone())),
                ..Found::default()
            }
        )
        .expect_err("refused")
        .0,
        "NoClientEndpoint"
    );
}

#[test]
fn every_refusal_the_webhook_makes_has_its_reason() {
    let ann = |k: &str, v: Option<&str>| {
        let (k, v) = (k.to_owned(), v.map(str::to_owned));
        pod(move |p| match v {
            Some(v) => p["metadata"]["annotations"][k] = v.into(),
            None => {
                p["metadata"]["annotations"]
                    .as_object_mut()
                    .expect("map")
                    .remove(&k);
            }
        })
    };
    // a, b
    assert_eq!(
        reason(&ann("kvcache.gpustack.ai/binding", None)),
        "BindingMissing"
    );
    assert_eq!(
        reason(&ann("kvcache.gpustack.ai/binding", Some("other/team-a"))),
        "CrossNamespaceBinding"
    );
    // c, d, k
    let p = pod(|_| {});
    assert_eq!(
        decide(
            &p,
            Found {
                binding: Some(None),
                ..Found::default()
            }
        )
        .expect_err("c")
        .0,
        "BindingNotFound"
    );
    assert!(
        decide(
            &p,
            Found {
                binding: Some(None),
                ..Found::default()
            }
        )
        .expect_err("c")
        .1
        .contains("team-a/team-a")
    );
    assert_eq!(
        decide(
            &p,
            Found {
                pool: Some(None),
                ..Found::default()
            }
        )
        .expect_err("d")
        .0,
        "DanglingReference"
    );
    assert_eq!(
        decide(
            &p,
            Found {
                backend: Some(None),
                ..Found::default()
            }
        )
        .expect_err("d")
        .0,
        "DanglingReference"
    );
    let mut deleting = binding();
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
    );
    assert_eq!(
        decide(
            &p,
            Found {
                binding: Some(Some(deleting.clone())),
                ..Found::default()
            }
        )
        .expect_err("k")
        .0,
        "BindingDeleting"
    );
    // f
    assert_eq!(
        reason(&ann("kvcache.gpustack.ai/engine", None)),
        "EngineMissing"
    );
    assert_eq!(
        reason(&ann("kvcache.gpustack.ai/engine", Some("vllm"))),
        "InvalidEngine"
    );
    assert_eq!(
        reason(&ann("kvcache.gpustack.ai/manufacturer", Some("nvidia"))),
        "UnknownManufacturer"
    );
    // g, h
    let two = pod(|p| {
        p["spec"]["containers"]
            .as_array_mut()
            .expect("list")
            .push(serde_json::json!({"name": "sidecar", "image": "busybox"}));
        p["spec"]["initContainers"] = serde_json::json!([{"name": "warmup", "image": "busybox"}]);
    });
    assert_eq!(reason(&two), "ContainerAmbiguous");
    let mut init = two.clone();
    init.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("kvcache.gpustack.ai/container".into(), "warmup".into());
    assert_eq!(reason(&init), "InitContainerNamed");
    let mut named = two.clone();
    named
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("kvcache.gpustack.ai/container".into(), "engine".into());
    assert!(decide(&named, Found::default()).is_ok());
    // i, j
    let owned = pod(|p| {
        p["spec"]["containers"][0]["args"] = serde_json::json!(["--kv-transfer-config", "{}"])
    });
    assert_eq!(reason(&owned), "OwnedKeyPresent");
    let dtype = pod(|p| {
        p["spec"]["containers"][0]["args"] = serde_json::json!(["--kv-cache-dtype", "fp8"])
    });
    assert_eq!(reason(&dtype), "DtypeOwned");
    // m
    let volume = pod(|p| {
        p["spec"]["volumes"] =
            serde_json::json!([{"name": "kvcache-client-config", "emptyDir": {}}])
    });
    assert_eq!(reason(&volume), "VolumeCollision");
    // n, o, p, q, r, s, t
    let cmd = |command: serde_json::Value, args: serde_json::Value| {
        pod(move |p| {
            p["spec"]["containers"][0]["command"] = command;
            p["spec"]["containers"][0]["args"] = args;
        })
    };
    assert_eq!(
        reason(&cmd(serde_json::Value::Null, serde_json::Value::Null)),
        "NoLaunchCommand"
    );
    assert_eq!(
        reason(&cmd(serde_json::Value::Null, serde_json::json!(["serve"]))),
        "EntrypointNotInspectable"
    );
    assert_eq!(
        reason(&cmd(
            serde_json::json!(["tini", "--"]),
            serde_json::Value::Null
        )),
        "LauncherWithoutProgram"
    );
    assert_eq!(
        reason(&cmd(
            serde_json::json!(["python3", "-m", "sglang.launch_server"]),
            serde_json::Value::Null
        )),
        "WrongProgram"
    );
    assert_eq!(
        reason(&cmd(
            serde_json::json!(["sh", "-c", "vllm serve m"]),
            serde_json::Value::Null
        )),
        "ShellLaunch"
    );
    assert_eq!(
        reason(&cmd(
            serde_json::json!(["env", "-S", "vllm serve m"]),
            serde_json::Value::Null
        )),
        "HiddenCommand"
    );
    assert_eq!(
        reason(&cmd(
            serde_json::json!(["./run.sh"]),
            serde_json::Value::Null
        )),
        "ScriptLaunch"
    );
    // u, v, w, x
    assert_eq!(
        reason(&ann("kvcache.gpustack.ai/bindng", Some("x"))),
        "UnknownAnnotation"
    );
    assert_eq!(
        reason(&ann("kvcache.gpustack.ai/injected", Some("{}"))),
        "RecordSubmitted"
    );
    assert_eq!(
        reason(&ann("kvcache.gpustack.ai/client-config", Some("{}"))),
        "RecordSubmitted"
    );
    assert_eq!(
        reason(&ann("kvcache.gpustack.ai/domain", Some("chat"))),
        "DomainAnnotation"
    );
    assert_eq!(
        reason(&ann("kvcache.gpustack.ai/role", Some("Server"))),
        "InvalidRole"
    );
}

#[test]
fn the_freeze_refuses_the_label_and_the_records_and_lets_other_metadata_pass() {
    let old = decide(&pod(|_| {}), Found::default()).expect("injected");
    let mut other = old.clone();
    other
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("team".into(), "a".into());
    other.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    assert_eq!(frozen_edit(&old, &other), None);
    let mut label = old.clone();
    label
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("kvcache.gpustack.ai/inject".into(), "false".into());
    assert!(frozen_edit(&old, &label).is_some_and(|m| m.contains("kvcache.gpustack.ai/inject")));
    for k in [
        "kvcache.gpustack.ai/injected",
        "kvcache.gpustack.ai/client-config",
    ] {
        let mut edited = old.clone();
        edited
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .remove(k);
        assert!(
            frozen_edit(&old, &edited).is_some_and(|m| m.contains(k)),
            "{k}"
        );
    }
}

#[test]
fn a_pod_asking_for_declared_ports_gets_its_own_policy_label_and_a_policy_owned_by_it() {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use kvcache_render::objects::engine_access::{ENGINE_POLICY_LABEL, pod_policy};
    // Without the annotation: no label, no policy (a workload opted in by label keeps its own).
    let plain = decide(&pod(|_| {}), Found::default()).expect("injected");
    assert!(
        !plain
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key(ENGINE_POLICY_LABEL)
    );
    let asked = pod(|v| {
        v["metadata"]["annotations"]["kvcache.gpustack.ai/network-policy"] = "DeclaredPorts".into();
        v["metadata"]["labels"]["app"] = "chat".into();
        v["metadata"]["labels"]["pod-template-hash"] = "5d4f".into();
        v["spec"]["containers"][0]["ports"] =
            serde_json::json!([{"containerPort": 8000, "name": "http"}]);
    });
    let mut out = decide(&asked, Found::default()).expect("injected");
    let labels = out.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels[ENGINE_POLICY_LABEL], "5f1c2d", "the request's uid");
    // The Pod as the API server stores it: named, with a uid.
    out.metadata.uid = Some("pod-uid".into());
    let policy = pod_policy(&out).expect("a policy");
    assert_eq!(policy.metadata.name.as_deref(), Some("engine-5f1c2d"));
    assert_eq!(policy.metadata.namespace.as_deref(), Some("team-a"));
    let owner = &policy.metadata.owner_references.clone().expect("an owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Pod", "pod-uid")
    );
    let spec = policy.spec.expect("a spec");
    assert_eq!(
        spec.pod_selector
            .and_then(|s| s.match_labels)
            .expect("a selector"),
        BTreeMap::from([(ENGINE_POLICY_LABEL.to_owned(), "5f1c2d".to_owned())])
    );
    let ingress = spec.ingress.expect("rules");
    let open: Vec<_> = ingress[0]
        .ports
        .iter()
        .flatten()
        .map(|p| p.port.clone())
        .collect();
    assert_eq!(open, vec![Some(IntOrString::Int(8000))]);
    assert_eq!(ingress[0].from, None);
    let own = ingress[1].from.as_ref().expect("peers")[0]
        .pod_selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .expect("the workload's Pods");
    assert_eq!(
        own,
        BTreeMap::from([
            ("app".to_owned(), "chat".to_owned()),
            ("kvcache.gpustack.ai/inject".to_owned(), "true".to_owned()),
        ]),
        "the Pod's labels but its own token and revision"
    );
    // A Pod that is not the webhook's doing gets nothing: the label without the webhook's
    // record (a Pod the webhook never saw), or without the annotation.
    let without = |key: &str| {
        let mut p = out.clone();
        p.metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .remove(key);
        p
    };
    let spoofed = without("kvcache.gpustack.ai/injected");
    assert!(pod_policy(&spoofed).is_none(), "no record, no policy");
    let unasked = without("kvcache.gpustack.ai/network-policy");
    assert!(pod_policy(&unasked).is_none(), "not asked, no policy");
    // A policy of that name someone else controls is left alone; the Pod's own is its.
    let mut theirs = pod_policy(&out).expect("a policy");
    assert!(!kvcache_render::objects::engine_access::held_by_another(
        &theirs, "pod-uid"
    ));
    theirs.metadata.owner_references = None;
    assert!(kvcache_render::objects::engine_access::held_by_another(
        &theirs, "pod-uid"
    ));
    // The label cannot be submitted, nor changed or removed afterwards.
    let submitted = pod(|v| {
        v["metadata"]["labels"][ENGINE_POLICY_LABEL] = "5f1c2d".into();
    });
    let (reason, message) = decide(&submitted, Found::default()).expect_err("refused");
    assert_eq!(reason, "RecordSubmitted");
    assert!(message.contains(ENGINE_POLICY_LABEL), "{message}");
    let mut edited = out.clone();
    edited
        .metadata
        .labels
        .as_mut()
        .expect("labels")
        .insert(ENGINE_POLICY_LABEL.to_owned(), "another".into());
    let why = frozen_edit(&out, &edited).expect("the label is frozen");
    assert!(why.contains(ENGINE_POLICY_LABEL), "{why}");
    assert!(
        frozen_edit(&out, &unasked).is_some(),
        "the annotation is frozen"
    );

    // Another spelling is refused, naming the annotation.
    let wrong = pod(|v| {
        v["metadata"]["annotations"]["kvcache.gpustack.ai/network-policy"] = "declared".into();
    });
    let (reason, message) = decide(&wrong, Found::default()).expect_err("refused");
    assert_eq!(reason, "InvalidNetworkPolicy");
    assert!(
        message.contains("kvcache.gpustack.ai/network-policy"),
        "{message}"
    );
}
