//! Each controller's pass decided from what it read: a backend's ([`backend`], with its members'
//! steps from [`crate::members`]), a pool's ([`pool`]), a ModelDeployment's ([`model`]); and the
//! offline `kvcache-operator render` through the same plans ([`resolve`]).

pub mod backend;
pub mod model;
pub mod pool;
pub mod resolve;
