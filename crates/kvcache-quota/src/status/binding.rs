//! A Binding's verdict: its pool's verdict and its tenant's ledger entry become its conditions,
//! figures and phase; [`quota_pressure`] adds what its engines saw.

use kvcache_api::condition::{Cond, Status, find};
use kvcache_api::pool::PoolPhase;
use kvcache_api::pool::binding_conditions as b;

use super::figure::bytes;
use super::pool::PoolVerdict;
use super::releasable::{Release, release_cond};
use crate::admin::TenantEntry;

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
