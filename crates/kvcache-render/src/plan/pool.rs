//! One pass of the pool controller, decided in two halves around the store calls it cannot
//! avoid: [`plan`] reads the [`World`] (the pool's backend, its Bindings, the ceilings to push,
//! where its deletion stands) and [`conclude`] turns the ledger's answers into the pool's
//! status, each Binding's verdict (handed to the Binding controller, its status's one writer)
//! and the figures the next read is compared with. The operator reads, calls [`plan`], asks
//! the master, calls [`conclude`], writes.

use std::collections::{BTreeMap, BTreeSet};

use kvcache_api::backend::EndpointName;
use kvcache_api::{KVCachePool, KVCachePoolBinding};
use kvcache_quota::admin::{Outcome, TenantEntry};
use kvcache_quota::ceiling::BindingCeiling;
use kvcache_quota::claims::contested;
use kvcache_quota::release::Unclaimed;
use kvcache_quota::status::{
    BackendView, BindingInput, BindingVerdict, PolicyWrite, PoolInput, PoolVerdict, Release,
    binding_status, pool_status,
};

use crate::objects::backend::client_endpoint;
use crate::world::{World, binding_id, ceiling_view};

/// What a pool pass asks the master, decided from the [`World`].
#[derive(Clone, Debug)]
pub struct PoolPlan {
    /// The pool's name.
    pub pool: String,
    /// Its backend as the ledger sees it: managed (with or without multi-tenancy), external or
    /// missing.
    pub backend: BackendView,
    /// Each Binding's view, sorted by `namespace/name`; one whose ceiling does not parse is
    /// left out ([`PoolPlan::unreadable`]).
    pub bindings: Vec<BindingCeiling>,
    /// The Bindings whose ceilings are pushed: all but those being deleted (a release may have
    /// removed the tenant already, and a push would put it back).
    pub pushed: Vec<BindingCeiling>,
    /// Bindings whose ceiling could not be read: `namespace/name` and why.
    pub unreadable: Vec<(String, String)>,
    /// Whether the ledger is read at all: `false` when the backend declares
    /// `multiTenancy: false` (it keeps none).
    pub read_ledger: bool,
    /// Whether the ceilings are pushed (not while the pool is deleted).
    pub push: bool,
    /// Where the pool's deletion stands before any store call.
    pub release: Release,
    /// `spec.quota.total`, bytes (0 when it does not parse: admission refuses that).
    pub total_bytes: u64,
}

/// What the pool's backend is to its ledger: managed with or without multi-tenancy, external,
/// or missing.
pub fn backend_view(world: &World, namespace: &str, pool: &KVCachePool) -> BackendView {
    let name = pool.spec.backend().unwrap_or_default().to_owned();
    let Some(b) = world.backend_of(pool) else {
        return BackendView::Missing { name };
    };
    match (&b.spec.connection.managed, &b.spec.connection.external) {
        (Some(m), _) => BackendView::Managed {
            multi_tenancy: m.leader.multi_tenancy,
            client_endpoint: client_endpoint(&name, namespace),
            name,
        },
        (None, Some(x)) => BackendView::External {
            client_endpoint: x
                .address(EndpointName::Client)
                .unwrap_or_default()
                .to_owned(),
            name,
        },
        (None, None) => BackendView::Missing { name },
    }
}

/// Decides what a pass of `pool` asks the master (`deleting`: its finalizer's cleanup).
pub fn plan(world: &World, namespace: &str, pool: &KVCachePool, deleting: bool) -> PoolPlan {
    let name = pool.metadata.name.clone().unwrap_or_default();
    let mut bindings: Vec<&KVCachePoolBinding> = world.bindings_of_pool(&name).collect();
    bindings.sort_by_key(|b| binding_id(b));
    let mut views = Vec::new();
    let mut unreadable = Vec::new();
    for b in &bindings {
        match ceiling_view(b) {
            Ok(v) => views.push(v),
            Err(e) => unreadable.push((binding_id(b), e.to_string())),
        }
    }
    let going: BTreeSet<String> = bindings
        .iter()
        .filter(|b| b.metadata.deletion_timestamp.is_some())
        .map(|b| binding_id(b))
        .collect();
    let pushed = views
        .iter()
        .filter(|v| !going.contains(&v.binding))
        .cloned()
        .collect();
    let backend = backend_view(world, namespace, pool);
    let read_ledger = !matches!(
        backend,
        BackendView::Managed {
            multi_tenancy: false,
            ..
        }
    );
    let release = if !deleting {
        Release::NotDeleting
    } else if !views.is_empty() {
        Release::Held(views.iter().map(|v| v.binding.clone()).collect())
    } else {
        Release::Released
    };
    PoolPlan {
        pool: name,
        total_bytes: pool.spec.quota.total.bytes("spec.quota.total").unwrap_or(0),
        backend,
        bindings: views,
        pushed,
        unreadable,
        read_ledger,
        push: !deleting,
        release,
    }
}

/// What the master answered a pool pass.
#[derive(Clone, Debug)]
pub struct LedgerAnswers {
    /// The ledger as last listed (after any removal of unclaimed tenants).
    pub ledger: Outcome,
    /// How the push of ceilings went; `None`: none was attempted.
    pub policy_write: Option<PolicyWrite>,
    /// The master's allocatable capacity, when read.
    pub capacity_bytes: Option<u64>,
    /// Tenants on the ledger no Binding claims, still there.
    pub unclaimed: Vec<Unclaimed>,
}

/// What a pool pass concluded.
#[derive(Clone, Debug)]
pub struct PoolConclusion {
    /// The pool's status.
    pub verdict: PoolVerdict,
    /// Each pushed Binding's verdict (`namespace/name`), for the Binding controller; a Binding
    /// being deleted reports its release itself.
    pub bindings: Vec<(String, BindingVerdict)>,
    /// Each listed tenant's grant, which the next read is compared with (not usage, which moves
    /// with every write).
    pub grants: BTreeMap<String, u64>,
}

/// Concludes a pass of `plan` from the master's `answers`.
pub fn conclude(plan: &PoolPlan, world: &World, answers: &LedgerAnswers) -> PoolConclusion {
    let verdict = pool_status(&PoolInput {
        pool: &plan.pool,
        total_bytes: plan.total_bytes,
        backend: plan.backend.clone(),
        ledger: &answers.ledger,
        capacity_bytes: answers.capacity_bytes,
        policy_write: answers.policy_write.clone(),
        bindings: &plan.bindings,
        unclaimed: &answers.unclaimed,
        release: plan.release.clone(),
    });
    let entries: BTreeMap<&str, &TenantEntry> = match &answers.ledger {
        Outcome::Listed(e) => e.iter().map(|t| (t.tenant_id.as_str(), t)).collect(),
        _ => BTreeMap::new(),
    };
    let backend = match &plan.backend {
        BackendView::Missing { name }
        | BackendView::Managed { name, .. }
        | BackendView::External { name, .. } => name.as_str(),
    };
    let raced = contested(&world.claims_on(backend));
    let bindings = plan
        .pushed
        .iter()
        .map(|v| {
            let b = binding_status(&BindingInput {
                binding: &v.binding,
                tenant: &v.tenant,
                ceiling_bytes: v.ceiling_bytes,
                pool: Some((&plan.pool, &verdict)),
                entry: entries.get(v.tenant.as_str()).copied(),
                contested_with: raced.get(&v.binding).map_or(&[], Vec::as_slice),
                release: Release::NotDeleting,
            });
            (v.binding.clone(), b)
        })
        .collect();
    let grants = entries
        .values()
        .map(|t| (t.tenant_id.clone(), t.effective_quota_bytes))
        .collect();
    PoolConclusion {
        verdict,
        bindings,
        grants,
    }
}
