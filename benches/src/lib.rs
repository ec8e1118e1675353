//! The project's benchmarks: each runs what users run (real kubelet nodes, the real store, the
//! real operator, real engines where the figure is theirs) and prints its figures as Markdown
//! rows. `cargo xtask bench <name>` installs the parts first (`cargo xtask setup`) and calls
//! the one named here; the current figures are in BENCHMARKS.md.

pub mod admission;
pub mod capacity;
mod engine_rig;
pub use engine_rig::check_leader_cpu;
pub mod failover;
pub mod isolation;
mod operator;
pub mod planned;
pub mod prefix;
pub mod rollout;
pub mod scale;
pub mod soak;
pub mod transfer;
