//! A Binding as the quota layer reads it: who it is, its tenant and its ceiling. What the tenant
//! policy is rendered from (`policy`), the ceilings a pool pass writes (`admin`) and the pool's
//! `QuotaWithinTotal` (`status`) all take this one shape.

/// One Binding's ceiling: `namespace/name`, its tenant and its ceiling in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindingCeiling {
    /// `namespace/name`.
    pub binding: String,
    /// The tenant id: the Binding's `spec.domain.name`, `default` when empty.
    pub tenant: String,
    /// Its ceiling, bytes.
    pub ceiling_bytes: u64,
}
