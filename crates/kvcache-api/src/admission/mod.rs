//! Admission rules for every kind as pure functions: `validate_create` and `validate_update`
//! return every violation (field path and message) and every warning, never only the first.
//!
//! The CRD's CEL rules refuse most of these at the API server already (see [`crate::rules`]);
//! these functions also cover what CEL cannot express well (group reordering, ratcheting on a
//! setting) and serve the offline `kvcache-operator validate` and the admission webhook.

mod backend;
mod model;
mod pool;
mod verdict;

pub use crate::names::{domain_name_problem, is_dns_subdomain, is_host_port, tier_path_problem};
pub use pool::{MAX_QUOTA_BYTES, tenant_of};
pub use verdict::{Admission, Verdict, Violation};
