//! The admission judgement's own rules (`kvcache_render::review`), without an API server.

use kvcache_api::Settings;
use kvcache_api::manifest::{Object, parse};
use kvcache_render::review::review;

fn backend(image: Option<&str>, multi_tenancy: bool) -> Object {
    let mut v = serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": "m"},
        "spec": {"connection": {"managed": {"leader": {"multiTenancy": multi_tenancy},
                 "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}]}}}
    });
    if let Some(i) = image {
        v["spec"]["image"] = i.into();
    }
    parse("test", &v.to_string())
        .expect("parses")
        .remove(0)
        .object
}

#[test]
fn a_master_older_than_0_3_12_must_declare_multi_tenancy_off() {
    let settings = Settings::default();
    let old = backend(Some("kvcacheai/mooncake:0.3.11.post1"), true);
    let r = review(&old, None, &[], &[], &settings);
    assert!(
        r.refusals
            .iter()
            .any(|f| f.field == "spec.connection.managed.leader.multiTenancy"
                && f.message.contains("0.3.11.post1")
                && f.message.contains("unknown command line flag")),
        "{r:?}"
    );
    // Declared off: admitted. On 0.3.12 or later: admitted. A tag naming no version: not judged.
    for ok in [
        backend(Some("kvcacheai/mooncake:0.3.11.post1"), false),
        backend(Some("kvcacheai/mooncake:0.3.12.post1"), true),
        backend(Some("gpustack/mirrored-mooncake:0.3.13.post1-cpu"), true),
        backend(Some("example.local/store:latest"), true),
    ] {
        let r = review(&ok, None, &[], &[], &settings);
        assert!(r.allowed(), "{r:?}");
    }
    // Ratchet: a stored backend whose image and field stay is not judged again.
    let r = review(&old, Some(&old), &[], &[], &settings);
    assert!(r.allowed(), "{r:?}");
    // Turning it on, or moving the image onto an old line, is.
    let off = backend(Some("kvcacheai/mooncake:0.3.11.post1"), false);
    assert!(!review(&old, Some(&off), &[], &[], &settings).allowed());
    let new = backend(Some("kvcacheai/mooncake:0.3.13.post1"), true);
    assert!(!review(&old, Some(&new), &[], &[], &settings).allowed());
}
