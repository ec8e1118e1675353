//! The KVCachePoolBinding controller, its status's one writer: what its pool's last pass
//! concluded from the master's ledger (`pool.rs` hands it over through the context), the
//! workloads attached to it (`usedBy`), and its finalizer, which revokes the tenant on the
//! master at once and releases it once nothing uses or holds it. What the status says is
//! `kvcache_render::status::binding` (pure).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalized, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use kvcache_api::KVCachePoolBinding;
use kvcache_api::admission::tenant_of;
use kvcache_api::backend::ObjectRef as Consumer;
use kvcache_quota::admin::{self, Request};
use kvcache_quota::release::{self, Ledger, Step};
use kvcache_quota::status::{BackendView, Release};
use tracing::instrument;

use kvcache_render::observe::shared_cache;
use kvcache_render::status::binding::{PoolConclusion, binding_status_after};

use super::pool::id;
use crate::context::{Context, MANAGER};
use crate::error::Error;
use kvcache_render::plan::pool::backend_view;

/// Held while a Binding's tenant is not released on the master.
pub const BINDING_FINALIZER: &str = super::shared::RELEASE_FINALIZER;

const BINDING: &str = "kvcachepoolbinding";

/// Retry while a release waits on the master (docs/design.md#binding-release).
const RELEASE_RETRY: Duration = Duration::from_secs(30);

/// Runs the Binding controller (its finalizer: releasing the tenant) until shutdown.
pub async fn run(ctx: Arc<Context>, changes: crate::watch::Subscription<KVCachePoolBinding>) {
    let client = ctx.client.clone();
    // A pool pass's conclusion on a Binding wakes it.
    let woken = ctx
        .binding_wakes()
        .map(|mut rx| futures::stream::poll_fn(move |cx| rx.poll_recv(cx)));
    let controller = crate::watch::shared_controller(&changes, ctx.bindings.clone());
    let controller = match woken {
        Some(woken) => controller.reconcile_on(woken),
        None => controller,
    };
    let controller = controller
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
        );
    super::shared::drive(controller, BINDING, reconcile_binding, RELEASE_RETRY, ctx).await;
}

#[instrument(skip(b, ctx), fields(binding = %id(&b)))]
async fn reconcile_binding(b: Arc<KVCachePoolBinding>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<KVCachePoolBinding> =
        Api::namespaced(ctx.client.clone(), &b.namespace().unwrap_or_default());
    finalizer(&api, BINDING_FINALIZER, b, |event| async {
        match event {
            Finalized::Apply(b) => {
                let world = ctx.world();
                let conclusion = if world.pool_of(&b).is_none() {
                    PoolConclusion::NoPool
                } else {
                    ctx.binding_conclusion(&id(&b))
                        .map_or(PoolConclusion::Pending, PoolConclusion::Concluded)
                };
                let view = shared_cache::tenant_shared_cache(&world, &b);
                // The deployments' status.sharedCache moves without any spec changing: a
                // Binding with a view reads them again on the engines' interval.
                let next = if view.is_some() {
                    Action::requeue(ctx.config.engine_metrics_interval)
                } else {
                    Action::await_change()
                };
                write_status(&ctx, &b, conclusion, (world.users(&b), view), None).await?;
                Ok(next)
            }
            Finalized::Cleanup(b) => release_binding(&b, &ctx).await,
        }
    })
    .await
    .map_err(crate::error::from_finalizer)
}

/// Writes the Binding's status as `kvcache_render::status::binding` decides it, when it moved.
async fn write_status(
    ctx: &Context,
    b: &KVCachePoolBinding,
    conclusion: PoolConclusion,
    users: (Vec<Consumer>, Option<kvcache_api::model::SharedCacheStatus>),
    release: Option<&Release>,
) -> Result<(), Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let Some(status) = binding_status_after(b, conclusion, users, release, &now) else {
        return Ok(());
    };
    let api: Api<KVCachePoolBinding> =
        Api::namespaced(ctx.client.clone(), &b.namespace().unwrap_or_default());
    super::status::apply(&api, "KVCachePoolBinding", b.meta(), MANAGER, &status).await?;
    let before = b.status.clone().unwrap_or_default();
    for note in kvcache_render::status::events::binding_events(&before, &status) {
        super::shared::publish(
            ctx,
            &b.object_ref(&()),
            &super::shared::event_of(&note, "Reconcile", None),
        )
        .await;
    }
    Ok(())
}

/// Whether the Binding's backend keeps a ledger entry this release must clear, and where its
/// master answers.
fn ledger_of(ctx: &Context, b: &KVCachePoolBinding) -> (Ledger, Option<String>) {
    let world = ctx.world();
    let chain = world.chain_of(b);
    let Some(pool) = chain.pool else {
        return (Ledger::None, None);
    };
    let view = backend_view(&world, &ctx.config.namespace, pool);
    let Some((backend, admin)) = chain
        .backend
        .and_then(|be| Some((be, ctx.admin_address(be)?)))
    else {
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
    let shared = world
        .claims_on(backend.metadata.name.as_deref().unwrap_or_default())
        .into_iter()
        .any(|c| c.tenant == tenant && c.binding != who);
    if shared {
        return (Ledger::SharedTenant, None);
    }
    (Ledger::Own, Some(admin))
}

/// The finalizer's pass: decides with `kvcache_quota::release` whether the Binding may go,
/// revoking its tenant on the master first (its quota cut, its objects removed: what ends an
/// open connection's puts and reads, docs/isolation.md#revocation), asking the master what it
/// needs to, writes the decision to `Releasable` and the phase, and holds (an error, retried
/// every 30 s) until it is released.
async fn release_binding(b: &KVCachePoolBinding, ctx: &Context) -> Result<Action, Error> {
    let who = id(b);
    let world = ctx.world();
    let attached = world.users(b);
    let view = shared_cache::tenant_shared_cache(&world, b);
    let users: Vec<String> = attached.iter().map(ToString::to_string).collect();
    let (ledger, admin) = ledger_of(ctx, b);
    let tenant = tenant_of(b).to_owned();
    let mut step = release::first_step(&users, &ledger);
    let admin = admin.unwrap_or_default();
    if step == Step::ReadEntry {
        step = release::after_entry(
            &tenant,
            ctx.store
                .ledger(&admin, &Request::Get(tenant.clone()), admin::decode_entry)
                .await,
            &users,
        );
    }
    if step == Step::Revoke {
        let revoke = Request::Upsert {
            tenant: tenant.clone(),
            bytes: release::REVOKED_QUOTA_BYTES,
        };
        step = release::after_revoke(
            &tenant,
            ctx.store.ledger(&admin, &revoke, admin::decode_ack).await,
        );
        if step == Step::RemoveObjects {
            revoked_event(ctx, b, &tenant).await;
        }
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
        if let Ok(Ok(count)) = &removed
            && *count > 0
        {
            dropped_event(ctx, b, &tenant, *count).await;
        }
        step = release::after_removal(&tenant, removed, &users);
    }
    let release = match step {
        Step::Done(r) => r,
        Step::ReadEntry | Step::Revoke | Step::RemoveObjects | Step::DeleteEntry => {
            release::after_delete(
                &tenant,
                ctx.store
                    .ledger(&admin, &Request::Delete(tenant.clone()), admin::decode_ack)
                    .await,
            )
        }
    };
    write_status(
        ctx,
        b,
        PoolConclusion::Pending,
        (attached, view),
        Some(&release),
    )
    .await?;
    match release {
        Release::Released => {
            ctx.forget_binding(&who);
            Ok(Action::await_change())
        }
        held => Err(Error::BindingHeld {
            binding: who,
            release: held,
        }),
    }
}

/// Records that the tenant was revoked on the master: its puts refused from now on, on every
/// connection.
async fn revoked_event(ctx: &Context, b: &KVCachePoolBinding, tenant: &str) {
    let note = kvcache_render::status::events::tenant_revoked(tenant);
    super::shared::publish(
        ctx,
        &b.object_ref(&()),
        &super::shared::event_of(&note, "Release", None),
    )
    .await;
}

/// Records that the tenant's objects were removed with the Binding's deletion.
async fn dropped_event(ctx: &Context, b: &KVCachePoolBinding, tenant: &str, count: u64) {
    let note = kvcache_render::status::events::cached_data_dropped(tenant, count);
    super::shared::publish(
        ctx,
        &b.object_ref(&()),
        &super::shared::event_of(&note, "Release", None),
    )
    .await;
}
