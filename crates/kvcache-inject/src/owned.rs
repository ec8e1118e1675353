//! Keys the operator owns (docs/design.md#owned-keys) and the store settings a container may
//! not give itself (docs/design.md#injection-refusals).

use k8s_openapi::api::core::v1::{Container, EnvVar};
use kvcache_api::model::RoleKind;

use crate::argv;
use crate::engines::{DTYPE_FLAG, EngineRow, RESERVED_ENV};
use crate::error::Error;
use crate::request::{Ledger, Request, Source, user_wins};
use crate::vehicle::{MASTER_ENV, TENANT_ENV};

/// Owned keys a user value may not set, for this source.
pub(crate) fn refuse_owned(req: &Request<'_>, argv: &[String]) -> Result<(), Error> {
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

/// A container may not choose its own store identity (docs/design.md#injection-refusals): the
/// tenant id and the master address the injection sets are absent from the container or set
/// there to the same value; another value would be a Pod picking its own tenant or store. Any
/// variable the injection sets may appear at most once: the kubelet keeps the last entry of a
/// name, so a second one would win over the injected value whatever it says. The container's own
/// value of another injected variable (a transport setting) is replaced, with a warning.
pub(crate) fn check_user_env(req: &Request<'_>, injected: &[EnvVar]) -> Result<Vec<String>, Error> {
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
