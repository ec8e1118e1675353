//! The quota layer behind pools and bindings, as pure functions: who each Binding's tenant is,
//! what the store is told (its policy document and admin-API requests), and how what the store
//! answers becomes pool and binding status. No I/O: the operator does the HTTP and the writes.

#![warn(missing_docs)]

pub mod admin;
pub mod claims;
pub mod grant;
pub mod policy;
pub mod release;
pub mod status;
pub mod tenancy;

pub use admin::{AdminError, Outcome, TenantEntry};
pub use claims::{Claim, DuplicateDomain};
pub use grant::recut;
pub use policy::{PolicyDocument, TenantQuota};

/// What can go wrong in this crate.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The policy document would be refused by the store; nothing is rendered.
    #[error("the tenant policy for backend {backend} was not rendered: {}", problems.join("; "))]
    PolicyRefused {
        /// Name of the KVCacheBackend whose tenant policy was not rendered.
        backend: String,
        /// Every problem, each naming the Binding.
        problems: Vec<String>,
    },
    /// The store's admin API answered something this crate cannot use: unreadable, or a
    /// refusal of the ledger's (converted from [`AdminError`]).
    #[error("the store's admin API answered something unreadable ({context}): {message}")]
    Unreadable {
        /// What was asked.
        context: String,
        /// What the decoder could not read, or the ledger's refusal.
        message: String,
    },
}
