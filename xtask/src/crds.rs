//! `cargo xtask crds`.

use std::path::PathBuf;

use anyhow::Context;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

pub fn write() -> anyhow::Result<()> {
    let dir = root().join("deploy/crds");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for crd in kvcache_api::crd::all() {
        let path = dir.join(kvcache_api::crd::file_name(&crd));
        std::fs::write(&path, kvcache_api::crd::to_yaml(&crd)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
