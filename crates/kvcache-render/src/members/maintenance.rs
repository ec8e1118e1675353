//! Members that are about to lose their node (docs/design.md#node-maintenance): a node cordoned
//! (`spec.unschedulable`, the `node.kubernetes.io/unschedulable` taint) or marked for deletion by
//! the cluster autoscaler, and a member group whose edited template no longer admits a node its
//! members run on. Such a member is drained through the master before it goes (the rollout's
//! drain, `crate::members::rollout`), and held, not replaced: its replacement would land on the
//! same node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration,
};

pub use crate::observe::node::{
    AUTOSCALER_DELETION_TAINT, Leaving, SchedulingFacts, UNSCHEDULABLE_TAINT, leaving_nodes,
    node_leaving,
};
use crate::observe::read::MemberPod;

/// Taints every DaemonSet Pod tolerates (the DaemonSet controller adds these tolerations), so
/// they never make a node refuse a member.
const DAEMON_SET_TOLERATED: &[&str] = &[
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/network-unavailable",
    UNSCHEDULABLE_TAINT,
];

/// Marks each member Pod on a node of `leaving` (a node leaving wins over a group narrowed).
pub fn mark(members: &mut [MemberPod], leaving: &BTreeMap<String, Leaving>) {
    for m in members {
        if let Some(why) = leaving.get(&m.node) {
            m.leaving = Some(why.clone());
        }
    }
}

/// The nodes a member group's Pods run on that its rendered template (`spec`) no longer admits
/// (a DaemonSet runs a Pod on every node its selector, required affinity and tolerations admit).
/// A node not in `nodes` is not judged.
pub fn narrowed_nodes<'a>(
    spec: &PodSpec,
    on: impl IntoIterator<Item = &'a str>,
    nodes: &BTreeMap<String, &Node>,
) -> Vec<String> {
    let mut out: Vec<String> = on
        .into_iter()
        .filter(|n| nodes.get(*n).is_some_and(|node| !admits(spec, node)))
        .map(str::to_owned)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Whether two Pod templates place their Pods alike: the same node selector, affinity and
/// tolerations (what a DaemonSet decides its nodes by).
pub fn same_placement(a: &PodSpec, b: &PodSpec) -> bool {
    let selector = |s: &PodSpec| s.node_selector.clone().unwrap_or_default();
    let tolerations = |s: &PodSpec| s.tolerations.clone().unwrap_or_default();
    selector(a) == selector(b) && a.affinity == b.affinity && tolerations(a) == tolerations(b)
}

/// Whether a DaemonSet with this Pod template runs a Pod on `node`: its `nodeSelector`, its
/// required node affinity and its tolerations against the node's `NoSchedule`/`NoExecute`
/// taints (those every DaemonSet Pod tolerates aside).
pub fn admits(spec: &PodSpec, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let selected = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let name = node.metadata.name.clone().unwrap_or_default();
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let affine = required.is_none_or(|r| {
        r.node_selector_terms
            .iter()
            .any(|t| term_matches(t, &labels, &name))
    });
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let tolerated = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .filter(|t| !DAEMON_SET_TOLERATED.contains(&t.key.as_str()))
        .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)));
    selected && affine && tolerated
}

/// One required node-selector term: every expression holds (an empty term matches nothing).
fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>, name: &str) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let field = |r: &NodeSelectorRequirement| {
        let value = (r.key == "metadata.name").then_some(name);
        requirement_holds(r, value)
    };
    exprs
        .iter()
        .all(|r| requirement_holds(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(field)
}

/// A node-selector requirement against the label's value (`None`: the node lacks the label).
fn requirement_holds(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v > x)
        }
        "Lt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v < x)
        }
        // An operator the API server would have refused: admits nothing.
        _ => false,
    }
}

/// Whether `tol` tolerates `taint` (the API's rules: an empty key with `Exists` tolerates every
/// taint; an empty effect every effect).
fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    let effect = tol.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = tol.key.as_deref().unwrap_or_default();
    let exists = tol.operator.as_deref() == Some("Exists");
    if key.is_empty() {
        return exists;
    }
    key == taint.key
        && (exists
            || tol.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default())
}

/// The serving leader Pod to hand over before its node goes: a leader Pod's budget keeps the
/// one serving master from eviction (its standbys are never Ready), so a drain of its node
/// would wait forever; the operator deletes it instead once a standby runs on a node that
/// stays, and the standby takes over (`electionBackend: Etcd`: with the keys).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handover {
    /// The serving leader Pod.
    pub pod: String,
    /// Its node.
    pub node: String,
    /// Why the node goes.
    pub leaving: Leaving,
    /// The standby leader Pod that takes over (on a node that stays).
    pub standby: String,
    /// The backend is warm (`electionBackend: Etcd`): the next master replays the keys.
    pub warm: bool,
}

/// The hand-over of [`Handover`], if one is due: exactly one leader Pod of `backend` (label
/// value) Ready, on a leaving node, another one on a node that stays, none terminating (one
/// hand-over at a time).
pub fn leader_handover(
    backend: &str,
    warm: bool,
    store_pods: &[k8s_openapi::api::core::v1::Pod],
    leaving: &BTreeMap<String, Leaving>,
) -> Option<Handover> {
    let leaders: Vec<&k8s_openapi::api::core::v1::Pod> = store_pods
        .iter()
        .filter(|p| {
            p.metadata.labels.as_ref().is_some_and(|l| {
                l.get(crate::names::INSTANCE_LABEL).map(String::as_str) == Some(backend)
                    && l.get(crate::names::COMPONENT_LABEL).map(String::as_str) == Some("leader")
            })
        })
        .collect();
    if leaders
        .iter()
        .any(|p| p.metadata.deletion_timestamp.is_some())
    {
        return None;
    }
    let node = |p: &k8s_openapi::api::core::v1::Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default()
    };
    let ready: Vec<_> = leaders
        .iter()
        .filter(|p| crate::observe::read::pod_ready(p))
        .collect();
    let [serving] = ready.as_slice() else {
        return None;
    };
    let why = leaving.get(&node(serving))?;
    let standby = leaders.iter().find(|p| {
        p.metadata.name != serving.metadata.name
            && !node(p).is_empty()
            && !leaving.contains_key(&node(p))
    })?;
    Some(Handover {
        pod: serving.metadata.name.clone().unwrap_or_default(),
        node: node(serving),
        leaving: why.clone(),
        standby: standby.metadata.name.clone().unwrap_or_default(),
        warm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, NodeSelector, NodeSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, labels: &[(&str, &str)], taints: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(
                    taints
                        .iter()
                        .map(|(k, e)| Taint {
                            key: (*k).into(),
                            effect: (*e).into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_cordon_the_unschedulable_taint_and_the_autoscaler_taint_each_mark_a_node_leaving() {
        let mut cordoned = node("a", &[], &[]);
        if let Some(s) = cordoned.spec.as_mut() {
            s.unschedulable = Some(true);
        }
        assert_eq!(node_leaving(&cordoned), Some(Leaving::Cordoned));
        let tainted = node("b", &[], &[(UNSCHEDULABLE_TAINT, "NoSchedule")]);
        assert_eq!(node_leaving(&tainted), Some(Leaving::Cordoned));
        let scaled = node("c", &[], &[(AUTOSCALER_DELETION_TAINT, "NoSchedule")]);
        assert_eq!(node_leaving(&scaled), Some(Leaving::ScaleDown));
        assert_eq!(
            node_leaving(&node("d", &[], &[("gpu", "NoSchedule")])),
            None
        );
        assert_eq!(node_leaving(&Node::default()), None);
        let all = [cordoned, tainted, scaled, node("d", &[], &[])];
        assert_eq!(
            leaving_nodes(&all).keys().collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
    }

    #[test]
    fn a_node_selector_an_affinity_and_taints_decide_whether_a_group_keeps_a_node() {
        let gpu = node("gpu-0", &[("pool", "gpu"), ("zone", "a")], &[]);
        let cpu = node("cpu-0", &[("pool", "cpu")], &[]);
        let tainted = node("gpu-1", &[("pool", "gpu")], &[("dedicated", "NoSchedule")]);
        let cordoned = node(
            "gpu-2",
            &[("pool", "gpu")],
            &[(UNSCHEDULABLE_TAINT, "NoSchedule")],
        );
        let mut spec = PodSpec::default();
        assert!(admits(&spec, &gpu) && admits(&spec, &cpu) && admits(&spec, &cordoned));
        assert!(!admits(&spec, &tainted), "an untolerated NoSchedule taint");
        spec.node_selector = Some([("pool".to_owned(), "gpu".to_owned())].into());
        assert!(admits(&spec, &gpu) && !admits(&spec, &cpu));
        spec.tolerations = Some(vec![Toleration {
            key: Some("dedicated".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }]);
        assert!(admits(&spec, &tainted));
        let term = |op: &str, values: &[&str]| NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "zone".into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| (*v).into()).collect()),
            }]),
            match_fields: None,
        };
        let with = |terms: Vec<NodeSelectorTerm>| PodSpec {
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: terms,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(admits(&with(vec![term("In", &["a"])]), &gpu));
        assert!(!admits(&with(vec![term("In", &["b"])]), &gpu));
        assert!(admits(
            &with(vec![term("In", &["b"]), term("Exists", &[])]),
            &gpu
        ));
        assert!(!admits(&with(vec![term("Exists", &[])]), &cpu));
        assert!(admits(&with(vec![term("DoesNotExist", &[])]), &cpu));
        assert!(admits(&with(vec![term("NotIn", &["a"])]), &cpu));
        assert!(!admits(&with(vec![NodeSelectorTerm::default()]), &gpu));
        let by_name = NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec!["cpu-0".into()]),
            }]),
        };
        assert!(admits(&with(vec![by_name.clone()]), &cpu));
        assert!(!admits(&with(vec![by_name]), &gpu));
    }

    #[test]
    fn the_nodes_a_narrowed_group_loses_are_those_its_template_no_longer_admits() {
        let gpu = node("gpu-0", &[("pool", "gpu")], &[]);
        let cpu = node("cpu-0", &[("pool", "cpu")], &[]);
        let nodes: BTreeMap<String, &Node> =
            [("gpu-0".to_owned(), &gpu), ("cpu-0".to_owned(), &cpu)].into();
        let spec = PodSpec {
            node_selector: Some([("pool".to_owned(), "gpu".to_owned())].into()),
            ..Default::default()
        };
        assert_eq!(
            narrowed_nodes(&spec, ["gpu-0", "cpu-0", "cpu-0", "gone"], &nodes),
            ["cpu-0"]
        );
        assert!(narrowed_nodes(&PodSpec::default(), ["gpu-0", "cpu-0"], &nodes).is_empty());
    }

    #[test]
    fn numeric_requirements_compare_numbers_and_refuse_what_is_not_one() {
        let r = |op: &str, v: &str| NodeSelectorRequirement {
            key: "cores".into(),
            operator: op.into(),
            values: Some(vec![v.into()]),
        };
        assert!(requirement_holds(&r("Gt", "4"), Some("8")));
        assert!(!requirement_holds(&r("Gt", "8"), Some("8")));
        assert!(requirement_holds(&r("Lt", "16"), Some("8")));
        assert!(!requirement_holds(&r("Lt", "x"), Some("8")));
        assert!(!requirement_holds(&r("Gt", "4"), None));
        assert!(!requirement_holds(&r("Near", "4"), Some("4")));
    }
}

#[cfg(test)]
mod handover_tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn leader(name: &str, node: &str, ready: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {
                "app.kubernetes.io/instance": "b", "app.kubernetes.io/component": "leader"}},
            "spec": {"nodeName": node, "containers": []},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .expect("a Pod")
    }

    #[test]
    fn the_serving_leader_on_a_leaving_node_is_handed_to_a_standby_on_a_node_that_stays() {
        let cordoned = BTreeMap::from([("n0".to_owned(), Leaving::Cordoned)]);
        let pods = [leader("l-a", "n0", true), leader("l-b", "n1", false)];
        assert_eq!(
            leader_handover("b", true, &pods, &cordoned),
            Some(Handover {
                pod: "l-a".into(),
                node: "n0".into(),
                leaving: Leaving::Cordoned,
                standby: "l-b".into(),
                warm: true,
            })
        );
        // Another backend's, a node that stays, a standby on a leaving node too: no hand-over.
        assert_eq!(leader_handover("c", true, &pods, &cordoned), None);
        assert_eq!(leader_handover("b", true, &pods, &BTreeMap::new()), None);
        let both = BTreeMap::from([
            ("n0".to_owned(), Leaving::Cordoned),
            ("n1".to_owned(), Leaving::ScaleDown),
        ]);
        assert_eq!(leader_handover("b", true, &pods, &both), None);
        // A single leader: nothing takes over (its exposure is DisruptionBudget's).
        assert_eq!(leader_handover("b", true, &pods[..1], &cordoned), None);
        // One hand-over at a time.
        let mut going = leader("l-c", "n1", false);
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let pods = [leader("l-a", "n0", true), leader("l-b", "n1", false), going];
        assert_eq!(leader_handover("b", true, &pods, &cordoned), None);
    }
}
