//! The KVCachePoolBinding controller: its `status.usedBy` (the workloads attached to it) and its
//! finalizer, which releases the tenant on the master once nothing uses or holds it. The rest of
//! a Binding's status is written by its pool's pass (`pool.rs`), from the same ledger reading.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalized, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use kvcache_api::admission::tenant_of;
use kvcache_api::backend::ObjectRef as Consumer;
use kvcache_api::{KVCachePoolBinding, Quantity};
use kvcache_quota::admin::{self, Request};
use kvcache_quota::status::{BackendView, BindingInput, Release, binding_status};
use tracing::instrument;

use super::pool::{backend_of, claims_on, id, write_binding_status};
use crate::context::Context;
use crate::error::Error;

/// Held while a Binding's tenant is not released on the master.
pub const BINDING_FINALIZER: &str = "kvcache.gpustack.ai/release";

/// The field manager of a Binding's `status.usedBy` (the pool pass writes the rest).
const USAGE_MANAGER: &str = "kvcache-operator-usage";

const BINDING: &str = "kvcachepoolbinding";

/// Retry while a release waits on the master (catalogue 4.7.5).
const RELEASE_RETRY: Duration = Duration::from_secs(30);

/// Runs the Binding controller (its finalizer: releasing the tenant) until shutdown.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let bindings: Api<KVCachePoolBinding> = Api::all(client.clone());
    crate::watch::controller(bindings, watcher::Config::default())
        // A ModelDeployment attaching or leaving changes its Binding's usedBy.
        .watches_stream(
            crate::watch::spec_changes(Api::<kvcache_api::ModelDeployment>::all(client.clone())),
            |md| {
                let ns = md.namespace()?;
                md.spec
                    .kv_cache
                    .as_ref()
                    .map(|k| ObjectRef::new(&k.pool_ref.name).within(&ns))
            },
        )
        .shutdown_on_signal()
        .run(
            crate::watch::traced(BINDING, reconcile_binding),
            super::error_policy(RELEASE_RETRY),
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
}

#[instrument(skip(b, ctx), fields(binding = %id(&b)))]
async fn reconcile_binding(b: Arc<KVCachePoolBinding>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<KVCachePoolBinding> =
        Api::namespaced(ctx.client.clone(), &b.namespace().unwrap_or_default());
    finalizer(&api, BINDING_FINALIZER, b, |event| async {
        match event {
            // Its status is the pool's to write, from the same ledger reading; usedBy is ours.
            // A Binding whose pool does not exist (yet) has no pool pass to write it: it says
            // so itself, and the pool's pass takes over once the pool arrives.
            Finalized::Apply(b) => {
                write_used_by(&ctx, &b).await?;
                if ctx
                    .pools
                    .get(&ObjectRef::new(&b.spec.pool_ref.name))
                    .is_none()
                {
                    let verdict = binding_status(&BindingInput {
                        binding: &id(&b),
                        tenant: tenant_of(&b),
                        ceiling_bytes: b
                            .spec
                            .quota
                            .ceiling
                            .bytes("spec.quota.ceiling")
                            .unwrap_or(0),
                        pool: None,
                        entry: None,
                        contested_with: &[],
                        release: Release::NotDeleting,
                    });
                    write_binding_status(&ctx, &b, verdict).await?;
                }
                Ok(Action::await_change())
            }
            Finalized::Cleanup(b) => release_binding(&b, &ctx).await,
        }
    })
    .await
    .map_err(crate::error::from_finalizer)
}

/// The ModelDeployments of the Binding's namespace that attach to it, from the cache.
fn users(ctx: &Context, b: &KVCachePoolBinding) -> Vec<Consumer> {
    let ns = b.namespace().unwrap_or_default();
    let name = b.name_any();
    let mut users: Vec<Consumer> = ctx
        .models
        .state()
        .iter()
        .filter(|md| {
            md.namespace().as_deref() == Some(ns.as_str())
                && md.meta().deletion_timestamp.is_none()
                && md.spec.kv_cache.as_ref().map(|k| k.pool_ref.name.as_str())
                    == Some(name.as_str())
        })
        .map(|md| Consumer {
            kind: "ModelDeployment".into(),
            namespace: Some(ns.clone()),
            name: md.name_any(),
        })
        .collect();
    users.sort();
    users
}

/// Writes the Binding's `status.usedBy` under its own field manager.
async fn write_used_by(ctx: &Context, b: &KVCachePoolBinding) -> Result<(), Error> {
    let users = users(ctx, b);
    if b.status.as_ref().map(|s| &s.used_by) == Some(&users) {
        return Ok(());
    }
    let api: Api<KVCachePoolBinding> =
        Api::namespaced(ctx.client.clone(), &b.namespace().unwrap_or_default());
    super::status::apply(
        &api,
        "KVCachePoolBinding",
        b.meta(),
        USAGE_MANAGER,
        &serde_json::json!({ "usedBy": users }),
    )
    .await
}

/// A Binding goes once no workload uses it and its tenant holds nothing on the master; its
/// ledger entry is removed (unless another Binding still claims the tenant). Backends without a
/// ledger release at once.
async fn release_binding(b: &KVCachePoolBinding, ctx: &Context) -> Result<Action, Error> {
    let who = id(b);
    let used_by = users(ctx, b);
    if !used_by.is_empty() {
        return Err(Error::DeletionHeld(format!(
            "KVCachePoolBinding {who} is used by {} (HeldByWorkloads)",
            used_by
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let Some(pool) = ctx.pools.get(&ObjectRef::new(&b.spec.pool_ref.name)) else {
        return Ok(Action::await_change());
    };
    let (view, backend) = backend_of(ctx, &pool);
    let Some(admin) = backend.as_deref().and_then(|be| ctx.admin_address(be)) else {
        return Ok(Action::await_change());
    };
    if matches!(
        view,
        BackendView::Managed {
            multi_tenancy: false,
            ..
        }
    ) {
        return Ok(Action::await_change());
    }
    let tenant = tenant_of(b).to_owned();
    let others = claims_on(ctx, pool.spec.backend().unwrap_or_default())
        .into_iter()
        .any(|c| c.tenant == tenant && c.binding != who);
    if others {
        return Ok(Action::await_change());
    }
    let entry = match crate::store::ledger(&admin, &Request::Get(tenant.clone())).await {
        Ok((status, body)) => admin::decode_entry(status, &body),
        Err(e) => {
            return Err(Error::DeletionHeld(format!(
                "the ledger of tenant {tenant} could not be read (LedgerRequestFailed): {e}"
            )));
        }
    };
    match entry {
        Err(admin::AdminError::UnavailableInCurrentMode) | Err(admin::AdminError::NotFound) => {
            Ok(Action::await_change())
        }
        Err(e) => Err(Error::DeletionHeld(format!(
            "the ledger of tenant {tenant} could not be read (LedgerRequestFailed): {e}"
        ))),
        Ok(e) if e.usage_bytes() > 0 => Err(Error::DeletionHeld(format!(
            "tenant {tenant} still holds {} on the master (LedgerNotReleased): drain the workloads that write it",
            Quantity::from_bytes(e.usage_bytes()).as_str()
        ))),
        Ok(_) => match crate::store::ledger(&admin, &Request::Delete(tenant.clone())).await {
            Ok((status, body)) => match admin::decode_ack(status, &body) {
                Ok(()) | Err(admin::AdminError::NotFound) => Ok(Action::await_change()),
                Err(e) => Err(Error::DeletionHeld(format!(
                    "the master refused to release tenant {tenant} (LedgerNotReleased): {e}"
                ))),
            },
            Err(e) => Err(Error::DeletionHeld(format!(
                "releasing tenant {tenant} failed (LedgerRequestFailed): {e}"
            ))),
        },
    }
}
