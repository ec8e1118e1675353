//! The applied set: every object a pass renders is applied under the operator's field manager
//! and recorded; one sweep over the kinds the owner owns then deletes what belongs to the owner
//! and was not recorded. A teardown is the same sweep over an empty set. What the sweep does with
//! each object it lists is decided by [`sweep_action`], a pure function.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::info;

use kvcache_render::objects::desired::{Desired, DesiredSet, ObjectKind, Write};

use crate::error::{Error, kube as kerr};

/// The API resource of a kind an owner renders.
pub fn resource(kind: &ObjectKind) -> ApiResource {
    ApiResource {
        group: kind.group.to_owned(),
        version: kind.version.to_owned(),
        api_version: kind.api_version.to_owned(),
        kind: kind.kind.to_owned(),
        plural: kind.plural.to_owned(),
    }
}

/// How a sweep deletes what it does not keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sweep {
    /// A pass: what the render no longer returns goes (in the background).
    Prune,
    /// The owner is going: workloads are deleted in the foreground and awaited, each for its
    /// Pods' termination grace plus `slack` after the owner's deletion (`elapsed` ago), then
    /// abandoned to the garbage collector.
    Teardown {
        /// Since the owner's deletion started.
        elapsed: Duration,
        /// Beyond a workload's termination grace.
        slack: Duration,
    },
}

/// What a sweep does with one listed object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SweepAction {
    /// Rendered this pass, or not the owner's: left alone.
    Keep,
    /// Already going (a prune does not ask twice).
    Going,
    /// Already going in a teardown, which waits for it to be gone without asking again.
    Waiting,
    /// Deleted; `wait` when the teardown waits for it to be gone.
    Delete {
        /// In the foreground (its Pods first).
        foreground: bool,
        /// The teardown is held until it is gone.
        wait: bool,
    },
    /// Past its Pods' termination grace plus the slack: left to the garbage collector.
    Abandon {
        /// The Pods' termination grace the workload declares.
        grace: Duration,
    },
}

/// What a sweep does with `object` of `kind`, owned by `owner_uid`, when the pass recorded
/// `kept` (names of that kind).
pub fn sweep_action(
    object: &DynamicObject,
    kind: &ObjectKind,
    owner_uid: &str,
    kept: &BTreeSet<String>,
    how: Sweep,
) -> SweepAction {
    let owned = object.owner_references().iter().any(|o| o.uid == owner_uid)
        || object
            .labels()
            .get(kvcache_render::objects::backend::OWNER_LABEL)
            == Some(&owner_uid.into());
    if !owned || kept.contains(&object.name_any()) {
        return SweepAction::Keep;
    }
    match how {
        Sweep::Prune if object.meta().deletion_timestamp.is_some() => SweepAction::Going,
        Sweep::Prune => SweepAction::Delete {
            foreground: false,
            wait: false,
        },
        Sweep::Teardown { .. } if !kind.workload => SweepAction::Delete {
            foreground: false,
            wait: false,
        },
        Sweep::Teardown { elapsed, slack } => {
            let grace = Duration::from_secs(
                object.data["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
                    .as_u64()
                    .unwrap_or(30),
            );
            if elapsed > grace + slack {
                SweepAction::Abandon { grace }
            } else if object.meta().deletion_timestamp.is_some() {
                SweepAction::Waiting
            } else {
                SweepAction::Delete {
                    foreground: true,
                    wait: true,
                }
            }
        }
    }
}

/// What a sweep left: the objects a teardown waits for, and those it abandoned.
#[derive(Debug, Default)]
pub struct Swept {
    /// `Kind name` of each object still going.
    pub waiting: Vec<String>,
    /// Each abandoned workload, its kind and its Pods' termination grace.
    pub abandoned: Vec<(ObjectReference, String, Duration)>,
}

/// A namespaced kind an applied set can apply.
pub trait Owned:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + Serialize
    + DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> Owned for K where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug
{
}

/// The objects one owner's pass applied, in one namespace.
pub struct AppliedSet {
    client: Client,
    namespace: String,
    owner_uid: String,
    /// The label selector that finds the owner's objects of any kind.
    selector: String,
    /// `(kind, name)` of every object applied or kept this pass.
    kept: BTreeSet<(String, String)>,
    /// Kinds the sweep leaves alone this pass.
    untouched: BTreeSet<String>,
}

impl AppliedSet {
    /// An empty set for the owner with uid `owner_uid`, whose objects in `namespace` carry
    /// `selector`.
    pub fn new(client: Client, namespace: &str, owner_uid: &str, selector: String) -> Self {
        AppliedSet {
            client,
            namespace: namespace.to_owned(),
            owner_uid: owner_uid.to_owned(),
            selector,
            kept: BTreeSet::new(),
            untouched: BTreeSet::new(),
        }
    }

    /// Writes every object of `set` in its order, records it, and leaves the kinds it leaves.
    pub async fn write(&mut self, set: &DesiredSet) -> Result<(), Error> {
        for kind in &set.left {
            self.untouched.insert(kind.kind.to_owned());
        }
        for object in &set.objects {
            self.write_one(object).await?;
        }
        Ok(())
    }

    /// Writes one object as its [`Write`] says and records it.
    async fn write_one(&mut self, object: &Desired) -> Result<(), Error> {
        let resource = resource(&object.kind);
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, &resource);
        let body = object.json()?;
        let what = object.to_string();
        let exists = match object.write {
            Write::Apply => false,
            // Left as it is: recorded, so that the sweep spares it.
            Write::Keep => true,
            Write::CreateOnce => api
                .get_opt(&object.name)
                .await
                .map_err(kerr("get", what.clone()))?
                .is_some(),
        };
        if !exists {
            api.patch(
                &object.name,
                &PatchParams::apply(crate::context::MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(kerr("apply", what))?;
        }
        self.kept
            .insert((object.kind.kind.to_owned(), object.name.clone()));
        Ok(())
    }

    /// Lists the owner's objects of each kind in `kinds` and deletes those not recorded, as
    /// [`sweep_action`] decides.
    pub async fn sweep(&self, kinds: &[ObjectKind], how: Sweep) -> Result<Swept, Error> {
        let mut swept = Swept::default();
        for kind in kinds {
            let name = kind.kind.to_owned();
            let resource = resource(kind);
            if self.untouched.contains(&name) {
                continue;
            }
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &self.namespace, &resource);
            let listed = api
                .list(&ListParams::default().labels(&self.selector))
                .await
                .map_err(kerr("list", format!("{name}s of {}", self.owner_uid)))?;
            let kept: BTreeSet<String> = self
                .kept
                .iter()
                .filter(|(k, _)| *k == name)
                .map(|(_, n)| n.clone())
                .collect();
            for o in listed {
                let object = o.name_any();
                match sweep_action(&o, kind, &self.owner_uid, &kept, how) {
                    SweepAction::Keep | SweepAction::Going => {}
                    SweepAction::Waiting => swept.waiting.push(format!("{name} {object}")),
                    SweepAction::Abandon { grace } => {
                        swept
                            .abandoned
                            .push((o.object_ref(&resource), name.clone(), grace));
                    }
                    SweepAction::Delete { foreground, wait } => {
                        if how == Sweep::Prune {
                            info!(kind = %name, name = %object, "pruning an object the render no longer returns");
                        }
                        let params = if foreground {
                            DeleteParams::foreground()
                        } else {
                            DeleteParams::default()
                        };
                        if super::shared::delete(&api, &name, &object, &params).await? && wait {
                            swept.waiting.push(format!("{name} {object}"));
                        }
                    }
                }
            }
        }
        Ok(swept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Service;

    fn object(name: &str, owner: &str, deleting: bool, grace: Option<u64>) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": name, "namespace": "ns",
                "ownerReferences": [{"apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
                    "name": "b", "uid": owner, "controller": true}],
                "deletionTimestamp": deleting.then_some("2026-01-01T00:00:00Z"),
            },
            "spec": {"template": {"spec": {"terminationGracePeriodSeconds": grace}}}
        }))
        .expect("an object")
    }

    #[test]
    fn a_prune_deletes_only_the_owners_objects_the_pass_did_not_record() {
        let kind = ObjectKind::workload::<Deployment>();
        let kept = BTreeSet::from(["leader".to_owned()]);
        let act = |o: &DynamicObject| sweep_action(o, &kind, "u", &kept, Sweep::Prune);
        assert_eq!(act(&object("leader", "u", false, None)), SweepAction::Keep);
        assert_eq!(
            act(&object("other", "someone", false, None)),
            SweepAction::Keep
        );
        assert_eq!(act(&object("old", "u", true, None)), SweepAction::Going);
        assert_eq!(
            act(&object("old", "u", false, None)),
            SweepAction::Delete {
                foreground: false,
                wait: false
            }
        );
    }

    #[test]
    fn a_teardown_waits_for_a_workload_within_its_grace_and_then_abandons_it() {
        let kept = BTreeSet::new();
        let teardown = |elapsed| Sweep::Teardown {
            elapsed: Duration::from_secs(elapsed),
            slack: Duration::from_secs(120),
        };
        let workload = ObjectKind::workload::<Deployment>();
        assert_eq!(
            sweep_action(
                &object("leader", "u", false, Some(60)),
                &workload,
                "u",
                &kept,
                teardown(100)
            ),
            SweepAction::Delete {
                foreground: true,
                wait: true
            }
        );
        // Once going, waited for without a second request.
        let o = object("leader", "u", true, Some(60));
        assert_eq!(
            sweep_action(&o, &workload, "u", &kept, teardown(100)),
            SweepAction::Waiting
        );
        assert_eq!(
            sweep_action(&o, &workload, "u", &kept, teardown(181)),
            SweepAction::Abandon {
                grace: Duration::from_secs(60)
            }
        );
        // Without a declared grace, Kubernetes' 30 s.
        let o = object("leader", "u", true, None);
        assert!(matches!(
            sweep_action(&o, &workload, "u", &kept, teardown(151)),
            SweepAction::Abandon { .. }
        ));
        // A Service is deleted and not waited for.
        let service = ObjectKind::of::<Service>();
        assert_eq!(
            sweep_action(&o, &service, "u", &kept, teardown(1000)),
            SweepAction::Delete {
                foreground: false,
                wait: false
            }
        );
    }
}
