//! What becomes of each member: the rollout that replaces a member group's Pods one at a time,
//! each segment drained first ([`rollout`]), and the segments a master lists that are no member
//! Pod's own ([`mounts`]): decided from what was observed, described by the statuses and
//! carried out by the backend's pass.

pub mod maintenance;
pub mod mounts;
pub mod rollout;
