use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::access::{Source, Sources, admitted, network_policy};
use super::deployment::operator_container;
use super::meta::{METRICS_PORT, WEBHOOK_PORT};
use super::*;

fn access(control_plane: &[&str], metrics_from: &[&str]) -> Access {
    Access {
        control_plane: control_plane.iter().map(|s| (*s).to_owned()).collect(),
        metrics_from: metrics_from.iter().map(|s| (*s).to_owned()).collect(),
    }
}

/// The policy's rules as (port, peers): `None` for a rule that admits every source.
fn rules(access: &Access) -> Vec<(i32, Option<Vec<String>>)> {
    let policy = network_policy("gpustack-system", access);
    let spec = policy.spec.expect("a spec");
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));
    spec.ingress
        .expect("ingress rules")
        .into_iter()
        .map(|r| {
            let ports = r.ports.expect("every rule names its port");
            assert_eq!(ports.len(), 1, "one port a rule");
            let port = match ports[0].port {
                Some(IntOrString::Int(n)) => n,
                ref other => panic!("a numbered port: {other:?}"),
            };
            let peers = r.from.map(|from| {
                from.into_iter()
                    .map(
                        |p| match (p.ip_block, p.namespace_selector, p.pod_selector) {
                            (Some(b), None, None) => b.cidr,
                            (None, Some(n), None) => format!(
                                "ns:{}",
                                n.match_labels.expect("labels")["kubernetes.io/metadata.name"]
                            ),
                            other => panic!("a block or a namespace: {other:?}"),
                        },
                    )
                    .collect()
            });
            (port, peers)
        })
        .collect()
}

#[test]
fn by_default_the_webhook_is_open_and_metrics_admit_the_monitoring_namespace_alone() {
    assert_eq!(
        admitted(&Access::default()),
        vec![
            (WEBHOOK_PORT, Sources::Anyone),
            (
                METRICS_PORT,
                Sources::Only(vec![Source::Namespace("monitoring".into())])
            ),
        ]
    );
    assert_eq!(
        rules(&Access::default()),
        vec![(9443, None), (8080, Some(vec!["ns:monitoring".to_owned()])),]
    );
}

#[test]
fn with_the_control_planes_addresses_the_webhook_admits_them_alone() {
    let a = access(&["10.0.0.0/28", "fd00::/64"], &["monitoring", "ops"]);
    assert_eq!(
        rules(&a),
        vec![
            (9443, Some(vec!["10.0.0.0/28".into(), "fd00::/64".into()])),
            (
                8080,
                Some(vec![
                    "10.0.0.0/28".into(),
                    "fd00::/64".into(),
                    "ns:monitoring".into(),
                    "ns:ops".into()
                ])
            ),
        ]
    );
}

#[test]
fn the_webhook_is_told_the_control_planes_addresses_it_serves() {
    let args = |a: &Access| operator_container("img", a).args.unwrap_or_default();
    assert!(
        args(&access(&["10.0.0.0/28", "fd00::/64"], &[]))
            .contains(&"--webhook-allowed-source=10.0.0.0/28,fd00::/64".to_owned())
    );
    assert!(
        !args(&Access::default())
            .iter()
            .any(|a| a.starts_with("--webhook-allowed-source")),
        "unnamed, every source is served"
    );
}

#[test]
fn a_port_that_admits_nobody_has_no_rule_never_an_open_one() {
    // No monitoring namespace and no control plane: the metrics port takes the node's
    // probes alone, so it has no rule (a rule without `from` would admit everyone).
    assert_eq!(
        admitted(&access(&[], &[])),
        vec![
            (WEBHOOK_PORT, Sources::Anyone),
            (METRICS_PORT, Sources::Only(Vec::new()))
        ]
    );
    assert_eq!(rules(&access(&[], &[])), vec![(9443, None)]);
    // Whatever the settings, only the webhook port may be open to everyone, and only
    // while the control plane is not named.
    for a in [
        access(&[], &[]),
        access(&["10.0.0.1/32"], &[]),
        access(&[], &["monitoring"]),
        access(&["10.0.0.1/32"], &["monitoring"]),
    ] {
        for (port, peers) in rules(&a) {
            if peers.is_none() {
                assert_eq!(port, WEBHOOK_PORT, "{a:?}");
                assert!(a.control_plane.is_empty(), "{a:?}");
            }
        }
    }
}

#[test]
fn the_manifest_says_what_its_policy_admits_above_it() {
    let text = operator_yaml("gpustack-system", "img").expect("renders");
    let (before, _) = text
        .split_once("kind: NetworkPolicy")
        .expect("the policy is in the manifest");
    let comment = before.rsplit("---\n").next().unwrap_or_default();
    assert!(
        comment.contains("admits every source") && comment.contains("controlPlaneCIDRs"),
        "{comment}"
    );
    let text = operator_yaml_with_access(
        "gpustack-system",
        "img",
        &access(&["10.0.0.0/28"], &["monitoring"]),
    )
    .expect("renders");
    assert!(
        text.contains("admits the control plane alone: 10.0.0.0/28."),
        "{text}"
    );
}
