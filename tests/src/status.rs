//! The status of the operator's kinds as the tests read it: the phase, a condition by type, a
//! condition against the `Type=Status/Reason` the tests' messages already write, and a wait for
//! one on a watch.

use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kvcache_api::backend::BackendPhase;
use kvcache_api::condition::Status;
use kvcache_api::model::ModelDeploymentPhase;
use kvcache_api::pool::PoolPhase;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment};

use crate::cluster::wait_object_shown;
use crate::{Error, Result, Watched};

/// A kind whose status carries a phase and a list of conditions: the operator's four.
pub trait HasStatus {
    /// The enum of the kind's `status.phase` (`BackendPhase`, `PoolPhase`, …).
    type Phase: Copy + PartialEq + Debug;
    /// The phase, once the operator wrote a status.
    fn phase(&self) -> Option<Self::Phase>;
    /// The conditions; none before the operator wrote a status.
    fn conditions(&self) -> &[Condition];
}

macro_rules! has_status {
    ($($kind:ty => $phase:ty),* $(,)?) => {$(
        impl HasStatus for $kind {
            type Phase = $phase;
            fn phase(&self) -> Option<$phase> {
                self.status.as_ref().and_then(|s| s.phase)
            }
            fn conditions(&self) -> &[Condition] {
                self.status.as_ref().map_or(&[], |s| s.conditions.as_slice())
            }
        }
    )*};
}

has_status! {
    KVCacheBackend => BackendPhase,
    KVCachePool => PoolPhase,
    KVCachePoolBinding => PoolPhase,
    ModelDeployment => ModelDeploymentPhase,
}

/// The object's phase, once the operator wrote a status.
pub fn phase<K: HasStatus>(o: &K) -> Option<K::Phase> {
    o.phase()
}

/// The object's condition of type `type_`, if its status has one.
pub fn condition<'a, K: HasStatus>(o: &'a K, type_: &str) -> Option<&'a Condition> {
    o.conditions().iter().find(|c| c.type_ == type_)
}

/// Whether the object has the condition `spec` (`Type=Status` or `Type=Status/Reason`; see
/// [`Expected`]). A spec that does not parse matches nothing; [`wait_condition`] refuses one.
pub fn has_condition<K: HasStatus>(o: &K, spec: &str) -> bool {
    Expected::parse(spec).is_ok_and(|want| o.conditions().iter().any(|c| want.matches(c)))
}

/// The phase and every condition, one `Type=Status/Reason: message` each: what a wait that ran
/// out or a failed assertion shows of the object.
pub fn describe<K: HasStatus>(o: &K) -> String {
    let conditions: Vec<String> = o
        .conditions()
        .iter()
        .map(|c| format!("{}={}/{}: {}", c.type_, c.status, c.reason, c.message))
        .collect();
    format!(
        "phase {:?}; conditions: [{}]",
        o.phase(),
        conditions.join("; ")
    )
}

/// A condition as a test expects it, parsed from `Type=Status` (any reason) or
/// `Type=Status/Reason`, the status one of `True`, `False`, `Unknown`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected<'a> {
    /// The condition's type, e.g. `QuotaGranted`.
    pub type_: &'a str,
    /// The verdict it must have.
    pub status: Status,
    /// The reason it must give; `None`: any.
    pub reason: Option<&'a str>,
}

impl<'a> Expected<'a> {
    /// Parses `Type=Status` or `Type=Status/Reason`.
    pub fn parse(spec: &'a str) -> Result<Expected<'a>> {
        let invalid = |reason: &str| Error::ConditionSpec {
            spec: spec.to_owned(),
            reason: reason.to_owned(),
        };
        let (type_, verdict) = spec
            .split_once('=')
            .ok_or_else(|| invalid("no `=` between the type and the status"))?;
        let (status, reason) = match verdict.split_once('/') {
            Some((status, reason)) => (status, Some(reason)),
            None => (verdict, None),
        };
        let status = match status {
            "True" => Status::True,
            "False" => Status::False,
            "Unknown" => Status::Unknown,
            _ => return Err(invalid("the status is not True, False or Unknown")),
        };
        let word = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric());
        if !word(type_) {
            return Err(invalid("the type is not one CamelCase word"));
        }
        if reason.is_some_and(|r| !word(r)) {
            return Err(invalid("the reason is not one CamelCase word"));
        }
        Ok(Expected {
            type_,
            status,
            reason,
        })
    }

    /// Whether `c` is this condition.
    pub fn matches(&self, c: &Condition) -> bool {
        c.type_ == self.type_
            && c.status == self.status.as_str()
            && self.reason.is_none_or(|r| c.reason == r)
    }
}

/// Waits on a watch until the object `name` has the condition `spec` (`Type=Status` or
/// `Type=Status/Reason`), and returns it. A spec that does not parse fails at once; a wait that
/// runs out names the object and the spec, and shows the phase and conditions last seen.
pub async fn wait_condition<K>(api: &Api<K>, name: &str, spec: &str, within: Duration) -> Result<K>
where
    K: Watched + HasStatus,
{
    let want = Expected::parse(spec)?;
    wait_object_shown(
        api,
        name,
        spec,
        within,
        |o| o.conditions().iter().any(|c| want.matches(c)),
        |last| last.map_or_else(|| "no such object".to_owned(), describe),
    )
    .await
}

/// Waits until an event in any namespace regards an object named `regarding`, with `reason`
/// and a note holding `note_part` (events of a cluster-scoped object land in `default`).
pub async fn wait_event(
    client: &kube::Client,
    regarding: &str,
    reason: &str,
    note_part: &str,
    within: Duration,
) -> Result<()> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let seen = events
            .list(&Default::default())
            .await?
            .items
            .iter()
            .any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(regarding)
                    && e.reason.as_deref() == Some(reason)
                    && e.note.as_deref().is_some_and(|n| n.contains(note_part))
            });
        if seen {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Wait {
                what: format!("a {reason} event on {regarding} naming {note_part:?}"),
                reason: format!("none within {within:?}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(type_: &str, status: &str, reason: &str) -> Condition {
        serde_json::from_value(serde_json::json!({
            "type": type_, "status": status, "reason": reason, "message": "m",
            "lastTransitionTime": "2025-01-01T00:00:00Z",
        }))
        .expect("a Condition")
    }

    #[test]
    fn a_spec_names_the_type_the_status_and_maybe_the_reason() {
        let granted = Expected::parse("QuotaGranted=True/Granted").expect("parses");
        assert_eq!(
            granted,
            Expected {
                type_: "QuotaGranted",
                status: Status::True,
                reason: Some("Granted"),
            }
        );
        assert!(granted.matches(&cond("QuotaGranted", "True", "Granted")));
        assert!(!granted.matches(&cond("QuotaGranted", "True", "Recut")));
        assert!(!granted.matches(&cond("QuotaGranted", "False", "Granted")));
        assert!(!granted.matches(&cond("QuotaObserved", "True", "Granted")));
        let any_reason = Expected::parse("CacheAttached=Unknown").expect("parses");
        assert_eq!(any_reason.reason, None);
        assert!(any_reason.matches(&cond("CacheAttached", "Unknown", "NoObservationAvailable")));
    }

    #[test]
    fn a_malformed_spec_is_refused_and_matches_nothing() {
        for spec in [
            "QuotaGranted",
            "QuotaGranted=Yes",
            "=True",
            "QuotaGranted=True/",
            "Quota Granted=True",
            "QuotaGranted=True/Granted/Again",
        ] {
            assert!(Expected::parse(spec).is_err(), "{spec}");
        }
        let b: KVCachePoolBinding = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
            "metadata": {"name": "b", "namespace": "n"},
            "spec": {"poolRef": {"name": "p"}, "quota": {"ceiling": "1Gi"},
                     "domain": {"blockSize": 64, "dtype": "bfloat16"}},
            "status": {"conditions": [{"type": "QuotaGranted", "status": "True", "reason": "Granted",
                       "message": "m", "lastTransitionTime": "2025-01-01T00:00:00Z"}]},
        }))
        .expect("a Binding");
        assert!(has_condition(&b, "QuotaGranted=True/Granted"));
        assert!(has_condition(&b, "QuotaGranted=True"));
        assert!(!has_condition(&b, "QuotaGranted"), "malformed: no match");
        assert_eq!(
            condition(&b, "QuotaGranted").map(|c| c.reason.as_str()),
            Some("Granted")
        );
        assert_eq!(phase(&b), None);
        assert_eq!(
            describe(&b),
            "phase None; conditions: [QuotaGranted=True/Granted: m]"
        );
    }
}
