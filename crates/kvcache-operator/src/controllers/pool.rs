//! The KVCachePool controller and the Binding finalizer: the quota ledger on the real master.
//!
//! One pool pass reads its backend's ledger once, pushes every Binding's ceiling through the
//! admin API (`/api/v1/tenant_quotas`, so a ceiling change takes effect without a restart), reads
//! the grants back, writes the pool's status and hands what it concluded of each Binding to the
//! Binding controller, its status's one writer (`binding.rs`). What a pass asks and concludes
//! is `kvcache_render::plan::pool` (pure, over `kvcache-quota::status`'s verdicts); the operator
//! caps nothing: grants are the master's.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalized, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use kvcache_api::admission::tenant_of;
use kvcache_api::relation::Relation;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};
use kvcache_quota::admin::{self, Outcome, Request, TenantEntry};
use kvcache_quota::ceiling::BindingCeiling;
use kvcache_quota::release::{self, Unclaimed};
use kvcache_quota::status::{BackendView, PolicyWrite, PoolVerdict, RefusedCeiling, Release};
use kvcache_render::plan::pool::{self as pool_plan, LedgerAnswers};
use kvcache_render::status::pool::pool_status_document;
use tracing::{instrument, warn};

use crate::context::{Context, Figures, MANAGER, Polled};
use crate::error::Error;
use crate::store::StoreClient;

/// Held while a pool's Bindings exist.
pub const POOL_FINALIZER: &str = super::shared::RELEASE_FINALIZER;

const POOL: &str = "kvcachepool";

pub(super) use kvcache_render::world::binding_id as id;

/// Runs the pool controller until shutdown.
pub async fn run(ctx: Arc<Context>, changes: crate::watch::Subscription<KVCachePool>) {
    let client = ctx.client.clone();
    let controller = crate::watch::shared_controller(&changes, ctx.pools.clone());
    let by_backend = controller.store();
    let controller = controller
        // A Binding's ceiling, domain or existence changes its pool's ledger (the statuses
        // this pass writes do not).
        .watches_stream(
            crate::watch::spec_changes(Api::<KVCachePoolBinding>::all(client.clone())),
            |b| Some(ObjectRef::new(&b.spec.pool_ref.name)),
        )
        // The backend's status moves with capacity and the leader: re-read the ledger.
        .watches(
            Api::<KVCacheBackend>::all(client.clone()),
            watcher::Config::default(),
            move |backend| {
                let name = backend.name_any();
                Relation::of_pools(by_backend.state())
                    .pools_on(&name)
                    .map(ObjectRef::from_obj)
                    .collect::<Vec<_>>()
            },
        );
    super::shared::drive(controller, POOL, reconcile_pool, crate::error::RETRY, ctx).await;
}

/// Reads the ledger and pushes the ceilings it does not hold yet
/// ([`admin::ceilings_to_write`]), reading it again after a write. Returns the listing, the
/// push outcome and capacity.
async fn ledger_pass(
    store: &StoreClient,
    admin: &str,
    views: &[BindingCeiling],
    push: bool,
) -> (Outcome, Option<PolicyWrite>, Option<u64>) {
    let capacity = store.capacity(admin).await;
    let list = || async {
        Outcome::from_list(
            store
                .ledger(admin, &Request::List, admin::decode_list)
                .await,
        )
    };
    let mut listed = list().await;
    let mut write = None;
    if push {
        let held = match &listed {
            Outcome::Listed(entries) => Some(entries.as_slice()),
            _ => None,
        };
        let due = admin::ceilings_to_write(held, views);
        let mut problems = Vec::new();
        for v in &due {
            let req = Request::Upsert {
                tenant: v.tenant.clone(),
                bytes: v.ceiling_bytes,
            };
            let answer = match store.ledger(admin, &req, admin::decode_entry).await {
                Ok(Ok(_)) => continue,
                Ok(Err(admin::AdminError::UnavailableInCurrentMode)) => {
                    return (Outcome::NoLedger, None, capacity);
                }
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            };
            problems.push(RefusedCeiling {
                binding: v.binding.clone(),
                answer,
            });
        }
        write = Some(if problems.is_empty() {
            PolicyWrite::Written
        } else {
            PolicyWrite::Refused(problems)
        });
        if !due.is_empty() {
            listed = list().await;
        }
    }
    (listed, write, capacity)
}

#[instrument(skip(p, ctx), fields(pool = %p.name_any()))]
async fn reconcile_pool(p: Arc<KVCachePool>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<KVCachePool> = Api::all(ctx.client.clone());
    finalizer(&api, POOL_FINALIZER, p, |event| async {
        match event {
            Finalized::Apply(p) => pool_pass(&p, &ctx, false).await,
            Finalized::Cleanup(p) => pool_pass(&p, &ctx, true).await,
        }
    })
    .await
    .map_err(crate::error::from_finalizer)
}

/// A pool pass: read the World, plan what to ask the master
/// (`kvcache_render::plan::pool::plan`), ask it, conclude (`pool_plan::conclude`), write the
/// pool's status and hand each Binding's verdict to the Binding controller.
async fn pool_pass(p: &KVCachePool, ctx: &Context, deleting: bool) -> Result<Action, Error> {
    let world = ctx.world();
    let plan = pool_plan::plan(&world, &ctx.config.namespace, p, deleting);
    for (binding, error) in &plan.unreadable {
        warn!(%binding, %error, "unreadable ceiling");
    }
    let admin = world.backend_of(p).and_then(|b| ctx.admin_address(b));
    let (ledger, policy_write, capacity_bytes) = match &admin {
        Some(admin) if plan.read_ledger => {
            ledger_pass(&ctx.store, admin, &plan.pushed, plan.push).await
        }
        Some(admin) => (Outcome::NoLedger, None, ctx.store.capacity(admin).await),
        None => (Outcome::NotObserved, None, None),
    };
    // Only on a store the operator runs: an external master's other tenants are not its own.
    let (ledger, unclaimed) = match (ledger, &admin, &plan.backend) {
        (Outcome::Listed(entries), Some(admin), BackendView::Managed { .. }) => {
            remove_unclaimed(ctx, p, admin, entries).await
        }
        (other, _, _) => (other, Vec::new()),
    };
    let answers = LedgerAnswers {
        ledger,
        policy_write,
        capacity_bytes,
        unclaimed,
    };
    let concluded = pool_plan::conclude(&plan, &world, &answers);
    write_pool_status(ctx, p, &concluded.verdict, &plan.bindings).await?;
    for (binding, verdict) in concluded.bindings {
        if let Some(b) = world
            .bindings_of_pool(&plan.pool)
            .find(|b| id(b) == binding)
        {
            ctx.conclude_binding(b, verdict);
        }
    }
    match plan.release {
        Release::Held(bindings) => Err(Error::PoolHeld {
            pool: plan.pool,
            bindings,
        }),
        Release::Released => Ok(Action::await_change()),
        // The master recuts as members mount and leave, a little after the capacity moves:
        // read again soon while the grants or the capacity move, then back off to the ledger
        // interval (a grant read after one of two members mounted is otherwise stale for it).
        _ => Ok(Action::requeue(ctx.next_poll(
            Polled::Pool(plan.pool),
            Figures::Pool {
                capacity: capacity_bytes,
                grants: concluded.grants.into_iter().collect(),
            },
            ctx.config.ledger_interval,
        ))),
    }
}

/// Deletes the tenants this pool registered that no Binding claims any more and that hold
/// nothing (`kvcache_quota::release::unclaimed`), each with an event on the pool; returns the
/// ledger as listed after the deletions and the unclaimed tenants still on it.
async fn remove_unclaimed(
    ctx: &Context,
    p: &KVCachePool,
    admin: &str,
    entries: Vec<TenantEntry>,
) -> (Outcome, Vec<Unclaimed>) {
    let registered: BTreeSet<String> = p
        .status
        .iter()
        .flat_map(|s| s.domains.iter().chain(&s.unclaimed_tenants))
        .cloned()
        .collect();
    // Any Binding's tenant, on any backend, counts as claimed: only a tenant nobody names goes.
    let claimed = |bindings: &[Arc<KVCachePoolBinding>]| -> BTreeSet<String> {
        bindings.iter().map(|b| tenant_of(b).to_owned()).collect()
    };
    let found = release::unclaimed(&entries, &registered, &claimed(&ctx.bindings.state()));
    if !found.iter().any(Unclaimed::deletable) {
        return (Outcome::Listed(entries), found);
    }
    // The cache can lag a Binding just created (after a handover, its tenant may already be on
    // the ledger): a deletion is decided on the API server's own list.
    let live = match Api::<KVCachePoolBinding>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items.into_iter().map(Arc::new).collect::<Vec<_>>(),
        Err(e) => {
            warn!(error = %e, "could not list the Bindings to confirm unclaimed tenants; none removed");
            return (Outcome::Listed(entries), found);
        }
    };
    let found = release::unclaimed(&entries, &registered, &claimed(&live));
    let backend = p.spec.backend().unwrap_or_default();
    let mut kept = Vec::new();
    let mut removed = false;
    for tenant in found {
        if !tenant.deletable() {
            kept.push(tenant);
            continue;
        }
        let answer = ctx
            .store
            .ledger(
                admin,
                &Request::Delete(tenant.tenant.clone()),
                admin::decode_ack,
            )
            .await;
        // Not found: another pool of the same backend removed it first (no second event).
        let confirmed = matches!(answer, Ok(Ok(())));
        // What a delete's answer means is the Binding release's decision too.
        match release::after_delete(&tenant.tenant, answer) {
            Release::Released => {
                removed = true;
                if confirmed {
                    unclaimed_removed_event(ctx, p, backend, &tenant.tenant).await;
                }
            }
            held => {
                warn!(tenant = %tenant.tenant, release = ?held, "an unclaimed tenant was not removed");
                kept.push(tenant);
            }
        }
    }
    if !removed {
        return (Outcome::Listed(entries), kept);
    }
    let listed = Outcome::from_list(
        ctx.store
            .ledger(admin, &Request::List, admin::decode_list)
            .await,
    );
    (listed, kept)
}

async fn unclaimed_removed_event(ctx: &Context, p: &KVCachePool, backend: &str, tenant: &str) {
    let note = kvcache_render::status::events::unclaimed_tenant_removed(backend, tenant);
    super::shared::publish(
        ctx,
        &p.object_ref(&()),
        &super::shared::event_of(&note, "Release", None),
    )
    .await;
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

async fn write_pool_status(
    ctx: &Context,
    p: &KVCachePool,
    v: &PoolVerdict,
    views: &[BindingCeiling],
) -> Result<(), Error> {
    let stored = p.status.clone().unwrap_or_default();
    let status = pool_status_document(p.meta().generation, v, views, &stored, &now());
    super::status::apply(
        &Api::<KVCachePool>::all(ctx.client.clone()),
        "KVCachePool",
        p.meta(),
        MANAGER,
        &status,
    )
    .await
}
