//! Fixtures shared by the kvcache-api tests.
#![allow(dead_code)]

use kvcache_api::manifest::{self, Object};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment};

pub const WALKTHROUGH_BACKEND: &str =
    include_str!("../../../../examples/walkthrough/01-backend.yaml");
pub const WALKTHROUGH_POOL: &str = include_str!("../../../../examples/walkthrough/02-pool.yaml");
pub const WALKTHROUGH_BINDING: &str =
    include_str!("../../../../examples/walkthrough/03-binding.yaml");
pub const WALKTHROUGH_MD: &str =
    include_str!("../../../../examples/walkthrough/05-modeldeployment.yaml");
pub const DISK_HEAVY_BACKEND: &str =
    include_str!("../../../../examples/disk-heavy/01-backend.yaml");

pub fn object(yaml: &str) -> Object {
    let mut docs = manifest::parse("test", yaml).expect("fixture parses");
    assert_eq!(docs.len(), 1, "one document per fixture");
    let m = docs.remove(0);
    assert!(
        m.unknown_fields.is_empty(),
        "unknown fields: {:?}",
        m.unknown_fields
    );
    m.object
}

pub fn backend(yaml: &str) -> KVCacheBackend {
    match object(yaml) {
        Object::Backend(b) => *b,
        other => panic!("not a backend: {}", other.describe()),
    }
}

pub fn pool(yaml: &str) -> KVCachePool {
    match object(yaml) {
        Object::Pool(p) => *p,
        other => panic!("not a pool: {}", other.describe()),
    }
}

pub fn binding(yaml: &str) -> KVCachePoolBinding {
    match object(yaml) {
        Object::Binding(b) => *b,
        other => panic!("not a binding: {}", other.describe()),
    }
}

pub fn model_deployment(yaml: &str) -> ModelDeployment {
    match object(yaml) {
        Object::ModelDeployment(m) => *m,
        other => panic!("not a model deployment: {}", other.describe()),
    }
}

/// A managed backend whose only spec is the given `members:` / `leader:` YAML body (indented
/// for `spec.connection.managed`).
pub fn managed(body: &str) -> KVCacheBackend {
    let indented: String = body.lines().map(|l| format!("      {l}\n")).collect();
    backend(&format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata:\n  name: b\nspec:\n  connection:\n    managed:\n{indented}"
    ))
}

/// A disk-tier group with the given segment size and tier lines.
pub fn tiered(capacity_per_member: &str, tier: &str) -> KVCacheBackend {
    let tier: String = tier.lines().map(|l| format!("        {l}\n")).collect();
    managed(&format!(
        "members:\n  - medium: DRAM\n    capacityPerMember: {capacity_per_member}\n    localDisks:\n      - path: /var/lib/kvcache\n{tier}"
    ))
}
