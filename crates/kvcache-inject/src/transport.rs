//! The store client's TCP transport settings that the operator sets by default, for engines
//! (the injection) and members (the backend render) alike: each a setting of Mooncake
//! 0.3.13.post1's TCP transport, read from the environment when a client starts. A container's
//! or a member group's own value of the same name wins. The figures behind each value are in
//! `benches/README.md` ("transfer").

/// One defaulted setting: the variable, its value, and why it is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// The environment variable the store's client reads.
    pub name: &'static str,
    /// The value the operator sets.
    pub value: &'static str,
    /// Why, in one sentence (for the docs and the decision record).
    pub why: &'static str,
}

/// What every TCP client of the store (engines and members) gets unless it sets the name
/// itself.
pub const TCP_TUNING: &[Tuning] = &[Tuning {
    name: "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER",
    value: "65535",
    why: "0.3.13.post1 queues 1,024 transfers per peer (and 1,024 more for a second); a burst beyond them is refused at once as queue-full and, under vLLM's recompute policy, silently becomes a prefill",
}];

/// Whether `name` is a defaulted transport setting.
pub(crate) fn is_tuning(name: &str) -> bool {
    TCP_TUNING.iter().any(|t| t.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_stores_and_listed_once() {
        let mut names: Vec<&str> = TCP_TUNING.iter().map(|t| t.name).collect();
        assert!(names.iter().all(|n| n.starts_with("MC_TCP_")));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TCP_TUNING.len());
        assert!(is_tuning("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER"));
        assert!(!is_tuning("MOONCAKE_MASTER"));
    }
}
