//! Every store Pod the render makes meets the restricted Pod Security Standard
//! (<https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted>), but for
//! the exceptions a member group really needs, each named here and in docs/isolation.md: a
//! fabric group's host network and its two capabilities, a disk tier's host folder.

use kvcache_api::Settings;
use kvcache_api::manifest;
use kvcache_render::plan::resolve::{DEFAULT_NAMESPACE, Environment, render_all};
use serde_json::Value;

/// The rendered store workloads of an input file: (kind/name, Pod spec).
fn pod_specs(file: &str) -> Vec<(String, Value)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/inputs")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("input");
    let objects: Vec<_> = manifest::parse(file, &text)
        .expect("input parses")
        .into_iter()
        .map(|m| m.object)
        .collect();
    let settings = Settings::default();
    let env = Environment {
        namespace: DEFAULT_NAMESPACE,
        settings: &settings,
    };
    let docs = render_all(&objects, &env).expect("renders");
    docs.into_iter()
        .map(|d| serde_json::to_value(d).expect("JSON"))
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("Deployment" | "DaemonSet" | "StatefulSet")
            ) && d["metadata"]["labels"]["app.kubernetes.io/name"] == "kv-cache-backend"
        })
        .map(|d| {
            (
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap_or_default(),
                    d["metadata"]["name"].as_str().unwrap_or_default()
                ),
                d["spec"]["template"]["spec"].clone(),
            )
        })
        .collect()
}

/// What in `spec` breaks the restricted standard, one line each.
fn violations(spec: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[host] == true {
            out.push(host.to_owned());
        }
    }
    for v in spec["volumes"].as_array().into_iter().flatten() {
        if v.get("hostPath").is_some() {
            out.push(format!("hostPath volume {}", v["name"]));
        }
    }
    let pod = &spec["securityContext"];
    if pod["seccompProfile"]["type"] != "RuntimeDefault" {
        out.push("no RuntimeDefault seccomp profile".into());
    }
    let containers = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(spec["initContainers"].as_array().into_iter().flatten());
    for c in containers {
        let name = c["name"].as_str().unwrap_or_default();
        let sc = &c["securityContext"];
        if pod["runAsNonRoot"] != true && sc["runAsNonRoot"] != true {
            out.push(format!("{name}: may run as root"));
        }
        if sc["allowPrivilegeEscalation"] != false {
            out.push(format!("{name}: privilege escalation allowed"));
        }
        if sc["privileged"] == true {
            out.push(format!("{name}: privileged"));
        }
        let dropped = sc["capabilities"]["drop"]
            .as_array()
            .is_some_and(|d| d.iter().any(|c| c == "ALL"));
        if !dropped {
            out.push(format!("{name}: capabilities not dropped"));
        }
        for added in sc["capabilities"]["add"].as_array().into_iter().flatten() {
            if added != "NET_BIND_SERVICE" {
                out.push(format!(
                    "{name}: adds {}",
                    added.as_str().unwrap_or_default()
                ));
            }
        }
        if sc["readOnlyRootFilesystem"] != true {
            out.push(format!("{name}: writable root"));
        }
    }
    out
}

#[test]
fn every_store_pod_of_a_dram_backend_meets_the_restricted_standard() {
    for file in [
        "walkthrough-backend.yaml",
        "ha-replicas-3.yaml",
        "lease-addressing.yaml",
        "warm-failover.yaml",
        "two-groups.yaml",
    ] {
        let specs = pod_specs(file);
        assert!(!specs.is_empty(), "{file} renders store workloads");
        for (what, spec) in specs {
            assert_eq!(violations(&spec), Vec::<String>::new(), "{file}: {what}");
        }
    }
}

#[test]
fn a_fabric_or_a_disk_tier_is_the_named_exception() {
    let fabric: Vec<String> = pod_specs("rdma-group.yaml")
        .iter()
        .flat_map(|(_, s)| violations(s))
        .collect();
    assert_eq!(
        fabric,
        [
            "hostNetwork",
            "member: adds IPC_LOCK",
            "member: adds SYS_RESOURCE",
            // The group's own securityContext asks for it (the input's).
            "member: adds NET_ADMIN"
        ],
        "the RDMA group's exceptions and the user's own, nothing else"
    );
    let tier: Vec<String> = pod_specs("disk-heavy.yaml")
        .iter()
        .flat_map(|(_, s)| violations(s))
        .collect();
    assert!(
        !tier.is_empty() && tier.iter().all(|v| v.starts_with("hostPath volume")),
        "the disk tier's host folder, and nothing else: {tier:?}"
    );
}

#[test]
fn the_isolation_probe_pod_meets_the_restricted_standard() {
    use kvcache_render::objects::backend::probe::{ProbeInput, decide};
    let b: kvcache_api::KVCacheBackend = serde_json::from_value(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
        "metadata": {"name": "mooncake-dram", "uid": "u"},
        "spec": {"connection": {"managed": {"leader": {},
            "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}]}}}
    }))
    .expect("a backend");
    let pod = decide(&ProbeInput {
        enabled: true,
        backend: &b,
        namespace: DEFAULT_NAMESPACE,
        bound_namespaces: &[],
        policies: Some("f00dfeedcafe0123"),
        target: Some("10.244.0.7:50051"),
        image: Some("kvcacheai/mooncake:v0.3.13.post1"),
        recorded: None,
        pods: &[],
        now: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    })
    .create
    .expect("a probe Pod");
    let spec = serde_json::to_value(pod.spec).expect("JSON");
    assert_eq!(violations(&spec), Vec::<String>::new());
}
