//! Engine and store version lines (docs/design.md#version-lines): a store and a client on
//! different minor lines pass every probe and then fail every write (`RPC_FAIL`, -900), so such a
//! pair is refused.

use crate::engines::EngineRow;

/// A dotted version's numeric parts (`0.3.13.post1` → [0, 3, 13]); the `.postN` suffix is a
/// build of the same line.
pub fn numbers(version: &str) -> Option<Vec<u64>> {
    let v = version.trim().trim_start_matches('v');
    let parts: Vec<u64> = v
        .split(['.', '-', '+'])
        .take_while(|p| !p.starts_with("post") && !p.is_empty())
        .map_while(|p| p.parse().ok())
        .collect();
    (parts.len() >= 2).then_some(parts)
}

/// The minor line of a version (`0.3.13.post1` → `0.3.13`: Mooncake's 0.x lines move on the third
/// number).
pub fn line(version: &str) -> Option<String> {
    let n = numbers(version)?;
    Some(
        n.iter()
            .take(3)
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join("."),
    )
}

/// The store version an image tag names (`gpustack/mirrored-mooncake:0.3.13.post1-cpu`,
/// `kvcacheai/mooncake:0.3.12.post1`), if it names one.
pub fn store_version_of_image(image: &str) -> Option<String> {
    let (_, tag) = image.rsplit_once(':')?;
    if tag.contains('/') {
        return None; // a registry port, not a tag
    }
    let version = tag.split('-').next()?;
    numbers(version).map(|_| version.to_owned())
}

/// The store client an engine version carries, per the engine's lines.
pub(crate) fn client_of(row: &EngineRow, engine_version: &str) -> Option<&'static str> {
    let v = numbers(engine_version)?;
    row.client_lines
        .iter()
        .rev()
        .find(|l| numbers(l.from_engine).is_some_and(|from| v >= from))
        .map(|l| l.client)
}

/// What the pair of versions means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pairing {
    /// Same line.
    Compatible,
    /// Different lines: refuse.
    Mismatch {
        /// The store's version (e.g. `0.3.13.post1`): what the running master reports
        /// (`status.storeVersion`), else what the backend's image tag names.
        store: String,
        /// The store client the engine's version carries, per the engine's version lines.
        client: String,
    },
    /// Something unknown: warn, do not refuse.
    Unknown(String),
}

/// Judges a store version against an engine version.
pub fn pair(row: &EngineRow, store: Option<&str>, engine_version: Option<&str>) -> Pairing {
    let Some(store) = store else {
        return Pairing::Unknown(
            "the store image names no version, so its client line cannot be checked".into(),
        );
    };
    let Some(version) = engine_version else {
        return Pairing::Unknown(format!(
            "no {} version is known (a role with its own image), so its store client cannot be checked against store {store}",
            row.name
        ));
    };
    let Some(client) = client_of(row, version) else {
        return Pairing::Unknown(format!(
            "{} {version} is not in the version table (lowest known: {}), so its store client is not known",
            row.name,
            row.client_lines.first().map_or("-", |l| l.from_engine)
        ));
    };
    match (line(store), line(client)) {
        (Some(s), Some(c)) if s == c => Pairing::Compatible,
        (Some(_), Some(_)) => Pairing::Mismatch {
            store: store.to_owned(),
            client: client.to_owned(),
        },
        _ => Pairing::Unknown(format!("store {store} or client {client} is not a version")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::{ENGINES, Engine};

    fn row(e: Engine) -> &'static EngineRow {
        ENGINES.iter().find(|r| r.engine == e).expect("row")
    }

    #[test]
    fn lines_and_images() {
        assert_eq!(line("0.3.13.post1").as_deref(), Some("0.3.13"));
        assert_eq!(line("0.3.12").as_deref(), Some("0.3.12"));
        assert_eq!(
            store_version_of_image("gpustack/mirrored-mooncake:0.3.13.post1-cpu").as_deref(),
            Some("0.3.13.post1")
        );
        assert_eq!(
            store_version_of_image("docker.io/kvcacheai/mooncake:0.3.13").as_deref(),
            Some("0.3.13")
        );
        assert_eq!(store_version_of_image("kvcacheai/mooncake:latest"), None);
        assert_eq!(store_version_of_image("registry:5000/mooncake"), None);
    }

    #[test]
    fn the_documented_pairs() {
        let vllm = row(Engine::Vllm);
        let sglang = row(Engine::Sglang);
        assert_eq!(client_of(vllm, "0.29.0"), Some("0.3.13.post1"));
        assert_eq!(client_of(vllm, "0.30.1"), Some("0.3.13.post1"));
        assert_eq!(client_of(vllm, "0.28.0"), None);
        assert_eq!(
            client_of(row(Engine::VllmAscend), "0.23.0"),
            Some("0.3.11.post1")
        );
        assert_eq!(
            pair(vllm, Some("0.3.13.post1"), Some("0.29.0")),
            Pairing::Compatible
        );
        assert_eq!(
            pair(sglang, Some("0.3.13.post1"), Some("0.5.18")),
            Pairing::Mismatch {
                store: "0.3.13.post1".into(),
                client: "0.3.12.post1".into()
            }
        );
        assert_eq!(
            pair(sglang, Some("0.3.12.post1"), Some("0.5.18")),
            Pairing::Compatible
        );
        assert!(matches!(
            pair(vllm, None, Some("0.29.0")),
            Pairing::Unknown(_)
        ));
        assert!(matches!(
            pair(vllm, Some("0.3.13"), Some("0.1.0")),
            Pairing::Unknown(_)
        ));
    }
}
