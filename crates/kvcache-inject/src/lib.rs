//! What an engine container is given to reach the shared store, or the exact reason it cannot be
//! attached. Pure and table-driven ([`engines::ENGINES`]); one entry point, [`inject`], serves both
//! the ModelDeployment renderer and the Pod injection webhook.

#![warn(missing_docs)]

pub mod argv;
pub mod engines;
pub mod transport;
pub mod versions;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EnvVar, EnvVarSource,
    ObjectFieldSelector, Volume, VolumeMount,
};
use kvcache_api::backend::Protocol;
use kvcache_api::model::RoleKind;
use serde::Serialize;

use engines::{COMPUTE_DTYPE_FLAG, DTYPE_FLAG, ENGINES, EngineRow, RESERVED_ENV, Vehicle};
use versions::Pairing;

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

fn kv_role(role: RoleKind) -> &'static str {
    match role {
        RoleKind::Server => "kv_both",
        RoleKind::Prefill => "kv_producer",
        RoleKind::Decode => "kv_consumer",
    }
}

/// The one protocol the pool offers this engine, or the refusal naming every offer.
fn protocol(req: &Request<'_>) -> Result<(&'static str, Vec<String>), Error> {
    store_protocol(req.engine, req.protocols)
}

/// The one store protocol `protocols` (the effective protocols of a pool's member groups) offer
/// an engine, with warnings, or the `NotSupportedTransport` refusal naming every offer in the
/// artifact spelling and the API value to set (docs/design.md#pool-transport). Admission of a
/// ModelDeployment and the injection make the same judgement.
pub fn store_protocol(
    row: &EngineRow,
    protocols: &[Protocol],
) -> Result<(&'static str, Vec<String>), Error> {
    let mut offers: Vec<(&'static str, &'static str)> = protocols
        .iter()
        .map(|p| (p.artifact(), p.api_value()))
        .collect();
    offers.sort_unstable();
    offers.dedup_by_key(|o| o.0);
    let listed = || {
        offers
            .iter()
            .map(|(a, api)| format!("{a} ({api})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(first) = offers.first() else {
        return Err(Error::refused(
            "NotSupportedTransport",
            format!(
                "the pool's backend offers no member group, so {} has no store protocol to use",
                row.name
            ),
        ));
    };
    if offers.len() > 1 {
        return Err(Error::refused(
            "NotSupportedTransport",
            format!(
                "the pool's member groups offer mixed protocols ({}); {} installs one transport and fails with NotSupportedTransport on the others: give every group one protocol (spec.transport.protocol or members[].transport.protocol)",
                listed(),
                row.name
            ),
        ));
    }
    let (artifact, _) = *first;
    if let Some(only) = row.only_protocols
        && !only.contains(&artifact)
    {
        return Err(Error::refused(
            "NotSupportedTransport",
            format!(
                "{} uses only {} but the pool offers {}: set protocol CANN on the backend (spec.transport.protocol) or on its groups",
                row.name,
                only.join(", "),
                listed()
            ),
        ));
    }
    if row.refused_protocols.contains(&artifact) {
        return Err(Error::refused(
            "NotSupportedTransport",
            format!(
                "{} does not support the store protocol {} the pool offers; use a pool whose groups use TCP",
                row.name,
                listed()
            ),
        ));
    }
    let mut warnings = Vec::new();
    if artifact != "tcp" && row.only_protocols.is_none() {
        warnings.push(format!("{} over {artifact} is not verified", row.name));
    }
    Ok((artifact, warnings))
}

/// Owned keys a user value may not set, for this source.
fn refuse_owned(req: &Request<'_>, argv: &[String]) -> Result<(), Error> {
    let row = req.engine;
    let c = req.container;
    let user_env: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
    let escape = match req.source {
        Source::Webhook => "remove it: the webhook supplies it",
        Source::ModelDeployment => {
            "remove it, or take over the command with roles[].command (the operator then adds no cache settings)"
        }
    };
    let mut args: Vec<&str> = row.mechanism_args.to_vec();
    let mut envs: Vec<&str> = row.mechanism_env.to_vec();
    if req.source == Source::ModelDeployment {
        args.extend_from_slice(row.owned_args);
        envs.extend_from_slice(row.owned_env);
        envs.extend_from_slice(RESERVED_ENV);
    }
    for flag in args {
        if let Some(i) = argv::find(argv, flag, row) {
            return Err(Error::refused(
                "OwnedKeyPresent",
                format!(
                    "{:?} sets {flag}, which the operator owns on {}: two sources would configure the connector; {escape}",
                    argv[i], row.name
                ),
            ));
        }
    }
    for name in envs {
        if user_env.contains(&name) {
            return Err(Error::refused(
                "OwnedKeyPresent",
                format!(
                    "env {name} is owned by the operator on {}: two sources would configure the store client; {escape}",
                    row.name
                ),
            ));
        }
    }
    if req.dtype_owned
        && let Some(i) = argv::find(argv, DTYPE_FLAG, row)
    {
        return Err(Error::refused(
            "DtypeOwned",
            format!(
                "{:?} sets {DTYPE_FLAG}, which comes from the Binding's spec.domain.dtype ({}) on attached {} containers: remove it (the setting model-deployment-kv-cache-dtype-owned turns this off)",
                argv[i], req.dtype, row.name
            ),
        ));
    }
    Ok(())
}

/// The ModelDeployment rules on a role's own `extraArgs` and `env` (docs/design.md#owned-keys):
/// keys the operator owns on an attached role are refused, naming the key, the engine and
/// `roles[].command` as the escape. Take-over roles are not judged.
pub fn check_role_keys(
    row: &EngineRow,
    extra_args: &[String],
    env: &[EnvVar],
    dtype_owned: bool,
) -> Result<(), Error> {
    let container = Container {
        args: Some(extra_args.to_vec()),
        env: Some(env.to_vec()),
        ..Default::default()
    };
    let req = Request {
        source: Source::ModelDeployment,
        engine: row,
        role: RoleKind::Server,
        binding: "",
        domain: "",
        ledger: Ledger::Absent,
        dtype: "",
        dtype_owned,
        client_endpoint: None,
        protocols: &[],
        store_version: None,
        engine_version: None,
        container: &container,
        pod_volumes: &[],
        launch_args_forwarded: false,
    };
    refuse_owned(&req, extra_args)
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

/// A container may not choose its own store identity (docs/design.md#injection-refusals): the
/// tenant id and the master address the injection sets are absent from the container or set
/// there to the same value; another value would be a Pod picking its own tenant or store. Any
/// variable the injection sets may appear at most once: the kubelet keeps the last entry of a
/// name, so a second one would win over the injected value whatever it says. The container's own
/// value of another injected variable (a transport setting) is replaced, with a warning.
fn check_user_env(req: &Request<'_>, injected: &[EnvVar]) -> Result<Vec<String>, Error> {
    let user: Vec<&EnvVar> = req.container.env.iter().flatten().collect();
    let mut warnings = Vec::new();
    for e in injected.iter().filter(|e| !user_wins(&e.name)) {
        let theirs: Vec<&EnvVar> = user.iter().copied().filter(|u| u.name == e.name).collect();
        let what = match e.name.as_str() {
            TENANT_ENV => "its store tenant (the Binding's domain)",
            MASTER_ENV => "its store (the master the Binding's pool publishes)",
            _ => "a store client setting",
        };
        let given = Setting::of(e);
        match theirs.as_slice() {
            [] => {}
            [one] if Setting::of(one) == given => {}
            [one] if IDENTITY_ENV.contains(&e.name.as_str()) => {
                return Err(Error::refused(
                    "StoreSettingOverridden",
                    format!(
                        "the container sets {}={}, but KVCachePoolBinding {} gives {given}; a Pod may not choose {what}: remove {} from the container",
                        e.name,
                        Setting::of(one),
                        req.binding,
                        e.name
                    ),
                ));
            }
            [one] => warnings.push(format!(
                "the container's {}={} is replaced by {given} ({what} the operator sets)",
                e.name,
                Setting::of(one),
            )),
            many => {
                return Err(Error::refused(
                    "DuplicateStoreSetting",
                    format!(
                        "the container sets {} {} times; the kubelet keeps the last entry of a name, which would override what KVCachePoolBinding {} gives ({what}): remove every {} entry",
                        e.name,
                        many.len(),
                        req.binding,
                        e.name
                    ),
                ));
            }
        }
    }
    Ok(warnings)
}

/// The injected variables a container may not give another value: who it is to the store and
/// which store it reaches.
const IDENTITY_ENV: &[&str] = &[TENANT_ENV, MASTER_ENV];

/// The variable through which SGLang's store client takes its master's address.
const MASTER_ENV: &str = "MOONCAKE_MASTER";

/// What a variable resolves to, compared as the API server stores it: an absent value is the
/// empty string, a field reference defaults its `apiVersion` to `v1`.
#[derive(PartialEq, Eq)]
enum Setting<'a> {
    Literal(&'a str),
    Field(&'a str),
    /// Read from a ConfigMap, Secret or resource: unknown here, never equal to a literal.
    Elsewhere,
}

impl<'a> Setting<'a> {
    fn of(e: &'a EnvVar) -> Self {
        match &e.value_from {
            None => Setting::Literal(e.value.as_deref().unwrap_or_default()),
            Some(from) => match &from.field_ref {
                Some(f) if f.api_version.as_deref().unwrap_or("v1") == "v1" => {
                    Setting::Field(&f.field_path)
                }
                _ => Setting::Elsewhere,
            },
        }
    }
}

impl std::fmt::Display for Setting<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Setting::Literal(v) => write!(f, "{v:?}"),
            Setting::Field(path) => write!(f, "the Pod's {path}"),
            Setting::Elsewhere => f.write_str("a value read from a ConfigMap, Secret or resource"),
        }
    }
}

/// The variable through which SGLang's store client takes its tenant.
const TENANT_ENV: &str = "MOONCAKE_TENANT_ID";

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

/// A float dtype in one spelling (`half` and `float16`, `bf16` and `bfloat16`, `float` and
/// `float32` name one type); `None` for `auto` and for what is not a plain float type (the fp8
/// and fp4 cache types, which engines convert to on purpose).
fn float_type(dtype: &str) -> Option<&'static str> {
    match dtype.trim().to_ascii_lowercase().as_str() {
        "half" | "float16" | "fp16" => Some("float16"),
        "bf16" | "bfloat16" => Some("bfloat16"),
        "float" | "float32" | "fp32" => Some("float32"),
        _ => None,
    }
}

/// A warning when the container's `--dtype` (what the model computes in) names another float
/// type than the KV cache dtype the injection hands the engine (the Binding's
/// `spec.domain.dtype`, when the operator owns it). Such a pairing is not a conversion every
/// engine makes: vLLM 0.32.0 on CPU sizes its cache by `--kv-cache-dtype` and writes blocks in
/// the model's dtype, past the end of the cache for a wider type (the crash traced in
/// `benches/README.md`, "Why the writer crashed at 2,048 tokens busy"). `auto` and an absent
/// flag are not judged: the model's own configuration decides, which the operator cannot read.
pub fn compute_dtype_warning(
    row: &EngineRow,
    argv: &[String],
    kv_dtype: &str,
    dtype_owned: bool,
) -> Option<String> {
    if !dtype_owned {
        return None;
    }
    let given = argv::value_of(argv, COMPUTE_DTYPE_FLAG, row)?;
    let (compute, cache) = (float_type(given)?, float_type(kv_dtype)?);
    if compute == cache {
        return None;
    }
    // A wider compute type writes past the end of a cache sized for the narrower one.
    let harm = if compute == "float32" {
        format!(
            "vLLM 0.32.0 on CPU writes {compute} blocks into a cache sized for {cache}, past its end"
        )
    } else {
        format!("vLLM 0.32.0 on CPU stores {compute} blocks in a cache read as {cache}")
    };
    let binding = if row.dtypes.iter().any(|d| float_type(d) == Some(compute)) {
        format!(", or attach it through a Binding whose spec.domain.dtype is {compute}")
    } else {
        String::new()
    };
    Some(format!(
        "{} computes in {compute} ({COMPUTE_DTYPE_FLAG} {given}) but is handed {DTYPE_FLAG} {kv_dtype} (the Binding's spec.domain.dtype): a KV cache of another float type than the model's is not converted by every engine ({harm}), and the blocks it shares would not be the domain's dtype; run the model with {COMPUTE_DTYPE_FLAG} {cache}{binding}",
        row.name
    ))
}

/// The Binding must be named, and in the container's own namespace.
fn check_binding(binding: &str) -> Result<(), Error> {
    if binding.is_empty() {
        return Err(Error::refused(
            "BindingMissing",
            "kvcache.gpustack.ai/binding is required: name a KVCachePoolBinding of this namespace",
        ));
    }
    if binding.contains('/') {
        return Err(Error::refused(
            "CrossNamespaceBinding",
            format!(
                "binding {binding:?} names another namespace; only a KVCachePoolBinding of this namespace can be named: ask an administrator for one here"
            ),
        ));
    }
    Ok(())
}

/// The tenant id the engine is given: the Binding's domain where the ledger is enforced, none
/// where the store keeps no ledger; refused while the ledger cannot be confirmed.
fn tenant_id<'a>(req: &Request<'a>) -> Result<Option<&'a str>, Error> {
    match &req.ledger {
        Ledger::Enforced => Ok(Some(req.domain)),
        Ledger::Absent => Ok(None),
        Ledger::Unavailable(why) => Err(Error::refused(
            "LedgerNotReady",
            format!(
                "the pool of KVCachePoolBinding {} cannot confirm its tenant ledger ({why}); writes could fail with TENANT_NOT_REGISTERED, so Pods are refused until it recovers",
                req.binding
            ),
        )),
    }
}

/// With the dtype owned, the engine must accept the Binding's dtype as spelled.
fn check_dtype(req: &Request<'_>) -> Result<(), Error> {
    let row = req.engine;
    if req.dtype_owned && !row.dtypes.contains(&req.dtype) {
        return Err(Error::refused(
            "DtypeNotAccepted",
            format!(
                "{} does not accept --kv-cache-dtype {} (the Binding's spec.domain.dtype), so every Pod would fail argument parsing; it accepts {}: use a Binding whose dtype is spelled for {}",
                row.name,
                req.dtype,
                row.dtypes.join(", "),
                row.name
            ),
        ));
    }
    Ok(())
}

/// The store and the engine's client on one Mooncake line: refused when they differ, a warning
/// when a version is unknown.
fn version_warning(req: &Request<'_>) -> Result<Option<String>, Error> {
    let row = req.engine;
    match versions::pair(row, req.store_version, req.engine_version) {
        Pairing::Compatible => Ok(None),
        Pairing::Mismatch { store, client } => Err(Error::refused(
            "StoreVersionMismatch",
            format!(
                "the store runs Mooncake {store} but {} {} carries client {client}: different lines pass every probe and then fail every write (RPC_FAIL -900); pin the backend's spec.image to the {} line, or use an engine version on the store's line",
                row.name,
                req.engine_version.unwrap_or_default(),
                versions::line(&client).unwrap_or_default()
            ),
        )),
        Pairing::Unknown(why) => Ok(Some(why)),
    }
}

/// The program that runs: for the webhook, the user's command past transparent launchers; for
/// a ModelDeployment, the engine's own program (the operator builds the command).
fn launch_of(req: &Request<'_>) -> Result<argv::Launch, Error> {
    let (row, c) = (req.engine, req.container);
    Ok(match req.source {
        Source::Webhook => argv::launch(
            c.command.as_deref().unwrap_or_default(),
            c.args.as_deref().unwrap_or_default(),
            req.launch_args_forwarded,
            row,
            ENGINES,
        )?,
        Source::ModelDeployment => argv::Launch {
            program: row.programs.first().copied().unwrap_or_default().to_owned(),
            module: None,
            forwarded: false,
        },
    })
}

/// What one vehicle adds to the container (and, for the file, to the Pod).
#[derive(Default)]
struct Delivery {
    args: Vec<String>,
    env: Vec<EnvVar>,
    volume: Option<Volume>,
    mount: Option<VolumeMount>,
    client_config: Option<String>,
}

/// The vLLM family's vehicle: the client document in the `client-config` annotation, projected
/// into the container by a downward-API volume, and the `--kv-transfer-config` argument.
fn by_file(
    req: &Request<'_>,
    endpoint: &str,
    protocol: &str,
    tenant: Option<&str>,
) -> Result<Delivery, Error> {
    let (row, c) = (req.engine, req.container);
    let collides_volume = req.pod_volumes.iter().any(|v| v == VOLUME_NAME);
    let collides_mount = c
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.name == VOLUME_NAME || m.mount_path.trim_end_matches('/') == MOUNT_PATH);
    if collides_volume || collides_mount {
        return Err(Error::refused(
            "VolumeCollision",
            format!(
                "the Pod already has a volume named {VOLUME_NAME} or a mount at {MOUNT_PATH}, where the client document goes; rename or move it"
            ),
        ));
    }
    let mut doc: BTreeMap<&str, serde_json::Value> = BTreeMap::new();
    doc.insert("master_server_address", endpoint.into());
    doc.insert("metadata_server", "P2PHANDSHAKE".into());
    doc.insert("protocol", protocol.into());
    doc.insert("device_name", "".into());
    doc.insert("global_segment_size", 0.into());
    doc.insert("local_buffer_size", LOCAL_BUFFER_BYTES.into());
    doc.insert("mode", "standalone-store".into());
    if let Some(t) = tenant {
        doc.insert("tenant_id", t.into());
    }
    let mut transfer = serde_json::json!({
        "kv_connector": row.connector.unwrap_or_default(),
        "kv_role": kv_role(req.role),
    });
    // A block the store cannot deliver is recomputed rather than failing the request: the
    // store is a cache.
    if let (Some(policy), Some(doc)) = (row.load_failure_policy, transfer.as_object_mut()) {
        doc.insert("kv_load_failure_policy".to_owned(), policy.into());
    }
    Ok(Delivery {
        args: vec!["--kv-transfer-config".to_owned(), transfer.to_string()],
        env: vec![env(
            "MOONCAKE_CONFIG_PATH",
            format!("{MOUNT_PATH}/{FILE_NAME}"),
        )],
        volume: Some(Volume {
            name: VOLUME_NAME.to_owned(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![DownwardAPIVolumeFile {
                    path: FILE_NAME.to_owned(),
                    field_ref: Some(ObjectFieldSelector {
                        api_version: None,
                        field_path: format!("metadata.annotations['{CLIENT_CONFIG_ANNOTATION}']"),
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        mount: Some(VolumeMount {
            name: VOLUME_NAME.to_owned(),
            mount_path: MOUNT_PATH.to_owned(),
            read_only: Some(true),
            ..Default::default()
        }),
        client_config: Some(serde_json::to_string(&doc).unwrap_or_default()),
    })
}

/// SGLang's vehicle: the hierarchical-cache arguments and the `MOONCAKE_*` variables; with a
/// warning when the container sets its own tenant id on a store that keeps no ledger.
fn by_environment(
    req: &Request<'_>,
    endpoint: &str,
    protocol: &str,
    tenant: Option<&str>,
    user_argv: &[String],
) -> (Delivery, Option<String>) {
    let (row, c) = (req.engine, req.container);
    let mut args = vec![
        "--hicache-storage-backend".to_owned(),
        "mooncake".to_owned(),
    ];
    let (flag, extra) = if req.role == RoleKind::Decode {
        (
            "--disaggregation-decode-retraction-backup",
            Some("cpu_tensor"),
        )
    } else {
        ("--enable-hierarchical-cache", None)
    };
    if argv::find(user_argv, flag, row).is_none() {
        args.push(flag.to_owned());
        args.extend(extra.map(str::to_owned));
    }
    let mut out_env = vec![
        env(MASTER_ENV, endpoint),
        env("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
        env("MOONCAKE_PROTOCOL", protocol),
        env("MOONCAKE_DEVICE", ""),
        env("MOONCAKE_GLOBAL_SEGMENT_SIZE", "0"),
        field_env("MOONCAKE_LOCAL_HOSTNAME", "status.podIP"),
    ];
    let mut warning = None;
    if let Some(t) = tenant {
        out_env.push(env(TENANT_ENV, t));
    } else if c.env.iter().flatten().any(|e| e.name == TENANT_ENV) {
        warning = Some("the container's own MOONCAKE_TENANT_ID is kept, but the store keeps no ledger: every write lands in its default tenant".into());
    }
    (
        Delivery {
            args,
            env: out_env,
            ..Delivery::default()
        },
        warning,
    )
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
