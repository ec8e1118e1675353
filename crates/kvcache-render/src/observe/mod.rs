//! What the operator reads, parsed: the store's admin answers ([`store`]), any Prometheus text
//! ([`exposition`]) and which of a master's series are re-exported ([`store_series`]), what
//! Pods and Deployments say ([`read`]), and the engines' shared-cache counters
//! ([`shared_cache`]).

pub mod exposition;
pub mod node;
pub mod read;
pub mod shared_cache;
pub mod store;
pub mod store_series;
