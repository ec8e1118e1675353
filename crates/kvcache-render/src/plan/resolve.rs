//! Offline resolution, as the operator resolves references on a cluster: backends get their image
//! and tenant policy, deployments their Binding, pool and backend. What `kvcache-operator render`
//! prints.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use kvcache_api::manifest::Object;
use kvcache_api::{KVCacheBackend, ModelDeployment};
use kvcache_quota::policy;

use crate::error::Error;
pub use crate::objects::attachment::Environment;
use crate::objects::attachment::attachment_on;
use crate::objects::backend::StoreAccess;
use crate::objects::model::Attachment;
use crate::plan::backend::{self as backend_plan, BackendRead};
use crate::plan::model::{self as model_plan, Refusal};
use crate::world::{Resolution, World};

/// The namespace the operator is installed into when `--namespace` is not given.
pub const DEFAULT_NAMESPACE: &str = "gpustack-system";
/// The operator image `cargo xtask manifests` writes into `deploy/operator.yaml` and the chart.
pub const DEFAULT_OPERATOR_IMAGE: &str = "gpustack/kvcache-operator:0.1.0";

pub use crate::objects::backend::store_image;

/// Each object of `desired` as a YAML document, in its order.
fn to_docs(
    docs: &mut Vec<serde_yaml::Value>,
    errors: &mut Vec<Error>,
    desired: &crate::objects::desired::DesiredSet,
) {
    for o in &desired.objects {
        match o.yaml() {
            Ok(v) => docs.push(v),
            Err(e) => errors.push(e),
        }
    }
}

/// Renders every object the operator would create for `objects` on a cluster where none runs
/// yet, through the controllers' own plans (`crate::plan::backend::plan`,
/// `crate::plan::model::roles`), in the order a pass writes them; errors name what does not
/// resolve.
pub fn render_all(
    objects: &[Object],
    env: &Environment<'_>,
) -> Result<Vec<serde_yaml::Value>, Vec<Error>> {
    let world = World::from_objects(objects);
    let mut docs = Vec::new();
    let mut errors = Vec::new();
    for b in world.backends() {
        match backend_objects(&world, b, env) {
            Ok(Some(desired)) => to_docs(&mut docs, &mut errors, &desired),
            Ok(None) => {}
            Err(e) => errors.extend(e),
        }
    }
    let instance_types = world.instance_type_map();
    for md in world.models() {
        let ns = md.metadata.namespace.as_deref().unwrap_or("default");
        let plan = model_plan::roles(
            md,
            &world,
            Some(env.settings),
            None,
            env.namespace,
            &instance_types,
        );
        match (plan.objects, plan.refusal, &md.spec.kv_cache) {
            (Some(o), _, _) => to_docs(&mut docs, &mut errors, &o.desired()),
            (None, Some(Refusal::Failed(e)), _) => errors.push(e),
            // Held: a Binding being deleted, or the first missing link.
            (None, _, Some(_)) if let Resolution::BindingDeleted { binding } = &plan.resolution => {
                errors.push(Error::BindingDeleted {
                    deployment: format!("{ns}/{}", md.metadata.name.as_deref().unwrap_or_default()),
                    binding: binding.clone(),
                });
            }
            (None, _, Some(kv)) => {
                if let Err(e) = attachment(&world, md, ns, &kv.pool_ref.name, env) {
                    errors.push(e);
                }
            }
            (None, _, None) => {}
        }
    }
    if errors.is_empty() {
        Ok(docs)
    } else {
        Err(errors)
    }
}

/// What a managed backend's pass writes on a cluster where nothing of it runs yet (`None` for
/// an external backend), or what keeps it from rendering: a Binding it cannot read, a refused
/// tenant policy, no store image.
fn backend_objects(
    world: &World,
    b: &KVCacheBackend,
    env: &Environment<'_>,
) -> Result<Option<crate::objects::desired::DesiredSet>, Vec<Error>> {
    let name = b.metadata.name.clone().unwrap_or_default();
    if b.spec.connection.managed.is_none() {
        return Ok(None);
    }
    let (ceilings, mut problems) = world.ceilings_on(&name);
    if let Err(e) = policy::render(&name, &ceilings) {
        problems.push(e.into());
    }
    if store_image(b, env.settings).is_none() {
        problems.push(Error::NoStoreImage {
            backend: name.clone(),
        });
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let nothing = BTreeMap::new();
    let plan = backend_plan::plan(&BackendRead {
        backend: b,
        namespace: env.namespace,
        // What an operator in a Pod applies (no `--store-admin-from` or
        // `--store-metrics-from`).
        access: &StoreAccess::IN_CLUSTER,
        settings: Some(env.settings),
        settings_refused: None,
        world,
        deployments: &[],
        daemon_sets: &[],
        stateful_sets: &[],
        lease: None,
        store_pods: &[],
        nodes: &[],
        store: None,
        jobs: BTreeMap::new(),
        pods_at: &nothing,
        drain_unknown: true,
        probe_pods: &[],
        probe: false,
        now: Timestamp::UNIX_EPOCH,
    })
    .map_err(|e| vec![e])?;
    Ok(plan.desired())
}

/// The attachment a ModelDeployment's `kvCache.poolRef` gives, or the first missing link.
fn attachment(
    world: &World,
    md: &ModelDeployment,
    ns: &str,
    binding: &str,
    env: &Environment<'_>,
) -> Result<Attachment, Error> {
    let links = world
        .reach(ns, binding)
        .map_err(|link| crate::world::missing_error(link, md))?;
    attachment_on(binding, links.binding, links.backend, env)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcache_api::Settings;

    /// Every input of the render snapshots, as one World each.
    fn inputs() -> Vec<(String, World)> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/inputs");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).expect("inputs") {
            let path = entry.expect("an input").path();
            let text = std::fs::read_to_string(&path).expect("input");
            let objects: Vec<Object> =
                kvcache_api::manifest::parse(&path.display().to_string(), &text)
                    .expect("input parses")
                    .into_iter()
                    .map(|m| m.object)
                    .collect();
            out.push((path.display().to_string(), World::from_objects(&objects)));
        }
        out
    }

    /// An owner's sweep lists every kind its pass writes: a kind added to a render without its
    /// place in the owner's kinds would be applied and never swept.
    #[test]
    fn every_kind_a_pass_writes_is_one_its_sweep_lists() {
        let settings = Settings::default();
        let env = Environment {
            namespace: "gpustack-system",
            settings: &settings,
        };
        let mut seen = 0;
        for (name, world) in inputs() {
            let mut sets = Vec::new();
            for b in world.backends() {
                if let Ok(Some(set)) = backend_objects(&world, b, &env) {
                    sets.push(set);
                }
            }
            let instance_types = world.instance_type_map();
            for md in world.models() {
                let plan = model_plan::roles(
                    md,
                    &world,
                    Some(&settings),
                    None,
                    env.namespace,
                    &instance_types,
                );
                sets.extend(plan.objects.map(|o| o.desired()));
            }
            for set in sets {
                for o in &set.objects {
                    seen += 1;
                    assert!(
                        set.kinds
                            .iter()
                            .any(|k| k.kind == o.kind.kind && k.api_version == o.kind.api_version),
                        "{name}: {o} is written but its kind is not swept ({:?})",
                        set.kinds.iter().map(|k| k.kind).collect::<Vec<_>>()
                    );
                }
            }
        }
        assert!(seen > 100, "{seen} objects checked");
    }

    /// A deployment whose Binding is being deleted renders nothing offline, as the controller
    /// holds it, and says why instead of printing nothing.
    #[test]
    fn a_deployment_on_a_binding_being_deleted_is_named_not_rendered() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/inputs/walkthrough-model-with-cache.yaml"
        );
        let text = std::fs::read_to_string(path).expect("input");
        let mut objects: Vec<Object> = kvcache_api::manifest::parse(path, &text)
            .expect("input parses")
            .into_iter()
            .map(|m| m.object)
            .collect();
        for o in &mut objects {
            if let Object::Binding(b) = o {
                b.metadata.deletion_timestamp = Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
                );
            }
        }
        let settings = Settings::default();
        let env = Environment {
            namespace: "gpustack-system",
            settings: &settings,
        };
        let errors = render_all(&objects, &env).expect_err("held");
        assert!(
            errors.iter().any(
                |e| matches!(e, Error::BindingDeleted { .. }) && e.reason() == "BindingDeleted"
            ),
            "{:?}",
            errors.iter().map(ToString::to_string).collect::<Vec<_>>()
        );
    }

    /// What a pass reads before it plans is what its roles render, kind by kind.
    #[test]
    fn a_pass_reads_the_names_its_roles_render() {
        let settings = Settings::default();
        for (name, world) in inputs() {
            for md in world.models() {
                let roles = model_plan::roles(
                    md,
                    &world,
                    Some(&settings),
                    None,
                    "gpustack-system",
                    &world.instance_type_map(),
                );
                let names = model_plan::object_names(&roles);
                let rendered = roles
                    .objects
                    .map(|o| o.desired().objects.len())
                    .unwrap_or_default();
                assert_eq!(names.len(), rendered, "{name}");
                let order: Vec<&str> = names.iter().map(|(k, _)| k.kind).collect();
                let mut sorted = order.clone();
                let rank = |k: &str| {
                    ["Deployment", "Service", "NetworkPolicy"]
                        .iter()
                        .position(|x| *x == k)
                };
                sorted.sort_by_key(|k| rank(k));
                assert_eq!(
                    order, sorted,
                    "{name}: Deployments, then Services, then policies"
                );
            }
        }
    }
}
