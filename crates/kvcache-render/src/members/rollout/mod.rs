//! A backend's rollout, decided from what runs: which member Pods to replace (their DaemonSets
//! are `OnDelete`, so the operator deletes them), one at a time per group, each member's segment
//! drained to the other members first where the master can ([`member_rollout`],
//! docs/design.md#member-rollout); and whether the standbys wait for election to be enabled at
//! one replica first.

mod describe;
mod leader;
mod plan;
mod step;

pub(crate) use describe::member_progress;
pub use describe::step_event;
pub use leader::hold_standbys;
pub use plan::{GroupFacts, RolloutInput, member_rollout, stale_member_pods};
pub use step::{Drain, GroupStep, Held, Moved, Next, NoDrain, Progress, Step, Until};

#[cfg(test)]
mod tests;
