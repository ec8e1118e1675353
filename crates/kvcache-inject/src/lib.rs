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
mod error;
mod owned;
mod request;
pub mod transport;
mod vehicle;
pub mod versions;

use k8s_openapi::api::core::v1::Container;
use kvcache_api::model::RoleKind;

use checks::{check_binding, check_dtype, launch_of, protocol, tenant_id, version_warning};
use engines::{DTYPE_FLAG, Vehicle};
use owned::{check_user_env, refuse_owned};
use vehicle::{by_environment, by_file};

pub use checks::{compute_dtype_warning, store_protocol};
pub use owned::check_role_keys;
pub use request::{
    CLIENT_CONFIG_ANNOTATION, Error, INJECTED_ANNOTATION, Injection, LOCAL_BUFFER_BYTES, Ledger,
    Record, Request, Source, env, field_env,
};
use request::{TOGGLES, user_wins};

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
