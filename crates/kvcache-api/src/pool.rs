//! `KVCachePool` and `KVCachePoolBinding`: the quota layer over one backend, and the namespaced
//! grant that authorizes a namespace to use it.

// kube's `printcolumn(..)` attributes repeat `type_ = "string"`, which clippy takes for duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::backend::ObjectRef;
use crate::quantity::Quantity;
use crate::rules;

/// A quota layer over exactly one backend. Several pools may share a backend.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "worker.gpustack.ai",
    version = "v1",
    kind = "KVCachePool",
    shortname = "kvcp",
    category = "kvcache",
    status = "KVCachePoolStatus",
    derive = "PartialEq",
    doc = "A quota layer over one KVCacheBackend; namespaces reach it through a KVCachePoolBinding.",
    printcolumn(name = "Backend", type_ = "string", json_path = ".spec.backends[0]"),
    printcolumn(name = "Total", type_ = "string", json_path = ".spec.quota.total"),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".status.clientEndpoint"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct KVCachePoolSpec {
    /// The backend this pool draws on: a list of exactly one KVCacheBackend name. It cannot be
    /// re-pointed after creation.
    #[schemars(length(min = 1, max = 1), inner(length(min = 1, max = 253)))]
    #[x_kube(validation = rules::exactly_one_backend())]
    #[x_kube(validation = rules::immutable("spec.backends", "a pool cannot be re-pointed; create a new pool for the other backend"))]
    pub backends: Vec<String>,
    /// The pool's declared total.
    pub quota: PoolQuota,
}

impl KVCachePoolSpec {
    /// The one backend's name.
    pub fn backend(&self) -> Option<&str> {
        self.backends.first().map(String::as_str)
    }
}

/// The pool's declared total.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolQuota {
    /// The total the Bindings' ceilings are compared against (`QuotaWithinTotal`). Exceeding it
    /// is reported, never refused.
    pub total: Quantity,
}

/// What the operator observed of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KVCachePoolStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Error` or `Deleting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<PoolPhase>,
    /// Why the phase is not `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_message: Option<String>,
    /// The address engines are given (`master_server_address` / `MOONCAKE_MASTER`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_endpoint: Option<String>,
    /// The reuse domains registered by this pool's Bindings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<String>,
    /// Tenants this pool registered on a managed backend's ledger that no Binding claims any
    /// more (their Binding went while no operator released it) and that still hold data, so
    /// their entries stay until it drains or is dropped (`TenantsClaimed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unclaimed_tenants: Vec<String>,
    /// Bindings holding this pool; deletion waits for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<ObjectRef>,
    /// `BackendResolved`, `CapacityAllocatable`, `QuotaLedgerAvailable`, `QuotaWithinTotal`,
    /// `QuotaPolicyWritable`, `TenantsClaimed`, `Releasable`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The condition types of a pool's status, in the order the operator writes them.
pub mod pool_conditions {
    /// The pool's backend exists.
    pub const BACKEND_RESOLVED: &str = "BackendResolved";
    /// The master reports capacity to allocate.
    pub const CAPACITY_ALLOCATABLE: &str = "CapacityAllocatable";
    /// The master keeps a tenant ledger.
    pub const QUOTA_LEDGER_AVAILABLE: &str = "QuotaLedgerAvailable";
    /// The Bindings' ceilings fit `quota.total`.
    pub const QUOTA_WITHIN_TOTAL: &str = "QuotaWithinTotal";
    /// Ceilings reach the master.
    pub const QUOTA_POLICY_WRITABLE: &str = "QuotaPolicyWritable";
    /// Every tenant with a ceiling on the master's ledger belongs to a Binding.
    pub const TENANTS_CLAIMED: &str = "TenantsClaimed";
    /// The pool can be released.
    pub const RELEASABLE: &str = "Releasable";
}

/// The condition types of a Binding's status, in the order the operator writes them.
pub mod binding_conditions {
    /// The ledger was read for this domain.
    pub const QUOTA_OBSERVED: &str = "QuotaObserved";
    /// The master granted this domain a quota.
    pub const QUOTA_GRANTED: &str = "QuotaGranted";
    /// No other Binding claims this domain on the same backend.
    pub const DOMAIN_EXCLUSIVE: &str = "DomainExclusive";
    /// The domain is at its grant: it holds more than a set share of it (the store evicts its
    /// own older blocks to take new ones), or most of it while its engines' saves are refused.
    pub const QUOTA_PRESSURE: &str = "QuotaPressure";
    /// The Binding can be released.
    pub const RELEASABLE: &str = "Releasable";
}

/// The `status.phase` of a KVCachePool or a KVCachePoolBinding; the conditions say why.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PoolPhase {
    /// Usable.
    Ready,
    /// Not usable now; the conditions say why.
    Error,
    /// Being deleted.
    Deleting,
}

/// A namespace's grant on a pool: its ceiling and its one reuse domain.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "worker.gpustack.ai",
    version = "v1",
    kind = "KVCachePoolBinding",
    namespaced,
    shortname = "kvcpb",
    category = "kvcache",
    status = "KVCachePoolBindingStatus",
    derive = "PartialEq",
    doc = "Authorizes a namespace to use a KVCachePool, with a quota ceiling and one immutable reuse domain.",
    printcolumn(name = "Pool", type_ = "string", json_path = ".spec.poolRef.name"),
    printcolumn(name = "Domain", type_ = "string", json_path = ".spec.domain.name"),
    printcolumn(
        name = "Effective",
        type_ = "string",
        json_path = ".status.effectiveQuota"
    ),
    printcolumn(name = "Usage", type_ = "string", json_path = ".status.usage"),
    printcolumn(
        name = "Hit Ratio",
        type_ = "string",
        json_path = ".status.sharedCache.hitRatio"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct KVCachePoolBindingSpec {
    /// The pool this namespace may use. Immutable.
    #[x_kube(validation = rules::immutable("spec.poolRef", "create a new Binding for another pool"))]
    pub pool_ref: PoolRef,
    /// The most this namespace may hold at once (not a reservation; going over it evicts this
    /// domain's own objects, it never fails a write).
    pub quota: BindingQuota,
    /// The cache's compatibility key. Every field is immutable: workloads sharing a domain share
    /// cached blocks, so a different model or dtype needs a different Binding.
    #[x_kube(validation = rules::immutable("spec.domain", "a domain is the cache's compatibility key; create a new Binding for a different model or dtype"))]
    pub domain: Domain,
}

/// The KVCachePool a Binding grants its namespace (`spec.poolRef`); immutable.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolRef {
    /// Name of a KVCachePool.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A Binding's quota (`spec.quota`): the most its domain may hold in the store at once.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingQuota {
    /// Required; the store has no default quota.
    pub ceiling: Quantity,
}

/// A Binding's reuse domain (`spec.domain`): the store tenant its deployments write under, and the
/// block size and dtype every deployment sharing those blocks must use.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Domain {
    /// The tenant id engines are handed. Omitted: `default`, the tenant the store uses for a
    /// writer that names none. Name each domain once a second Binding shares the backend.
    #[serde(default = "default_domain_name")]
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = rules::domain_name_shape())]
    pub name: String,
    /// KV block size, in tokens, of the deployments that share this domain (e.g. 16, 64).
    #[schemars(range(min = 1, max = 65536))]
    pub block_size: i32,
    /// KV cache dtype, handed verbatim to engines as `--kv-cache-dtype` (e.g. `bfloat16`,
    /// `fp8_e4m3`). Spell it as the engine does.
    #[schemars(length(min = 1, max = 32))]
    pub dtype: String,
}

/// The tenant used for a domain with no name.
pub const DEFAULT_DOMAIN: &str = "default";

fn default_domain_name() -> String {
    DEFAULT_DOMAIN.to_owned()
}

/// What the operator observed of a Binding.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KVCachePoolBindingStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` or `Error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<PoolPhase>,
    /// Why the phase is not `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_message: Option<String>,
    /// The grant the store computed for this domain. Absent when the backend keeps no ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_quota: Option<Quantity>,
    /// Bytes the store reports this domain holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Quantity>,
    /// The store's flag: true only when a grant was recut below current holdings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over_quota: Option<bool>,
    /// The store's flag: true while it refuses new allocations for this domain (absent from
    /// stores before 0.3.13).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission_closed: Option<bool>,
    /// Workloads referencing this Binding; deletion waits for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<ObjectRef>,
    /// The tenant's view: the `status.sharedCache` of the ModelDeployments that use this
    /// Binding, summed (absent while none reports one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_cache: Option<crate::shared_cache::SharedCacheStatus>,
    /// `QuotaObserved`, `QuotaGranted`, `DomainExclusive`, `Releasable`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
