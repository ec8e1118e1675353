//! Where a deletion stands ([`Release`]) and the `Releasable` condition that says so, for a pool
//! and for a Binding; `kvcache_quota::release` decides a Binding's, the pool pass a pool's.

use kvcache_api::condition::Cond;
use kvcache_api::pool::binding_conditions as b;

use crate::admin::{AdminError, LedgerFailure, Unanswered};

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

/// The `Releasable` condition of `what` (a pool or a Binding) for where its deletion stands,
/// naming what holds it (`holder_kind`).
pub(crate) fn release_cond(
    type_: &'static str,
    release: &Release,
    what: &str,
    holder_kind: &str,
) -> Cond {
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
