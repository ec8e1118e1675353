//! `cargo xtask crds`.

use std::path::PathBuf;

use anyhow::Context;

/// The workspace root: the parent of xtask's manifest directory, fixed at build time.
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

/// `cargo xtask manifests --out FILE`: the installation with these network settings, alone.
pub fn installation(
    out: &std::path::Path,
    control_plane: Vec<String>,
    metrics_from: Option<Vec<String>>,
) -> anyhow::Result<()> {
    let mut access = kvcache_render::install::Access {
        control_plane,
        ..Default::default()
    };
    if let Some(m) = metrics_from {
        access.metrics_from = m.into_iter().filter(|n| !n.is_empty()).collect();
    }
    let text = kvcache_render::install::operator_yaml_with_access(
        kvcache_render::plan::resolve::DEFAULT_NAMESPACE,
        kvcache_render::plan::resolve::DEFAULT_OPERATOR_IMAGE,
        &access,
    )?;
    std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

/// `cargo xtask manifests`: writes deploy/operator.yaml (the operator's installation).
pub fn manifests() -> anyhow::Result<()> {
    let path = root().join("deploy/operator.yaml");
    let text = kvcache_render::install::operator_yaml(
        kvcache_render::plan::resolve::DEFAULT_NAMESPACE,
        kvcache_render::plan::resolve::DEFAULT_OPERATOR_IMAGE,
    )?;
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    let chart = root().join("deploy/helm/kvcache-operator");
    if chart.exists() {
        std::fs::remove_dir_all(&chart)?;
    }
    for (name, text) in kvcache_render::install::helm_chart(
        kvcache_render::plan::resolve::DEFAULT_NAMESPACE,
        kvcache_render::plan::resolve::DEFAULT_OPERATOR_IMAGE,
    )? {
        let path = chart.join(name);
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("wrote {}", chart.display());
    let dir = root().join("deploy/monitoring");
    std::fs::create_dir_all(&dir)?;
    for (name, text) in kvcache_render::install::monitoring::files(
        kvcache_render::plan::resolve::DEFAULT_NAMESPACE,
    )? {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    let runbook = root().join("docs/troubleshooting.md");
    let text = std::fs::read_to_string(&runbook)
        .with_context(|| format!("reading {}", runbook.display()))?;
    let text = kvcache_render::install::monitoring::with_runbook(&text).with_context(|| {
        format!(
            "{} lacks the alerts markers {:?}",
            runbook.display(),
            kvcache_render::install::monitoring::RUNBOOK_MARKERS
        )
    })?;
    std::fs::write(&runbook, text).with_context(|| format!("writing {}", runbook.display()))?;
    println!("wrote the alerts' runbook in {}", runbook.display());
    Ok(())
}
