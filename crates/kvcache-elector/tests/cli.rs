//! The command line: every option has an environment fallback, and `--help` documents each.

use std::process::Command;

fn elector() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvcache-elector"));
    c.env_remove("KUBECONFIG")
        .env("HOME", "/nonexistent")
        .env("KUBERNETES_SERVICE_HOST", "");
    c
}

/// The help text of each option, keyed by its long flag: from the line that names it to the
/// line that names the next option.
fn option_blocks(help: &str) -> Vec<(String, String)> {
    let mut blocks: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        let flag = trimmed
            .split([' ', ',', '='])
            .find(|t| t.starts_with("--") && t.len() > 2);
        if trimmed.starts_with('-')
            && let Some(flag) = flag
        {
            blocks.push((flag.to_owned(), String::new()));
        }
        if let Some((_, text)) = blocks.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    blocks
}

fn assert_each_flag_has_its_variable(help: &str, rows: &[(&str, &str)]) {
    let blocks = option_blocks(help);
    for (flag, var) in rows {
        let block = blocks
            .iter()
            .find(|(f, _)| f == flag)
            .map(|(_, text)| text.as_str())
            .unwrap_or_else(|| panic!("{flag} is not documented in:\n{help}"));
        assert!(
            block.contains(&format!("[env: {var}=")),
            "{flag} does not name {var} in its own help:\n{block}"
        );
    }
}

#[test]
fn help_documents_every_option_with_its_variable() {
    let out = elector().args(["leader", "--help"]).output().expect("runs");
    let help = String::from_utf8_lossy(&out.stdout);
    assert_each_flag_has_its_variable(
        &help,
        &[
            ("--lease", "KVCACHE_ELECTOR_LEASE"),
            ("--namespace", "KVCACHE_ELECTOR_NAMESPACE"),
            ("--identity", "KVCACHE_ELECTOR_IDENTITY"),
            ("--address", "KVCACHE_ELECTOR_ADDRESS"),
            ("--lease-duration", "KVCACHE_ELECTOR_LEASE_DURATION"),
            ("--renew-deadline", "KVCACHE_ELECTOR_RENEW_DEADLINE"),
            ("--retry-period", "KVCACHE_ELECTOR_RETRY_PERIOD"),
            ("--child-health-url", "KVCACHE_ELECTOR_CHILD_HEALTH_URL"),
            ("--ready-addr", "KVCACHE_ELECTOR_READY_ADDR"),
            ("--stop-grace", "KVCACHE_ELECTOR_STOP_GRACE"),
        ],
    );
    let member = elector().args(["member", "--help"]).output().expect("runs");
    assert_each_flag_has_its_variable(
        &String::from_utf8_lossy(&member.stdout),
        &[
            ("--lease", "KVCACHE_ELECTOR_LEASE"),
            ("--namespace", "KVCACHE_ELECTOR_NAMESPACE"),
            ("--master-env", "KVCACHE_ELECTOR_MASTER_ENV"),
        ],
    );
}

#[test]
fn the_blocks_tell_a_flag_from_its_longer_sibling() {
    // `--lease` must not be satisfied by the `--lease-duration` block.
    let help = "      --lease <LEASE>\n          The Lease\n      --lease-duration <D>\n          [env: KVCACHE_ELECTOR_LEASE_DURATION=]\n";
    let blocks = option_blocks(help);
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    let result = std::panic::catch_unwind(|| {
        assert_each_flag_has_its_variable(help, &[("--lease", "KVCACHE_ELECTOR_LEASE")]);
    });
    assert!(result.is_err(), "--lease has no variable of its own here");
}

#[test]
fn the_environment_stands_in_for_flags() {
    // Without them the parser refuses, naming the flag.
    let bare = elector()
        .args(["leader", "--", "true"])
        .output()
        .expect("runs");
    assert!(!bare.status.success());
    assert!(String::from_utf8_lossy(&bare.stderr).contains("--lease <LEASE>"));
    // Each required variable stands in for its own flag: leave one out and that flag is named.
    let all = [
        ("KVCACHE_ELECTOR_LEASE", "--lease <LEASE>"),
        ("KVCACHE_ELECTOR_NAMESPACE", "--namespace <NAMESPACE>"),
        ("KVCACHE_ELECTOR_IDENTITY", "--identity <IDENTITY>"),
    ];
    for (missing, flag) in all {
        let mut cmd = elector();
        cmd.args(["leader", "--", "true"]);
        for (var, _) in all.iter().filter(|(v, _)| *v != missing) {
            cmd.env(var, "x");
        }
        let out = cmd.output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        // What clap says is missing comes before its usage line (which lists every flag).
        let err = stderr.split("Usage:").next().unwrap_or_default();
        assert!(!out.status.success());
        assert!(err.contains(flag), "without {missing}: {stderr}");
        for (_, other) in all.iter().filter(|(v, _)| *v != missing) {
            assert!(
                !err.contains(other),
                "{other} was given through its variable: {err}"
            );
        }
    }
    // With them it parses and goes on to the API server (absent here).
    let out = elector()
        .args(["leader", "--", "true"])
        .env("KVCACHE_ELECTOR_LEASE", "b-leader")
        .env("KVCACHE_ELECTOR_NAMESPACE", "ns")
        .env("KVCACHE_ELECTOR_IDENTITY", "pod-0")
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

/// The default elector image the operator renders into store Pods carries this crate's version:
/// the image moves when the elector does (and only then), never with an operator release alone.
#[test]
fn the_default_elector_image_is_tagged_with_this_crates_version() {
    let image = kvcache_api::settings::DEFAULT_ELECTOR_IMAGE;
    assert_eq!(
        image.rsplit_once(':').map(|(_, tag)| tag),
        Some(env!("CARGO_PKG_VERSION")),
        "{image}: bump its tag with crates/kvcache-elector's version"
    );
}
