//! What the operator observed of a backend's store (`status`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::external::ExternalEndpoint;
use crate::quantity::Quantity;

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
