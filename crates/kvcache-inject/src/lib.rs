//! What an engine container is given to reach the shared store, or the exact reason it cannot be
//! attached. Pure and table-driven ([`engines::ENGINES`]); one entry point, [`inject`], serves both
//! the ModelDeployment renderer and the Pod injection webhook.
//!
//! [`inject`] runs the checks of `checks.rs` (the Binding, the ledger, the dtype, the transport,
//! the versions, the launcher) and of `owned.rs` (keys the operator owns, the container's own
//! store settings), then hands the engine its vehicle (`vehicle.rs`: a client document or
//! variables).

#![warn(missing_docs)]

pub mod argv;
mod checks;
pub mod engines;
mod owned;
pub mod transport;
mod vehicle;
pub mod versions;

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, Volume, VolumeMount,
};
use kvcache_api::backend::Protocol;
use kvcache_api::model::RoleKind;
use serde::Serialize;

use checks::{check_binding, check_dtype, launch_of, protocol, tenant_id, version_warning};
use engines::{DTYPE_FLAG, EngineRow, Vehicle};
use owned::{check_user_env, refuse_owned};
use vehicle::{by_environment, by_file};

pub use checks::{compute_dtype_warning, store_protocol};
pub use owned::check_role_keys;

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
fn user_wins(name: &str) -> bool {
    TOGGLES.contains(&name) || transport::is_tuning(name)
}

/// A refusal: a CamelCase reason and a message naming the key, the engine and the fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The container cannot be attached.
    #[error("{reason}: {message}")]
    Refused {
        /// CamelCase, searchable.
        reason: &'static str,
        /// What and how to fix.
        message: String,
    },
}

impl Error {
    pub(crate) fn refused(reason: &'static str, message: impl Into<String>) -> Self {
        Error::Refused {
            reason,
            message: message.into(),
        }
    }

    /// The refusal's CamelCase reason (e.g. `DtypeNotAccepted`), for conditions and admission
    /// answers.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Refused { reason, .. } => reason,
        }
    }
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

/// Decides the injection for one container, or the refusal. The checks run in a fixed order,
/// so a container with several faults always gets the same reason: the Binding, the ledger, the
/// pool's address, the dtype, the transport, the versions, the launcher, the owned keys, then
/// the vehicle's own (a volume collision).
pub fn inject(req: &Request<'_>) -> Result<Injection, Error> {
    let row = req.engine;
    check_binding(req.binding)?;
    let tenant = tenant_id(req)?;
    let Some(endpoint) = req.client_endpoint else {
        return Err(Error::refused(
            "NoClientEndpoint",
            format!(
                "the pool of KVCachePoolBinding {} publishes no status.clientEndpoint yet, so there is no address to give {}; wait for the pool to be Ready",
                req.binding, row.name
            ),
        ));
    };
    check_dtype(req)?;
    let (protocol, mut warnings) = protocol(req)?;
    let user_argv = user_args(req.container);
    warnings.extend(compute_dtype_warning(
        row,
        &user_argv,
        req.dtype,
        req.dtype_owned,
    ));
    warnings.extend(version_warning(req)?);
    let launch = launch_of(req)?;
    refuse_owned(req, &user_argv)?;
    let mut delivery = match row.vehicle {
        Vehicle::File => by_file(req, endpoint, protocol, tenant)?,
        Vehicle::Environment => {
            let (delivery, warning) = by_environment(req, endpoint, protocol, tenant, &user_argv);
            warnings.extend(warning);
            delivery
        }
    };
    warnings.extend(check_user_env(req, &delivery.env)?);
    if req.dtype_owned {
        delivery.args.push(DTYPE_FLAG.to_owned());
        delivery.args.push(req.dtype.to_owned());
    }
    for t in TOGGLES {
        delivery.env.push(env(t, "1"));
    }
    if protocol == "tcp" {
        delivery
            .env
            .extend(transport::TCP_TUNING.iter().map(|t| env(t.name, t.value)));
    }
    Ok(Injection {
        args: delivery.args,
        env: delivery.env,
        volume: delivery.volume,
        mount: delivery.mount,
        client_config: delivery.client_config,
        record: Record {
            binding: req.binding.to_owned(),
            engine: row.record.to_owned(),
            vehicle: row.vehicle.as_str().to_owned(),
            domain: req.domain.to_owned(),
            tenant_injected: tenant.is_some(),
            launch_program: launch.program,
            launch_args_forwarded: launch.forwarded,
        },
        warnings,
    })
}

/// A container's command line as written: its command, then its arguments.
fn user_args(container: &Container) -> Vec<String> {
    container
        .command
        .iter()
        .flatten()
        .chain(container.args.iter().flatten())
        .cloned()
        .collect()
}

impl Injection {
    /// The container with the injection applied: arguments appended, variables set in place
    /// (one entry per name; the user's observability toggles kept), the mount added.
    pub fn apply(&self, container: &Container) -> Container {
        let mut c = container.clone();
        let mut args = c.args.take().unwrap_or_default();
        args.extend(self.args.iter().cloned());
        c.args = Some(args);
        let mut env = c.env.take().unwrap_or_default();
        for e in &self.env {
            match env.iter_mut().find(|x| x.name == e.name) {
                Some(_) if user_wins(&e.name) => {}
                Some(existing) => *existing = e.clone(),
                None => env.push(e.clone()),
            }
        }
        c.env = Some(env);
        if let Some(m) = &self.mount {
            c.volume_mounts.get_or_insert_with(Vec::new).push(m.clone());
        }
        c
    }

    /// The decision record as the annotation holds it.
    pub fn record_json(&self) -> String {
        serde_json::to_string(&self.record).unwrap_or_default()
    }
}

/// Reads the `kvcache.gpustack.ai/role` annotation: absent for a plain server, `Prefill` or
/// `Decode` otherwise (`InvalidRole`, docs/design.md#injection-refusals).
pub fn parse_role(value: Option<&str>) -> Result<RoleKind, Error> {
    match value {
        None => Ok(RoleKind::Server),
        Some("Prefill") => Ok(RoleKind::Prefill),
        Some("Decode") => Ok(RoleKind::Decode),
        Some(other) => Err(Error::refused(
            "InvalidRole",
            format!(
                "kvcache.gpustack.ai/role {other:?} is not Prefill or Decode; omit it for a plain server"
            ),
        )),
    }
}
