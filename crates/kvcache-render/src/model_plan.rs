//! One pass of the ModelDeployment controller, decided: how its `kvCache.poolRef` resolves in
//! the [`World`], and the role objects to apply, or why none are (what runs then stays as it
//! is: docs/design.md#rollout-held-by-cache). The operator reads, calls [`plan`], applies and
//! writes the status.

use std::collections::BTreeMap;

use kvcache_api::model::InstanceType;
use kvcache_api::{ModelDeployment, Settings};

use crate::model::{ModelInputs, ModelObjects, render};
use crate::resolve::{Environment, attachment_on};
use crate::status::model::{ForeignObject, Resolution};
use crate::world::World;

/// What a pass does with a ModelDeployment's roles.
#[derive(Clone, Debug)]
pub struct RolesPlan {
    /// How its `kvCache.poolRef` resolved.
    pub resolution: Resolution,
    /// The role objects to apply (what the set no longer holds is swept); `None`: nothing is
    /// applied this pass.
    pub objects: Option<ModelObjects>,
    /// Why the roles could not be attached or rendered: a condition reason and the message.
    pub refusal: Option<(&'static str, String)>,
    /// No cache connection resolved, so nothing was rendered.
    pub held: bool,
}

/// Decides the roles' objects of `md` from `world`, the cluster settings in force (`None`:
/// refused and none read before, `refused` saying why) and the InstanceTypes.
pub fn plan(
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
        let why = refused.unwrap_or_default();
        plan.refusal = Some((
            "SettingsUnreadable",
            format!(
                "{why}; no settings were read since the operator started, so the roles are left as they are until it is fixed"
            ),
        ));
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
                    plan.refusal = Some((e.reason(), e.to_string()));
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
        Err(e) => plan.refusal = Some((e.reason(), e.to_string())),
    }
    plan
}

/// An object of the deployment's namespace that bears the name of one the roles render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Existing {
    /// `Deployment` or `Service`.
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
pub fn leave_foreign(
    objects: &mut ModelObjects,
    existing: &[Existing],
    owner_uid: &str,
) -> Vec<ForeignObject> {
    let foreign: Vec<ForeignObject> = existing
        .iter()
        .filter(|e| e.controller_uid.as_deref() != Some(owner_uid))
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
        plan(
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
        let p = plan(
            &md,
            &w,
            None,
            Some("a refused key".into()),
            "gpustack-system",
            &w.instance_type_map(),
        );
        assert!(p.objects.is_none());
        let (reason, message) = p.refusal.expect("a refusal");
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
}
