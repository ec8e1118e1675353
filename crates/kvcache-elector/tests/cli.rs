//! The command line: every option has an environment fallback, and `--help` documents each.

use std::process::Command;

fn elector() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvcache-elector"));
    c.env_remove("KUBECONFIG")
        .env("HOME", "/nonexistent")
        .env("KUBERNETES_SERVICE_HOST", "");
    c
}

#[test]
fn help_documents_every_option_with_its_variable() {
    let out = elector().args(["leader", "--help"]).output().expect("runs");
    let help = String::from_utf8_lossy(&out.stdout);
    for (flag, var) in [
        ("--lease", "KVCACHE_ELECTOR_LEASE"),
        ("--namespace", "KVCACHE_ELECTOR_NAMESPACE"),
        ("--identity", "KVCACHE_ELECTOR_IDENTITY"),
        ("--address", "KVCACHE_ELECTOR_ADDRESS"),
        ("--lease-duration", "KVCACHE_ELECTOR_LEASE_DURATION"),
        ("--renew-deadline", "KVCACHE_ELECTOR_RENEW_DEADLINE"),
        ("--retry-period", "KVCACHE_ELECTOR_RETRY_PERIOD"),
        ("--child-health-url", "KVCACHE_ELECTOR_CHILD_HEALTH_URL"),
        ("--ready-addr", "KVCACHE_ELECTOR_READY_ADDR"),
        ("--label-pod", "KVCACHE_ELECTOR_LABEL_POD"),
        ("--stop-grace", "KVCACHE_ELECTOR_STOP_GRACE"),
    ] {
        assert!(
            help.contains(flag) && help.contains(var),
            "{flag} / {var} missing from:\n{help}"
        );
    }
    let member = elector().args(["member", "--help"]).output().expect("runs");
    assert!(String::from_utf8_lossy(&member.stdout).contains("KVCACHE_ELECTOR_MASTER_ENV"));
}

#[test]
fn the_environment_stands_in_for_flags() {
    // Without them the parser refuses, naming the flag.
    let bare = elector()
        .args(["leader", "--", "true"])
        .output()
        .expect("runs");
    assert!(!bare.status.success());
    assert!(String::from_utf8_lossy(&bare.stderr).contains("--lease"));
    // With them it parses and goes on to the API server (absent here).
    let out = elector()
        .args(["leader", "--", "true"])
        .env("KVCACHE_ELECTOR_LEASE", "b-leader")
        .env("KVCACHE_ELECTOR_NAMESPACE", "ns")
        .env("KVCACHE_ELECTOR_IDENTITY", "pod-0")
        .env("KVCACHE_ELECTOR_LABEL_POD", "true")
        .env("KVCACHE_ELECTOR_RETRY_PERIOD", "250ms")
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot reach the API server"), "{err}");
    // Unsafe timing is refused before anything starts.
    let out = elector()
        .args([
            "leader",
            "--lease",
            "l",
            "--namespace",
            "n",
            "--identity",
            "i",
            "--renew-deadline",
            "9s",
            "--",
            "true",
        ])
        .output()
        .expect("runs");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("must be shorter than the lease duration")
    );
}
