//! Every Kubernetes object the kvcache-operator owns, as pure functions: specs in, k8s-openapi
//! objects out, no client, clock or environment. The same input gives byte-identical YAML.
//!
//! Grouped by what each part does in a controller's pass, from the top down (each imports only
//! what stands below it):
//! - [`admission`]: the review of objects and Pods (`validate`, the webhook, the injection);
//! - [`plan`]: each controller's pass decided from what it read (the backend's, the pool's, the
//!   ModelDeployment's), and the offline `render` through the same plans;
//! - [`status`]: every kind's status document and the events of its transitions;
//! - [`members`]: each member's steps: the rollout, the segments no member Pod mounted;
//! - [`objects`]: the objects an owner renders, as one ordered list a pass writes;
//! - [`observe`]: what the operator reads, parsed (the store's answers, Pods, engines' counters);
//! - [`install`]: the operator's own installation and monitoring;
//! - [`world`], [`names`]: how objects reach one another; names and label contracts.

#![warn(missing_docs)]

pub mod admission;
mod error;
pub mod install;
pub mod members;
pub mod names;
mod note;
pub mod objects;
pub mod observe;
pub mod plan;
pub mod status;
pub mod world;

pub use error::Error;
pub use objects::backend::{BackendInputs, BackendObjects, fingerprint};
