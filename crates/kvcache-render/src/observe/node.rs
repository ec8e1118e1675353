//! The Nodes as a backend's pass reads them (docs/design.md#node-maintenance): whether one is
//! being taken out of service (cordoned, or marked for deletion by the cluster autoscaler), and
//! the facts of it that decide where members run.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::Node;

/// The taint `kubectl cordon` mirrors `spec.unschedulable` with.
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// The taint the cluster autoscaler puts on a node it is about to delete.
pub const AUTOSCALER_DELETION_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Why a member is about to lose its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leaving {
    /// The node is cordoned (`spec.unschedulable` or the unschedulable taint): maintenance.
    Cordoned,
    /// The cluster autoscaler marked the node for deletion.
    ScaleDown,
    /// The member group's edited template no longer admits the node: the DaemonSet controller
    /// deletes its member as soon as the template is applied.
    GroupNarrowed,
}

impl fmt::Display for Leaving {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Leaving::Cordoned => "cordoned",
            Leaving::ScaleDown => "marked for deletion by the cluster autoscaler",
            Leaving::GroupNarrowed => "no longer selected by its member group",
        })
    }
}

/// What of a Node decides where members run and whether it is leaving: its labels, taints and
/// cordon. A change of these (not of its status) is what a backend's pass looks again for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulingFacts {
    labels: BTreeMap<String, String>,
    taints: Vec<(String, Option<String>, String)>,
    unschedulable: bool,
}

impl SchedulingFacts {
    /// The facts of `node`.
    pub fn of(node: &Node) -> Self {
        let spec = node.spec.clone().unwrap_or_default();
        SchedulingFacts {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec
                .taints
                .unwrap_or_default()
                .into_iter()
                .map(|t| (t.key, t.value, t.effect))
                .collect(),
            unschedulable: spec.unschedulable == Some(true),
        }
    }
}

/// Whether `node` is being taken out of service, and how.
pub fn node_leaving(node: &Node) -> Option<Leaving> {
    let spec = node.spec.as_ref()?;
    let taints = spec.taints.as_deref().unwrap_or_default();
    if taints.iter().any(|t| t.key == AUTOSCALER_DELETION_TAINT) {
        return Some(Leaving::ScaleDown);
    }
    (spec.unschedulable == Some(true) || taints.iter().any(|t| t.key == UNSCHEDULABLE_TAINT))
        .then_some(Leaving::Cordoned)
}

/// The nodes being taken out of service, by name.
pub fn leaving_nodes<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> BTreeMap<String, Leaving> {
    nodes
        .into_iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, node_leaving(n)?)))
        .collect()
}
