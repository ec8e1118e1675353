//! The README's first command, `cargo xtask demo`, run to its end as a user would on this
//! machine: every step finishes (each waits for what it shows, so a step that does not happen
//! fails the run), the summary lists each, and the cluster is gone afterwards.

use std::process::Command;

use kvcache_e2e::paths;

/// Processes whose command line names the demo's cluster folder.
fn cluster_processes(folder: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(folder) {
            found.push(format!(
                "{}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

#[test]
fn the_demo_runs_every_step_and_tears_the_cluster_down() {
    let xtask = paths::xtask_bin().expect("the xtask binary");
    let out = Command::new(xtask)
        .arg("demo")
        .current_dir(paths::workspace_root())
        .output()
        .expect("running the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail = |t: &str| {
        t.lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        out.status.success(),
        "the demo failed ({}):\n{}\n--- stderr:\n{}",
        out.status,
        tail(&stdout),
        tail(&stderr)
    );
    let started: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("==> "))
        .collect();
    let finished: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("--- "))
        .filter_map(|l| l.rsplit_once(": ").map(|(title, _)| title))
        .collect();
    assert_eq!(started, finished, "every step that started finished");
    assert!(
        started.len() >= 6,
        "cluster, install, the walkthrough's three steps, HA, disk: {started:?}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let at = lines
        .iter()
        .rposition(|l| l.starts_with("Summary ("))
        .expect("a summary");
    let summary: Vec<&str> = lines[at + 1..]
        .iter()
        .copied()
        .take_while(|l| l.starts_with("  ") && !l.trim().is_empty())
        .collect();
    assert_eq!(summary.len(), started.len(), "{summary:#?} {started:#?}");
    for (line, title) in summary.iter().zip(&started) {
        let (secs, rest) = line
            .trim()
            .split_once("s  ")
            .expect("a duration and a title");
        assert!(secs.parse::<f64>().is_ok_and(|s| s >= 0.0), "{line}");
        assert_eq!(rest, *title);
    }
    // Torn down (no --keep): nothing runs from the demo's cluster folder.
    let folder = paths::cache_dir().join("run/cluster");
    let left = cluster_processes(&folder.display().to_string());
    assert!(left.is_empty(), "still running after the demo: {left:#?}");
    println!("{}", tail(&stdout));
}
