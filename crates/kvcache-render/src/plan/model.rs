//! One pass of the ModelDeployment controller, decided: how its `kvCache.poolRef` resolves in
//! the [`World`], the role objects to apply, or why none are (what runs then stays as it is:
//! docs/design.md#rollout-held-by-cache), the status and the events. The operator reads once
//! ([`ModelRead`]), calls [`plan`] once, then writes what it says ([`ModelPlan`]).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kvcache_api::condition::Cond;
use kvcache_api::model::{InstanceType, ModelDeploymentStatus, SharedCacheStatus};
use kvcache_api::{KVCachePoolBinding, ModelDeployment, Settings};

use crate::error::Error;
use crate::objects::attachment::{Environment, attachment_on};
use crate::objects::desired::{DesiredSet, ObjectKind};
use crate::objects::model::{ModelInputs, ModelObjects, render};
use crate::observe::shared_cache::{self, Engines};
use crate::status::events::{self, Note};
use crate::status::model::{
    ForeignObject, ModelObservation, Resolution, RoleObservation, model_deployment_status,
};
use crate::world::World;

/// What a pass does with a ModelDeployment's roles.
#[derive(Debug)]
pub struct RolesPlan {
    /// How its `kvCache.poolRef` resolved.
    pub resolution: Resolution,
    /// The role objects to apply (what the set no longer holds is swept); `None`: nothing is
    /// applied this pass.
    pub objects: Option<ModelObjects>,
    /// Why the roles could not be attached or rendered.
    pub refusal: Option<Refusal>,
    /// No cache connection resolved, so nothing was rendered.
    pub held: bool,
}

/// Why a deployment's roles were not rendered.
#[derive(Debug)]
pub enum Refusal {
    /// The cluster settings were refused and none were read before; why they were.
    SettingsUnreadable(String),
    /// The attachment or the render failed.
    Failed(Error),
}

impl Refusal {
    /// The condition reason and message `CacheAttached` shows.
    pub fn condition(&self) -> (&'static str, String) {
        match self {
            Refusal::SettingsUnreadable(why) => (
                "SettingsUnreadable",
                format!(
                    "{why}; no settings were read since the operator started, so the roles are left as they are until it is fixed"
                ),
            ),
            Refusal::Failed(e) => (e.reason(), e.to_string()),
        }
    }
}

/// Decides the roles' objects of `md` from `world`, the cluster settings in force (`None`:
/// refused and none read before, `refused` saying why) and the InstanceTypes: what the
/// controller's [`plan`] and the offline `kvcache-operator render` apply.
pub fn roles(
    md: &ModelDeployment,
    world: &World,
    settings: Option<&Settings>,
    refused: Option<String>,
    namespace: &str,
    instance_types: &BTreeMap<String, InstanceType>,
) -> RolesPlan {
    let (resolution, reached) = world.resolve(md);
    let mut plan = RolesPlan {
        resolution,
        objects: None,
        refusal: None,
        held: false,
    };
    let Some(settings) = settings else {
        plan.refusal = Some(Refusal::SettingsUnreadable(refused.unwrap_or_default()));
        return plan;
    };
    let env = Environment {
        namespace,
        settings,
    };
    let attachment = match reached {
        Some((b, backend)) => {
            let name = b.metadata.name.as_deref().unwrap_or_default();
            match attachment_on(name, b, backend, &env) {
                Ok(a) => Some(a),
                Err(e) => {
                    plan.refusal = Some(Refusal::Failed(e));
                    None
                }
            }
        }
        None => None,
    };
    if md.spec.kv_cache.is_some() && attachment.is_none() {
        plan.held = true;
        return plan;
    }
    match render(&ModelInputs {
        deployment: md,
        instance_types,
        attachment: attachment.as_ref(),
    }) {
        Ok(objects) => plan.objects = Some(objects),
        Err(e) => plan.refusal = Some(Refusal::Failed(e)),
    }
    plan
}

/// An object of the deployment's namespace that bears the name of one the roles render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Existing {
    /// `Deployment`, `Service` or `NetworkPolicy`.
    pub kind: &'static str,
    /// Its name.
    pub name: String,
    /// Its controller's uid (`ownerReferences[].controller: true`), if any.
    pub controller_uid: Option<String>,
    /// Its controller as `Kind name`, if any, for the message.
    pub controller: Option<String>,
}

/// Which of the rendered `objects` would take over an existing object the deployment
/// (`owner_uid`) does not control; those are taken out of `objects`, so a pass never applies
/// over, nor sweeps, what is someone else's.
pub(crate) fn leave_foreign(
    objects: &mut ModelObjects,
    existing: &[Existing],
    owner_uid: &str,
) -> Vec<ForeignObject> {
    let rendered = objects.desired();
    let foreign: Vec<ForeignObject> = existing
        .iter()
        .filter(|e| e.controller_uid.as_deref() != Some(owner_uid))
        .filter(|e| {
            rendered
                .objects
                .iter()
                .any(|o| o.kind.kind == e.kind && o.name == e.name)
        })
        .map(|e| ForeignObject {
            kind: e.kind,
            name: e.name.clone(),
            controller: e.controller.clone(),
        })
        .collect();
    let taken = |kind: &str, name: Option<&String>| {
        foreign
            .iter()
            .any(|f| f.kind == kind && Some(&f.name) == name)
    };
    objects
        .deployments
        .retain(|d| !taken("Deployment", d.metadata.name.as_ref()));
    objects
        .services
        .retain(|s| !taken("Service", s.metadata.name.as_ref()));
    objects
        .network_policies
        .retain(|p| !taken("NetworkPolicy", p.metadata.name.as_ref()));
    foreign
}

/// The objects the roles render (none while they are held or refused), kind by kind in the
/// order of [`crate::objects::model::MODEL_KINDS`]: what a pass reads before it plans, to leave
/// alone what is someone else's ([`leave_foreign`]).
pub fn object_names(roles: &RolesPlan) -> Vec<(ObjectKind, String)> {
    let Some(objects) = &roles.objects else {
        return Vec::new();
    };
    let desired = objects.desired();
    desired
        .kinds
        .iter()
        .flat_map(|kind| {
            desired
                .objects
                .iter()
                .filter(move |o| o.kind.kind == kind.kind)
                .map(|o| (o.kind, o.name.clone()))
        })
        .collect()
}

/// What the engines of a deployment are and how many are ready, from how its roles resolved
/// and its role Deployments: whether a pass reads their `/metrics`
/// (`crate::observe::shared_cache::engines`).
pub fn engines(md: &ModelDeployment, roles: &RolesPlan, owned: &[Deployment]) -> Engines {
    shared_cache::engines(
        md.spec.engine.name,
        &roles.resolution,
        &role_observations(md, owned),
    )
}

/// Each role as its Deployment (among `owned`, the deployment's own) reports it.
pub(crate) fn role_observations(
    md: &ModelDeployment,
    owned: &[Deployment],
) -> Vec<RoleObservation> {
    md.spec
        .roles
        .iter()
        .map(|r| {
            let d = owned.iter().find(|d| {
                d.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(crate::names::COMPONENT_LABEL))
                    == Some(&crate::names::label_value(&r.name))
            });
            let counts = d.map(crate::observe::read::replicas).unwrap_or_default();
            RoleObservation {
                name: r.name.clone(),
                desired: r.replicas,
                ready: counts.ready,
                updated: counts.updated,
                total: counts.total,
                observed: counts.observed,
                unmanaged: !r.command.is_empty(),
            }
        })
        .collect()
}

/// What the deployment's engines showed this pass: `status.sharedCache` and the conditions
/// read from their counters (`crate::observe::shared_cache`).
#[derive(Clone, Debug, Default)]
pub struct EngineFigures {
    /// `status.sharedCache`, once an engine was read.
    pub shared_cache: Option<SharedCacheStatus>,
    /// `SharedCacheObserved`, and for engines that count `SharedCacheHealthy` and
    /// `PrefillPriced`.
    pub conditions: Vec<Cond>,
}

/// What one pass read for a ModelDeployment (every read done before anything is decided), with
/// its roles rendered once ([`roles`]): what is read depends on what they render.
#[derive(Debug)]
pub struct ModelRead<'a> {
    /// The deployment.
    pub deployment: &'a ModelDeployment,
    /// Its Binding, pool and backend, the InstanceTypes.
    pub world: &'a World,
    /// Its roles as [`roles`] resolved and rendered them.
    pub roles: RolesPlan,
    /// The objects of the deployment's namespace bearing the names of [`object_names`].
    pub existing: &'a [Existing],
    /// The role Deployments the deployment owns.
    pub owned: &'a [Deployment],
    /// What its engines showed.
    pub engines: EngineFigures,
    /// The time of this pass.
    pub now: Time,
}

/// What one pass does for a ModelDeployment.
#[derive(Clone, Debug)]
pub struct ModelPlan {
    /// The role objects to write, in order (what the set no longer holds is swept); `None`:
    /// nothing is written this pass.
    pub desired: Option<DesiredSet>,
    /// What the write did, recorded right after it (a name left alone: NameTaken).
    pub written: Vec<Note>,
    /// The status to write.
    pub status: ModelDeploymentStatus,
    /// The status's transitions, recorded once it is written.
    pub events: Vec<Note>,
}

/// Decides one pass for the deployment from what was read.
pub fn plan(read: ModelRead<'_>) -> ModelPlan {
    let md = read.deployment;
    let roles = read.roles;
    let mut foreign = Vec::new();
    let desired = roles.objects.map(|mut objects| {
        // Never over what is someone else's (docs/design.md#model-objects-owned).
        foreign = leave_foreign(
            &mut objects,
            read.existing,
            md.metadata.uid.as_deref().unwrap_or_default(),
        );
        objects.desired()
    });
    let binding = match &roles.resolution {
        Resolution::Resolved { .. } => read.world.chain_of_model(md).binding,
        _ => None,
    };
    let obs = ModelObservation {
        tenant_charged: binding.and_then(tenant_charged),
        refusal: roles.refusal.as_ref().map(Refusal::condition),
        roles: role_observations(md, read.owned),
        held: roles.held,
        deleting: md.metadata.deletion_timestamp.is_some(),
        missing_instance_types: md
            .spec
            .roles
            .iter()
            .filter(|r| read.world.instance_type(&r.instance_type).is_none())
            .map(|r| (r.name.clone(), r.instance_type.clone()))
            .collect(),
        foreign,
        resolution: roles.resolution,
    };
    let status = model_deployment_status(
        md,
        &obs,
        binding.map(|b| &b.spec.domain),
        read.engines.shared_cache.clone(),
        read.engines.conditions.clone(),
        &read.now,
    );
    let before = md.status.clone().unwrap_or_default();
    ModelPlan {
        desired,
        written: events::name_taken(&obs.foreign).into_iter().collect(),
        events: events::model_events(&before, &status),
        status,
    }
}

/// What the store charges the Binding's domain, as the pool's last reading of the master's
/// ledger put it on the Binding (`status.usage`): observed, never inferred from rendered flags.
fn tenant_charged(b: &KVCachePoolBinding) -> Option<u64> {
    b.status
        .as_ref()
        .and_then(|s| s.usage.as_ref())
        .and_then(|q| kvcache_api::quantity::parse_bytes(&q.0).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world(names: &[&str]) -> World {
        let mut objects = Vec::new();
        for name in names {
            let path = format!("{}/tests/inputs/{name}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).expect("input");
            objects.extend(
                kvcache_api::manifest::parse(&path, &text)
                    .expect("input parses")
                    .into_iter()
                    .map(|m| m.object),
            );
        }
        World::from_objects(&objects)
    }

    fn model(world: &World) -> ModelDeployment {
        world.models().next().expect("a ModelDeployment").clone()
    }

    /// The plan of `md` in `w` under the default settings.
    fn settled(md: &ModelDeployment, w: &World) -> RolesPlan {
        let settings = Settings::default();
        roles(
            md,
            w,
            Some(&settings),
            None,
            "gpustack-system",
            &w.instance_type_map(),
        )
    }

    #[test]
    fn a_deployment_whose_binding_does_not_resolve_is_held_and_renders_nothing() {
        let mut w = world(&["walkthrough-model-with-cache.yaml"]);
        let md = model(&w);
        let resolved = settled(&md, &w);
        assert!(
            matches!(resolved.resolution, Resolution::Resolved { .. }),
            "{:?}",
            resolved.resolution
        );
        assert!(resolved.objects.is_some());
        let binding = md
            .spec
            .kv_cache
            .as_ref()
            .expect("kvCache")
            .pool_ref
            .name
            .clone();
        w.remove_binding("team-a", &binding);
        let p = settled(&md, &w);
        assert!(p.held);
        assert!(p.objects.is_none());
        assert!(matches!(p.resolution, Resolution::BindingNotFound { .. }));
    }

    #[test]
    fn without_settings_nothing_is_rendered_and_the_refusal_says_why() {
        let w = world(&["walkthrough-model-without-cache.yaml"]);
        let md = model(&w);
        let p = roles(
            &md,
            &w,
            None,
            Some("a refused key".into()),
            "gpustack-system",
            &w.instance_type_map(),
        );
        assert!(p.objects.is_none());
        let (reason, message) = p.refusal.expect("a refusal").condition();
        assert_eq!(reason, "SettingsUnreadable");
        assert!(message.starts_with("a refused key;"), "{message}");
    }

    #[test]
    fn an_object_of_the_same_name_that_is_not_the_deployments_is_left_alone() {
        let w = world(&["walkthrough-model-without-cache.yaml"]);
        let md = model(&w);
        let mut objects = settled(&md, &w).objects.expect("role objects");
        let deployment = objects.deployments[0]
            .metadata
            .name
            .clone()
            .expect("a name");
        let service = objects.services[0].metadata.name.clone().expect("a name");
        let existing = [
            Existing {
                kind: "Deployment",
                name: deployment.clone(),
                controller_uid: Some("md-uid".into()),
                controller: Some("ModelDeployment x".into()),
            },
            Existing {
                kind: "Service",
                name: service.clone(),
                controller_uid: None,
                controller: None,
            },
        ];
        let before = objects.deployments.len();
        let foreign = leave_foreign(&mut objects, &existing, "md-uid");
        assert_eq!(
            foreign,
            [ForeignObject {
                kind: "Service",
                name: service,
                controller: None
            }]
        );
        assert!(objects.services.is_empty(), "the Service is not applied");
        assert_eq!(objects.deployments.len(), before, "its own Deployment is");
        // Only what the roles render counts: an existing object of a name no role renders
        // any more is not named.
        let mut objects = settled(&md, &w).objects.expect("role objects");
        let foreign = leave_foreign(&mut objects, &existing, "another-uid");
        assert_eq!(foreign.len(), 2);
        assert!(
            objects
                .deployments
                .iter()
                .all(|d| d.metadata.name.as_ref() != Some(&deployment))
        );
    }

    #[test]
    fn a_deployment_without_a_cache_renders_its_roles() {
        let w = world(&["walkthrough-model-without-cache.yaml"]);
        let md = model(&w);
        let p = settled(&md, &w);
        assert_eq!(p.resolution, Resolution::NotApplicable);
        let objects = p.objects.expect("role objects");
        assert_eq!(objects.deployments.len(), md.spec.roles.len());
        assert!(!p.held && p.refusal.is_none());
    }

    /// A pass of `md` in `w` with `existing` objects of its names and no role Deployment yet.
    fn pass(md: &ModelDeployment, w: &World, existing: &[Existing]) -> ModelPlan {
        plan(ModelRead {
            deployment: md,
            world: w,
            roles: settled(md, w),
            existing,
            owned: &[],
            engines: EngineFigures::default(),
            now: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        })
    }

    #[test]
    fn one_pass_writes_the_policies_first_and_warns_of_a_name_it_left_alone() {
        let w = world(&["walkthrough-model-without-cache.yaml"]);
        let mut md = model(&w);
        md.metadata.uid = Some("md-uid".into());
        let p = pass(&md, &w, &[]);
        let desired = p.desired.expect("role objects");
        let kinds: Vec<&str> = desired.objects.iter().map(|o| o.kind.kind).collect();
        let first_other = kinds
            .iter()
            .position(|k| *k != "NetworkPolicy")
            .expect("a Deployment");
        assert!(
            kinds[first_other..].iter().all(|k| *k != "NetworkPolicy"),
            "every policy before the Pods it closes: {kinds:?}"
        );
        assert_eq!(desired.kinds, crate::objects::model::MODEL_KINDS);
        assert!(p.written.is_empty());

        let service = crate::names::object(md.metadata.name.as_deref().unwrap_or_default(), "");
        let taken = [Existing {
            kind: "Service",
            name: service.clone(),
            controller_uid: Some("someone".into()),
            controller: Some("Deployment x".into()),
        }];
        let p = pass(&md, &w, &taken);
        let desired = p.desired.expect("role objects");
        assert!(
            desired
                .objects
                .iter()
                .all(|o| !(o.kind.kind == "Service" && o.name == service)),
            "the Service of another is not written"
        );
        let note = p
            .written
            .iter()
            .find(|n| n.reason == "NameTaken")
            .expect("a NameTaken warning");
        assert!(
            note.message
                .starts_with(&format!("Service {service} exists"))
        );
        assert!(
            p.status
                .conditions
                .iter()
                .any(|c| c.reason == "NameTaken" || c.message.contains(&service)),
            "the status names it: {:?}",
            p.status.conditions
        );
    }
}
