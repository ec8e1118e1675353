//! The objects each owner renders: a managed backend's store ([`backend`]), a ModelDeployment's
//! roles ([`model`], with the engines' NetworkPolicies from [`engine_access`]), and the one
//! ordered list a pass writes ([`desired`]).

pub mod attachment;
pub mod backend;
pub mod desired;
pub mod engine_access;
pub mod model;
