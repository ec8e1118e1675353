//! The quota layer behind pools and bindings, as pure functions: who each Binding's tenant is,
//! what the store is told (its policy document and admin-API requests), and how what the store
//! answers becomes pool and binding status. No I/O: the operator does the HTTP and the writes.

#![warn(missing_docs)]

pub mod admin;
pub mod ceiling;
pub mod claims;
mod error;
pub mod grant;
pub mod policy;
pub mod release;
pub mod status;
pub mod tenancy;

pub use admin::{AdminError, Outcome, TenantEntry};
pub use ceiling::BindingCeiling;
pub use claims::{Claim, DuplicateDomain};
pub use error::Error;
pub use grant::recut;
pub use policy::{PolicyDocument, TenantQuota};
