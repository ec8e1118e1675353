//! A pool's verdict: its backend as resolved, the ledger as read and its Bindings' ceilings
//! become its conditions and phase.

use kvcache_api::condition::{Cond, Status, find};
use kvcache_api::pool::PoolPhase;
use kvcache_api::pool::pool_conditions as p;

use super::figure::bytes;
use super::releasable::{Release, Unclaimed, release_cond};
use crate::admin::Outcome;
use crate::ceiling::BindingCeiling;

/// What the pool's backend is, as resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendView {
    /// The named backend does not exist.
    Missing {
        /// The name the pool gives.
        name: String,
    },
    /// A backend the operator runs (`connection.managed`).
    Managed {
        /// Name of the KVCacheBackend the pool's `spec.backends` gives.
        name: String,
        /// `leader.multiTenancy` as declared.
        multi_tenancy: bool,
        /// The address engines are given.
        client_endpoint: String,
    },
    /// An external backend (its ledger is known only by asking).
    External {
        /// Name of the KVCacheBackend the pool's `spec.backends` gives.
        name: String,
        /// The declared `Client` address.
        client_endpoint: String,
    },
}

/// What the operator observed for one pool.
#[derive(Clone, Debug)]
pub struct PoolInput<'a> {
    /// The KVCachePool's name, as conditions and messages name it.
    pub pool: &'a str,
    /// `spec.quota.total` in bytes.
    pub total_bytes: u64,
    /// The pool's one backend as resolved: missing, managed or external.
    pub backend: BackendView,
    /// The last ledger read.
    pub ledger: &'a Outcome,
    /// `master_total_capacity_bytes` (allocatable), if read.
    pub capacity_bytes: Option<u64>,
    /// The last push of ceilings to the master: `None` when none was attempted.
    pub policy_write: Option<PolicyWrite>,
    /// The Bindings whose `spec.poolRef` names this pool, in every namespace.
    pub bindings: &'a [BindingCeiling],
    /// The tenants still on the ledger that no Binding claims, after this pass removed the
    /// empty ones (`kvcache_quota::release::unclaimed`).
    pub unclaimed: &'a [Unclaimed],
    /// Where its deletion stands: [`Release::NotDeleting`] until it has a deletion timestamp.
    pub release: Release,
}

/// How the last push of the Bindings' ceilings to the master's ledger went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyWrite {
    /// Every ceiling reached the master.
    Written,
    /// Some did not: each refused Binding with the store's or the transport's answer, as
    /// `QuotaPolicyWritable`'s message shows them.
    Refused(Vec<RefusedCeiling>),
}

/// One Binding whose ceiling the master did not take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedCeiling {
    /// The Binding, `namespace/name`.
    pub binding: String,
    /// What the master or the connection answered.
    pub answer: String,
}

/// A pool's computed status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolVerdict {
    /// `Ready`, `Error` or `Deleting`.
    pub phase: PoolPhase,
    /// Why not `Ready`.
    pub phase_message: Option<String>,
    /// The address engines are given.
    pub client_endpoint: Option<String>,
    /// The domains of the pool's Bindings, sorted.
    pub domains: Vec<String>,
    /// Whether the master enforces ceilings (it keeps a ledger).
    pub ledger: Option<bool>,
    /// The unclaimed tenants kept on the ledger, sorted (`status.unclaimedTenants`).
    pub unclaimed_tenants: Vec<String>,
    /// Every condition, in a fixed order.
    pub conditions: Vec<Cond>,
}

/// Computes a pool's status: one function per condition, in the order they are written, then
/// `pool_phase` from them.
pub fn pool_status(input: &PoolInput<'_>) -> PoolVerdict {
    let (resolved, backend_name, client_endpoint, declared_off) =
        backend_resolved(input.pool, &input.backend);
    let (ledger_cond, ledger) = quota_ledger_available(backend_name, declared_off, input.ledger);
    let conds = vec![
        resolved,
        capacity_allocatable(backend_name, input.capacity_bytes),
        ledger_cond,
        quota_within_total(input.bindings, input.total_bytes),
        quota_policy_writable(backend_name, ledger, &input.policy_write),
        tenants_claimed(&input.backend, input.ledger, input.unclaimed),
        release_cond(
            p::RELEASABLE,
            &input.release,
            &format!("KVCachePool {}", input.pool),
            "KVCachePoolBinding",
        ),
    ];
    let mut domains: Vec<String> = input.bindings.iter().map(|b| b.tenant.clone()).collect();
    domains.sort();
    domains.dedup();
    let (phase, phase_message) = pool_phase(&input.release, &conds);
    PoolVerdict {
        phase,
        phase_message,
        client_endpoint,
        domains,
        ledger,
        unclaimed_tenants: input.unclaimed.iter().map(|u| u.tenant.clone()).collect(),
        conditions: conds,
    }
}

/// `BackendResolved`, with the backend's name, the address engines are given and whether the
/// backend is declared without multi-tenancy.
fn backend_resolved<'a>(
    pool: &str,
    backend: &'a BackendView,
) -> (Cond, &'a str, Option<String>, bool) {
    match backend {
        BackendView::Missing { name } => (
            Cond::no(
                p::BACKEND_RESOLVED,
                "BackendNotFound",
                format!(
                    "KVCachePool {pool} names KVCacheBackend {name}, which does not exist: create it, or delete this pool and create one over an existing backend"
                ),
            ),
            name,
            None,
            false,
        ),
        BackendView::Managed {
            name,
            multi_tenancy,
            client_endpoint,
        } => (
            Cond::yes(
                p::BACKEND_RESOLVED,
                "Resolved",
                format!("managed KVCacheBackend {name}"),
            ),
            name,
            Some(client_endpoint.clone()),
            !*multi_tenancy,
        ),
        BackendView::External {
            name,
            client_endpoint,
        } => (
            Cond::yes(
                p::BACKEND_RESOLVED,
                "Resolved",
                format!("external KVCacheBackend {name}"),
            ),
            name,
            Some(client_endpoint.clone()),
            false,
        ),
    }
}

/// `CapacityAllocatable`: what the master reports it can allocate (`None`: not read yet).
fn capacity_allocatable(backend_name: &str, capacity_bytes: Option<u64>) -> Cond {
    match capacity_bytes {
        None => Cond::unknown(
            p::CAPACITY_ALLOCATABLE,
            "CapacityNotObserved",
            format!("the capacity of KVCacheBackend {backend_name} has not been read yet"),
        ),
        Some(0) => Cond::no(
            p::CAPACITY_ALLOCATABLE,
            "NothingToAllocate",
            format!(
                "the master of KVCacheBackend {backend_name} reports nothing to allocate, so every domain's effective quota is zero: its members are not mounted yet, or have not remounted after a leader restart (this clears by itself once they do)"
            ),
        ),
        Some(c) => Cond::yes(
            p::CAPACITY_ALLOCATABLE,
            "Allocatable",
            format!("the master reports {} allocatable", bytes(c)),
        ),
    }
}

/// `QuotaLedgerAvailable`, with whether the master enforces ceilings (`None`: not known now).
fn quota_ledger_available(
    backend_name: &str,
    declared_off: bool,
    ledger: &Outcome,
) -> (Cond, Option<bool>) {
    if declared_off || matches!(ledger, Outcome::NoLedger) {
        return (
            Cond::no(
                p::QUOTA_LEDGER_AVAILABLE,
                "MultiTenancyDisabled",
                format!(
                    "KVCacheBackend {backend_name} runs without multi-tenancy: no per-tenant quota is enforced, the pool serves one reuse domain and every write lands in the store's default tenant"
                ),
            ),
            Some(false),
        );
    }
    match ledger {
        Outcome::Listed(_) => (
            Cond::yes(
                p::QUOTA_LEDGER_AVAILABLE,
                "LedgerAvailable",
                format!("the master of {backend_name} keeps a tenant ledger"),
            ),
            Some(true),
        ),
        Outcome::Unreachable(why) => (
            Cond::no(
                p::QUOTA_LEDGER_AVAILABLE,
                "LedgerUnreachable",
                format!(
                    "the tenant ledger of KVCacheBackend {backend_name} could not be read: {why}"
                ),
            ),
            None,
        ),
        Outcome::NotObserved | Outcome::NoLedger => (
            Cond::unknown(
                p::QUOTA_LEDGER_AVAILABLE,
                "LedgerNotObserved",
                format!("the tenant ledger of KVCacheBackend {backend_name} has not been read yet"),
            ),
            None,
        ),
    }
}

/// `QuotaWithinTotal`: the Bindings' ceilings against `quota.total` (reported, never refused).
fn quota_within_total(bindings: &[BindingCeiling], total_bytes: u64) -> Cond {
    let sum: u128 = bindings.iter().map(|b| u128::from(b.ceiling_bytes)).sum();
    let sum_text = u64::try_from(sum).map_or_else(|_| format!("{sum} bytes"), bytes);
    if sum <= u128::from(total_bytes) {
        Cond::yes(
            p::QUOTA_WITHIN_TOTAL,
            "WithinTotal",
            format!(
                "the Bindings' ceilings sum to {sum_text}, within quota.total {}",
                bytes(total_bytes)
            ),
        )
    } else {
        Cond::no(
            p::QUOTA_WITHIN_TOTAL,
            "Oversubscribed",
            format!(
                "the Bindings' ceilings sum to {sum_text}, above quota.total {}: this is reported, not refused; the master recuts grants only when ceilings exceed its allocatable capacity",
                bytes(total_bytes)
            ),
        )
    }
}

/// `QuotaPolicyWritable`: whether the last push of ceilings reached the master.
fn quota_policy_writable(
    backend_name: &str,
    ledger: Option<bool>,
    policy_write: &Option<PolicyWrite>,
) -> Cond {
    match (ledger, policy_write) {
        (Some(false), _) => Cond::yes(
            p::QUOTA_POLICY_WRITABLE,
            "NoLedger",
            "the master keeps no ledger, so there is no policy to write",
        ),
        (_, Some(PolicyWrite::Written)) => Cond::yes(
            p::QUOTA_POLICY_WRITABLE,
            "Writable",
            "ceilings reach the master",
        ),
        (_, Some(PolicyWrite::Refused(refused))) => Cond::no(
            p::QUOTA_POLICY_WRITABLE,
            "PolicyNotWritable",
            format!(
                "ceilings no longer reach the master of {backend_name}: {}",
                refused
                    .iter()
                    .map(|r| format!("{}: {}", r.binding, r.answer))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ),
        (_, None) => Cond::unknown(
            p::QUOTA_POLICY_WRITABLE,
            "NotAttempted",
            "no ceiling has been pushed yet",
        ),
    }
}

/// `TenantsClaimed`: whether the ledger holds tenants no Binding claims (reported, never a
/// reason to stop serving).
fn tenants_claimed(backend: &BackendView, ledger: &Outcome, unclaimed: &[Unclaimed]) -> Cond {
    let backend_name = match backend {
        BackendView::External { name, .. } => {
            return Cond::yes(
                p::TENANTS_CLAIMED,
                "ExternalStore",
                format!(
                    "KVCacheBackend {name} is an external store: its ledger's other tenants are not the operator's to judge"
                ),
            );
        }
        BackendView::Managed { name, .. } | BackendView::Missing { name } => name.as_str(),
    };
    match ledger {
        Outcome::Listed(_) if unclaimed.is_empty() => Cond::yes(
            p::TENANTS_CLAIMED,
            "AllClaimed",
            format!(
                "every tenant this pool registered on the master of {backend_name} belongs to a Binding"
            ),
        ),
        Outcome::Listed(_) => Cond::no(
            p::TENANTS_CLAIMED,
            "UnclaimedTenants",
            format!(
                "the master of {backend_name} keeps tenants this pool registered that no Binding claims (their Binding went while no operator released it): {}. Their ceilings still take a share of the capacity the master recuts; an empty one is removed by the next pass. To drop the data of one, create a Binding on this pool whose domain.name is that tenant and delete it: its release revokes the tenant and removes its objects",
                unclaimed
                    .iter()
                    .map(|u| match u.objects {
                        0 => format!("{} holds {}", u.tenant, bytes(u.bytes)),
                        n => format!("{} holds {} in {n} objects", u.tenant, bytes(u.bytes)),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        ),
        Outcome::NoLedger => Cond::yes(
            p::TENANTS_CLAIMED,
            "NoLedger",
            "the master keeps no ledger, so no tenant can be left on it",
        ),
        Outcome::NotObserved | Outcome::Unreachable(_) => Cond::unknown(
            p::TENANTS_CLAIMED,
            "LedgerNotObserved",
            format!("the tenant ledger of KVCacheBackend {backend_name} has not been read"),
        ),
    }
}

/// A pool's phase: `Deleting` while being deleted, `Error` on the first condition that makes
/// the pool unusable, else `Ready`.
fn pool_phase(release: &Release, conds: &[Cond]) -> (PoolPhase, Option<String>) {
    let blocking = conds.iter().find(|c| {
        c.status == Status::False
            && matches!(
                c.reason,
                "BackendNotFound" | "NothingToAllocate" | "LedgerUnreachable" | "PolicyNotWritable"
            )
    });
    if *release != Release::NotDeleting {
        let why = find(conds, p::RELEASABLE).map(|c| c.message.clone());
        (PoolPhase::Deleting, why)
    } else if let Some(c) = blocking {
        (
            PoolPhase::Error,
            Some(format!("{}: {}", c.type_, c.message)),
        )
    } else {
        (PoolPhase::Ready, None)
    }
}
