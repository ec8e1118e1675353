//! Statuses from what the operator observed, one module per kind: each condition from its own
//! function, the phase from them. Pure; the operator reads, calls and writes.
//!
//! Every kind's status document lives here, beside the objects the same crate renders: the
//! backend's, the ModelDeployment's, the pool's ([`pool`]) and the Binding's ([`binding`]). The
//! pool's and the Binding's ledger verdicts (conditions, phase and figures as plain values)
//! stay in `kvcache_quota::status`: they judge the master's tenant ledger alone, and a tool
//! that embeds only the quota crate (GPUStack's own quota view) gets them without the render's
//! Kubernetes objects.

pub mod backend;
pub mod binding;
pub mod events;
pub mod model;
pub mod pool;
