//! What an injection is asked and answers: the request, the record, the injection itself, the
//! refusal, and the names and variables they carry.

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, Volume, VolumeMount,
};
use kvcache_api::backend::Protocol;
use kvcache_api::model::RoleKind;
use serde::Serialize;

use crate::engines::EngineRow;
pub use crate::error::Error;
use crate::transport;

/// The Pod annotation holding the rendered client document (vLLM family).
pub const CLIENT_CONFIG_ANNOTATION: &str = "kvcache.gpustack.ai/client-config";
/// The Pod annotation holding the decision record.
pub const INJECTED_ANNOTATION: &str = "kvcache.gpustack.ai/injected";
/// The projected volume's name.
pub(crate) const VOLUME_NAME: &str = "kvcache-client-config";
/// Where the client document is mounted.
pub(crate) const MOUNT_PATH: &str = "/etc/gpustack/kvcache";
/// The client document's file name.
pub(crate) const FILE_NAME: &str = "mooncake.json";
/// Staging buffer handed to vLLM (add it to the container's memory request and limit).
pub const LOCAL_BUFFER_BYTES: u64 = 128 << 20;
/// Observability toggles: defaults the user may override.
pub(crate) const TOGGLES: &[&str] = &["MC_TE_METRIC", "MC_STORE_CLIENT_METRIC_BANDWIDTH"];

/// Whether a container's own value of the injected variable `name` is kept: the observability
/// toggles and the transport settings of [`transport::TCP_TUNING`] are defaults, not identity.
pub(crate) fn user_wins(name: &str) -> bool {
    TOGGLES.contains(&name) || transport::is_tuning(name)
}

/// Who asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The Pod injection webhook: the container is the user's; launchers are inspected and
    /// injected variables overwrite the user's.
    Webhook,
    /// The ModelDeployment renderer: the operator builds the command; a role's own `extraArgs` or
    /// `env` naming an owned key is refused (the escape is `roles[].command`).
    ModelDeployment,
}

/// The pool's ledger, as its `QuotaLedgerAvailable` condition reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ledger {
    /// True: engines get the Binding's domain as tenant id.
    Enforced,
    /// False/MultiTenancyDisabled: engines get no tenant id.
    Absent,
    /// Not reported, Unknown, or False for another reason (the message carries it).
    Unavailable(String),
}

/// Everything the injection needs.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    /// Webhook or ModelDeployment.
    pub source: Source,
    /// The engine row ([`engines::row`]).
    pub engine: &'a EngineRow,
    /// The role (`Server` for a plain server).
    pub role: RoleKind,
    /// Name of the KVCachePoolBinding in the container's namespace (a Pod's
    /// `kvcache.gpustack.ai/binding`, a ModelDeployment's `kvCache.poolRef`); empty is refused.
    pub binding: &'a str,
    /// The Binding's domain (its tenant).
    pub domain: &'a str,
    /// Whether the pool's store keeps a tenant ledger: decides whether the engine gets a tenant
    /// id, and refuses the container while it cannot be confirmed.
    pub ledger: Ledger,
    /// The Binding's `spec.domain.dtype`, handed to the engine as `--kv-cache-dtype` when
    /// `dtype_owned`.
    pub dtype: &'a str,
    /// The `model-deployment-kv-cache-dtype-owned` setting.
    pub dtype_owned: bool,
    /// The pool's `status.clientEndpoint`.
    pub client_endpoint: Option<&'a str>,
    /// The effective protocols of the pool's member groups.
    pub protocols: &'a [Protocol],
    /// The store version (from the backend's image), if known.
    pub store_version: Option<&'a str>,
    /// The engine version, if known.
    pub engine_version: Option<&'a str>,
    /// The container as written.
    pub container: &'a Container,
    /// Names of the Pod's volumes.
    pub pod_volumes: &'a [String],
    /// `kvcache.gpustack.ai/launch-args-forwarded: "true"`.
    pub launch_args_forwarded: bool,
}

/// The decision record (`kvcache.gpustack.ai/injected`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// Name of the KVCachePoolBinding the container was attached through.
    pub binding: String,
    /// The engine, lowercase.
    pub engine: String,
    /// `file` or `environment`.
    pub vehicle: String,
    /// The Binding's `spec.domain.name`, recorded whether or not a tenant id was injected.
    pub domain: String,
    /// Whether a tenant id was injected (an action, not proof the engine uses it).
    pub tenant_injected: bool,
    /// The executable after transparent launchers.
    pub launch_program: String,
    /// Whether forwarding was declared.
    pub launch_args_forwarded: bool,
}

/// What to add to the container and the Pod.
#[derive(Clone, Debug, PartialEq)]
pub struct Injection {
    /// Arguments appended after the container's own.
    pub args: Vec<String>,
    /// Variables set (overwriting the user's, except the observability toggles and the
    /// transport defaults).
    pub env: Vec<EnvVar>,
    /// The projected client document volume (vLLM family).
    pub volume: Option<Volume>,
    /// The client document's read-only mount at [`MOUNT_PATH`] (vLLM family).
    pub mount: Option<VolumeMount>,
    /// The client document, for the `client-config` annotation (vLLM family).
    pub client_config: Option<String>,
    /// What was decided, written to the Pod's `kvcache.gpustack.ai/injected` annotation.
    pub record: Record,
    /// Admitted, but worth knowing (unknown versions, unverified transports).
    pub warnings: Vec<String>,
}

/// An environment variable with a literal value (the one builder the render layer uses too).
pub fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.into()),
        value_from: None,
    }
}

/// An environment variable read from the Pod's own fields (`status.podIP`, `metadata.name`).
pub fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: path.to_owned(),
            }),
            ..Default::default()
        }),
    }
}
