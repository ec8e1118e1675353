//! `cargo xtask test`: every test in the workspace, unit and end-to-end, with their parts
//! installed; closes with one summary line over every test binary.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::setup;

/// The variables the end-to-end harness reads to find the installed parts.
pub const ENV_K8S_BIN: &str = "KVCACHE_K8S_BIN";
/// See [`ENV_K8S_BIN`].
pub const ENV_MOONCAKE_VENV: &str = "KVCACHE_MOONCAKE_VENV";
/// See [`ENV_K8S_BIN`].
pub const ENV_XTASK_BIN: &str = "KVCACHE_XTASK_BIN";

/// Counts from one `test result:` line of the libtest harness: `Ok(None)` for any other line,
/// an error for a result line whose counts cannot be read (never a silent zero).
fn counts(line: &str) -> anyhow::Result<Option<(u64, u64, u64)>> {
    let Some(rest) = line.trim().strip_prefix("test result: ") else {
        return Ok(None);
    };
    let body = rest
        .strip_prefix("ok.")
        .or_else(|| rest.strip_prefix("FAILED."))
        .with_context(|| {
            format!("unreadable test result line (neither ok. nor FAILED.): {line:?}")
        })?;
    let number = |word: &str| -> anyhow::Result<u64> {
        let part = body
            .split(';')
            .map(str::trim)
            .find(|part| part.ends_with(word))
            .with_context(|| format!("no {word:?} count in the test result line {line:?}"))?;
        let n = part.trim_end_matches(word).trim();
        n.parse()
            .with_context(|| format!("{n:?} is not a {word} count in {line:?}"))
    };
    Ok(Some((
        number("passed")?,
        number("failed")?,
        number("ignored")?,
    )))
}

/// The test that holds the operator's RBAC against the audit logs of the whole run (ignored in
/// a plain `cargo test`, which may run it before the binaries that write them).
const RBAC_AUDIT: &[&str] = &[
    "-p",
    "kvcache-e2e",
    "--test",
    "rbac_audit",
    "--",
    "--ignored",
];

pub fn run(extra: &[String]) -> anyhow::Result<()> {
    let installed = setup::all()?;
    // The whole suite: every control plane logs its operator's calls into one empty folder,
    // which the RBAC audit reads after the rest.
    let audit = extra.is_empty().then(|| {
        kvcache_e2e::paths::workspace_root()
            .join("target")
            .join("kvcache-audit")
    });
    if let Some(dir) = &audit {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("emptying {}", dir.display()))?;
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut totals = (0, 0, 0);
    let mut failures = Vec::new();
    // Every test (or those `extra` selects), then, for the whole suite, the RBAC audit.
    let mut passes: Vec<Vec<String>> = vec![
        ["--workspace", "--no-fail-fast"]
            .iter()
            .map(|s| (*s).to_owned())
            .chain(extra.iter().cloned())
            .collect(),
    ];
    if audit.is_some() {
        passes.push(RBAC_AUDIT.iter().map(|s| (*s).to_owned()).collect());
    }
    for args in &passes {
        let (counts, status) = cargo_test(args, &installed, audit.as_deref())?;
        totals.0 += counts.0;
        totals.1 += counts.1;
        totals.2 += counts.2;
        if !status.success() {
            failures.push(format!("cargo test {} ({status})", args.join(" ")));
        }
    }
    let (passed, failed, ignored) = totals;
    println!("summary: {passed} passed, {failed} failed, {ignored} skipped");
    if audit.is_none() {
        println!("(the RBAC audit, tests/tests/rbac_audit.rs, runs with the whole suite only)");
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(())
}

/// One `cargo test` with the installed parts named (and the audit folder, for the whole suite),
/// its output passed through; the counts of its result lines and its exit status.
fn cargo_test(
    args: &[String],
    installed: &setup::Installed,
    audit: Option<&std::path::Path>,
) -> anyhow::Result<((u64, u64, u64), std::process::ExitStatus)> {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    command.arg("test").args(args);
    if let Some(dir) = audit {
        command.env(kvcache_e2e::cluster::ENV_AUDIT_DIR, dir);
    }
    let mut child = command
        .env(ENV_K8S_BIN, &installed.k8s_bin)
        .env(ENV_MOONCAKE_VENV, &installed.mooncake_venv)
        .env("KVCACHE_IMAGES", &installed.images)
        // The demo's test runs this very binary rather than building xtask again with the
        // features one package alone unifies to (a rebuild of its dependencies, minutes).
        .env(
            ENV_XTASK_BIN,
            std::env::current_exe().context("this binary's path")?,
        )
        .stdout(Stdio::piped())
        .spawn()
        .context("starting cargo test")?;
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    if let Some(out) = child.stdout.take() {
        let mut stdout = std::io::stdout().lock();
        for line in BufReader::new(out).lines() {
            let line = line.context("reading cargo test output")?;
            if let Some((p, f, i)) = counts(&line)? {
                passed += p;
                failed += f;
                ignored += i;
            }
            writeln!(stdout, "{line}")?;
        }
    }
    let status = child.wait()?;
    Ok(((passed, failed, ignored), status))
}

#[cfg(test)]
mod tests {
    use super::counts;

    #[test]
    fn reads_libtest_result_lines() {
        assert_eq!(
            counts(
                "test result: ok. 24 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.04s"
            )
            .expect("readable"),
            Some((24, 0, 1))
        );
        assert_eq!(
            counts(
                "test result: FAILED. 10 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out"
            )
            .expect("readable"),
            Some((10, 2, 0))
        );
        assert_eq!(counts("running 3 tests").expect("not a result line"), None);
    }

    #[test]
    fn an_unreadable_result_line_is_an_error() {
        for line in [
            "test result: ok. many passed; 0 failed; 0 ignored",
            "test result: ok. 3 passed; 0 ignored",
            "test result: maybe. 3 passed; 0 failed; 0 ignored",
            "test result: FAILED. 3 passed; -1 failed; 0 ignored",
        ] {
            assert!(counts(line).is_err(), "{line}");
        }
    }
}
