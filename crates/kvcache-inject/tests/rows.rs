//! One snapshot per engine row for the walkthrough Binding, and the README table.

mod support;

use kvcache_api::model::RoleKind;
use kvcache_inject::engines::{ENGINES, Vehicle};
use kvcache_inject::{Source, inject};
use support::*;

fn snapshot(
    row: &kvcache_inject::engines::EngineRow,
    role: RoleKind,
    command: &[&str],
    args: &[&str],
) -> String {
    let c = container(command, args);
    let mut req = walkthrough(row, &c);
    req.role = role;
    let inj = inject(&req).unwrap_or_else(|e| panic!("{}: {e}", row.name));
    let applied = inj.apply(&c);
    let doc = serde_json::json!({
        "container": applied,
        "volume": inj.volume,
        "annotations": {
            "kvcache.gpustack.ai/client-config": inj.client_config,
            "kvcache.gpustack.ai/injected": inj.record_json(),
        },
        "warnings": inj.warnings,
    });
    serde_yaml::to_string(&doc).expect("yaml")
}

#[test]
fn vllm_server() {
    insta::assert_snapshot!(snapshot(
        vllm(),
        RoleKind::Server,
        &["vllm", "serve"],
        &["Qwen/Qwen2.5-7B-Instruct"]
    ));
}

#[test]
fn vllm_ascend_prefill() {
    insta::assert_snapshot!(snapshot(
        ascend(),
        RoleKind::Prefill,
        &["vllm", "serve"],
        &["Qwen/Qwen2.5-7B-Instruct"]
    ));
}

#[test]
fn sglang_server() {
    insta::assert_snapshot!(snapshot(
        sglang(),
        RoleKind::Server,
        &["python3", "-m", "sglang.launch_server"],
        &["--model-path", "Qwen/Qwen2.5-7B-Instruct"]
    ));
}

#[test]
fn sglang_decode() {
    insta::assert_snapshot!(snapshot(
        sglang(),
        RoleKind::Decode,
        &["python3", "-m", "sglang.launch_server"],
        &["--model-path", "m"]
    ));
}

#[test]
fn the_record_matches_the_documented_shape() {
    let c = container(&["vllm", "serve"], &["m"]);
    let inj = inject(&walkthrough(vllm(), &c)).expect("injects");
    assert_eq!(
        inj.record_json(),
        r#"{"binding":"team-a","engine":"vllm","vehicle":"file","domain":"default","tenantInjected":true,"launchProgram":"vllm","launchArgsForwarded":false}"#
    );
    let doc: serde_json::Value =
        serde_json::from_str(inj.client_config.as_deref().expect("doc")).expect("json");
    assert_eq!(doc["global_segment_size"], 0);
    assert_eq!(doc["local_buffer_size"], 134217728);
    assert_eq!(doc["mode"], "standalone-store");
    assert_eq!(doc["device_name"], "");
    assert_eq!(doc["tenant_id"], "default");
    assert_eq!(doc["master_server_address"], ENDPOINT);
}

#[test]
fn without_a_ledger_no_tenant_is_injected() {
    let c = container(&["vllm", "serve"], &["m"]);
    let mut req = walkthrough(vllm(), &c);
    req.ledger = kvcache_inject::Ledger::Absent;
    let inj = inject(&req).expect("injects");
    assert!(!inj.record.tenant_injected);
    assert!(!inj.client_config.expect("doc").contains("tenant_id"));
    let c = with_env(
        container(&["python3", "-m", "sglang.launch_server"], &[]),
        &[("MOONCAKE_TENANT_ID", "mine")],
    );
    let mut req = walkthrough(sglang(), &c);
    req.ledger = kvcache_inject::Ledger::Absent;
    let inj = inject(&req).expect("injects");
    assert!(inj.env.iter().all(|e| e.name != "MOONCAKE_TENANT_ID"));
    // With a ledger, a container's own tenant other than the Binding's is refused; the same
    // one stays a single entry.
    req.ledger = kvcache_inject::Ledger::Enforced;
    let refusal = inject(&req).expect_err("another tenant is refused");
    assert_eq!(refusal.reason(), "StoreSettingOverridden", "{refusal}");
    let c = with_env(
        container(&["python3", "-m", "sglang.launch_server"], &[]),
        &[("MOONCAKE_TENANT_ID", "default")],
    );
    let mut req = walkthrough(sglang(), &c);
    req.ledger = kvcache_inject::Ledger::Enforced;
    let applied = inject(&req).expect("injects").apply(&c);
    let tenants: Vec<_> = applied
        .env
        .iter()
        .flatten()
        .filter(|e| e.name == "MOONCAKE_TENANT_ID")
        .collect();
    assert_eq!(tenants.len(), 1);
    assert_eq!(tenants[0].value.as_deref(), Some("default"));
}

#[test]
fn user_toggles_win_and_flags_the_user_named_suppress_ours() {
    let c = with_env(
        container(
            &["python3", "-m", "sglang.launch_server"],
            &["--enable-hierarchical-cache"],
        ),
        &[("MC_TE_METRIC", "0")],
    );
    let inj = inject(&walkthrough(sglang(), &c)).expect("injects");
    let applied = inj.apply(&c);
    let metric: Vec<_> = applied
        .env
        .iter()
        .flatten()
        .filter(|e| e.name == "MC_TE_METRIC")
        .collect();
    assert_eq!(metric[0].value.as_deref(), Some("0"));
    let args = applied.args.expect("args");
    assert_eq!(
        args.iter()
            .filter(|a| *a == "--enable-hierarchical-cache")
            .count(),
        1
    );
}

#[test]
fn model_deployment_source_skips_launcher_inspection() {
    let c = container(&[], &[]);
    let mut req = walkthrough(vllm(), &c);
    req.source = Source::ModelDeployment;
    let inj = inject(&req).expect("the operator builds the command itself");
    assert_eq!(inj.record.launch_program, "vllm");
}

fn table() -> String {
    let mut out = String::from(
        "| engine | vehicle | connector | dtype flag spellings | store protocols | store client by engine version | owned keys (refused if set) |\n|---|---|---|---|---|---|---|\n",
    );
    for r in ENGINES {
        let protocols = match r.only_protocols {
            Some(only) => format!("only {}", only.join(", ")),
            None if r.refused_protocols.is_empty() => "any one".to_owned(),
            None => format!("any one but {}", r.refused_protocols.join(", ")),
        };
        let lines: Vec<String> = r
            .client_lines
            .iter()
            .map(|l| format!("≥{} → {}", l.from_engine, l.client))
            .collect();
        let owned: Vec<String> = r
            .mechanism_args
            .iter()
            .chain(r.mechanism_env)
            .map(|k| format!("`{k}`"))
            .collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.name,
            if r.vehicle == Vehicle::File {
                "file (`/etc/gpustack/kvcache/mooncake.json`)"
            } else {
                "environment"
            },
            r.connector.map_or("–".to_owned(), |c| format!("`{c}`")),
            r.dtypes.join(", "),
            protocols,
            lines.join("; "),
            owned.join(", "),
        ));
    }
    out
}

#[test]
fn readme_table_is_fresh() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap_or_default();
    let (start, end) = ("<!-- engine-table:start -->\n", "<!-- engine-table:end -->");
    let fresh = table();
    let current = readme
        .split_once(start)
        .and_then(|(_, rest)| rest.split_once(end))
        .map(|(t, _)| t.to_owned())
        .unwrap_or_default();
    if current != fresh {
        if std::env::var_os("UPDATE_README").is_some() {
            let (head, rest) = readme.split_once(start).expect("start marker");
            let (_, tail) = rest.split_once(end).expect("end marker");
            std::fs::write(&path, format!("{head}{start}{fresh}{end}{tail}"))
                .expect("write README");
        } else {
            panic!(
                "the engine table in {} is stale: run `UPDATE_README=1 cargo test -p kvcache-inject --test rows` and commit",
                path.display()
            );
        }
    }
}

#[test]
fn tcp_engines_get_the_transport_defaults_and_their_own_value_wins() {
    use kvcache_inject::transport::TCP_TUNING;
    let queue = TCP_TUNING[0];
    let value_of = |c: &k8s_openapi::api::core::v1::Container| -> Vec<Option<String>> {
        c.env
            .iter()
            .flatten()
            .filter(|e| e.name == queue.name)
            .map(|e| e.value.clone())
            .collect()
    };
    let plain = container(&["python3", "-m", "sglang.launch_server"], &[]);
    let inj = inject(&walkthrough(sglang(), &plain)).expect("injects");
    assert_eq!(
        value_of(&inj.apply(&plain)),
        vec![Some(queue.value.to_owned())]
    );

    let theirs = with_env(plain.clone(), &[(queue.name, "2048")]);
    let inj = inject(&walkthrough(sglang(), &theirs)).expect("a transport setting is no identity");
    assert!(
        inj.warnings.iter().all(|w| !w.contains(queue.name)),
        "{:?}",
        inj.warnings
    );
    assert_eq!(value_of(&inj.apply(&theirs)), vec![Some("2048".to_owned())]);
}
