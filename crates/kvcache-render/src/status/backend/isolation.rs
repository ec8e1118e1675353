//! Who reaches the store: `NetworkIsolated` (docs/isolation.md#enforcement-checked) and
//! `UnknownSegments` (docs/isolation.md#unknown-segments), with how an unknown segment is named.

use kvcache_api::KVCacheBackend;
use kvcache_api::backend::UnknownSegment;
use kvcache_api::backend::conditions::*;
use kvcache_api::condition::Cond;

use super::facts::managed;
use super::observation::Observation;

/// `NetworkIsolated` (written once the objects were rendered): the leader and member Pods take
/// store traffic only from the backend's own Pods and the namespaces bound to it, and whether
/// something enforces that, as the isolation probe found (docs/isolation.md#enforcement-checked);
/// or which member groups run on the host network where no NetworkPolicy reaches.
pub(super) fn network_isolated(obs: &Observation) -> Option<Cond> {
    use crate::objects::backend::probe::Isolation;
    use kvcache_api::backend::ProbeResult;
    const T: &str = NETWORK_ISOLATED;
    let unguarded = obs.unguarded_groups.as_ref()?;
    if !unguarded.is_empty() {
        return Some(Cond::no(
            T,
            "HostNetworkMembers",
            format!(
                "the Pods of member DaemonSet {} run on the host network (the RDMA fabric), which no NetworkPolicy covers: any Pod that reaches their node reaches their ports; keep those nodes for trusted tenants or guard them with the hosts' firewall",
                unguarded.join(", ")
            ),
        ));
    }
    const APPLIED: &str = "the leader and member Pods take store traffic only from this backend's Pods and the namespaces bound to it, the admin port only from the operator";
    let probed = |r: &kvcache_api::backend::IsolationProbe| {
        format!(
            "probe Pod {}, in a namespace no Binding admits, dialled the master's RPC port at {}",
            r.pod, r.target
        )
    };
    Some(match &obs.isolation {
        None => Cond::yes(T, "PoliciesApplied", APPLIED),
        Some(Isolation::Off) => Cond::unknown(
            T,
            "Unverified",
            format!(
                "{APPLIED} by their NetworkPolicies; whether an enforcer applies them is not checked (the operator runs with --isolation-probe=false)"
            ),
        ),
        Some(Isolation::OwnNamespaceBound) => Cond::unknown(
            T,
            "Unverified",
            format!(
                "{APPLIED} by their NetworkPolicies; whether an enforcer applies them cannot be checked: the operator's own namespace holds a Binding on this backend, so a probe Pod there is admitted; bind the workloads of another namespace instead"
            ),
        ),
        Some(Isolation::Probing { previous }) => Cond::unknown(
            T,
            "Probing",
            format!(
                "{APPLIED} by their NetworkPolicies; a probe Pod checks that they are enforced{}",
                previous.as_ref().map_or_else(String::new, |r| format!(
                    " (the last probe, of earlier policies or without an answer: {:?}, {})",
                    r.result, r.message
                ))
            ),
        ),
        Some(Isolation::Probed(r)) => match r.result {
            ProbeResult::Enforced => Cond::yes(
                T,
                "Enforced",
                format!(
                    "{APPLIED}, enforced: {} and was refused ({})",
                    probed(r),
                    r.message
                ),
            ),
            ProbeResult::NotEnforced => Cond::no(
                T,
                "NotEnforced",
                format!(
                    "{} and connected: nothing enforces the store's NetworkPolicies, so any Pod of the cluster reaches the store's ports; run a NetworkPolicy enforcer (a CNI that implements NetworkPolicy; docs/isolation.md#an-enforcer-is-required)",
                    probed(r)
                ),
            ),
            ProbeResult::Inconclusive => Cond::unknown(
                T,
                "ProbeFailed",
                format!(
                    "{APPLIED} by their NetworkPolicies; the probe of their enforcement gave no answer ({}: {}); it is tried again within {} minutes",
                    r.pod,
                    r.message,
                    crate::objects::backend::probe::RETRY_INCONCLUSIVE.as_secs() / 60
                ),
            ),
        },
    })
}

/// `UnknownSegments`, for a managed backend (docs/isolation.md#unknown-segments): the segments
/// the serving master lists that no member Pod of the backend mounted, once listed past their
/// grace, each named with its address, its Pod and where it stands; `Unknown` while no serving
/// master's listing was read. Not written for an external store, whose members the operator
/// does not know.
pub(super) fn unknown_segments(b: &KVCacheBackend, obs: &Observation) -> Option<Cond> {
    const T: &str = UNKNOWN_SEGMENTS;
    if !managed(b) {
        return None;
    }
    let Some(unknown) = &obs.unknown_segments else {
        return Some(Cond::unknown(
            T,
            "NotChecked",
            "segments are checked against a serving leader's listing",
        ));
    };
    let confirmed: Vec<&UnknownSegment> = unknown.iter().filter(|u| u.confirmed).collect();
    let pending = unknown.len() - confirmed.len();
    if confirmed.is_empty() {
        let mut why =
            "every segment the master lists is one of this backend's member Pods'".to_owned();
        if pending > 0 {
            why.push_str(&format!(
                "; {pending} more, listed for less than the master's client TTL, may be a replaced member's and are judged once it has passed"
            ));
        }
        return Some(Cond::no(T, "None", why));
    }
    let named: Vec<String> = confirmed.iter().map(|u| describe_unknown(u)).collect();
    let action = if obs.drain_unknown {
        "each is drained onto this backend's members, so that no new block lands there (state DRAINING, then DRAINED; a segment left OK has not been drained yet: its blocks had nowhere to go)"
    } else {
        "the operator runs with --unknown-segments=report and leaves them taking blocks"
    };
    Some(Cond::yes(
        T,
        "MountedByNoMember",
        format!(
            "the master lists {} no member Pod of this backend mounted: {}. The store places any tenant's blocks in such a segment's memory and serves them from there; {action}. Stop the process that mounts it (a store client set up with global_segment_size above 0); a client that must contribute memory belongs on a backend of its own (spec.tenancy: Dedicated)",
            match confirmed.len() {
                1 => "a segment".to_owned(),
                n => format!("{n} segments"),
            },
            named.join("; ")
        ),
    ))
}

/// One unknown segment as a condition or event names it.
pub(crate) fn describe_unknown(u: &UnknownSegment) -> String {
    let size = u.size.as_deref().unwrap_or_default();
    let pod = u.pod.as_deref().map_or_else(
        || "no Pod has this address".to_owned(),
        |p| format!("Pod {p}"),
    );
    let state = if u.state.is_empty() {
        String::new()
    } else {
        format!(", state {}", u.state)
    };
    format!(
        "{} ({size} at address {}, {pod}{state})",
        u.segment_name, u.address
    )
}
