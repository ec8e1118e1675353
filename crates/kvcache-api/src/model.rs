//! `ModelDeployment` (the parts the KV cache touches) and `InstanceType`.

// kube's `printcolumn(..)` attributes repeat `type_ = "string"`, which clippy takes for duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerPort, EnvVar, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::backend::PullPolicy;
use crate::pool::Domain;
use crate::quantity::Quantity;
use crate::rules;

/// A model served by an engine in one or more roles, optionally attached to a shared KV cache.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "worker.gpustack.ai",
    version = "v1",
    kind = "ModelDeployment",
    namespaced,
    shortname = "md",
    status = "ModelDeploymentStatus",
    derive = "PartialEq",
    doc = "A model served by vLLM or SGLang, optionally attached to a shared KV cache through a KVCachePoolBinding.",
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.model.name"),
    printcolumn(name = "Engine", type_ = "string", json_path = ".spec.engine.name"),
    printcolumn(
        name = "Binding",
        type_ = "string",
        json_path = ".spec.kvCache.poolRef.name"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Hit Ratio",
        type_ = "string",
        json_path = ".status.sharedCache.hitRatio"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = rules::immutable_on("self.model == oldSelf.model", "spec.model", "a different model means a new ModelDeployment"))]
#[x_kube(validation = rules::immutable_on("self.engine.name == oldSelf.engine.name", "spec.engine.name", "a different engine means a new ModelDeployment"))]
#[x_kube(validation = rules::immutable_on("has(self.kvCache) == has(oldSelf.kvCache) && (!has(self.kvCache) || self.kvCache == oldSelf.kvCache)", "spec.kvCache", "attaching, detaching or re-pointing the cache means a new ModelDeployment"))]
#[x_kube(validation = rules::roles_frozen())]
#[x_kube(validation = rules::engine_version_or_images())]
pub struct ModelDeploymentSpec {
    /// The model to serve. Frozen.
    pub model: Model,
    /// The engine. `name` is frozen; `version` is editable.
    pub engine: Engine,
    /// Attach every role to a shared KV cache. Omit for no shared cache at all. Frozen as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<KvCache>,
    /// The roles (1 to 10). The set of names and kinds is frozen.
    #[schemars(length(min = 1, max = 10))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub roles: Vec<Role>,
    /// Who may reach the roles' Pods. `DeclaredPorts` (default): a NetworkPolicy per role admits
    /// the ports its container declares (`http` and `roles[].ports`) from any source, every port
    /// from this deployment's own Pods, and nothing else (the engine's transfer engine takes no
    /// connection from the store: docs/isolation.md#engine-pods). `Unmanaged`: no policy, for
    /// clusters whose own policies cover these Pods.
    #[serde(default)]
    pub network_policy: EngineNetworkPolicy,
}

/// Whether the operator closes a deployment's Pods to all but their declared ports
/// (`spec.networkPolicy`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum EngineNetworkPolicy {
    /// A NetworkPolicy per role: the declared ports from anywhere, every port from the
    /// deployment's own Pods.
    #[default]
    DeclaredPorts,
    /// No NetworkPolicy: the cluster's own policies decide.
    Unmanaged,
}

impl EngineNetworkPolicy {
    /// The value as `spec.networkPolicy` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineNetworkPolicy::DeclaredPorts => "DeclaredPorts",
            EngineNetworkPolicy::Unmanaged => "Unmanaged",
        }
    }
}

/// What a ModelDeployment serves (`spec.model`); frozen once created.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Model {
    /// Model name, e.g. `Qwen/Qwen2.5-7B-Instruct`.
    #[schemars(length(min = 1, max = 512))]
    pub name: String,
}

/// The inference engine that serves the model (`spec.engine`): which one, and which version.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Engine {
    /// `vLLM` or `SGLang`. Frozen.
    pub name: EngineName,
    /// Engine version, e.g. `0.29.0`. It decides the store client the engine carries, which must
    /// be on the store's version line. Required when a role names no `image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub version: Option<String>,
}

/// Which engine serves the model (`spec.engine.name`); the operator hands it the store's settings
/// the way that engine reads them.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum EngineName {
    /// vLLM.
    #[serde(rename = "vLLM")]
    Vllm,
    /// SGLang.
    #[serde(rename = "SGLang")]
    Sglang,
}

impl EngineName {
    /// The value as `spec.engine.name` spells it: `vLLM` or `SGLang`.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineName::Vllm => "vLLM",
            EngineName::Sglang => "SGLang",
        }
    }
}

/// The shared-cache attachment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvCache {
    /// A KVCachePoolBinding in this namespace (not a pool: the Binding is the authorization).
    pub pool_ref: BindingRef,
    /// The engine-side connector. Only `Mooncake`.
    #[serde(default)]
    pub connector: Connector,
}

/// A Binding in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingRef {
    /// Name of a KVCachePoolBinding in this namespace.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub name: String,
}

/// The engine-side cache connector.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Connector {
    /// The Mooncake store connector.
    #[default]
    Mooncake,
}

/// One role of a deployment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Role {
    /// Role name, a DNS label. Frozen.
    #[schemars(
        length(min = 1, max = 40),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// `Server` (default), `Prefill` or `Decode`. Frozen.
    #[serde(default)]
    pub kind: RoleKind,
    /// Replicas of this role.
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 1024))]
    pub replicas: i32,
    /// Pods per replica.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 64))]
    pub size: i32,
    /// An InstanceType name (`kubectl get instancetype`): placement and per-accelerator resources.
    #[schemars(length(min = 1, max = 253))]
    pub instance_type: String,
    /// Accelerators per Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<RoleResources>,
    /// Extra engine arguments. Keys the operator owns are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub extra_args: Vec<String>,
    /// Extra environment. Names the operator owns are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub env: Vec<EnvVar>,
    /// Take over the container command: the operator then adds no engine arguments and no cache
    /// settings (the role reports `unmanaged`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub command: Vec<String>,
    /// Engine image. Unset: the runner image for the engine and version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub image: Option<String>,
    /// Pull policy for the engine image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Extra container ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub ports: Vec<ContainerPort>,
}

fn one() -> i32 {
    1
}

/// What a role does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum RoleKind {
    /// Prefill and decode in one server.
    #[default]
    Server,
    /// The prefill half of a disaggregated pair.
    Prefill,
    /// The decode half of a disaggregated pair.
    Decode,
}

impl RoleKind {
    /// The value as `roles[].kind` spells it: `Server`, `Prefill` or `Decode`.
    pub fn as_str(self) -> &'static str {
        match self {
            RoleKind::Server => "Server",
            RoleKind::Prefill => "Prefill",
            RoleKind::Decode => "Decode",
        }
    }
}

/// Per-Pod accelerator request.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleResources {
    /// Accelerators per Pod (cards of the InstanceType's accelerator resource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 64))]
    pub accelerator: Option<i32>,
    /// Fabric interfaces (RDMA/EFA devices) per Pod. Needs a pool whose member groups all use
    /// one managed fabric protocol (`RDMA` or `EFA`); refused otherwise at admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 32))]
    pub interface: Option<i32>,
}

/// What the operator observed of a deployment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Starting`, `Ready`, `Degraded` or `Deleting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ModelDeploymentPhase>,
    /// Why the phase is not `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_message: Option<String>,
    /// The cache attachment as resolved: Binding, pool and the full domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<KvCacheStatus>,
    /// Per-role replica counts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<RoleStatus>,
    /// What the shared cache saved the engines over the last window, from their own counters
    /// (`SharedCacheObserved` says whether every ready engine was read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_cache: Option<SharedCacheStatus>,
    /// `DomainRegistered`, `CacheAttached`, `ReplicasUpToDate`, …
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

pub use crate::shared_cache::SharedCacheStatus;

/// The condition types of a ModelDeployment's status, in the order the operator writes them.
pub mod conditions {
    /// `kvCache.poolRef` reaches a Binding, its pool and its domain.
    pub const DOMAIN_REGISTERED: &str = "DomainRegistered";
    /// The replicas are attached to the shared cache (the store charges their domain).
    pub const CACHE_ATTACHED: &str = "CacheAttached";
    /// Every role's InstanceType exists.
    pub const INSTANCE_TYPES_RESOLVED: &str = "InstanceTypesResolved";
    /// Every replica runs the current template.
    pub const REPLICAS_UP_TO_DATE: &str = "ReplicasUpToDate";
    /// Every ready engine's shared-cache counters were read.
    pub const SHARED_CACHE_OBSERVED: &str = "SharedCacheObserved";
    /// The engines' loads from the store succeed (no more than a set share failed in the
    /// window: a failed load is a prefill paid after all).
    pub const SHARED_CACHE_HEALTHY: &str = "SharedCacheHealthy";
    /// The engines computed enough prompt tokens, in prefills of different sizes, to price a
    /// computed token: `status.sharedCache.prefillSecondsSaved` is known.
    pub const PREFILL_PRICED: &str = "PrefillPriced";
    /// Every Deployment and Service the roles render is this deployment's own: none bears the
    /// name of an object something else controls.
    pub const OBJECTS_OWNED: &str = "ObjectsOwned";
}

/// A ModelDeployment's `status.phase`: where its replicas stand.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ModelDeploymentPhase {
    /// Replicas are starting.
    Starting,
    /// Every role is ready.
    Ready,
    /// Some role is short.
    Degraded,
    /// Being deleted.
    Deleting,
}

/// The resolved cache attachment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvCacheStatus {
    /// The KVCachePoolBinding `spec.kvCache.poolRef` names: `namespace/name` once it resolves,
    /// the bare name until then.
    pub binding: String,
    /// The KVCachePool that Binding grants. Absent until the Binding, its pool and its backend
    /// resolve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The Binding's reuse domain (tenant name, block size, dtype) the replicas share cached
    /// blocks under. Absent until the Binding, its pool and its backend resolve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<Domain>,
}

/// One role's replica counts.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleStatus {
    /// The role's `name` in `spec.roles`.
    pub name: String,
    /// The role's `kind` in `spec.roles`.
    #[serde(default)]
    pub kind: RoleKind,
    /// The role's `spec.roles[].replicas`.
    #[serde(default)]
    pub desired: i32,
    /// Ready replicas of the role's Deployment (its `status.readyReplicas`).
    #[serde(default)]
    pub ready: i32,
    /// True for a take-over (`command`) role: no engine arguments, no cache settings.
    #[serde(default)]
    pub unmanaged: bool,
}

/// A kind of machine a role runs on: where its Pods go and what each accelerator brings.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "worker.gpustack.ai",
    version = "v1",
    kind = "InstanceType",
    shortname = "it",
    derive = "PartialEq",
    doc = "A kind of machine that ModelDeployment roles name in roles[].instanceType.",
    printcolumn(
        name = "Accelerator",
        type_ = "string",
        json_path = ".spec.accelerator.resourceName"
    ),
    printcolumn(name = "CPU", type_ = "string", json_path = ".spec.resources.cpu"),
    printcolumn(
        name = "Memory",
        type_ = "string",
        json_path = ".spec.resources.memory"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct InstanceTypeSpec {
    /// Nodes of this type.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints Pods of this type tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// The accelerator these nodes carry. Absent: a CPU-only type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<Accelerator>,
    /// CPU and memory per accelerator card (per Pod for a role that requests no accelerator).
    pub resources: InstanceResources,
}

/// The accelerator an InstanceType's nodes carry: the extended resource Pods request for it and
/// its manufacturer.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Accelerator {
    /// Extended resource name, e.g. `nvidia.com/gpu` or `huawei.com/Ascend910`.
    #[schemars(length(min = 1, max = 253))]
    pub resource_name: String,
    /// Manufacturer, e.g. `nvidia`, `ascend`, `amd`. `ascend` selects vLLM-Ascend for vLLM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manufacturer: Option<String>,
}

/// Resources per accelerator card.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceResources {
    /// CPU, e.g. `8` or `7500m`.
    pub cpu: K8sQuantity,
    /// Memory, e.g. `64Gi`.
    pub memory: Quantity,
}
