//! Pool and Binding verdicts from what the operator observed: phases, figures and conditions as
//! plain values. The status documents built from them, stamped and merged, are
//! `kvcache_render::status::{pool, binding}`.

use bytesize::ByteSize;
use kvcache_api::condition::{Cond, Status, find};
use kvcache_api::pool::PoolPhase;
use kvcache_api::pool::{binding_conditions as b, pool_conditions as p};

use crate::admin::{AdminError, LedgerFailure, Outcome, TenantEntry, Unanswered};

/// A byte figure as users write it (`16Gi`) when exact, else approximately with the exact count.
fn bytes(b: u64) -> String {
    let q = kvcache_api::quantity::format_bytes(b);
    if q.ends_with('i') {
        q
    } else {
        format!("{} ({b} bytes)", ByteSize::b(b).display().iec())
    }
}

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

/// One Binding of the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindingView {
    /// `namespace/name`.
    pub binding: String,
    /// The tenant id: the Binding's `spec.domain.name`, `default` when empty.
    pub tenant: String,
    /// Its ceiling, bytes.
    pub ceiling_bytes: u64,
}

/// Where a deletion stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// Not being deleted.
    NotDeleting,
    /// Still referenced: by Bindings (for a pool) or workloads (for a Binding).
    Held(Vec<String>),
    /// The master refused a step of the release (the tenant's revocation, the removal of its
    /// objects, the deletion of its entry); retried.
    LedgerNotReleased(NotReleased),
    /// A ledger request failed and its outcome is unknown; retried.
    LedgerRequestFailed(RequestFailed),
    /// Released; the finalizer may go.
    Released,
}

/// Why the master keeps a tenant (`Releasable=False/LedgerNotReleased`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotReleased {
    /// The master refused to cut the tenant's quota (its revocation).
    #[error("the master refused to revoke tenant {tenant} (its quota cut to 1 byte): {refusal}")]
    RevokeRefused {
        /// The tenant id on the master's ledger: the Binding's domain name.
        tenant: String,
        /// The master's answer.
        refusal: AdminError,
    },
    /// The master refused to remove the tenant's objects.
    #[error("the master refused to remove the objects of tenant {tenant}: {refusal}")]
    RemovalRefused {
        /// The tenant id on the master's ledger: the Binding's domain name.
        tenant: String,
        /// The master's answer.
        refusal: AdminError,
    },
    /// The master refused to delete the tenant's entry because it still holds objects
    /// (`TENANT_NOT_EMPTY`).
    #[error("the master refused to release tenant {tenant}: it still holds objects")]
    NotEmpty {
        /// The tenant id on the master's ledger: the Binding's domain name.
        tenant: String,
    },
    /// The master refused to delete the tenant's entry for another reason.
    #[error("the master refused to release tenant {tenant}: {refusal}")]
    DeleteRefused {
        /// The tenant id on the master's ledger: the Binding's domain name.
        tenant: String,
        /// The master's answer.
        refusal: AdminError,
    },
}

/// Which ledger request of a release failed, and why (`Releasable=False/LedgerRequestFailed`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestFailed {
    /// Reading the tenant's entry: refused or unanswered.
    #[error("reading the ledger of tenant {tenant}: {cause}")]
    ReadingEntry {
        /// The tenant id on the master's ledger: the Binding's domain name.
        tenant: String,
        /// The master's refusal or the missing answer.
        cause: LedgerFailure,
    },
    /// Cutting the tenant's quota (its revocation): unanswered.
    #[error("revoking tenant {tenant}: {cause}")]
    Revoking {
        /// The tenant id on the master's ledger: the Binding's domain name.
        tenant: String,
        /// Why no answer came.
        cause: Unanswered,
    },
    /// Removing the tenant's objects: unanswered.
    #[error("removing the objects of tenant {tenant}: {cause}")]
    RemovingObjects {
        /// The tenant id on the master's ledger: the Binding's domain name.
        tenant: String,
        /// Why no answer came.
        cause: Unanswered,
    },
    /// Deleting the tenant's entry: unanswered.
    #[error("releasing tenant {tenant}: {cause}")]
    DeletingEntry {
        /// The tenant id on the master's ledger: the Binding's domain name.
        tenant: String,
        /// Why no answer came.
        cause: Unanswered,
    },
}

/// A tenant this pool registered on the master's ledger that no Binding claims any more: its
/// Binding went while no operator ran (its finalizer removed by hand), so nothing released it,
/// and its ceiling still takes a share whenever the master recuts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unclaimed {
    /// The tenant id.
    pub tenant: String,
    /// Bytes it still holds (charged, used or reserved, whichever the entry reports).
    pub bytes: u64,
    /// Objects it still holds, where the entry counts them (0.3.12's committed or listed
    /// objects).
    pub objects: u64,
}

impl Unclaimed {
    /// Whether the pool pass may delete the entry: it holds nothing, in either entry
    /// generation's figures (bytes charged, used or reserved, objects committed or listed).
    /// While it holds anything its entry is kept: the master refuses the delete and its
    /// objects are nobody's to drop.
    pub fn deletable(&self) -> bool {
        self.bytes == 0 && self.objects == 0
    }
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
    pub bindings: &'a [BindingView],
    /// The tenants still on the ledger that no Binding claims, after this pass removed the
    /// empty ones ([`crate::release::unclaimed`]).
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
fn quota_within_total(bindings: &[BindingView], total_bytes: u64) -> Cond {
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

fn release_cond(type_: &'static str, release: &Release, what: &str, holder_kind: &str) -> Cond {
    match release {
        Release::NotDeleting => {
            Cond::yes(type_, "NotDeleting", format!("{what} is not being deleted"))
        }
        Release::Held(by) if holder_kind == "KVCachePoolBinding" => Cond::no(
            type_,
            "HeldByBindings",
            format!(
                "{what} is held by {holder_kind} {}: delete those first; running workloads keep running",
                by.join(", ")
            ),
        ),
        Release::Held(by) => Cond::no(
            type_,
            "HeldByWorkloads",
            format!(
                "{what} is held by {holder_kind} {}, which still names it: its namespace no longer reaches the store and those run without the shared cache (docs/isolation.md#revocation); point their spec.kvCache.poolRef at another Binding or delete them, and the release goes on",
                by.join(", ")
            ),
        ),
        Release::LedgerNotReleased(why) => Cond::no(
            type_,
            "LedgerNotReleased",
            format!(
                "{what} waits for the master to release its tenant entries (retried every 30s): {why}"
            ),
        ),
        Release::LedgerRequestFailed(why) => Cond::no(
            type_,
            "LedgerRequestFailed",
            format!(
                "the ledger request for {what} failed and its outcome is unknown, so it is held: {why}"
            ),
        ),
        Release::Released => Cond::yes(type_, "Released", format!("{what} is released")),
    }
}

/// A Binding's `Releasable` condition for where its deletion stands (`who`: `namespace/name`).
pub fn binding_releasable(who: &str, release: &Release) -> Cond {
    release_cond(b::RELEASABLE, release, who, "workload")
}

/// What the operator observed for one Binding.
#[derive(Clone, Debug)]
pub struct BindingInput<'a> {
    /// `namespace/name`.
    pub binding: &'a str,
    /// The tenant id: the Binding's `spec.domain.name`, `default` when empty.
    pub tenant: &'a str,
    /// Its ceiling, bytes.
    pub ceiling_bytes: u64,
    /// Its pool's verdict; `None` when the pool does not exist.
    pub pool: Option<(&'a str, &'a PoolVerdict)>,
    /// The tenant's ledger entry, when the ledger was listed.
    pub entry: Option<&'a TenantEntry>,
    /// Other Bindings claiming the same tenant on the same backend.
    pub contested_with: &'a [String],
    /// Where its deletion stands: [`Release::NotDeleting`] until it has a deletion timestamp.
    pub release: Release,
}

/// A Binding's computed status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindingVerdict {
    /// `Ready` or `Error` (`Deleting` while held).
    pub phase: PoolPhase,
    /// Why not `Ready`.
    pub phase_message: Option<String>,
    /// The grant, when the backend keeps a ledger.
    pub effective_quota_bytes: Option<u64>,
    /// Bytes held, when the backend keeps a ledger.
    pub usage_bytes: Option<u64>,
    /// The master's over-quota flag.
    pub over_quota: Option<bool>,
    /// The master's admission-closed flag (0.3.13 and later).
    pub admission_closed: Option<bool>,
    /// Every condition, in a fixed order.
    pub conditions: Vec<Cond>,
}

/// Computes a Binding's status: one function per condition, in the order they are written,
/// then `binding_phase` from them.
pub fn binding_status(input: &BindingInput<'_>) -> BindingVerdict {
    let who = format!("KVCachePoolBinding {}", input.binding);
    let (observed, granted, figures) = quota_observed_and_granted(input, &who);
    let mut conds = vec![
        observed,
        granted,
        domain_exclusive(input.tenant, input.contested_with),
    ];
    conds.push(release_cond(
        b::RELEASABLE,
        &input.release,
        &who,
        "workload",
    ));
    let (phase, phase_message) = binding_phase(input, &conds);
    BindingVerdict {
        phase,
        phase_message,
        effective_quota_bytes: figures.map(|f| f.effective_quota_bytes),
        usage_bytes: figures.map(|f| f.usage_bytes),
        over_quota: figures.map(|f| f.over_quota),
        admission_closed: figures.and_then(|f| f.admission_closed),
        conditions: conds,
    }
}

/// Above this share of its grant a domain is under pressure (`QuotaPressure=True`).
pub const PRESSURE_SHARE: f64 = 0.9;

/// Above this share of its grant a domain whose engines' saves failed in the window is at its
/// grant too: the store refuses a put that would take the domain past its grant, so where one
/// object is a large part of the grant (a small ceiling, large blocks) saves fail well below
/// [`PRESSURE_SHARE`].
pub const REFUSED_SAVES_SHARE: f64 = 0.5;

/// The saves a Binding's deployments made within their window (their `status.sharedCache`,
/// summed), as the Binding's writer reads them beside the ledger's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SavesInWindow {
    /// Saves the engines made.
    pub saves: u64,
    /// Of those, the saves that failed.
    pub failed: u64,
}

/// A Binding's `QuotaPressure`, once the ledger gave figures (`verdict`, its pool's last
/// conclusion) and beside what its engines saw (`saves`): whether the domain holds more than
/// [`PRESSURE_SHARE`] of its grant, or more than [`REFUSED_SAVES_SHARE`] while its saves fail.
/// Mooncake 0.3.13 takes a full tenant's puts by discarding that tenant's older objects (its
/// over-quota flag stays down) and counts no such discards per tenant, so the condition says a
/// tenant is at its grant, not how much it lost. Decided here, by the Binding's one writer, and
/// not in [`binding_status`]: the pool's pass reads the ledger, not the engines.
pub fn quota_pressure(
    verdict: &BindingVerdict,
    ceiling_bytes: u64,
    saves: SavesInWindow,
) -> Option<Cond> {
    let (granted, used) = (verdict.effective_quota_bytes?, verdict.usage_bytes?);
    if granted == 0 {
        return None;
    }
    let share = used as f64 / granted as f64;
    let held = format!(
        "holds {} of its grant {} ({:.0}%)",
        bytes(used),
        bytes(granted),
        share * 100.0
    );
    let fix = if granted < ceiling_bytes {
        "the grant is below the ceiling because the pool's total is shared out: raise the pool's quota.total or add capacity, or move some workloads to another Binding"
    } else {
        "raise spec.quota.ceiling (the grant follows it as far as the pool allows), or move some workloads to another Binding"
    };
    if verdict.admission_closed == Some(true) {
        return Some(Cond::yes(
            b::QUOTA_PRESSURE,
            "AdmissionClosed",
            format!(
                "the store refuses new allocations for the domain, which {held}: its engines' saves fail until it holds less; {fix}"
            ),
        ));
    }
    Some(if share > PRESSURE_SHARE {
        Cond::yes(
            b::QUOTA_PRESSURE,
            "AtGrant",
            format!(
                "the domain {held}: the store makes room for its new blocks by discarding its own older ones (the store counts no such discards per tenant, so how many is not known); {fix}"
            ),
        )
    } else if saves.failed > 0 && share > REFUSED_SAVES_SHARE {
        Cond::yes(
            b::QUOTA_PRESSURE,
            "SavesRefused",
            format!(
                "the domain {held} and {} of its engines' {} saves in the window failed: the store refuses a block that would take the domain past its grant, so those prompts are not cached; {fix}",
                saves.failed, saves.saves
            ),
        )
    } else {
        Cond::no(
            b::QUOTA_PRESSURE,
            "BelowGrant",
            format!("the domain {held}"),
        )
    })
}

/// The figures a Binding shows from its tenant's ledger entry.
#[derive(Clone, Copy, Debug)]
struct Figures {
    effective_quota_bytes: u64,
    usage_bytes: u64,
    over_quota: bool,
    admission_closed: Option<bool>,
}

/// `QuotaObserved` and `QuotaGranted`, decided together (both read the same pool verdict and
/// ledger entry), and the figures the entry gives.
fn quota_observed_and_granted(
    input: &BindingInput<'_>,
    who: &str,
) -> (Cond, Cond, Option<Figures>) {
    let tenant = input.tenant;
    let Some((pool, verdict)) = input.pool else {
        return (
            Cond::no(
                b::QUOTA_OBSERVED,
                "PoolNotFound",
                format!(
                    "{who} names a KVCachePool that does not exist: ask an administrator to create it"
                ),
            ),
            Cond::unknown(b::QUOTA_GRANTED, "PoolNotFound", "no pool, so no grant"),
            None,
        );
    };
    match (verdict.ledger, input.entry) {
        (Some(false), _) => (
            Cond::yes(
                b::QUOTA_OBSERVED,
                "NoLedger",
                format!("the backend of KVCachePool {pool} keeps no tenant ledger"),
            ),
            Cond::yes(
                b::QUOTA_GRANTED,
                "Unenforced",
                format!(
                    "no ceiling is enforced: the backend of KVCachePool {pool} runs without multi-tenancy, engines are given no tenant id and every write lands in the store's default tenant"
                ),
            ),
            None,
        ),
        (Some(true), Some(entry)) => (
            Cond::yes(
                b::QUOTA_OBSERVED,
                "Observed",
                format!("tenant {tenant} read from the ledger"),
            ),
            quota_granted(
                pool,
                tenant,
                entry.effective_quota_bytes,
                input.ceiling_bytes,
            ),
            Some(Figures {
                effective_quota_bytes: entry.effective_quota_bytes,
                usage_bytes: entry.usage_bytes(),
                over_quota: entry.over_quota,
                admission_closed: entry.admission_closed,
            }),
        ),
        (Some(true), None) => (
            Cond::no(
                b::QUOTA_OBSERVED,
                "TenantNotInLedger",
                format!(
                    "tenant {tenant} is not in the ledger yet: the operator registers it on its next pass; writes meanwhile fail with TENANT_NOT_REGISTERED"
                ),
            ),
            Cond::unknown(
                b::QUOTA_GRANTED,
                "TenantNotInLedger",
                format!("tenant {tenant} has no grant yet"),
            ),
            None,
        ),
        (None, _) => (
            Cond::unknown(
                b::QUOTA_OBSERVED,
                "LedgerNotObserved",
                format!(
                    "the ledger of KVCachePool {pool}'s backend is not readable now; see the pool's QuotaLedgerAvailable"
                ),
            ),
            Cond::unknown(b::QUOTA_GRANTED, "LedgerNotObserved", "no grant read"),
            None,
        ),
    }
}

/// `QuotaGranted` for a tenant the ledger lists: nothing, less than the ceiling (a recut), or
/// the ceiling.
fn quota_granted(pool: &str, tenant: &str, granted: u64, ceiling: u64) -> Cond {
    if granted == 0 {
        Cond::no(
            b::QUOTA_GRANTED,
            "ZeroGranted",
            format!(
                "the master granted tenant {tenant} nothing: check KVCachePool {pool}'s CapacityAllocatable (NothingToAllocate while members mount or remount after a leader restart, about half a minute)"
            ),
        )
    } else if granted < ceiling {
        Cond::yes(
            b::QUOTA_GRANTED,
            "Recut",
            format!(
                "granted {} of the {} ceiling: the ceilings on this backend exceed its allocatable capacity, so the master recut every grant in proportion",
                bytes(granted),
                bytes(ceiling)
            ),
        )
    } else {
        Cond::yes(
            b::QUOTA_GRANTED,
            "Granted",
            format!("granted {}", bytes(granted)),
        )
    }
}

/// `DomainExclusive`: whether another Binding claims the same tenant on the same backend.
fn domain_exclusive(tenant: &str, contested_with: &[String]) -> Cond {
    if contested_with.is_empty() {
        Cond::yes(
            b::DOMAIN_EXCLUSIVE,
            "Exclusive",
            format!("domain {tenant} is held by this Binding alone"),
        )
    } else {
        Cond::no(
            b::DOMAIN_EXCLUSIVE,
            "DomainClaimedByMultipleBindings",
            format!(
                "domain {tenant} is also claimed on the same backend by {}: they raced past admission; delete all but one, or give each its own spec.domain.name (in a new Binding)",
                contested_with.join(", ")
            ),
        )
    }
}

/// A Binding's phase from its conditions: `Deleting` with the release's message while it is
/// deleted, `Error` with the first failing condition (or its pool's error), else `Ready`.
fn binding_phase(input: &BindingInput<'_>, conds: &[Cond]) -> (PoolPhase, Option<String>) {
    if input.release != Release::NotDeleting {
        return (
            PoolPhase::Deleting,
            find(conds, b::RELEASABLE).map(|c| c.message.clone()),
        );
    }
    if let Some(c) = conds
        .iter()
        // `QuotaPressure` reads the other way round (True is the warning) and is no fault:
        // a full domain still serves.
        .find(|c| {
            c.status == Status::False && c.type_ != b::RELEASABLE && c.type_ != b::QUOTA_PRESSURE
        })
    {
        return (
            PoolPhase::Error,
            Some(format!("{}: {}", c.type_, c.message)),
        );
    }
    let pool_error = input
        .pool
        .filter(|(_, v)| v.phase == PoolPhase::Error)
        .and_then(|(name, v)| {
            v.phase_message
                .as_ref()
                .map(|m| format!("KVCachePool {name}: {m}"))
        });
    match pool_error {
        Some(m) => (PoolPhase::Error, Some(m)),
        None => (PoolPhase::Ready, None),
    }
}
