//! Whose master a member mounts. A leader elector answers [`PATH`] with the Lease it campaigns
//! for, its identity and whether it leads now; a member elector asks the address the Lease
//! publishes before it mounts there, and keeps asking while it stays. A Pod address freed by a
//! failover can be given to another backend's new leader at once, and a member following a
//! stale address (or a store client reconnecting to it) would then mount its segment on that
//! other master. The answer is judged here, without I/O; `member.rs` asks and acts.

use serde::{Deserialize, Serialize};

/// The leader elector's route that names it.
pub const PATH: &str = "/identity";

/// What a leader elector answers at [`PATH`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderIdentity {
    /// The Lease it campaigns for (`<backend>-leader`): which backend's master this is.
    pub lease: String,
    /// The Lease's namespace.
    pub namespace: String,
    /// Its identity on the Lease (the Pod name).
    pub identity: String,
    /// Whether it holds the Lease now (and so runs the master).
    pub leading: bool,
}

/// What the member elector heard at the identity address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// An elector named itself.
    Named(LeaderIdentity),
    /// Something answered without this route (404: an elector from before it).
    NoRoute,
    /// No answer, or one that does not decode: nothing can be told from it.
    Nothing,
}

/// Whether a member may mount on (or stay mounted on) the master at an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The Lease holder's own elector answers, leading: mount or stay.
    Ours,
    /// Nothing tells either way (no answer, or an elector without the route): mount or stay,
    /// as members did before the check. A member that cannot reach the address cannot mount
    /// there either.
    Unverified,
    /// Another backend's leader answers there: never mount; a member mounted there is stopped.
    Foreign(LeaderIdentity),
    /// This backend's elector answers, but not as the holder the Lease names (a standby, or a
    /// holder that stepped down): do not mount yet; the Lease moves on by itself.
    NotHolder(LeaderIdentity),
}

impl Verdict {
    /// Whether a member may be started toward the address.
    pub fn may_mount(&self) -> bool {
        matches!(self, Verdict::Ours | Verdict::Unverified)
    }
}

/// Judges `answer`, asked at the address the Lease `namespace/lease` publishes for `holder`.
pub fn judge(lease: &str, namespace: &str, holder: &str, answer: &Answer) -> Verdict {
    match answer {
        Answer::NoRoute | Answer::Nothing => Verdict::Unverified,
        Answer::Named(who) if who.lease != lease || who.namespace != namespace => {
            Verdict::Foreign(who.clone())
        }
        Answer::Named(who) if who.identity != holder || !who.leading => {
            Verdict::NotHolder(who.clone())
        }
        Answer::Named(_) => Verdict::Ours,
    }
}

/// The identity URL of the elector beside the master at `address` (`host:port` as the Lease
/// publishes it: the render writes `$(POD_IP):50051`, so an IPv6 host comes unbracketed),
/// whose readiness server listens on `port`; `None` when the address has no port.
pub fn url(address: &str, port: u16) -> Option<String> {
    let (host, _) = address.rsplit_once(':')?;
    if host.is_empty() {
        return None;
    }
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    Some(format!("http://{host}:{port}{PATH}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(lease: &str, identity: &str, leading: bool) -> Answer {
        Answer::Named(LeaderIdentity {
            lease: lease.into(),
            namespace: "gpustack-system".into(),
            identity: identity.into(),
            leading,
        })
    }

    #[test]
    fn the_holders_own_leading_elector_is_ours() {
        let v = judge(
            "dram-leader",
            "gpustack-system",
            "dram-leader-a",
            &named("dram-leader", "dram-leader-a", true),
        );
        assert_eq!(v, Verdict::Ours);
        assert!(v.may_mount());
    }

    #[test]
    fn another_backends_leader_at_the_address_is_foreign_whatever_it_says_of_itself() {
        for leading in [true, false] {
            let v = judge(
                "dram-leader",
                "gpustack-system",
                "dram-leader-a",
                &named("other-leader", "dram-leader-a", leading),
            );
            assert!(matches!(v, Verdict::Foreign(ref w) if w.lease == "other-leader"));
            assert!(!v.may_mount());
        }
        let mut elsewhere = LeaderIdentity {
            lease: "dram-leader".into(),
            namespace: "other-ns".into(),
            identity: "dram-leader-a".into(),
            leading: true,
        };
        let v = judge(
            "dram-leader",
            "gpustack-system",
            "dram-leader-a",
            &Answer::Named(elsewhere.clone()),
        );
        assert_eq!(v, Verdict::Foreign(elsewhere.clone()));
        elsewhere.namespace = "gpustack-system".into();
        assert_eq!(
            judge(
                "dram-leader",
                "gpustack-system",
                "dram-leader-a",
                &Answer::Named(elsewhere)
            ),
            Verdict::Ours
        );
    }

    #[test]
    fn a_standby_or_another_replica_of_this_backend_is_not_mounted_yet() {
        let standby = judge(
            "dram-leader",
            "gpustack-system",
            "dram-leader-a",
            &named("dram-leader", "dram-leader-a", false),
        );
        assert!(matches!(standby, Verdict::NotHolder(_)));
        let other_replica = judge(
            "dram-leader",
            "gpustack-system",
            "dram-leader-a",
            &named("dram-leader", "dram-leader-b", true),
        );
        assert!(matches!(other_replica, Verdict::NotHolder(_)));
        assert!(!standby.may_mount() && !other_replica.may_mount());
    }

    #[test]
    fn no_answer_and_an_older_elector_change_nothing() {
        for answer in [Answer::NoRoute, Answer::Nothing] {
            let v = judge("dram-leader", "gpustack-system", "dram-leader-a", &answer);
            assert_eq!(v, Verdict::Unverified);
            assert!(v.may_mount());
        }
    }

    #[test]
    fn the_url_is_the_addresss_host_on_the_readiness_port() {
        assert_eq!(
            url("10.1.0.7:50051", 8090).as_deref(),
            Some("http://10.1.0.7:8090/identity")
        );
        assert_eq!(
            url("[fd00::7]:50051", 8090).as_deref(),
            Some("http://[fd00::7]:8090/identity")
        );
        assert_eq!(
            url("fd00::7:50051", 8090).as_deref(),
            Some("http://[fd00::7]:8090/identity"),
            "the rendered form, unbracketed"
        );
        assert_eq!(url("10.1.0.7", 8090), None);
        assert_eq!(url(":50051", 8090), None);
    }
}
