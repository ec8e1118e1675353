//! `KVCacheBackend`: one Mooncake store, run by the operator (managed) or somewhere else
//! (external).

// kube's `printcolumn(..)` attributes repeat `type_ = "string"`, which clippy takes for duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, LocalObjectReference, SecurityContext};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Quantity;
use crate::resources::StoreResources;
use crate::rules;

/// A Mooncake store: a leader (master) that holds the metadata and member groups that contribute
/// memory segments, optionally with a local-disk tier. Or a store run elsewhere (`external`).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "worker.gpustack.ai",
    version = "v1",
    kind = "KVCacheBackend",
    shortname = "kvcb",
    category = "kvcache",
    status = "KVCacheBackendStatus",
    derive = "PartialEq",
    doc = "A Mooncake KV-cache store shared by the deployments of the cluster.",
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "Tenancy", type_ = "string", json_path = ".spec.tenancy.mode"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".status.endpoint"),
    printcolumn(
        name = "Capacity",
        type_ = "string",
        json_path = ".status.capacity.total"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct KVCacheBackendSpec {
    /// The store implementation. Only `Mooncake` exists.
    #[serde(default)]
    pub r#type: BackendType,

    /// Store image for the leader and every member group that names none. Unset: the cluster
    /// setting `kv-cache-backend-image` supplies it. A group's own `image` wins over this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    #[x_kube(validation = rules::image_not_blank())]
    pub image: Option<String>,

    /// Registry credentials for the leader and every member group, including groups that name
    /// their own image. The cluster's image-pull settings do not reach store workloads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// Pull policy for every store container. Unset: `Always` for an untagged or `:latest`
    /// image, `IfNotPresent` otherwise, recomputed whenever the image changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,

    /// How store processes move bytes between each other and engines. Defaults to `Auto`
    /// (which is TCP) whether or not this block is present.
    #[serde(default)]
    pub transport: Transport,

    /// Who runs the store: the operator (`managed`) or someone else (`external`). Exactly one.
    pub connection: Connection,

    /// Which namespaces may bind this store. `Shared` (the default): any namespace a
    /// KVCachePoolBinding grants; the store has no authentication, so each bound namespace can
    /// read and remove the others' blocks. `Dedicated`: only `namespace`; a Binding from any
    /// other is refused.
    #[serde(default)]
    pub tenancy: Tenancy,
}

/// Who may bind a backend (`spec.tenancy`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = rules::dedicated_names_its_namespace())]
#[x_kube(validation = rules::shared_names_no_namespace())]
pub struct Tenancy {
    /// `Shared` (the default) or `Dedicated`.
    #[serde(default)]
    pub mode: TenancyMode,
    /// With `Dedicated`, the one namespace whose KVCachePoolBindings may use this backend;
    /// left out with `Shared`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = rules::tenancy_namespace_shape())]
    pub namespace: Option<String>,
}

impl Tenancy {
    /// The one namespace the backend is dedicated to (`None`: shared).
    pub fn dedicated_to(&self) -> Option<&str> {
        match self.mode {
            TenancyMode::Dedicated => self.namespace.as_deref(),
            TenancyMode::Shared => None,
        }
    }
}

/// Whether a backend takes Bindings of many namespaces or of one.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum TenancyMode {
    /// Any namespace a KVCachePoolBinding grants; those namespaces trust one another.
    #[default]
    Shared,
    /// Only `tenancy.namespace`.
    Dedicated,
}

/// Which store implementation a backend runs (`spec.type`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BackendType {
    /// A Mooncake store (a master and member groups); the default and, for now, the only value.
    #[default]
    Mooncake,
}

/// Image pull policy, as on a Pod.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    /// Pull on every start.
    Always,
    /// Pull when the node does not have the image.
    IfNotPresent,
    /// Never pull.
    Never,
}

impl PullPolicy {
    /// The value as Kubernetes writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

/// Backend-wide transport.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Transport {
    /// The protocol. `Auto` means `TCP`; nodes are not probed.
    #[serde(default)]
    pub protocol: Protocol,
}

/// A member group's own transport; unset fields inherit the backend's.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupTransport {
    /// The protocol for this group only. Unset: the backend's `transport.protocol`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
}

/// Transfer protocol between store processes and engines.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum Protocol {
    /// TCP; no per-node probing.
    #[default]
    Auto,
    /// TCP sockets.
    #[serde(rename = "TCP")]
    Tcp,
    /// RDMA verbs (host network, `IPC_LOCK`, an RDMA device request).
    #[serde(rename = "RDMA")]
    Rdma,
    /// AWS Elastic Fabric Adapter.
    #[serde(rename = "EFA")]
    Efa,
    /// Huawei Ascend HCCS/RoCE (`ascend`).
    #[serde(rename = "CANN")]
    Cann,
    /// AMD ROCm (`hip`).
    #[serde(rename = "ROCM")]
    Rocm,
    /// Moore Threads intra-node IPC.
    #[serde(rename = "MUSA")]
    Musa,
    /// MetaX intra-node IPC.
    #[serde(rename = "MACA")]
    Maca,
}

impl Protocol {
    /// The spelling the store and engines use (`tcp`, `rdma`, `efa`, `ascend`, `hip`, …).
    pub fn artifact(self) -> &'static str {
        match self {
            Protocol::Auto | Protocol::Tcp => "tcp",
            Protocol::Rdma => "rdma",
            Protocol::Efa => "efa",
            Protocol::Cann => "ascend",
            Protocol::Rocm => "hip",
            Protocol::Musa => "musa",
            Protocol::Maca => "maca",
        }
    }

    /// The API value as written in a manifest (`TCP`, `CANN`, …).
    pub fn api_value(self) -> &'static str {
        match self {
            Protocol::Auto => "Auto",
            Protocol::Tcp => "TCP",
            Protocol::Rdma => "RDMA",
            Protocol::Efa => "EFA",
            Protocol::Cann => "CANN",
            Protocol::Rocm => "ROCM",
            Protocol::Musa => "MUSA",
            Protocol::Maca => "MACA",
        }
    }

    /// Whether the protocol needs the host network and a fabric device (RDMA and EFA only).
    pub fn is_fabric(self) -> bool {
        matches!(self, Protocol::Rdma | Protocol::Efa)
    }
}

/// Exactly one of `managed` or `external`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = rules::exactly_one_connection())]
pub struct Connection {
    /// The operator runs the store: a leader Deployment and one DaemonSet per member group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<Managed>,
    /// The store runs elsewhere; the operator only reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<External>,
}

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

fn default_true() -> bool {
    true
}

/// An environment variable for a store container: a name and a value or a source, as on a Pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtraEnv {
    /// The variable's name as the container sees it.
    #[schemars(length(min = 1, max = 128))]
    pub name: String,
    /// The value as written (`$(VAR)` expanded as on a Pod); set this or `valueFrom`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub value: Option<String>,
    /// Where the value comes from instead (a Secret, a ConfigMap, a field of the Pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
}

impl From<&ExtraEnv> for EnvVar {
    fn from(e: &ExtraEnv) -> Self {
        EnvVar {
            name: e.name.clone(),
            value: e.value.clone(),
            value_from: e.value_from.clone(),
        }
    }
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

/// One member group: a DaemonSet whose Pods each mount one memory segment.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = rules::host_path_not_tier())]
#[x_kube(validation = rules::dram_visibility_env())]
pub struct MemberGroup {
    /// The nodes this group covers; one member Pod runs on each. Editable: widening it adds
    /// members without restarting the others.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// What the segment is made of: `DRAM` (host memory) or `VRAM` (accelerator memory).
    /// Immutable; a node contributing both needs two groups.
    pub medium: Medium,
    /// Segment size per member. For `DRAM` it is added to the member Pod's memory request, so it
    /// is a claim on the node. At least 16Mi (one disk bucket) on a group with `localDisks`.
    pub capacity_per_member: Quantity,
    /// Staging buffer per member, added to the member Pod's memory request. Default 16Mi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_buffer_size: Option<Quantity>,
    /// Store image for this group only; wins over `spec.image` and the cluster setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    #[x_kube(validation = rules::image_not_blank())]
    pub image: Option<String>,
    /// This group's own transport; unset fields inherit the backend's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<GroupTransport>,
    /// Fabric interfaces per member for `RDMA`/`EFA`. Unset counts as 1. Inert on other protocols.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 32))]
    pub fabric_interface_count: Option<i32>,
    /// Store configuration overrides, `key=value`, rendered as `-D key=value`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 256)))]
    #[x_kube(validation = rules::member_args_shape())]
    pub extra_args: Vec<String>,
    /// Extra environment for the member container (e.g. extra offload knobs, or
    /// `NVIDIA_VISIBLE_DEVICES` on a VRAM group). Names the operator renders are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[x_kube(validation = rules::member_env_allowed())]
    pub extra_env: Vec<ExtraEnv>,
    /// Runtime class for the member Pods (a vendor runtime for VRAM groups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// Host directories or files to mount into member Pods (driver trees for VRAM groups).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["mountPath".into()]))]
    pub host_paths: Vec<HostPathMount>,
    /// Merged field by field over what the protocol grants; `capabilities.add` is unioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
    /// The local-disk tier under this group's memory segment. At most one entry, on at most one
    /// group per backend. Declaring it is the whole switch. Its path is chosen once: adding,
    /// removing or repathing the tier of an existing group is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["path".into()]))]
    pub local_disks: Vec<LocalDisk>,
    /// CPU and memory of each member container. Unset figures take the defaults: 1 CPU, and
    /// for memory the segment (DRAM) plus the staging buffers; no limits. A memory request
    /// written here cannot be below that sum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<StoreResources>,
}

impl MemberGroup {
    /// The group's disk tier, if it declares one.
    pub fn tier(&self) -> Option<&LocalDisk> {
        self.local_disks.first()
    }

    /// The group's effective protocol given the backend-wide one.
    pub fn protocol(&self, backend: Protocol) -> Protocol {
        self.transport
            .as_ref()
            .and_then(|t| t.protocol)
            .unwrap_or(backend)
    }
}

/// What a segment is made of.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum Medium {
    /// Host memory.
    #[serde(rename = "DRAM")]
    Dram,
    /// Accelerator memory (needs a store build with VRAM segments).
    #[serde(rename = "VRAM")]
    Vram,
}

impl Medium {
    /// The value as a member group's `medium` spells it: `DRAM` or `VRAM`.
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Dram => "DRAM",
            Medium::Vram => "VRAM",
        }
    }
}

/// A host path mounted into member Pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HostPathMount {
    /// Path on the node.
    #[schemars(length(min = 1, max = 4096))]
    pub path: String,
    /// Path inside the member container. Must not be `/dev/infiniband` (device plugins inject
    /// granted devices) nor the group's own disk-tier path.
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = rules::mount_path_not_infiniband())]
    pub mount_path: String,
    /// Kubelet check on the host path (`Directory`, `File`, …). Empty: no check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#type: Option<String>,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// The local-disk tier of a member group.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = rules::watermark_needs_capacity())]
pub struct LocalDisk {
    /// Absolute directory on every selected node. It must already exist, writable by the store
    /// image's user (`install -d -o 65532 -g 0 -m 0750 <path>` for the published image).
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = rules::tier_path_absolute())]
    #[x_kube(validation = rules::tier_path_not_root())]
    #[x_kube(validation = rules::tier_path_no_dotdot())]
    #[x_kube(validation = rules::tier_path_no_whitespace())]
    #[x_kube(validation = rules::tier_path_not_infiniband())]
    #[x_kube(validation = rules::tier_path_normalized())]
    #[x_kube(validation = rules::tier_path_not_system())]
    pub path: String,
    /// Tier ceiling per member. Unset: the store's own ceiling. At least one bucket (16Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = rules::tier_capacity_floor())]
    pub capacity: Option<Quantity>,
    /// Most keys the tier holds per member. Unset: the store's own ceiling. At least one
    /// bucket's worth of keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = rules::tier_key_floor())]
    pub key_limit: Option<i64>,
    /// Eviction from the tier. Present with no fields: enabled, the store's FIFO policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<Eviction>,
    /// Empty the directory (content only) on every selected node when the backend is deleted.
    #[serde(default)]
    pub clean_after_delete: bool,
}

/// Eviction from a disk tier.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = rules::disabled_eviction_has_no_policy())]
#[x_kube(validation = rules::disabled_eviction_has_no_watermark())]
pub struct Eviction {
    /// Evict at all. Defaults to true when this block is present.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Which objects go first. Unset: the store's default, `FIFO`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<EvictionPolicy>,
    /// Start evicting at `high` percent of `capacity`, stop at `low`. Needs `capacity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<Watermark>,
}

/// Tier eviction order.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum EvictionPolicy {
    /// Oldest written first.
    #[serde(rename = "FIFO")]
    Fifo,
    /// Least recently used first.
    #[serde(rename = "LRU")]
    Lru,
}

impl EvictionPolicy {
    /// The value as a tier's `eviction.policy` spells it: `FIFO` or `LRU`.
    pub fn as_str(self) -> &'static str {
        match self {
            EvictionPolicy::Fifo => "FIFO",
            EvictionPolicy::Lru => "LRU",
        }
    }
}

/// Eviction watermarks, in percent of the tier's `capacity`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = rules::watermark_order())]
pub struct Watermark {
    /// Start evicting above this fill level (percent, e.g. 90).
    #[schemars(range(min = 1, max = 100))]
    pub high: i32,
    /// Stop evicting at this fill level (percent, e.g. 80). Must be below `high`.
    #[schemars(range(min = 0, max = 99))]
    pub low: i32,
}

/// Member scale-in behaviour.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaleIn {
    /// Seconds a departing member with a disk tier waits after deregistering the tier, 0..3600.
    /// Its Pod's termination grace is this plus 60.
    #[schemars(range(min = 0, max = 3600))]
    pub grace_period_seconds: i32,
}

/// A store the operator does not run.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct External {
    /// Exactly two entries: `Client` (what engines connect to) and `Admin` (what the operator
    /// reads: health, metrics, segments). Both `host:port`.
    #[schemars(length(min = 2, max = 2))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub endpoints: Vec<ExternalEndpoint>,
}

impl External {
    /// The address declared for one endpoint name.
    pub fn address(&self, name: EndpointName) -> Option<&str> {
        self.endpoints
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.address.as_str())
    }
}

/// One address of an external store.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExternalEndpoint {
    /// `Client` or `Admin`.
    pub name: EndpointName,
    /// `host:port`.
    #[schemars(length(min = 3, max = 261))]
    #[x_kube(validation = rules::host_port())]
    pub address: String,
}

/// Which address of an external store.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum EndpointName {
    /// What engines connect to (the master's RPC port).
    Client,
    /// What the operator reads (health, metrics, segment listing).
    Admin,
}

/// What the operator observed of the store.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KVCacheBackendStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Provisioning`, `Ready`, `Degraded`, `Error` or `Deleting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BackendPhase>,
    /// Why the phase is not `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_message: Option<String>,
    /// Where engines connect: `<backend>-leader.<namespace>.svc:50051` whatever the election, or
    /// the external `Client`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// For an external store, its two declared addresses, verbatim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2))]
    pub endpoints: Vec<ExternalEndpoint>,
    /// Capacity read from the serving leader; absent until it serves. Never derived from the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,
    /// One row per segment the leader lists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberStatus>,
    /// Pools holding this backend; deletion waits for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<ObjectRef>,
    /// The namespaces whose KVCachePoolBindings grant them this store (a managed store's
    /// NetworkPolicies admit their Pods), sorted. More than one: they share one trust domain,
    /// each able to read and remove the others' blocks (docs/isolation.md#tenancy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bound_namespaces: Vec<String>,
    /// The version the running master binary reports (`mooncake_master --version`, published by
    /// the elector on the Lease), used by the engine/store version check in preference to the
    /// image tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_version: Option<String>,
    /// With `electionBackend: Etcd`: which master serves, and what the last failover kept,
    /// from the masters' own figures (`/health`, `master_key_count`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub election: Option<ElectionStatus>,
    /// With `electionBackend: Etcd`: the backend's etcd Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdStatus>,
    /// Segments the master lists that no member Pod of this backend mounted: the store places
    /// other tenants' blocks in their memory (`UnknownSegments`, docs/isolation.md#unknown-segments).
    /// At most [`UNKNOWN_SEGMENTS_LISTED`], in name order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub unknown_segments: Vec<UnknownSegment>,
    /// The last check that something enforces the store's NetworkPolicies: a probe Pod in the
    /// operator's namespace dialling the master's RPC port (`NetworkIsolated`,
    /// docs/isolation.md#enforcement-checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation_probe: Option<IsolationProbe>,
    /// `LeaderAvailable`, `MembersMounted`, `CapacityObserved`, `PoolWrites`, `Deletable`,
    /// `RolloutComplete`, and `ElectionObserved` / `TierWasEmpty` / `EtcdAvailable` /
    /// `FailoverKeptCache` where they apply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One check of the store's NetworkPolicies from outside the backend's trust domain.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IsolationProbe {
    /// The fingerprint of the backend's NetworkPolicies the probe checked: a change of them
    /// (a Binding made or gone) is probed again.
    pub policies: String,
    /// What was dialled: the serving master's RPC address (`<Pod IP>:50051`).
    pub target: String,
    /// The probe Pod that dialled it (`namespace/name`).
    pub pod: String,
    /// `Enforced` (refused), `NotEnforced` (connected) or `Inconclusive` (no answer).
    pub result: ProbeResult,
    /// What the probe reported, or why it gave no answer.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When the operator read the result.
    pub probed_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
}

/// What a probe of the master's RPC port from outside the trust domain found.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ProbeResult {
    /// The connection was refused or dropped: something enforces the policies.
    Enforced,
    /// The probe connected: nothing enforces them.
    NotEnforced,
    /// The probe gave no answer (it could not start, or ended another way).
    Inconclusive,
}

/// How many unknown segments `status.unknownSegments` holds at most, the first in name order
/// (more are left out: the first are enough to act on).
pub const UNKNOWN_SEGMENTS_LISTED: usize = 64;

/// A segment on the backend's master that no member Pod of the backend mounted.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnknownSegment {
    /// The segment's name as the master lists it (`<address>:<port>`): the transfer endpoint
    /// the store sends blocks to.
    pub segment_name: String,
    /// The address the segment advertises (its name without the port).
    pub address: String,
    /// The Pod that has this address (`namespace/name`), when one has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Its size as mounted (a quantity, `32Mi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Where it stands on the master: `OK` (takes new blocks), `DRAINING`, `DRAINED`, ...
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
    /// When the operator first saw it.
    pub first_seen: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// Listed for longer than a replaced member's segment lingers on the master (its client
    /// TTL): reported in `UnknownSegments`, counted and, unless the operator runs with
    /// `--unknown-segments=report`, drained.
    #[serde(default)]
    pub confirmed: bool,
}

/// The warm election as the serving master reports it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElectionStatus {
    /// The serving master's RPC address (its Pod IP and port 50051).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_address: Option<String>,
    /// The master view's version: it moves by one or more at every election.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view_version: Option<i64>,
    /// The serving master's key count at the operator's last reading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<i64>,
    /// The last change of serving master the operator saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failover: Option<FailoverRecord>,
}

/// One change of serving master: the view versions and the key counts on either side.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverRecord {
    /// The view that served before.
    pub from_view: i64,
    /// The view that serves now.
    pub to_view: i64,
    /// Keys on the old master at the operator's last reading before the change.
    pub keys_before: i64,
    /// Keys on the new master at the first reading after it.
    pub keys_after: i64,
}

/// A warm backend's etcd, from its StatefulSet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdStatus {
    /// etcd Pods asked for (1, or 3 with standbys).
    pub replicas: i32,
    /// etcd Pods ready (a member answers `/readyz` only inside a quorum).
    pub ready: i32,
    /// Where the masters, members and engines reach it (`;`-separated).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoints: String,
}

/// The condition types of a backend's status (`kubectl get kvcb -o yaml` shows them as
/// `type`), in the order the operator writes them.
pub mod conditions {
    /// Nothing holds the backend: no pool uses it.
    pub const DELETABLE: &str = "Deletable";
    /// The leader answers and serves.
    pub const LEADER_AVAILABLE: &str = "LeaderAvailable";
    /// `status.capacity` was read from the serving leader.
    pub const CAPACITY_OBSERVED: &str = "CapacityObserved";
    /// Every ready member Pod's segment is registered.
    pub const MEMBERS_MOUNTED: &str = "MembersMounted";
    /// Writes complete.
    pub const POOL_WRITES: &str = "PoolWrites";
    /// Every leader replica and member Pod runs the current template.
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    /// The Lease names a holder (with election only).
    pub const ELECTION_OBSERVED: &str = "ElectionObserved";
    /// A warm backend's etcd has a quorum of ready members.
    pub const ETCD_AVAILABLE: &str = "EtcdAvailable";
    /// A warm backend's last failover kept the keys (written once a failover was seen).
    pub const FAILOVER_KEPT_CACHE: &str = "FailoverKeptCache";
    /// The disk tier's folders were empty on first start (with a disk tier only).
    pub const TIER_WAS_EMPTY: &str = "TierWasEmpty";
    /// A declared disk tier is registered with the master (with a disk tier only).
    pub const TIER_REGISTERED: &str = "TierRegistered";
    /// The running master's version agrees with the image tag (once the elector reported it).
    pub const STORE_VERSION_OBSERVED: &str = "StoreVersionObserved";
    /// NetworkPolicies keep the store's Pods to the backend's own Pods and its bound namespaces
    /// (`False` while a member group runs on the host network, which no policy covers).
    pub const NETWORK_ISOLATED: &str = "NetworkIsolated";
    /// The master lists segments no member Pod of the backend mounted (a managed backend's
    /// serving master only): each named with its address.
    pub const UNKNOWN_SEGMENTS: &str = "UnknownSegments";
    /// The backend's objects could not be rendered (written only then, always `False`).
    pub const RENDERED: &str = "Rendered";
    /// The cluster settings could not be read (written only then, always `False`): the message
    /// names the key and says whether the last good settings are kept.
    pub const SETTINGS_READ: &str = "SettingsRead";
}

/// A KVCacheBackend's `status.phase`: whether its leader serves and its members are mounted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum BackendPhase {
    /// The leader has no ready replica yet.
    Provisioning,
    /// The leader serves and members are mounted.
    Ready,
    /// The leader serves, but members are short or stuck.
    Degraded,
    /// The leader is not available.
    Error,
    /// Being torn down, or held by a consumer.
    Deleting,
}

/// Capacity as the leader reports it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    /// Memory segments plus any disk tier: capacity, not usage.
    pub total: Quantity,
    /// Memory segments registered with the leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Disk tier ceiling registered with the leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<Quantity>,
}

/// One mounted segment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// Segment identity from the leader.
    #[serde(rename = "segmentID")]
    pub segment_id: String,
    /// Client identity from the leader.
    #[serde(rename = "clientID", default, skip_serializing_if = "String::is_empty")]
    pub client_id: String,
    /// Segment name from the leader (names may repeat).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub segment_name: String,
    /// Node of the member Pod, when exactly one Pod matches.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    /// Medium of the member Pod's group.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub medium: String,
}

/// A reference to another object (a consumer).
#[derive(
    Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// Kind, e.g. `KVCachePool`.
    pub kind: String,
    /// Namespace, for namespaced kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The object's `metadata.name`.
    pub name: String,
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// The memory a member Pod requests at least, in bytes: its segment (DRAM groups; a VRAM
/// segment is accelerator memory), its staging buffer and a disk tier's staging buffer. It is
/// the default request, and a written `resources.requests.memory` cannot be below it.
/// `field` names the group (`spec.connection.managed.members[0]`) for the error.
pub fn member_memory_floor(field: &str, group: &MemberGroup) -> Result<u64, crate::Error> {
    let buffer = match &group.local_buffer_size {
        Some(q) => q.bytes(&format!("{field}.localBufferSize"))?,
        None => crate::resources::DEFAULT_LOCAL_BUFFER,
    };
    let segment = match group.medium {
        Medium::Dram => group
            .capacity_per_member
            .bytes(&format!("{field}.capacityPerMember"))?,
        Medium::Vram => 0,
    };
    let staging = if group.tier().is_some() {
        crate::resources::TIER_STAGING_BYTES
    } else {
        0
    };
    Ok(segment.saturating_add(buffer).saturating_add(staging))
}
