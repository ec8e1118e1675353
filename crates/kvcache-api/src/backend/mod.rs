//! `KVCacheBackend`: one Mooncake store, run by the operator (managed) or somewhere else
//! (external).
//!
//! The spec's top level is here; its parts are beside it: the transport (`transport.rs`), a
//! managed store's leader (`managed.rs`) and member groups (`members.rs`), an external store
//! (`external.rs`), and the status (`status.rs`, with its [`conditions`]).

// kube's `printcolumn(..)` attributes repeat `type_ = "string"`, which clippy takes for duplicates.
#![allow(clippy::duplicated_attributes)]

pub mod conditions;
mod env;
mod external;
mod managed;
mod members;
mod status;
mod transport;

use k8s_openapi::api::core::v1::LocalObjectReference;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::rules;

pub use env::ExtraEnv;
pub use external::{EndpointName, External, ExternalEndpoint};
pub use managed::{
    AllocationStrategy, ElectionBackend, EtcdSpec, Leader, Managed, MemberAddressing,
};
pub use members::{
    Eviction, EvictionPolicy, HostPathMount, LocalDisk, Medium, MemberGroup, ScaleIn, Watermark,
    member_memory_floor,
};
pub use status::{
    BackendPhase, Capacity, ElectionStatus, EtcdStatus, FailoverRecord, IsolationProbe,
    KVCacheBackendStatus, MemberStatus, ObjectRef, ProbeResult, UNKNOWN_SEGMENTS_LISTED,
    UnknownSegment,
};
pub use transport::{GroupTransport, Protocol, Transport};

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
