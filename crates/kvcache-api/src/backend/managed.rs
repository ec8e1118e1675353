//! A store the operator runs (`spec.connection.managed`): its leader, the leader's election
//! and etcd, and the environment a store container may be given.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::env::{ExtraEnv, default_true};
use super::members::{MemberGroup, ScaleIn};
use crate::quantity::Quantity;
use crate::resources::StoreResources;
use crate::rules;

/// A store the operator runs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = rules::one_tier_per_backend())]
#[x_kube(validation = rules::medium_immutable())]
#[x_kube(validation = rules::tier_path_immutable())]
#[x_kube(validation = rules::tier_segment_floor())]
pub struct Managed {
    /// The leader (Mooncake master). `leader: {}` takes every default.
    #[serde(default)]
    pub leader: Leader,
    /// Member groups, one DaemonSet each. A group has no name: its position in this list is its
    /// identity, so append new groups and retire one by narrowing its `nodeSelector`.
    #[schemars(length(min = 1, max = 32))]
    pub members: Vec<MemberGroup>,
    /// How members leave when they are removed (only used by a group with a disk tier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_in: Option<ScaleIn>,
    /// The PriorityClass of every store Pod (leader, members, the warm etcd). Recommended: one
    /// above the engines' (see docs/store-resources.md), so a node short of room evicts or
    /// delays an engine before the cache every engine reads. Unset: the cluster's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = rules::priority_class_name_shape())]
    pub priority_class_name: Option<String>,
}

/// The leader (master) of a managed store.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = rules::standbys_need_election())]
#[x_kube(validation = rules::etcd_election_immutable())]
#[x_kube(validation = rules::etcd_size_immutable())]
#[x_kube(validation = rules::etcd_storage_immutable())]
pub struct Leader {
    /// Leader Pods. One serves; the others are standbys that are deliberately not ready, so
    /// `3 desired / 1 ready` is the healthy state. More than one needs `electionBackend:
    /// Kubernetes` or `Etcd` (with `Etcd` it also gives the etcd three members instead of one,
    /// so it stays on its side of one once the backend exists).
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 5))]
    pub replicas: i32,
    /// How the serving leader is chosen: `Kubernetes` (a Lease, also at one replica; the cache
    /// is cold after every failover and leader restart), `Etcd` (Mooncake's own election and
    /// metadata operation log on an etcd the operator runs for this backend: a failover or a
    /// restart keeps the cache, for one or three etcd Pods and a few seconds more to serving),
    /// or `None`. Switching to or from `Etcd` is refused: it replaces every leader Pod and loses
    /// the cache; create a new backend instead.
    #[serde(default)]
    pub election_backend: ElectionBackend,
    /// The etcd the operator runs for `electionBackend: Etcd` (ignored otherwise); fixed when
    /// the backend is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdSpec>,
    /// How members find the serving leader: through the leader `Service` (default) or by reading
    /// the `Lease` holder. Ignored when `electionBackend` is `None` (Service) or `Etcd` (members
    /// read the serving master from the backend's etcd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_addressing: Option<MemberAddressing>,
    /// Where new objects go: `FreeRatioFirst` (emptier members first) or `Random`.
    #[serde(default)]
    pub allocation_strategy: AllocationStrategy,
    /// Keep a per-tenant quota ledger, so Binding ceilings are enforced. Needs a store image from
    /// Mooncake 0.3.12 on; write `false` for an older image.
    #[serde(default = "default_true")]
    pub multi_tenancy: bool,
    /// Extra master flags, `key=value` (or a bare boolean `key`), rendered as `-key=value` after the
    /// flags the operator derives. Flags the operator derives or that break the store are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 256)))]
    #[x_kube(validation = rules::leader_flags_refused(0))]
    #[x_kube(validation = rules::leader_flags_refused(1))]
    #[x_kube(validation = rules::leader_flags_refused(2))]
    #[x_kube(validation = rules::leader_flags_refused(3))]
    #[x_kube(validation = rules::leader_flags_refused(4))]
    #[x_kube(validation = rules::leader_flags_refused(5))]
    #[x_kube(validation = rules::leader_flags_refused(6))]
    #[x_kube(validation = rules::leader_flags_refused(7))]
    #[x_kube(validation = rules::leader_flags_refused(8))]
    pub extra_args: Vec<String>,
    /// Extra environment for the leader container; names the operator renders are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[x_kube(validation = rules::leader_env_allowed())]
    pub extra_env: Vec<ExtraEnv>,
    /// CPU and memory of each leader container. Unset figures take the defaults: 1 CPU and
    /// 1Gi requested, no limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<StoreResources>,
}

impl Default for Leader {
    fn default() -> Self {
        Leader {
            replicas: 1,
            election_backend: ElectionBackend::default(),
            etcd: None,
            member_addressing: None,
            allocation_strategy: AllocationStrategy::default(),
            multi_tenancy: true,
            extra_args: Vec::new(),
            extra_env: Vec::new(),
            resources: None,
        }
    }
}

impl Leader {
    /// Whether the leader runs under our Lease election.
    pub fn elects(&self) -> bool {
        self.election_backend == ElectionBackend::Kubernetes
    }

    /// Whether the leader runs Mooncake's own election on the backend's etcd, with the metadata
    /// operation log (a failover keeps the cache).
    pub fn warm(&self) -> bool {
        self.election_backend == ElectionBackend::Etcd
    }

    /// How many etcd Pods the backend runs: none unless `Etcd`; three when standbys are asked
    /// for (a quorum survives one loss), one otherwise.
    pub fn etcd_replicas(&self) -> i32 {
        match (self.warm(), self.replicas > 1) {
            (false, _) => 0,
            (true, true) => 3,
            (true, false) => 1,
        }
    }

    /// The addressing members really use: `Lease` only when asked for and election is on.
    pub fn effective_member_addressing(&self) -> MemberAddressing {
        match (self.elects(), self.member_addressing) {
            (true, Some(MemberAddressing::Lease)) => MemberAddressing::Lease,
            _ => MemberAddressing::Service,
        }
    }
}

fn default_replicas() -> i32 {
    1
}

/// How the serving leader is chosen.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ElectionBackend {
    /// A Kubernetes Lease named `<backend>-leader`, held by the serving leader.
    #[default]
    Kubernetes,
    /// No election: one leader Pod, whatever `replicas` says.
    None,
    /// Mooncake's own election (`--enable_ha --ha_backend_type=etcd`) with its metadata
    /// operation log (`--enable_oplog`) on an etcd the operator runs for this backend: a
    /// failover or a leader restart keeps every key. Only the masters use the etcd: members and
    /// engines dial the leader Service, which follows the serving master.
    Etcd,
}

/// The etcd of `electionBackend: Etcd`: one Pod, or three where `leader.replicas` is above one,
/// each with a PersistentVolumeClaim, reachable by nothing but the backend's own Pods in intent
/// (Mooncake's etcd client has no TLS).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSpec {
    /// The StorageClass of each etcd Pod's claim (the cluster's default when unset). The claims
    /// are deleted with the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class_name: Option<String>,
    /// The size of each claim (default 1Gi; the metadata of a million keys is well under it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_size: Option<Quantity>,
}

/// How members locate the serving leader.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MemberAddressing {
    /// Through the leader Service `<backend>-leader`.
    #[default]
    Service,
    /// By reading the Lease holder (members need read access to the Lease).
    Lease,
}

/// Where the leader places new objects.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AllocationStrategy {
    /// Emptier members first.
    #[default]
    FreeRatioFirst,
    /// Any member.
    Random,
}

impl AllocationStrategy {
    /// The master's flag value.
    pub fn flag_value(self) -> &'static str {
        match self {
            AllocationStrategy::FreeRatioFirst => "free_ratio_first",
            AllocationStrategy::Random => "random",
        }
    }
}
