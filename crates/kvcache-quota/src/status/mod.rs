//! Pool and Binding verdicts from what the operator observed: phases, figures and conditions as
//! plain values: a pool's (`pool`), a Binding's (`binding`) and where a deletion stands
//! (`releasable`). The status documents built from them, stamped and merged, are
//! `kvcache_render::status::{pool, binding}`.

mod binding;
mod figure;
mod pool;
mod releasable;

pub use binding::{
    BindingInput, BindingVerdict, PRESSURE_SHARE, REFUSED_SAVES_SHARE, SavesInWindow,
    binding_status, quota_pressure,
};
pub use pool::{BackendView, PolicyWrite, PoolInput, PoolVerdict, RefusedCeiling, pool_status};
pub use releasable::{NotReleased, Release, RequestFailed, Unclaimed, binding_releasable};
