//! Properties: never panics on any argv or env; an injection never leaves a duplicate
//! environment name or a duplicated flag; a refusal always carries a known CamelCase reason
//! and a message; and a fair share of generated containers is accepted (so the properties
//! above are exercised on injections, not only on refusals).

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

/// A launch command: one the engines really use (possibly behind an init), or random tokens.
fn command() -> impl Strategy<Value = Vec<String>> {
    let words = |w: &[&str]| w.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
    prop_oneof![
        Just(words(&["vllm", "serve"])),
        Just(words(&["tini", "--", "vllm", "serve"])),
        Just(words(&["python3", "-m", "sglang.launch_server"])),
        Just(words(&[
            "python3",
            "-m",
            "vllm.entrypoints.openai.api_server"
        ])),
        prop::collection::vec(token(), 0..5),
    ]
}

/// Every reason a container-level refusal may carry.
const KNOWN_REASONS: &[&str] = &[
    "NoLaunchCommand",
    "EntrypointNotInspectable",
    "LauncherWithoutProgram",
    "HiddenCommand",
    "ShellLaunch",
    "UnknownLauncher",
    "ScriptLaunch",
    "WrongProgram",
    "OwnedKeyPresent",
    "StoreSettingOverridden",
    "DuplicateStoreSetting",
    "DtypeOwned",
    "DtypeNotAccepted",
    "NotSupportedTransport",
    "StoreVersionMismatch",
    "VolumeCollision",
];

fn container(command: Vec<String>, args: Vec<String>, env: Vec<String>) -> Container {
    let mut seen = BTreeSet::new();
    let env: Vec<EnvVar> = env
        .into_iter()
        .filter(|n| seen.insert(n.clone()))
        .map(|n| EnvVar {
            name: n,
            value: Some("v".into()),
            value_from: None,
        })
        .collect();
    Container {
        name: "c".into(),
        command: Some(command),
        args: Some(args),
        env: Some(env),
        ..Default::default()
    }
}

#[test]
fn a_fair_share_of_generated_containers_is_accepted() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let strategy = (
        command(),
        prop::collection::vec(token(), 0..6),
        prop::collection::vec(name(), 0..4),
        0usize..3,
    );
    let mut runner = TestRunner::deterministic();
    let (mut accepted, total) = (0, 2000);
    for _ in 0..total {
        let (command, args, env, which) = strategy
            .new_tree(&mut runner)
            .expect("a generated case")
            .current();
        let c = container(command, args, env);
        let row = [vllm(), ascend(), sglang()][which];
        if inject(&walkthrough(row, &c)).is_ok() {
            accepted += 1;
        }
    }
    assert!(
        accepted * 5 >= total,
        "only {accepted} of {total} generated containers were accepted: the properties would test refusals only"
    );
    assert!(
        accepted < total,
        "every container was accepted: refusals go untested"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_panics_and_never_duplicates(
        command in command(),
        args in prop::collection::vec(token(), 0..6),
        env in prop::collection::vec(name(), 0..4),
        which in 0usize..3,
        forwarded in any::<bool>(),
    ) {
        let c = container(command, args, env);
        let row = [vllm(), ascend(), sglang()][which];
        let mut req = walkthrough(row, &c);
        req.launch_args_forwarded = forwarded;
        match inject(&req) {
            Err(e) => {
                let reason = e.reason();
                prop_assert!(KNOWN_REASONS.contains(&reason), "unknown reason {}: {}", reason, e);
                let kvcache_inject::Error::Refused { message, .. } = &e;
                prop_assert!(message.len() >= 20 && !message.contains(reason), "a refusal's message says what and how to fix: {:?}", message);
            }
            Ok(inj) => {
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
}
