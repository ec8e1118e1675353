use super::*;

fn backend() -> KVCacheBackend {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
        "metadata": {"name": "mooncake-dram", "uid": "u-1"},
        "spec": {"connection": {"managed": {"leader": {},
            "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}]}}}
    }))
    .expect("a backend")
}

const NS: &str = "gpustack-system";
const NOW: &str = "2026-12-06T10:00:00Z";

fn at(t: &str) -> Timestamp {
    t.parse().expect("a time")
}

fn input<'a>(
    b: &'a KVCacheBackend,
    recorded: Option<&'a IsolationProbe>,
    pods: &'a [ProbePod],
    now: &str,
) -> ProbeInput<'a> {
    ProbeInput {
        enabled: true,
        backend: b,
        namespace: NS,
        bound_namespaces: &[],
        policies: Some("f00dfeedcafe0123"),
        target: Some("10.244.0.7:50051"),
        image: Some("kvcacheai/mooncake:v0.3.13.post1"),
        recorded,
        pods,
        now: at(now),
    }
}

fn running(policies: &str, created: &str) -> ProbePod {
    ProbePod {
        name: format!("mooncake-dram-probe-{}", &policies[..8]),
        policies: policies.into(),
        target: "10.244.0.7:50051".into(),
        created: Some(at(created)),
        deleting: false,
        outcome: Outcome::Running,
    }
}

fn exited(code: i32, message: &str) -> ProbePod {
    ProbePod {
        outcome: Outcome::Exited {
            code,
            message: message.into(),
        },
        ..running("f00dfeedcafe0123", NOW)
    }
}

fn record(result: ProbeResult, policies: &str, at_: &str) -> IsolationProbe {
    IsolationProbe {
        policies: policies.into(),
        target: "10.244.0.7:50051".into(),
        pod: format!("{NS}/mooncake-dram-probe-{}", &policies[..8]),
        result,
        message: String::new(),
        probed_at: Time(at(at_)),
    }
}

#[test]
fn policies_without_a_result_start_one_probe_pod_outside_every_admitted_selector() {
    let b = backend();
    let d = decide(&input(&b, None, &[], NOW));
    assert!(d.delete.is_empty() && d.record.is_none());
    assert_eq!(d.isolation, Some(Isolation::Probing { previous: None }));
    assert_eq!(d.recheck, Some(PROBE_POLL));
    let pod = d.create.expect("a probe Pod");
    assert_eq!(
        pod.metadata.name.as_deref(),
        Some("mooncake-dram-probe-f00dfeed")
    );
    assert_eq!(pod.metadata.namespace.as_deref(), Some(NS));
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    // Neither the backend's own Pods (name kv-cache-backend) nor the operator's (name
    // kvcache-operator): no policy admits it.
    assert_eq!(
        labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("kvcache-isolation-probe")
    );
    assert!(!labels.contains_key("app.kubernetes.io/instance"));
    assert_eq!(
        labels.get(PROBE_LABEL).map(String::as_str),
        Some("mooncake-dram")
    );
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get(POLICIES_ANNOTATION).map(String::as_str),
        Some("f00dfeedcafe0123")
    );
    let spec = pod.spec.expect("a spec");
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(spec.automount_service_account_token, Some(false));
    let argv = spec.containers[0].command.clone().unwrap_or_default();
    assert_eq!(argv[argv.len() - 3..], ["10.244.0.7", "50051", "5"]);
    assert_eq!(
        pod.metadata.owner_references.map(|o| o[0].name.clone()),
        Some("mooncake-dram".to_owned())
    );
}

#[test]
fn a_running_probe_is_awaited_and_one_past_its_deadline_gives_no_answer() {
    let b = backend();
    let pods = [running("f00dfeedcafe0123", "2026-12-06T09:59:00Z")];
    let d = decide(&input(&b, None, &pods, NOW));
    assert_eq!((d.create, d.delete.len()), (None, 0));
    assert_eq!(d.recheck, Some(PROBE_POLL));
    let late = decide(&input(&b, None, &pods, "2026-12-06T10:01:01Z"));
    assert_eq!(late.delete, ["mooncake-dram-probe-f00dfeed"]);
    let r = late.record.expect("a record");
    assert_eq!(r.result, ProbeResult::Inconclusive);
    assert!(
        r.message.contains("did not end within 120s"),
        "{}",
        r.message
    );
    assert!(
        late.create.is_none(),
        "tried again only after the retry delay"
    );
    assert_eq!(late.isolation, Some(Isolation::Probed(r)));
    assert_eq!(late.recheck, Some(RETRY_INCONCLUSIVE));
}

#[test]
fn the_exit_code_is_the_result_read_once_and_the_pod_deleted() {
    let b = backend();
    for (code, result) in [
        (EXIT_REFUSED, ProbeResult::Enforced),
        (EXIT_CONNECTED, ProbeResult::NotEnforced),
        // Python's own exit on an uncaught error: no answer, never "refused".
        (1, ProbeResult::Inconclusive),
    ] {
        let pods = [exited(code, "refused: Connection refused")];
        let d = decide(&input(&b, None, &pods, NOW));
        let r = d.record.clone().expect("a record");
        assert_eq!(r.result, result, "exit {code}");
        assert_eq!(r.target, "10.244.0.7:50051");
        assert_eq!(r.pod, "gpustack-system/mooncake-dram-probe-f00dfeed");
        assert_eq!(d.delete, ["mooncake-dram-probe-f00dfeed"]);
        assert!(d.create.is_none(), "exit {code}: one Pod per change");
        assert_eq!(d.isolation, Some(Isolation::Probed(r)));
    }
}

#[test]
fn a_result_for_the_current_policies_holds_until_they_change() {
    let b = backend();
    let done = record(
        ProbeResult::Enforced,
        "f00dfeedcafe0123",
        "2026-12-01T00:00:00Z",
    );
    let d = decide(&input(&b, Some(&done), &[], NOW));
    assert_eq!(d.create, None);
    assert_eq!(d.isolation, Some(Isolation::Probed(done.clone())));
    assert_eq!(d.recheck, None);
    // A Binding made: other policies. The old result is no longer theirs, and a probe Pod
    // of the old ones still running goes.
    let pods = [running("0123456789abcdef", "2026-12-06T09:59:50Z")];
    let changed = decide(&ProbeInput {
        policies: Some("badc0ffee0ddf00d"),
        ..input(&b, Some(&done), &pods, NOW)
    });
    assert_eq!(changed.delete, ["mooncake-dram-probe-01234567"]);
    assert_eq!(
        changed.create.and_then(|p| p.metadata.name),
        Some("mooncake-dram-probe-badc0ffe".to_owned())
    );
    assert_eq!(
        changed.isolation,
        Some(Isolation::Probing {
            previous: Some(done)
        })
    );
}

#[test]
fn an_inconclusive_result_is_tried_again_after_the_retry_delay() {
    let b = backend();
    let failed = record(ProbeResult::Inconclusive, "f00dfeedcafe0123", NOW);
    let soon = decide(&input(&b, Some(&failed), &[], "2026-12-06T10:04:00Z"));
    assert!(soon.create.is_none());
    assert_eq!(soon.recheck, Some(Duration::from_secs(60)));
    let later = decide(&input(&b, Some(&failed), &[], "2026-12-06T10:05:00Z"));
    assert!(later.create.is_some());
    assert_eq!(
        later.isolation,
        Some(Isolation::Probing {
            previous: Some(failed)
        })
    );
}

#[test]
fn off_own_namespace_bound_or_no_serving_master_starts_nothing() {
    let b = backend();
    let pods = [running("f00dfeedcafe0123", NOW)];
    let off = decide(&ProbeInput {
        enabled: false,
        ..input(&b, None, &pods, NOW)
    });
    assert_eq!(
        (off.create, off.delete.clone(), off.isolation),
        (None, vec![pods[0].name.clone()], Some(Isolation::Off))
    );
    let bound = [NS.to_owned()];
    let own = decide(&ProbeInput {
        bound_namespaces: &bound,
        ..input(&b, None, &pods, NOW)
    });
    assert_eq!(own.isolation, Some(Isolation::OwnNamespaceBound));
    assert!(own.create.is_none());
    let waiting = decide(&ProbeInput {
        target: None,
        ..input(&b, None, &[], NOW)
    });
    assert!(waiting.create.is_none());
    assert_eq!(
        waiting.isolation,
        Some(Isolation::Probing { previous: None })
    );
    let nothing = decide(&ProbeInput {
        policies: None,
        ..input(&b, None, &pods, NOW)
    });
    assert_eq!((nothing.isolation, nothing.delete.len()), (None, 1));
}

#[test]
fn a_listed_pod_reads_as_its_outcome() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "mooncake-dram-probe-f00dfeed",
                     "creationTimestamp": "2026-12-06T10:00:00Z",
                     "annotations": {POLICIES_ANNOTATION: "f00dfeedcafe0123",
                                     TARGET_ANNOTATION: "10.244.0.7:50051"}},
        "status": {"phase": "Failed", "containerStatuses": [{
            "name": "probe", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 3, "message": "refused: Connection refused\n"}}
        }]}
    }))
    .expect("a Pod");
    let p = read_probe_pod(&pod);
    assert_eq!(p.policies, "f00dfeedcafe0123");
    assert_eq!(p.target, "10.244.0.7:50051");
    assert_eq!(
        p.outcome,
        Outcome::Exited {
            code: 3,
            message: "refused: Connection refused".into()
        }
    );
    let evicted: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p"},
        "status": {"phase": "Failed", "reason": "DeadlineExceeded",
                   "message": "Pod was active on the node longer than the specified deadline"}
    }))
    .expect("a Pod");
    assert_eq!(
        read_probe_pod(&evicted).outcome,
        Outcome::Failed("Pod was active on the node longer than the specified deadline".into())
    );
}

#[test]
fn the_target_is_this_backends_ready_leader_and_the_fingerprint_follows_the_policies() {
    let leader = |instance: &str, name: &str, ip: &str, ready: bool| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {
                "app.kubernetes.io/name": "kv-cache-backend",
                "app.kubernetes.io/instance": instance,
                "app.kubernetes.io/component": "leader"}},
            "status": {"podIP": ip, "conditions": [
                {"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .expect("a Pod")
    };
    let pods = [
        leader("other", "other-leader-a", "10.0.0.1", true),
        leader("mooncake-dram", "mooncake-dram-leader-b", "10.0.0.3", false),
        leader("mooncake-dram", "mooncake-dram-leader-a", "10.0.0.2", true),
    ];
    assert_eq!(
        target("mooncake-dram", &pods).as_deref(),
        Some("10.0.0.2:50051")
    );
    assert_eq!(target("mooncake-dram", &pods[..2]), None);
    let policy = |ns: &str| -> NetworkPolicy {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "mooncake-dram-leader"},
            "spec": {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {
                "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": [ns]}]}}]}]}
        }))
        .expect("a policy")
    };
    let (a, b) = (policy("team-a"), policy("team-b"));
    assert_eq!(policies_fingerprint(&[]), None);
    assert_eq!(policies_fingerprint(&[&a]), policies_fingerprint(&[&a]));
    assert_ne!(policies_fingerprint(&[&a]), policies_fingerprint(&[&b]));
}
