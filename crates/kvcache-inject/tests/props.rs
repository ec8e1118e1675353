//! Properties: never panics on any argv or env; an injection never leaves a duplicate
//! environment name or a duplicated flag.

mod support;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, EnvVar};
use kvcache_inject::inject;
use proptest::prelude::*;
use support::*;

fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("vllm".to_string()),
        Just("serve".to_string()),
        Just("tini".to_string()),
        Just("--".to_string()),
        Just("-c".to_string()),
        Just("env".to_string()),
        Just("python3".to_string()),
        Just("-m".to_string()),
        Just("sglang.launch_server".to_string()),
        Just("--kv-cache-dtype".to_string()),
        Just("--enable-hierarchical-cache".to_string()),
        "--[a-z_-]{1,20}(=[a-z]{0,4})?",
        ".{0,12}",
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("MC_TE_METRIC".to_string()),
        Just("MOONCAKE_TENANT_ID".to_string()),
        Just("MOONCAKE_MASTER".to_string()),
        "[A-Z_]{1,10}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_panics_and_never_duplicates(
        command in prop::collection::vec(token(), 0..5),
        args in prop::collection::vec(token(), 0..6),
        env in prop::collection::vec(name(), 0..4),
        which in 0usize..3,
        forwarded in any::<bool>(),
    ) {
        let mut seen = BTreeSet::new();
        let env: Vec<EnvVar> = env.into_iter().filter(|n| seen.insert(n.clone())).map(|n| EnvVar { name: n, value: Some("v".into()), value_from: None }).collect();
        let c = Container { name: "c".into(), command: Some(command), args: Some(args), env: Some(env), ..Default::default() };
        let row = [vllm(), ascend(), sglang()][which];
        let mut req = walkthrough(row, &c);
        req.launch_args_forwarded = forwarded;
        if let Ok(inj) = inject(&req) {
            let applied = inj.apply(&c);
            let names: Vec<&str> = applied.env.iter().flatten().map(|e| e.name.as_str()).collect();
            let unique: BTreeSet<&str> = names.iter().copied().collect();
            prop_assert_eq!(names.len(), unique.len(), "duplicate env names: {:?}", names);
            for flag in inj.args.iter().filter(|a| a.starts_with("--")) {
                let count = applied.args.iter().flatten().filter(|a| kvcache_inject::argv::sets(a, flag, row)).count();
                prop_assert_eq!(count, 1, "{} appears {} times in {:?}", flag, count, applied.args);
            }
        }
    }
}
