//! Every Kubernetes object the kvcache-operator owns, as pure functions: specs in, k8s-openapi
//! objects out, no client, clock or environment. The same input gives byte-identical YAML.
//!
//! Beside the objects, pure as well: offline resolution of references ([`resolve`]), what the
//! operator decides from what it observed (the statuses in [`status`], from [`store`]'s and
//! [`read`]'s readings; the events of a backend's transitions in [`events`]; the [`rollout`];
//! the [`shared_cache`] figures), the admission review of objects and Pods ([`review`], [`pod`])
//! and the operator's own installation ([`install`], [`monitoring`]).

#![warn(missing_docs)]

pub mod backend;
pub mod desired;
pub mod engine_access;
mod error;
pub mod events;
pub mod exposition;
pub mod install;
pub mod model;
pub mod model_plan;
pub mod monitoring;
pub mod mounts;
pub mod names;
mod note;
pub mod pod;
pub mod pool_plan;
pub mod read;
pub mod resolve;
pub mod review;
pub mod rollout;
pub mod shared_cache;
pub mod status;
pub mod store;
pub mod store_series;
pub mod world;

pub use backend::{BackendInputs, BackendObjects, fingerprint};
pub use error::Error;
