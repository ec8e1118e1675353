//! One event to record ([`Note`]): what the status transitions ([`crate::status::events`]) and the
//! rollout's steps ([`crate::members::rollout::step_event`]) hand the operator to publish.

/// An event's type, as Kubernetes spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A transition a user wants to know of.
    Normal,
    /// A transition that needs attention.
    Warning,
}

/// One event to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Normal or Warning.
    pub kind: Kind,
    /// The CamelCase reason `kubectl get events` shows.
    pub reason: &'static str,
    /// What happened, naming the object.
    pub message: String,
}
