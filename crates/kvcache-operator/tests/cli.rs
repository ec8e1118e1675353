//! The offline commands, run as a user runs them.

use std::process::Command;

fn operator(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvcache-operator"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn the_examples_validate_clean() {
    let (code, out) = operator(&[
        "validate",
        "-f",
        "examples/walkthrough",
        "-f",
        "examples/disk-heavy",
    ]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("ok ")).count(),
        6,
        "{out}"
    );
}

#[test]
fn refusals_name_the_field_and_exit_1() {
    let dir = std::env::temp_dir().join(format!("kvcache-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: b}\nspec:\n  metadata: {}\n  connection:\n    managed:\n      leader: {extraArgs: [enable_snapshot=true]}\n      members: [{medium: DRAM, capacityPerMember: 8Mi, localDisks: [{path: /var/lib/kvcache}]}]\n",
    )
    .expect("write");
    let (code, out) = operator(&["validate", "-f", bad.to_str().expect("utf-8")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("spec.metadata: unknown field"), "{out}");
    assert!(
        out.contains("spec.connection.managed.leader.extraArgs[0]: enable_snapshot is refused"),
        "{out}"
    );
    assert!(
        out.contains(
            "spec.connection.managed.members[0].capacityPerMember: must hold one bucket (16Mi)"
        ),
        "{out}"
    );

    // As an update of itself, the stored 8Mi segment is not re-judged (ratcheting).
    let (_, out) = operator(&[
        "validate",
        "-f",
        bad.to_str().expect("utf-8"),
        "--old",
        bad.to_str().expect("utf-8"),
    ]);
    assert!(out.contains("(update,"), "{out}");
    assert!(!out.contains("capacityPerMember"), "{out}");

    let missing = operator(&["validate", "-f", "does/not/exist.yaml"]);
    assert_eq!(missing.0, 2);
    assert!(
        missing.1.contains("cannot read does/not/exist.yaml"),
        "{}",
        missing.1
    );
}

#[test]
fn owned_keys_on_attached_roles_are_refused() {
    let dir = std::env::temp_dir().join(format!("kvcache-cli-md-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let md = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/walkthrough/05-modeldeployment.yaml"
    ))
    .expect("example");
    let bad = dir.join("md.yaml");
    std::fs::write(
        &bad,
        md.replace(
            "      resources:",
            "      extraArgs: [\"--kv-cache-dtype=fp8\"]\n      resources:",
        ),
    )
    .expect("write");
    let (code, out) = operator(&["validate", "-f", bad.to_str().expect("utf-8")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("spec.roles[0]: DtypeOwned"), "{out}");
}

#[test]
fn domains_are_claimed_once_per_backend_across_manifests() {
    let dir = std::env::temp_dir().join(format!("kvcache-cli-dup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let binding = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/walkthrough/03-binding.yaml"
    ))
    .expect("example");
    let second = binding.replace(
        "name: team-a\n  namespace: team-a",
        "name: team-b\n  namespace: team-b",
    );
    std::fs::write(dir.join("04-second.yaml"), second).expect("write");
    let (code, out) = operator(&[
        "validate",
        "-f",
        "examples/walkthrough",
        "-f",
        dir.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("refused  KVCachePoolBinding team-b/team-b"),
        "{out}"
    );
    assert!(out.contains("Duplicate: domain \"default\" is already held on backend mooncake-dram by KVCachePoolBinding team-a/team-a"), "{out}");
}

#[test]
fn validate_warns_of_a_second_namespace_on_a_backend() {
    let dir = std::env::temp_dir().join(format!("kvcache-cli-tenancy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let binding = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/walkthrough/03-binding.yaml"
    ))
    .expect("example");
    let second = binding
        .replace(
            "name: team-a\n  namespace: team-a",
            "name: team-b\n  namespace: team-b",
        )
        .replace("blockSize: 64", "name: chat\n    blockSize: 64");
    std::fs::write(dir.join("04-second.yaml"), second).expect("write");
    let (code, out) = operator(&[
        "validate",
        "-f",
        "examples/walkthrough",
        "-f",
        dir.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "admitted: {out}");
    assert!(
        out.contains("warning: namespace team-b will share KVCacheBackend mooncake-dram with namespaces team-a: "),
        "{out}"
    );
}

#[test]
fn crds_prints_all_five() {
    let (code, out) = operator(&["crds"]);
    assert_eq!(code, 0);
    assert_eq!(out.matches("kind: CustomResourceDefinition").count(), 5);
}
