//! Images of one binary each on an empty base: the operator and the elector (release builds
//! of this workspace) and etcd (the control plane's own).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use kvcache_e2e::images::{self, Image};

use crate::crds::root;

use super::base::RECIPE;
use super::buildah::{buildah, save, stale};

/// `cargo` without what a parent cargo put in the environment of the process it runs (`cargo
/// run` for `cargo xtask ...`, `cargo test` for the demo's test): those differ between the two
/// (`LD_LIBRARY_PATH`, the package's `CARGO_*`), and the release build run from the
/// demo's test recompiled every crate the suite's set-up had just built (about 2.5 minutes).
fn plain_cargo() -> Command {
    let mut cargo = Command::new(env!("CARGO"));
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let set_for_a_child = key == "LD_LIBRARY_PATH"
            || key == "OUT_DIR"
            || key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_BIN_")
            || matches!(
                key,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
            );
        if set_for_a_child {
            cargo.env_remove(key);
        }
    }
    cargo
}

/// The operator image and the elector image: each a release binary and the glibc files `ldd`
/// names, staged as the build context of its Dockerfile (the repository's `Dockerfile`, and
/// `images/elector/Dockerfile`). Two images so that an operator upgrade changes no store Pod
/// (store Pods take only the elector's).
pub(super) fn operator_image(dir: &Path) -> anyhow::Result<()> {
    let root = root();
    let status = plain_cargo()
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "kvcache-operator",
            "-p",
            "kvcache-elector",
        ])
        .current_dir(&root)
        .status()
        .context("cargo build --release")?;
    if !status.success() {
        bail!("building the operator's release binaries failed with {status}");
    }
    let release = root.join("target/release");
    binary_image(
        dir,
        &images::OPERATOR,
        &release.join("kvcache-operator"),
        &root.join("Dockerfile"),
    )?;
    binary_image(
        dir,
        &images::ELECTOR,
        &release.join("kvcache-elector"),
        &root.join("images/elector/Dockerfile"),
    )
}

/// The etcd image of warm-failover backends: the control plane's own etcd (built from the
/// module the Kubernetes release pins, a static binary) on an empty base
/// (`images/etcd/Dockerfile`).
pub(super) fn etcd_image(dir: &Path) -> anyhow::Result<()> {
    binary_image(
        dir,
        &images::ETCD,
        &kvcache_e2e::paths::k8s_bin()?.join("etcd"),
        &root().join("images/etcd/Dockerfile"),
    )
}

/// One image of one binary (and the shared libraries it links) on an empty base; rebuilt when
/// the binary or the Dockerfile changes.
fn binary_image(
    dir: &Path,
    image: &Image,
    path: &Path,
    dockerfile_path: &Path,
) -> anyhow::Result<()> {
    let root = root();
    let binary = path
        .file_name()
        .and_then(|n| n.to_str())
        .context("a binary's file name")?;
    let dockerfile = std::fs::read_to_string(dockerfile_path)
        .with_context(|| format!("reading {}", dockerfile_path.display()))?;
    let m = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let modified = m
        .modified()?
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let inputs = format!(
        "recipe {RECIPE}\n{dockerfile}\n{binary} {} {}",
        m.len(),
        modified.as_nanos()
    );
    if !stale(dir, image, &inputs) {
        return Ok(());
    }
    let started = Instant::now();
    let context = root.join("target/image-context").join(binary);
    let _ = std::fs::remove_dir_all(&context);
    let bin = context.join("rootfs/usr/local/bin");
    std::fs::create_dir_all(&bin)?;
    std::fs::copy(path, bin.join(binary))?;
    for lib in linked_libraries(path)? {
        let to = context.join("rootfs").join(lib.strip_prefix("/")?);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(&lib, &to).with_context(|| format!("copying {}", lib.display()))?;
    }
    std::fs::write(context.join("Dockerfile"), &dockerfile)?;
    buildah(&[
        "build",
        "--quiet",
        "--pull-never",
        "-t",
        image.name,
        "-f",
        &context.join("Dockerfile").display().to_string(),
        &context.display().to_string(),
    ])?;
    save(dir, image, &inputs)?;
    println!(
        "setup: image {} built in {:.0?}",
        image.name,
        started.elapsed()
    );
    Ok(())
}

/// The shared libraries a binary loads (and the loader), as `ldd` resolves them.
fn linked_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next(),
                None => l.split_whitespace().next(),
            }?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}
