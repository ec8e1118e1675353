//! The KVCachePoolBinding controller: its `status.usedBy` (the workloads attached to it) and its
//! finalizer, which releases the tenant on the master once nothing uses or holds it. The rest of
//! a Binding's status is written by its pool's pass (`pool.rs`), from the same ledger reading.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as Finalized, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use kvcache_api::KVCachePoolBinding;
use kvcache_api::admission::tenant_of;
use kvcache_api::backend::ObjectRef as Consumer;
use kvcache_api::condition::merge;
use kvcache_quota::admin::{self, Request};
use kvcache_quota::release::{self, Ledger, Step};
use kvcache_quota::status::{
    BackendView, BindingInput, Release, binding_releasable, binding_status,
};
use tracing::{instrument, warn};

use super::pool::{backend_of, claims_on, id, write_binding_status};
use crate::context::{Context, MANAGER};
use crate::error::Error;

/// Held while a Binding's tenant is not released on the master.
pub const BINDING_FINALIZER: &str = super::RELEASE_FINALIZER;

/// The field manager of a Binding's `status.usedBy` (the pool pass writes the rest).
const USAGE_MANAGER: &str = "kvcache-operator-usage";

const BINDING: &str = "kvcachepoolbinding";

/// Retry while a release waits on the master (docs/design.md#binding-release).
const RELEASE_RETRY: Duration = Duration::from_secs(30);

/// Runs the Binding controller (its finalizer: releasing the tenant) until shutdown.
pub async fn run(ctx: Arc<Context>, changes: crate::watch::Subscription<KVCachePoolBinding>) {
    let client = ctx.client.clone();
    crate::watch::shared_controller(&changes, ctx.bindings.clone())
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
            super::traced(BINDING, reconcile_binding),
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

/// Whether the Binding's backend keeps a ledger entry this release must clear, and where its
/// master answers.
fn ledger_of(ctx: &Context, b: &KVCachePoolBinding) -> (Ledger, Option<String>) {
    let Some(pool) = ctx.pools.get(&ObjectRef::new(&b.spec.pool_ref.name)) else {
        return (Ledger::None, None);
    };
    let (view, backend) = backend_of(ctx, &pool);
    let Some(admin) = backend.as_deref().and_then(|be| ctx.admin_address(be)) else {
        return (Ledger::None, None);
    };
    if matches!(
        view,
        BackendView::Managed {
            multi_tenancy: false,
            ..
        }
    ) {
        return (Ledger::None, None);
    }
    let (who, tenant) = (id(b), tenant_of(b));
    let shared = claims_on(ctx, pool.spec.backend().unwrap_or_default())
        .into_iter()
        .any(|c| c.tenant == tenant && c.binding != who);
    if shared {
        return (Ledger::SharedTenant, None);
    }
    (Ledger::Own, Some(admin))
}

/// The finalizer's pass: decides with `kvcache_quota::release` whether the Binding may go,
/// asking the master what it needs to, writes the decision to `Releasable` and the phase, and
/// holds (an error, retried every 30 s) until it is released.
async fn release_binding(b: &KVCachePoolBinding, ctx: &Context) -> Result<Action, Error> {
    let who = id(b);
    let users: Vec<String> = users(ctx, b).iter().map(ToString::to_string).collect();
    let (ledger, admin) = ledger_of(ctx, b);
    let tenant = tenant_of(b).to_owned();
    let mut step = release::first_step(&users, &ledger);
    let admin = admin.unwrap_or_default();
    if step == Step::ReadEntry {
        let drop_cached_data = b
            .annotations()
            .get(kvcache_api::DROP_CACHED_DATA_ANNOTATION)
            .is_some_and(|v| v.trim() == "true");
        step = release::after_entry(
            &tenant,
            ctx.store
                .ledger(&admin, &Request::Get(tenant.clone()), admin::decode_entry)
                .await,
            drop_cached_data,
        );
    }
    if step == Step::RemoveObjects {
        let removed = ctx
            .store
            .ledger(
                &admin,
                &Request::RemoveObjects(tenant.clone()),
                admin::decode_removed,
            )
            .await;
        if let Ok(Ok(count)) = &removed {
            dropped_event(ctx, b, &tenant, *count).await;
        }
        step = release::after_removal(&tenant, removed);
    }
    let release = match step {
        Step::Done(r) => r,
        Step::ReadEntry | Step::DeleteEntry | Step::RemoveObjects => release::after_delete(
            &tenant,
            ctx.store
                .ledger(&admin, &Request::Delete(tenant.clone()), admin::decode_ack)
                .await,
        ),
    };
    write_release(ctx, b, &release).await?;
    match release {
        Release::Released => Ok(Action::await_change()),
        held => Err(Error::BindingHeld {
            binding: who,
            release: held,
        }),
    }
}

/// Records that the tenant's objects were removed on the Binding's request.
async fn dropped_event(ctx: &Context, b: &KVCachePoolBinding, tenant: &str, count: u64) {
    let event = Event {
        type_: EventType::Normal,
        reason: "CachedDataDropped".into(),
        note: Some(format!(
            "removed {count} objects of tenant {tenant} from the store, as {}=true asks",
            kvcache_api::DROP_CACHED_DATA_ANNOTATION
        )),
        action: "Release".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &b.object_ref(&())).await {
        warn!(error = %e, "could not record an event");
    }
}

/// Writes the phase `Deleting` and the `Releasable` condition; the Binding's other conditions
/// stay as the last pool pass wrote them (the pool pass leaves a deleting Binding to this one).
async fn write_release(
    ctx: &Context,
    b: &KVCachePoolBinding,
    release: &Release,
) -> Result<(), Error> {
    let stored = b.status.clone().unwrap_or_default();
    let condition = binding_releasable(&id(b), release);
    let status = kvcache_api::pool::KVCachePoolBindingStatus {
        phase: Some(kvcache_api::pool::PoolPhase::Deleting),
        phase_message: Some(condition.message.clone()),
        conditions: merge(
            &stored.conditions,
            &[condition],
            &Time(k8s_openapi::jiff::Timestamp::now()),
            b.meta().generation,
        ),
        // `usedBy` is written under its own field manager.
        used_by: Vec::new(),
        ..stored
    };
    let api: Api<KVCachePoolBinding> =
        Api::namespaced(ctx.client.clone(), &b.namespace().unwrap_or_default());
    super::status::apply(&api, "KVCachePoolBinding", b.meta(), MANAGER, &status).await
}
