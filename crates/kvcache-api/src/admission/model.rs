//! ModelDeployment and InstanceType admission.

use std::collections::BTreeSet;

use super::verdict::{Admission, Verdict};
use crate::model::InstanceType;
use crate::model::ModelDeployment;
use crate::names::is_dns_label;
use crate::quantity::parse_millicores;
use crate::settings::Settings;

impl Admission for ModelDeployment {
    fn validate_create(&self, _: &Settings) -> Verdict {
        let mut v = Verdict::default();
        md_static(self, &mut v);
        v
    }

    fn validate_update(&self, old: &Self, _: &Settings) -> Verdict {
        let mut v = Verdict::default();
        md_static(self, &mut v);
        let (n, o) = (&self.spec, &old.spec);
        let frozen = [
            ("spec.model", n.model != o.model, "a different model"),
            (
                "spec.engine.name",
                n.engine.name != o.engine.name,
                "a different engine",
            ),
            (
                "spec.kvCache",
                n.kv_cache != o.kv_cache,
                "attaching, detaching or re-pointing the cache",
            ),
        ];
        for (field, changed, what) in frozen {
            if changed {
                v.refuse(
                    field,
                    format!("cannot be edited: {what} means a new ModelDeployment"),
                );
            }
        }
        let set = |roles: &[crate::model::Role]| -> BTreeSet<(String, &'static str)> {
            roles
                .iter()
                .map(|r| (r.name.clone(), r.kind.as_str()))
                .collect()
        };
        if set(&n.roles) != set(&o.roles) {
            v.refuse(
                "spec.roles",
                "the role set (names and kinds) cannot be edited: a different set means a new ModelDeployment",
            );
        }
        v
    }
}

fn md_static(md: &ModelDeployment, v: &mut Verdict) {
    let s = &md.spec;
    if s.model.name.trim().is_empty() {
        v.refuse("spec.model.name", "must name the model to serve");
    }
    if let Some(kv) = &s.kv_cache {
        let name = &kv.pool_ref.name;
        if name.is_empty() {
            v.refuse(
                "spec.kvCache.poolRef.name",
                "must name a KVCachePoolBinding in this namespace",
            );
        } else if name.contains('/') {
            v.refuse(
                "spec.kvCache.poolRef.name",
                "names a KVCachePoolBinding in this namespace; another namespace's Binding (or a pool) cannot be named: ask an administrator for a Binding here",
            );
        }
    }
    if !(1..=10).contains(&s.roles.len()) {
        v.refuse("spec.roles", "must hold 1 to 10 roles");
    }
    let mut names = BTreeSet::new();
    for (i, r) in s.roles.iter().enumerate() {
        let rf = format!("spec.roles[{i}]");
        if !is_dns_label(&r.name) {
            v.refuse(
                format!("{rf}.name"),
                "must be a DNS label (lowercase letters, digits and '-')",
            );
        }
        if !names.insert(r.name.as_str()) {
            v.refuse(format!("{rf}.name"), format!("{} is listed twice", r.name));
        }
        if !(0..=1024).contains(&r.replicas) {
            v.refuse(format!("{rf}.replicas"), "must be between 0 and 1024");
        }
        if !(1..=64).contains(&r.size) {
            v.refuse(format!("{rf}.size"), "must be between 1 and 64");
        }
        if r.instance_type.is_empty() {
            v.refuse(
                format!("{rf}.instanceType"),
                "must name an InstanceType (kubectl get instancetype)",
            );
        }
        if r.resources
            .as_ref()
            .and_then(|res| res.accelerator)
            .is_some_and(|a| a < 0)
        {
            v.refuse(
                format!("{rf}.resources.accelerator"),
                "must not be negative",
            );
        }
    }
    let version_missing = s
        .engine
        .version
        .as_deref()
        .is_none_or(|v| v.trim().is_empty());
    if version_missing && s.roles.iter().any(|r| r.image.is_none()) {
        v.refuse(
            "spec.engine.version",
            "is required when a role names no image: it picks the runner image and the store client it carries",
        );
    }
}

// ---------------------------------------------------------------------------------------------
// InstanceType

impl Admission for InstanceType {
    fn validate_create(&self, _: &Settings) -> Verdict {
        let mut v = Verdict::default();
        if let Err(e) = self.spec.resources.memory.bytes("spec.resources.memory") {
            v.refuse("spec.resources.memory", e.to_string());
        }
        if let Err(e) = parse_millicores(&self.spec.resources.cpu.0) {
            v.refuse(
                "spec.resources.cpu",
                format!("must be a CPU quantity such as 8 or 7500m: {e}"),
            );
        }
        if let Some(a) = &self.spec.accelerator
            && a.resource_name.trim().is_empty()
        {
            v.refuse(
                "spec.accelerator.resourceName",
                "must name the extended resource, e.g. nvidia.com/gpu",
            );
        }
        v
    }

    fn validate_update(&self, _: &Self, settings: &Settings) -> Verdict {
        self.validate_create(settings)
    }
}
