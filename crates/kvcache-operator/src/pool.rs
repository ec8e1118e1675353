//! The KVCachePool controller and the Binding finalizer: the quota ledger on the real master.
//!
//! One pool pass reads its backend's ledger once, pushes every Binding's ceiling through the
//! admin API (`/api/v1/tenant_quotas`, so a ceiling change takes effect without a restart), reads
//! the grants back, and writes the pool's status and each of its Bindings' statuses. What the
//! statuses say is `kvcache-quota::status` (pure); the operator caps nothing: grants are the
//! master's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalized, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use kvcache_api::admission::tenant_of;
use kvcache_api::backend::{EndpointName, ObjectRef as Consumer};
use kvcache_api::condition::merge;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, Quantity};
use kvcache_quota::admin::{self, Outcome, Request, TenantEntry};
use kvcache_quota::claims::{Claim, contested};
use kvcache_quota::status::{
    BackendView, BindingInput, BindingView, PoolInput, PoolVerdict, Release, binding_status,
    pool_status,
};
use kvcache_render::backend::client_endpoint;
use tracing::{info, instrument, warn};

use crate::backend::{MANAGER, admin_address};
use crate::error::Error;
use crate::run::Shared;

/// Held while a pool's Bindings exist.
pub const POOL_FINALIZER: &str = "kvcache.gpustack.ai/release";
/// Held while a Binding's tenant is not released on the master.
pub const BINDING_FINALIZER: &str = "kvcache.gpustack.ai/release";
const POOL: &str = "kvcachepool";
/// The field manager of a Binding's `status.usedBy` (the pool pass writes the rest).
const USAGE_MANAGER: &str = "kvcache-operator-usage";
const BINDING: &str = "kvcachepoolbinding";
/// Retry while a release waits on the master (catalogue 4.7.5).
const RELEASE_RETRY: Duration = Duration::from_secs(30);

fn id(b: &KVCachePoolBinding) -> String {
    format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any())
}

/// Runs the pool controller until shutdown.
pub async fn run_pools(shared: Arc<Shared>) {
    let client = shared.client.clone();
    let pools: Api<KVCachePool> = Api::all(client.clone());
    let controller = crate::run::controller(pools, watcher::Config::default());
    let by_backend = controller.store();
    controller
        // A Binding's ceiling, domain or existence changes its pool's ledger (the statuses
        // this pass writes do not).
        .watches_stream(
            crate::run::spec_changes(Api::<KVCachePoolBinding>::all(client.clone())),
            |b| Some(ObjectRef::new(&b.spec.pool_ref.name)),
        )
        // The backend's status moves with capacity and the leader: re-read the ledger.
        .watches(
            Api::<KVCacheBackend>::all(client.clone()),
            watcher::Config::default(),
            move |backend| {
                let name = backend.name_any();
                by_backend
                    .state()
                    .iter()
                    .filter(|p| p.spec.backend() == Some(name.as_str()))
                    .map(|p| ObjectRef::from_obj(&**p))
                    .collect::<Vec<_>>()
            },
        )
        .shutdown_on_signal()
        .run(
            crate::run::traced(POOL, reconcile_pool),
            error_policy_pool,
            shared,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// Runs the Binding controller (its finalizer: releasing the tenant) until shutdown.
pub async fn run_bindings(shared: Arc<Shared>) {
    let client = shared.client.clone();
    let bindings: Api<KVCachePoolBinding> = Api::all(client.clone());
    crate::run::controller(bindings, watcher::Config::default())
        // A ModelDeployment attaching or leaving changes its Binding's usedBy.
        .watches_stream(
            crate::run::spec_changes(Api::<kvcache_api::ModelDeployment>::all(client.clone())),
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
            crate::run::traced(BINDING, reconcile_binding),
            error_policy_binding,
            shared,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
}

fn error_policy_pool(p: Arc<KVCachePool>, e: &Error, shared: Arc<Shared>) -> Action {
    shared.metrics.reconciled(POOL, e.metric_label(), 0.0);
    match e {
        Error::DeletionHeld(why) => info!(pool = %p.name_any(), why, "deletion held"),
        e => warn!(pool = %p.name_any(), error = %e, "reconcile failed"),
    }
    Action::requeue(crate::error::retry_after(e))
}

fn error_policy_binding(b: Arc<KVCachePoolBinding>, e: &Error, shared: Arc<Shared>) -> Action {
    shared.metrics.reconciled(BINDING, e.metric_label(), 0.0);
    match e {
        Error::DeletionHeld(why) => {
            info!(binding = %id(&b), why, "deletion held");
            Action::requeue(RELEASE_RETRY)
        }
        e => {
            warn!(binding = %id(&b), error = %e, "reconcile failed");
            Action::requeue(crate::error::retry_after(e))
        }
    }
}

fn backend_of(shared: &Shared, pool: &KVCachePool) -> (BackendView, Option<Arc<KVCacheBackend>>) {
    let name = pool.spec.backend().unwrap_or_default().to_owned();
    let Some(b) = shared.backends.get(&ObjectRef::new(&name)) else {
        return (BackendView::Missing { name }, None);
    };
    let view = match (&b.spec.connection.managed, &b.spec.connection.external) {
        (Some(m), _) => BackendView::Managed {
            name: name.clone(),
            multi_tenancy: m.leader.multi_tenancy,
            client_endpoint: client_endpoint(&name, &shared.config.namespace),
        },
        (None, Some(x)) => BackendView::External {
            name: name.clone(),
            client_endpoint: x
                .address(EndpointName::Client)
                .unwrap_or_default()
                .to_owned(),
        },
        (None, None) => BackendView::Missing { name },
    };
    (view, Some(b))
}

fn bindings_of(shared: &Shared, pool: &str) -> Vec<Arc<KVCachePoolBinding>> {
    let mut out: Vec<_> = shared
        .bindings
        .state()
        .into_iter()
        .filter(|b| b.spec.pool_ref.name == pool)
        .collect();
    out.sort_by_key(|b| id(b));
    out
}

/// Every claim on the backend (all pools), for `DomainExclusive`.
fn claims_on(shared: &Shared, backend: &str) -> Vec<Claim> {
    let pools: BTreeMap<String, String> = shared
        .pools
        .state()
        .iter()
        .filter_map(|p| Some((p.name_any(), p.spec.backend()?.to_owned())))
        .collect();
    shared
        .bindings
        .state()
        .iter()
        .filter(|b| pools.get(&b.spec.pool_ref.name).map(String::as_str) == Some(backend))
        .map(|b| Claim {
            backend: backend.to_owned(),
            tenant: tenant_of(b).to_owned(),
            binding: id(b),
            pool: b.spec.pool_ref.name.clone(),
        })
        .collect()
}

/// Reads the ledger and pushes ceilings. Returns the listing, the push outcome and capacity.
async fn ledger_pass(
    admin: &str,
    views: &[BindingView],
    push: bool,
) -> (Outcome, Option<Result<(), String>>, Option<u64>) {
    let capacity = crate::store::capacity(admin).await;
    let mut write = None;
    if push {
        let mut pushed = BTreeSet::new();
        let mut problems = Vec::new();
        for v in views {
            // One ceiling per tenant: a raced duplicate claim is reported, not pushed twice.
            if !pushed.insert(v.tenant.clone()) {
                continue;
            }
            let req = Request::Upsert {
                tenant: v.tenant.clone(),
                bytes: v.ceiling_bytes,
            };
            match crate::store::ledger(admin, &req).await {
                Ok((status, body)) => match admin::decode_entry(status, &body) {
                    Ok(_) => {}
                    Err(admin::AdminError::UnavailableInCurrentMode) => {
                        return (Outcome::NoLedger, None, capacity);
                    }
                    Err(e) => problems.push(format!("{}: {e}", v.binding)),
                },
                Err(e) => problems.push(format!("{}: {e}", v.binding)),
            }
        }
        write = Some(if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        });
    }
    let listed = match crate::store::ledger(admin, &Request::List).await {
        Ok((status, body)) => Outcome::from_list(admin::decode_list(status, &body)),
        Err(e) => Outcome::Unreachable(e.to_string()),
    };
    (listed, write, capacity)
}

#[instrument(skip(p, shared), fields(pool = %p.name_any()))]
async fn reconcile_pool(p: Arc<KVCachePool>, shared: Arc<Shared>) -> Result<Action, Error> {
    let started = Instant::now();
    let api: Api<KVCachePool> = Api::all(shared.client.clone());
    let result = finalizer(&api, POOL_FINALIZER, p, |event| async {
        match event {
            Finalized::Apply(p) => pool_pass(&p, &shared, false).await,
            Finalized::Cleanup(p) => pool_pass(&p, &shared, true).await,
        }
    })
    .await
    .map_err(crate::error::from_finalizer);
    shared.metrics.succeeded(POOL, started, &result);
    result
}

async fn pool_pass(p: &KVCachePool, shared: &Shared, deleting: bool) -> Result<Action, Error> {
    let name = p.name_any();
    let (view, backend) = backend_of(shared, p);
    let bindings = bindings_of(shared, &name);
    let views: Vec<BindingView> = bindings
        .iter()
        .filter_map(|b| {
            let ceiling = b
                .spec
                .quota
                .ceiling
                .bytes(&format!("KVCachePoolBinding {} spec.quota.ceiling", id(b)))
                .map_err(|e| warn!(binding = %id(b), error = %e, "unreadable ceiling"))
                .ok()?;
            Some(BindingView {
                binding: id(b),
                tenant: tenant_of(b).to_owned(),
                ceiling_bytes: ceiling,
            })
        })
        .collect();
    let declared_off = matches!(
        view,
        BackendView::Managed {
            multi_tenancy: false,
            ..
        }
    );
    let (ledger, policy_write, capacity) =
        match backend.as_deref().and_then(|b| admin_address(shared, b)) {
            Some(admin) if !declared_off => ledger_pass(&admin, &views, !deleting).await,
            Some(admin) => (
                Outcome::NoLedger,
                None,
                crate::store::capacity(&admin).await,
            ),
            None => (Outcome::NotObserved, None, None),
        };
    let release = if !deleting {
        Release::NotDeleting
    } else if !views.is_empty() {
        Release::Held(views.iter().map(|v| v.binding.clone()).collect())
    } else {
        Release::Released
    };
    let total_bytes = p.spec.quota.total.bytes("spec.quota.total").unwrap_or(0);
    let verdict = pool_status(&PoolInput {
        pool: &name,
        total_bytes,
        backend: view.clone(),
        ledger: &ledger,
        capacity_bytes: capacity,
        policy_write,
        bindings: &views,
        release: release.clone(),
    });
    write_pool_status(shared, p, &verdict, &views).await?;
    // Each Binding's status from the same reading.
    let backend_name = p.spec.backend().unwrap_or_default();
    let raced = contested(&claims_on(shared, backend_name));
    let entries: BTreeMap<String, &TenantEntry> = match &ledger {
        Outcome::Listed(e) => e.iter().map(|t| (t.tenant_id.clone(), t)).collect(),
        _ => BTreeMap::new(),
    };
    // What the next read is compared with: the capacity and each tenant's grant (not usage,
    // which moves with every write).
    let grants = format!(
        "{capacity:?}/{:?}",
        entries
            .values()
            .map(|t| (&t.tenant_id, t.effective_quota_bytes))
            .collect::<Vec<_>>()
    );
    for (b, v) in bindings.iter().zip(&views) {
        let none = Vec::new();
        let contested_with = raced.get(&v.binding).unwrap_or(&none);
        let verdict = binding_status(&BindingInput {
            binding: &v.binding,
            tenant: &v.tenant,
            ceiling_bytes: v.ceiling_bytes,
            pool: Some((&name, &verdict)),
            entry: entries.get(&v.tenant).copied(),
            contested_with,
            release: Release::NotDeleting,
        });
        write_binding_status(shared, b, verdict).await?;
    }
    match release {
        Release::Held(names) => Err(Error::DeletionHeld(format!(
            "KVCachePool {name} is referenced by KVCachePoolBinding {}",
            names.join(", ")
        ))),
        Release::Released => Ok(Action::await_change()),
        // The master recuts as members mount and leave, a little after the capacity moves:
        // read again soon while the grants or the capacity move, then back off to the ledger
        // interval (a grant read after one of two members mounted is otherwise stale for it).
        _ => Ok(Action::requeue(crate::backend::next_poll(
            shared,
            &format!("pool/{name}"),
            grants,
            shared.config.ledger_interval,
        ))),
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

async fn write_pool_status(
    shared: &Shared,
    p: &KVCachePool,
    v: &PoolVerdict,
    views: &[BindingView],
) -> Result<(), Error> {
    let stored = p.status.clone().unwrap_or_default();
    let status = kvcache_api::pool::KVCachePoolStatus {
        observed_generation: p.meta().generation,
        phase: Some(v.phase),
        phase_message: v.phase_message.clone(),
        client_endpoint: v.client_endpoint.clone(),
        domains: v.domains.clone(),
        used_by: views
            .iter()
            .map(|b| {
                let (ns, name) = b.binding.split_once('/').unwrap_or(("", &b.binding));
                Consumer {
                    kind: "KVCachePoolBinding".into(),
                    namespace: Some(ns.to_owned()),
                    name: name.to_owned(),
                }
            })
            .collect(),
        conditions: merge(
            &stored.conditions,
            &v.conditions,
            &now(),
            p.meta().generation,
        ),
    };
    crate::status::apply(
        &Api::<KVCachePool>::all(shared.client.clone()),
        "KVCachePool",
        p.meta(),
        MANAGER,
        &status,
    )
    .await
}

async fn write_binding_status(
    shared: &Shared,
    b: &KVCachePoolBinding,
    v: kvcache_quota::status::BindingVerdict,
) -> Result<(), Error> {
    let stored = b.status.clone().unwrap_or_default();
    let status = kvcache_api::pool::KVCachePoolBindingStatus {
        observed_generation: b.meta().generation,
        phase: Some(v.phase),
        phase_message: v.phase_message,
        effective_quota: v.effective_quota_bytes.map(Quantity::from_bytes),
        usage: v.usage_bytes.map(Quantity::from_bytes),
        over_quota: v.over_quota,
        // `usedBy` is the Binding controller's (its own field manager).
        used_by: Vec::new(),
        conditions: merge(
            &stored.conditions,
            &v.conditions,
            &now(),
            b.meta().generation,
        ),
    };
    let api: Api<KVCachePoolBinding> =
        Api::namespaced(shared.client.clone(), &b.namespace().unwrap_or_default());
    crate::status::apply(&api, "KVCachePoolBinding", b.meta(), MANAGER, &status).await
}

#[instrument(skip(b, shared), fields(binding = %id(&b)))]
async fn reconcile_binding(
    b: Arc<KVCachePoolBinding>,
    shared: Arc<Shared>,
) -> Result<Action, Error> {
    let started = Instant::now();
    let api: Api<KVCachePoolBinding> =
        Api::namespaced(shared.client.clone(), &b.namespace().unwrap_or_default());
    let result = finalizer(&api, BINDING_FINALIZER, b, |event| async {
        match event {
            // Its status is the pool's to write, from the same ledger reading; usedBy is ours.
            // A Binding whose pool does not exist (yet) has no pool pass to write it: it says
            // so itself, and the pool's pass takes over once the pool arrives.
            Finalized::Apply(b) => {
                write_used_by(&shared, &b).await?;
                if shared
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
                    write_binding_status(&shared, &b, verdict).await?;
                }
                Ok(Action::await_change())
            }
            Finalized::Cleanup(b) => release_binding(&b, &shared).await,
        }
    })
    .await
    .map_err(crate::error::from_finalizer);
    shared.metrics.succeeded(BINDING, started, &result);
    result
}

/// The ModelDeployments of the Binding's namespace that attach to it, from the cache.
fn users(shared: &Shared, b: &KVCachePoolBinding) -> Vec<Consumer> {
    let ns = b.namespace().unwrap_or_default();
    let name = b.name_any();
    let mut users: Vec<Consumer> = shared
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
async fn write_used_by(shared: &Shared, b: &KVCachePoolBinding) -> Result<(), Error> {
    let users = users(shared, b);
    if b.status.as_ref().map(|s| &s.used_by) == Some(&users) {
        return Ok(());
    }
    let api: Api<KVCachePoolBinding> =
        Api::namespaced(shared.client.clone(), &b.namespace().unwrap_or_default());
    crate::status::apply(
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
async fn release_binding(b: &KVCachePoolBinding, shared: &Shared) -> Result<Action, Error> {
    let who = id(b);
    let used_by = users(shared, b);
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
    let Some(pool) = shared.pools.get(&ObjectRef::new(&b.spec.pool_ref.name)) else {
        return Ok(Action::await_change());
    };
    let (view, backend) = backend_of(shared, &pool);
    let Some(admin) = backend.as_deref().and_then(|be| admin_address(shared, be)) else {
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
    let others = claims_on(shared, pool.spec.backend().unwrap_or_default())
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
