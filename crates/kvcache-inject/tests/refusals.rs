//! Every injection refusal that applies to a container (docs/design.md#injection-refusals), and
//! the version and dtype checks, each with its reason and a message that names the key and the
//! fix.

mod support;

use kvcache_api::backend::Protocol;
use kvcache_inject::{Error, Ledger, Source, inject, parse_role};
use support::*;

#[track_caller]
fn refused(result: Result<kvcache_inject::Injection, Error>, reason: &str, fragment: &str) {
    match result {
        Ok(_) => panic!("expected {reason}, got an injection"),
        Err(e) => {
            assert_eq!(e.reason(), reason, "{e}");
            assert!(e.to_string().contains(fragment), "{e}");
        }
    }
}

#[test]
fn a_b_binding_name() {
    let c = container(&["vllm", "serve"], &["m"]);
    let mut r = walkthrough(vllm(), &c);
    r.binding = "";
    refused(inject(&r), "BindingMissing", "kvcache.gpustack.ai/binding");
    r.binding = "other/team-a";
    refused(inject(&r), "CrossNamespaceBinding", "this namespace");
}

#[test]
fn e_the_ledger_must_be_settled() {
    let c = container(&["vllm", "serve"], &["m"]);
    let mut r = walkthrough(vllm(), &c);
    r.ledger = Ledger::Unavailable("QuotaLedgerAvailable=False/LedgerUnreachable".into());
    refused(inject(&r), "LedgerNotReady", "LedgerUnreachable");
    r.ledger = Ledger::Absent;
    assert!(
        inject(&r).is_ok(),
        "MultiTenancyDisabled is admitted with no tenant id"
    );
}

#[test]
fn f_x_engine_manufacturer_and_role() {
    use kvcache_api::model::EngineName;
    use kvcache_inject::engines::row;
    let err = row(EngineName::Sglang, Some("ascend")).expect_err("refused");
    assert_eq!(err.reason(), "AscendNeedsVllm");
    assert!(err.to_string().contains("vLLM only"), "{err}");
    let err = row(EngineName::Vllm, Some("nvidia")).expect_err("refused");
    assert_eq!(err.reason(), "UnknownManufacturer");
    assert!(err.to_string().contains("only value is ascend"), "{err}");
    assert_eq!(
        parse_role(Some("Server")).expect_err("refused").reason(),
        "InvalidRole"
    );
    assert!(parse_role(Some("Decode")).is_ok());
    assert!(parse_role(None).is_ok());
}

#[test]
fn i_mechanism_keys_in_every_spelling() {
    for args in [
        vec!["--kv-transfer-config", "{}"],
        vec!["--kv-transfer-config={}"],
        vec!["--kv_transfer_config", "{}"],
        vec!["--kv-transfer-config.kv_connector=X"],
        vec!["--kv-transfer-c", "{}"],
    ] {
        let c = container(&["vllm", "serve"], &args);
        refused(
            inject(&walkthrough(vllm(), &c)),
            "OwnedKeyPresent",
            "--kv-transfer-config",
        );
    }
    // An ambiguous abbreviation is not this flag.
    let c = container(&["vllm", "serve"], &["--kv-c", "x"]);
    assert!(inject(&walkthrough(vllm(), &c)).is_ok());
    let c = with_env(
        container(&["vllm", "serve"], &["m"]),
        &[("MOONCAKE_CONFIG_PATH", "/x")],
    );
    refused(
        inject(&walkthrough(vllm(), &c)),
        "OwnedKeyPresent",
        "MOONCAKE_CONFIG_PATH",
    );
    for args in [
        vec!["--hicache-storage-backend", "file"],
        vec!["--hicache-storage-backend-extra-config", "{}"],
    ] {
        let c = container(&["python3", "-m", "sglang.launch_server"], &args);
        refused(
            inject(&walkthrough(sglang(), &c)),
            "OwnedKeyPresent",
            "--hicache-storage-backend",
        );
    }
    // A key for an engine that does not read it is not refused.
    let c = with_env(
        container(&["python3", "-m", "sglang.launch_server"], &[]),
        &[("MOONCAKE_CONFIG_PATH", "/x")],
    );
    assert!(inject(&walkthrough(sglang(), &c)).is_ok());
}

#[test]
fn j_dtype_is_the_bindings() {
    for args in [
        vec!["--kv-cache-dtype", "fp8"],
        vec!["--kv-cache-dtype=fp8"],
        vec!["--kv_cache_dtype", "fp8"],
    ] {
        let c = container(&["vllm", "serve"], &args);
        refused(
            inject(&walkthrough(vllm(), &c)),
            "DtypeOwned",
            "spec.domain.dtype",
        );
    }
    let c = container(&["vllm", "serve"], &["--kv-cache-dtype", "fp8"]);
    let mut r = walkthrough(vllm(), &c);
    r.dtype_owned = false;
    assert!(
        inject(&r).is_ok(),
        "with the setting off the user's dtype stands"
    );
    // A spelling the engine rejects is refused here rather than failing every Pod.
    let c = container(&["vllm", "serve"], &["m"]);
    let mut r = walkthrough(vllm(), &c);
    r.dtype = "bf16";
    refused(inject(&r), "DtypeNotAccepted", "bf16");
    let c = container(&["python3", "-m", "sglang.launch_server"], &[]);
    let mut r = walkthrough(sglang(), &c);
    r.dtype = "float16";
    refused(inject(&r), "DtypeNotAccepted", "float16");
    r.dtype = "bf16";
    assert!(inject(&r).is_ok());
}

#[test]
fn l_no_client_endpoint() {
    let c = container(&["vllm", "serve"], &["m"]);
    let mut r = walkthrough(vllm(), &c);
    r.client_endpoint = None;
    refused(inject(&r), "NoClientEndpoint", "status.clientEndpoint");
}

#[test]
fn m_volume_collisions() {
    let c = container(&["vllm", "serve"], &["m"]);
    let volumes = vec!["kvcache-client-config".to_string()];
    let mut r = walkthrough(vllm(), &c);
    r.pod_volumes = &volumes;
    refused(inject(&r), "VolumeCollision", "/etc/gpustack/kvcache");
    let mut c = container(&["vllm", "serve"], &["m"]);
    c.volume_mounts = Some(vec![k8s_openapi::api::core::v1::VolumeMount {
        name: "mine".into(),
        mount_path: "/etc/gpustack/kvcache/".into(),
        ..Default::default()
    }]);
    refused(
        inject(&walkthrough(vllm(), &c)),
        "VolumeCollision",
        "kvcache-client-config",
    );
}

#[test]
fn n_to_t_launch_programs() {
    let cases: Vec<(Vec<&str>, Vec<&str>, &str, &str)> = vec![
        (vec![], vec![], "NoLaunchCommand", "image's CMD"),
        (
            vec![],
            vec!["serve", "m"],
            "EntrypointNotInspectable",
            "launch-args-forwarded",
        ),
        (vec!["tini", "--"], vec![], "LauncherWithoutProgram", "tini"),
        (
            vec!["/app/entrypoint"],
            vec!["m"],
            "UnknownLauncher",
            "entrypoint",
        ),
        (vec!["run"], vec![], "UnknownLauncher", "run"),
        (
            vec!["python3", "-m", "sglang.launch_server"],
            vec![],
            "WrongProgram",
            "runs SGLang",
        ),
        (
            vec!["sh", "-c", "vllm serve m"],
            vec![],
            "ShellLaunch",
            "$0",
        ),
        (
            vec!["bash", "-lc", "vllm serve m"],
            vec![],
            "ShellLaunch",
            "bash -c",
        ),
        (
            vec!["env", "-S", "vllm serve m"],
            vec![],
            "HiddenCommand",
            "env -S",
        ),
        (
            vec!["env", "--split-string=vllm serve"],
            vec![],
            "HiddenCommand",
            "--split-string",
        ),
        (vec!["./run.sh"], vec![], "ScriptLaunch", "run.sh"),
        (
            vec!["sh", "/app/run.sh"],
            vec![],
            "ScriptLaunch",
            "/app/run.sh",
        ),
    ];
    for (command, args, reason, fragment) in cases {
        let c = container(&command, &args);
        refused(inject(&walkthrough(vllm(), &c)), reason, fragment);
    }
    // Transparent launchers are stripped; forwarding can be declared.
    for (command, program) in [
        (vec!["tini", "--", "vllm", "serve"], "vllm"),
        (vec!["/usr/bin/dumb-init", "vllm", "serve"], "vllm"),
        (
            vec!["env", "HF_HOME=/cache", "-u", "X", "vllm", "serve"],
            "vllm",
        ),
        (
            vec!["python3", "-m", "vllm.entrypoints.openai.api_server"],
            "python3",
        ),
    ] {
        let c = container(&command, &["m"]);
        let inj = inject(&walkthrough(vllm(), &c)).unwrap_or_else(|e| panic!("{command:?}: {e}"));
        assert_eq!(inj.record.launch_program, program);
    }
    let c = container(&["/app/entrypoint"], &["m"]);
    let mut r = walkthrough(vllm(), &c);
    r.launch_args_forwarded = true;
    let inj = inject(&r).expect("forwarding declared");
    assert!(inj.record.launch_args_forwarded);
    assert_eq!(inj.record.launch_program, "entrypoint");
    let c = container(&[], &["serve", "m"]);
    let mut r = walkthrough(vllm(), &c);
    r.launch_args_forwarded = true;
    assert_eq!(
        inject(&r)
            .expect("forwarded ENTRYPOINT")
            .record
            .launch_program,
        ""
    );
}

#[test]
fn y_transports() {
    let c = container(&["vllm", "serve"], &["m"]);
    let mut r = walkthrough(vllm(), &c);
    r.protocols = &[Protocol::Tcp, Protocol::Rdma];
    refused(inject(&r), "NotSupportedTransport", "rdma (RDMA)");
    r.protocols = &[Protocol::Cann];
    refused(inject(&r), "NotSupportedTransport", "ascend (CANN)");
    r.protocols = &[Protocol::Auto, Protocol::Tcp];
    assert!(inject(&r).is_ok(), "Auto is TCP: one protocol");
    let mut r = walkthrough(ascend(), &c);
    r.protocols = &[Protocol::Tcp];
    refused(inject(&r), "NotSupportedTransport", "set protocol CANN");
    let c = container(&["python3", "-m", "sglang.launch_server"], &[]);
    let mut r = walkthrough(sglang(), &c);
    r.protocols = &[Protocol::Efa];
    refused(inject(&r), "NotSupportedTransport", "efa (EFA)");
}

#[test]
fn store_version_lines() {
    let c = container(&["python3", "-m", "sglang.launch_server"], &[]);
    let mut r = walkthrough(sglang(), &c);
    r.store_version = Some("0.3.13.post1");
    refused(inject(&r), "StoreVersionMismatch", "0.3.13.post1");
    refused(inject(&r), "StoreVersionMismatch", "0.3.12.post1");
    r.store_version = None;
    let inj = inject(&r).expect("an unknown version is a warning");
    assert!(inj.warnings.iter().any(|w| w.contains("names no version")));
}

#[test]
fn model_deployment_owned_keys_name_the_escape() {
    let c = container(&[], &["--kv-events-config", "{}"]);
    let mut r = walkthrough(vllm(), &c);
    r.source = Source::ModelDeployment;
    refused(inject(&r), "OwnedKeyPresent", "roles[].command");
    let c = with_env(container(&[], &[]), &[("MOONCAKE_TENANT_ID", "x")]);
    let mut r = walkthrough(sglang(), &c);
    r.source = Source::ModelDeployment;
    refused(inject(&r), "OwnedKeyPresent", "MOONCAKE_TENANT_ID");
    let c = with_env(container(&[], &[]), &[("GPUSTACK_MEMBER_INDEX", "0")]);
    let mut r = walkthrough(vllm(), &c);
    r.source = Source::ModelDeployment;
    refused(inject(&r), "OwnedKeyPresent", "GPUSTACK_MEMBER_INDEX");
    let c = container(&[], &["--disaggregation-mode", "prefill"]);
    let mut r = walkthrough(sglang(), &c);
    r.source = Source::ModelDeployment;
    refused(inject(&r), "OwnedKeyPresent", "--disaggregation-mode");
}

#[test]
fn a_container_may_not_choose_its_own_tenant_or_store_settings() {
    let sglang_with = |env: &[(&str, &str)]| {
        with_env(
            container(&["python3", "-m", "sglang.launch_server"], &[]),
            env,
        )
    };
    // The Binding's tenant is the domain the walkthrough's Binding names.
    let domain = walkthrough(sglang(), &sglang_with(&[])).domain.to_owned();
    let c = sglang_with(&[("MOONCAKE_TENANT_ID", "team-b")]);
    refused(
        inject(&walkthrough(sglang(), &c)),
        "StoreSettingOverridden",
        "MOONCAKE_TENANT_ID=\"team-b\"",
    );
    let c = sglang_with(&[("MOONCAKE_MASTER", "10.0.0.1:50051")]);
    refused(
        inject(&walkthrough(sglang(), &c)),
        "StoreSettingOverridden",
        "may not choose its store",
    );
    // The same value, once, is no choice of its own.
    let c = sglang_with(&[("MOONCAKE_TENANT_ID", &domain)]);
    assert!(inject(&walkthrough(sglang(), &c)).is_ok());
    // A second entry of the name would win over the injected one, whatever its values.
    let c = sglang_with(&[
        ("MOONCAKE_TENANT_ID", &domain),
        ("MOONCAKE_TENANT_ID", &domain),
    ]);
    refused(
        inject(&walkthrough(sglang(), &c)),
        "DuplicateStoreSetting",
        "MOONCAKE_TENANT_ID 2 times",
    );
    // With no ledger there is no tenant to give: the container's own is kept, with a warning.
    let c = sglang_with(&[("MOONCAKE_TENANT_ID", "team-b")]);
    let mut r = walkthrough(sglang(), &c);
    r.ledger = Ledger::Absent;
    let injection = inject(&r).expect("admitted with no ledger");
    assert!(
        injection
            .warnings
            .iter()
            .any(|w| w.contains("MOONCAKE_TENANT_ID is kept")),
        "{:?}",
        injection.warnings
    );
    // The observability toggles stay the container's own.
    let c = sglang_with(&[("MC_TE_METRIC", "0")]);
    assert!(inject(&walkthrough(sglang(), &c)).is_ok());
    // A transport setting of its own is replaced, with a warning.
    let c = sglang_with(&[("MOONCAKE_PROTOCOL", "rdma")]);
    let injection = inject(&walkthrough(sglang(), &c)).expect("replaced, not refused");
    assert!(
        injection
            .warnings
            .iter()
            .any(|w| w.contains("MOONCAKE_PROTOCOL=\"rdma\" is replaced")),
        "{:?}",
        injection.warnings
    );
}

#[test]
fn a_setting_equal_to_the_injected_one_as_the_api_server_stores_it_is_no_choice() {
    use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};
    // What the webhook receives: the API server omits an empty value and defaults a field
    // reference's apiVersion to v1.
    let mut c = container(&["python3", "-m", "sglang.launch_server"], &[]);
    c.env = Some(vec![
        EnvVar {
            name: "MOONCAKE_DEVICE".into(),
            value: None,
            value_from: None,
        },
        EnvVar {
            name: "MOONCAKE_LOCAL_HOSTNAME".into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: Some("v1".into()),
                    field_path: "status.podIP".into(),
                }),
                ..Default::default()
            }),
        },
    ]);
    let injection = inject(&walkthrough(sglang(), &c)).expect("the same settings are admitted");
    assert!(
        injection.warnings.iter().all(|w| !w.contains("replaced")),
        "{:?}",
        injection.warnings
    );
    // The tenant read from a Secret is not the Binding's.
    c.env = Some(vec![EnvVar {
        name: "MOONCAKE_TENANT_ID".into(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(Default::default()),
            ..Default::default()
        }),
    }]);
    refused(
        inject(&walkthrough(sglang(), &c)),
        "StoreSettingOverridden",
        "a value read from a ConfigMap, Secret or resource",
    );
}

#[test]
fn a_model_dtype_other_than_the_domains_is_admitted_with_a_warning_naming_both() {
    let serve = ["vllm", "serve", "/models/m"];
    let warnings_for = |args: &[&str], owned: bool| {
        let c = container(&serve, args);
        let mut r = walkthrough(vllm(), &c);
        r.dtype_owned = owned;
        let injection = inject(&r).expect("a dtype pairing is admitted");
        injection
            .warnings
            .into_iter()
            .filter(|w| w.contains("--kv-cache-dtype bfloat16"))
            .collect::<Vec<_>>()
    };
    // float32 against the walkthrough's bfloat16 domain, in both spellings of the value.
    for args in [&["--dtype", "float32"][..], &["--dtype=float"][..]] {
        let w = warnings_for(args, true);
        assert_eq!(w.len(), 1, "{args:?}: {w:?}");
        assert!(w[0].contains("computes in float32"), "{}", w[0]);
        assert!(
            w[0].contains("run the model with --dtype bfloat16"),
            "{}",
            w[0]
        );
    }
    // The last --dtype wins, as the engine's parser keeps it.
    assert_eq!(
        warnings_for(&["--dtype", "float16", "--dtype", "half"], true).len(),
        1
    );
    assert!(warnings_for(&["--dtype", "float16", "--dtype", "bf16"], true).is_empty());
    // The domain's own dtype, auto, an absent flag and a dtype the operator does not own are
    // not judged.
    for args in [
        &["--dtype", "bfloat16"][..],
        &["--dtype", "auto"][..],
        &[][..],
    ] {
        assert!(warnings_for(args, true).is_empty(), "{args:?}");
    }
    assert!(warnings_for(&["--dtype", "float32"], false).is_empty());
    // A quantised cache type is a conversion engines make on purpose.
    let c = container(&serve, &["--dtype", "bfloat16"]);
    let mut r = walkthrough(vllm(), &c);
    r.dtype = "fp8_e4m3";
    let injection = inject(&r).expect("admitted");
    assert!(
        injection
            .warnings
            .iter()
            .all(|w| !w.contains("computes in")),
        "{:?}",
        injection.warnings
    );
}
