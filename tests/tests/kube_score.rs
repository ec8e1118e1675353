//! kube-score (github.com/zegl/kube-score, built by `cargo xtask setup` from
//! `xtask/go/kube-score`) over the installation (`deploy/operator.yaml`) and every object the
//! operator renders for the walkthrough: each critical finding is fixed or justified in
//! `tests/kube-score-justified.tsv` (the finding's text, a tab, why), and a justification that no
//! longer matches anything fails too.

use std::collections::BTreeSet;
use std::path::Path;

use kvcache_api::{Settings, manifest};
use kvcache_e2e::paths;
use kvcache_render::plan::resolve::{DEFAULT_NAMESPACE, Environment, render_all};

const JUSTIFIED: &str = "kube-score-justified.tsv";

/// The walkthrough's manifests rendered into the objects the operator creates, as one YAML
/// stream.
fn rendered_walkthrough() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/walkthrough");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the walkthrough")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut objects = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("a manifest");
        objects.extend(
            manifest::parse(&f.display().to_string(), &text)
                .expect("parses")
                .into_iter()
                .map(|m| m.object),
        );
    }
    let settings = Settings::default();
    let env = Environment {
        namespace: DEFAULT_NAMESPACE,
        settings: &settings,
    };
    let docs = render_all(&objects, &env).unwrap_or_else(|e| panic!("renders: {e:?}"));
    docs.iter()
        .map(|d| serde_yaml::to_string(d).expect("YAML"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// A finding without the object it is about: `(container) what` or `what`.
fn finding(line: &str) -> Option<String> {
    let rest = line.strip_prefix("[CRITICAL] ")?;
    let (_, what) = rest.split_once(": ")?;
    Some(what.trim().to_owned())
}

#[test]
fn every_critical_kube_score_finding_is_fixed_or_justified() {
    let bin = paths::k8s_bin()
        .expect("the parts `cargo xtask setup` installs")
        .join("kube-score");
    assert!(
        bin.exists(),
        "{} missing: run `cargo xtask setup`",
        bin.display()
    );
    let dir = paths::scratch("kube-score").expect("a scratch folder");
    let rendered = dir.join("walkthrough-rendered.yaml");
    std::fs::write(&rendered, rendered_walkthrough()).expect("written");
    let install = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/operator.yaml");
    let out = std::process::Command::new(&bin)
        .args(["score", "--output-format", "ci"])
        .arg(&install)
        .arg(&rendered)
        .output()
        .expect("kube-score runs");
    let text = String::from_utf8_lossy(&out.stdout);
    // Exit status 1 means findings; anything else is kube-score failing.
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "kube-score failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("[OK]"), "kube-score scored nothing: {text}");
    let justified: Vec<(String, String)> =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(JUSTIFIED))
            .expect("the justifications")
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .map(|l| {
                let (what, why) = l.split_once('\t').expect("finding<TAB>why");
                assert!(!why.trim().is_empty(), "{what}: a justification says why");
                (what.to_owned(), why.to_owned())
            })
            .collect();
    let findings: BTreeSet<String> = text.lines().filter_map(finding).collect();
    let unjustified: Vec<&String> = findings
        .iter()
        .filter(|f| !justified.iter().any(|(what, _)| what == *f))
        .collect();
    assert!(
        unjustified.is_empty(),
        "critical kube-score findings neither fixed nor justified in tests/{JUSTIFIED}:\n{}",
        unjustified
            .iter()
            .map(|f| f.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let stale: Vec<&str> = justified
        .iter()
        .filter(|(what, _)| !findings.contains(what))
        .map(|(what, _)| what.as_str())
        .collect();
    assert!(
        stale.is_empty(),
        "justified in tests/{JUSTIFIED} but no longer found (remove them): {stale:?}"
    );
}
