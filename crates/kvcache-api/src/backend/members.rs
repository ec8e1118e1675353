//! A managed store's member groups (`spec.connection.managed.members`): their segments, host
//! paths and disk tier, and the memory a member Pod requests at least.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::SecurityContext;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::env::{ExtraEnv, default_true};
use super::transport::{GroupTransport, Protocol};
use crate::quantity::Quantity;
use crate::resources::StoreResources;
use crate::rules;

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

/// The memory a member Pod requests at least, in bytes: its segment (DRAM groups; a VRAM
/// segment is accelerator memory), its staging buffer and a disk tier's staging buffer. It is
/// the default request, and a written `resources.requests.memory` cannot be below it.
/// `field` names the group (`spec.connection.managed.members[0]`) for the error.
pub fn member_memory_floor(field: &str, group: &MemberGroup) -> Result<u64, crate::error::Error> {
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
