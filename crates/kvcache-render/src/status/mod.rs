//! Statuses from what the operator observed, one module per kind: each condition from its own
//! function, the phase from them. Pure; the operator reads, calls and writes. The pool's and the
//! Binding's ledger conditions are judged by `kvcache_quota::status` (the tenant ledger's own
//! crate); the Binding's whole status, for its one writer, is [`binding`].

pub mod backend;
pub mod binding;
pub mod model;
