//! Render time for the walkthrough backend and a 16-group backend (figures in the README).

use criterion::{Criterion, criterion_group, criterion_main};
use kvcache_api::KVCacheBackend;
use kvcache_render::objects::backend::{BackendInputs, render};

fn backend(groups: usize) -> KVCacheBackend {
    let members: String = (0..groups)
        .map(|i| format!("        - nodeSelector: {{pool: p{i}}}\n          medium: DRAM\n          capacityPerMember: 8Gi\n"))
        .collect();
    serde_yaml::from_str(&format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: mooncake-dram}}\nspec:\n  connection:\n    managed:\n      leader: {{replicas: 3}}\n      members:\n{members}"
    ))
    .expect("backend")
}

fn bench(c: &mut Criterion) {
    for (label, groups) in [
        ("walkthrough backend (1 group)", 1),
        ("16-group backend", 16),
    ] {
        let b = backend(groups);
        c.bench_function(label, |bench| {
            bench.iter(|| {
                render(&BackendInputs {
                    backend: &b,
                    store_image: "gpustack/mirrored-mooncake:0.3.13.post1-cpu",
                    namespace: "gpustack-system",
                    elector_image: "gpustack/kvcache-elector:0.2.0",
                    etcd_image: "gpustack/kvcache-etcd:v3.6.4",
                    bound_namespaces: &[],
                    policy: None,
                    access: &kvcache_render::objects::backend::StoreAccess::IN_CLUSTER,
                })
                .expect("renders")
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
