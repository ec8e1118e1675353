//! The admission review: of manifests and objects ([`review`], for `validate` and the webhook)
//! and of engine Pods, with the store's settings injected ([`pod`]).

pub mod leader_edit;
pub mod pod;
pub mod review;
