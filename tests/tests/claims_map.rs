//! `docs/seed-claims.md` maps every claim of the seed documents to the end-to-end tests that show
//! it. This keeps the map true: every test it names exists in the binary it names (in any of its
//! modules), as a test, and every claim names at least one.

use std::path::Path;

const MAP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/seed-claims.md");
const TESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests");

/// The `binary::name` references of one table row.
fn references(row: &str) -> Vec<(String, String)> {
    row.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|r| r.split_once("::"))
        .filter(|(b, n)| {
            [b, n]
                .iter()
                .all(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        })
        .map(|(b, n)| (b.to_owned(), n.to_owned()))
        .collect()
}

/// The sources of the test binary `binary`, and where they are: `tests/<binary>.rs`, or every
/// file of `tests/<binary>/` (a binary whose `main.rs` has its tests in modules).
fn sources(binary: &str) -> Result<(String, Vec<String>), String> {
    let file = Path::new(TESTS).join(format!("{binary}.rs"));
    if file.is_file() {
        let source =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        return Ok((file.display().to_string(), vec![source]));
    }
    let dir = Path::new(TESTS).join(binary);
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut sources = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if path.extension().is_some_and(|e| e == "rs") {
            sources.push(
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?,
            );
        }
    }
    Ok((dir.display().to_string(), sources))
}

/// Whether `source` declares `name` as a test: `fn name(` with a test attribute just above it.
fn declares_test(source: &str, name: &str) -> bool {
    let lines: Vec<&str> = source.lines().collect();
    lines.iter().enumerate().any(|(i, l)| {
        let l = l.trim_start();
        (l.starts_with(&format!("fn {name}(")) || l.starts_with(&format!("async fn {name}(")))
            && lines[i.saturating_sub(2)..i].iter().any(|a| {
                let a = a.trim();
                a == "#[test]" || a.starts_with("#[tokio::test")
            })
    })
}

#[test]
fn every_claim_names_tests_that_exist() {
    let map = std::fs::read_to_string(MAP).expect("docs/seed-claims.md");
    let rows: Vec<&str> = map
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| Claim"))
        .collect();
    assert!(rows.len() >= 30, "the map lost its rows: {}", rows.len());
    let mut missing = Vec::new();
    for row in &rows {
        let refs = references(row);
        if refs.is_empty() {
            missing.push(format!("a claim without a test: {row}"));
        }
        for (binary, name) in refs {
            match sources(&binary) {
                Ok((_, sources)) if sources.iter().any(|s| declares_test(s, &name)) => {}
                Ok((place, _)) => {
                    missing.push(format!("{binary}::{name}: no such test in {place}"))
                }
                Err(e) => missing.push(format!("{binary}::{name}: {e}")),
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/seed-claims.md is stale:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_renamed_test_is_reported() {
    let source = "#[test]\nfn a_claim() {}\n\nfn helper() {}\n#[tokio::test(flavor = \"multi_thread\")]\nasync fn b() {}\n";
    assert!(declares_test(source, "a_claim"));
    assert!(declares_test(source, "b"));
    assert!(!declares_test(source, "helper"), "not a test");
    assert!(!declares_test(source, "a_clai"));
    assert_eq!(
        references("| x | `store_on_nodes::a_b`, `api_server::c` and `not a ref` |"),
        [
            ("store_on_nodes".into(), "a_b".into()),
            ("api_server".into(), "c".into())
        ]
    );
}
