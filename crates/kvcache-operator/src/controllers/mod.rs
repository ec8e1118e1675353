//! The controllers, one file each (`backend`, `pool`, `binding`, `model`, `engine_pod`, and
//! `members`: the member steps a backend's pass carries out), and what they share: the applied
//! set (`applied`), the status writer (`status`), how a pass is driven, traced and retried and
//! its events recorded (`shared`); `start` runs them.

mod applied;
mod backend;
mod binding;
mod engine_pod;
mod members;
mod model;
mod pool;
mod shared;
mod start;
pub mod status;

pub use shared::trace_id;
pub use start::run;
