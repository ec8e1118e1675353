//! Members mounted on the wrong master: a segment a backend's master lists whose address is a
//! member Pod of another backend (and of none of its own). Seen when a failover freed a
//! master's address and a member redialed it after another backend's master took it
//! (README's note on the harness's address books); a real CNI can reuse an address as quickly.
//! The backend's status names each one and the operator restarts it, so that it mounts on its
//! own master again. Pure: the operator lists the store Pods and the segments.

use std::collections::BTreeSet;

use crate::read::MemberPod;
use crate::store::Segment;

/// A member Pod of another backend, as the operator listed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtherMember {
    /// The backend whose member it is (its `app.kubernetes.io/instance` label).
    pub backend: String,
    /// The member Pod: its name, node and address.
    pub pod: MemberPod,
}

/// The other backends' members this backend's master lists a segment of. An address that is
/// also one of this backend's own members (members on `hostNetwork` of two backends on one
/// node share it) is not judged: it cannot tell whose segment it is.
pub fn foreign_mounts<'a>(
    segments: &[Segment],
    own: &[MemberPod],
    others: &'a [OtherMember],
) -> Vec<&'a OtherMember> {
    let own: BTreeSet<&str> = own.iter().map(|p| p.ip.as_str()).collect();
    let listed: BTreeSet<&str> = segments.iter().map(Segment::host).collect();
    others
        .iter()
        .filter(|m| !m.pod.ip.is_empty() && !m.pod.terminating)
        .filter(|m| listed.contains(m.pod.ip.as_str()) && !own.contains(m.pod.ip.as_str()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ip: &str) -> MemberPod {
        MemberPod {
            name: name.into(),
            node: "n0".into(),
            ip: ip.into(),
            group: 0,
            ready: true,
            terminating: false,
            hash: "h".into(),
            problem: None,
            survey: None,
            drain: None,
        }
    }

    fn segment(host: &str) -> Segment {
        serde_json::from_value(serde_json::json!({
            "segment_name": format!("{host}:15000"), "size_bytes": 1024,
            "allocator_used_bytes": 0, "allocator_capacity_bytes": 1024
        }))
        .expect("a segment")
    }

    fn other(backend: &str, name: &str, ip: &str) -> OtherMember {
        OtherMember {
            backend: backend.into(),
            pod: pod(name, ip),
        }
    }

    #[test]
    fn another_backends_member_listed_here_is_foreign() {
        let own = [pod("a-m0", "10.0.0.5")];
        let others = [
            other("b", "b-m0", "10.0.0.7"),
            other("b", "b-m1", "10.0.1.7"),
        ];
        let listed = [segment("10.0.0.5"), segment("10.0.0.7")];
        let found: Vec<&str> = foreign_mounts(&listed, &own, &others)
            .iter()
            .map(|m| m.pod.name.as_str())
            .collect();
        assert_eq!(found, ["b-m0"]);
    }

    #[test]
    fn an_address_shared_with_an_own_member_or_a_leaving_pod_is_not_judged() {
        // hostNetwork: both backends' members on one node advertise the node's address.
        let own = [pod("a-m0", "192.168.0.10")];
        let mut leaving = other("b", "b-m1", "10.0.1.7");
        leaving.pod.terminating = true;
        let others = [other("b", "b-m0", "192.168.0.10"), leaving];
        let listed = [segment("192.168.0.10"), segment("10.0.1.7")];
        assert!(foreign_mounts(&listed, &own, &others).is_empty());
    }

    #[test]
    fn a_segment_of_no_known_pod_is_not_foreign() {
        // A replaced member's segment lingers until the master's client TTL: no Pod has its
        // address any more, and it is not another backend's.
        let own = [pod("a-m0", "10.0.0.5")];
        let listed = [segment("10.0.0.5"), segment("10.0.0.9")];
        assert!(foreign_mounts(&listed, &own, &[]).is_empty());
    }
}
