//! Statuses from what the operator observed, one module per kind: each condition from its own
//! function, the phase from them. Pure; the operator reads, calls and writes. The pool's and the
//! Binding's are `kvcache-quota`'s (`kvcache_quota::status`): they judge the tenant ledger.

pub mod backend;
pub mod model;
