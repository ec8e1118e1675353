//! What can go wrong in this crate: one error, re-exported at the crate's root.

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
