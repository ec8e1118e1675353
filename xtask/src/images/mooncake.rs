//! The store image and the engine stand-ins: Mooncake's wheels, downloaded once, installed on
//! the Debian base.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use kvcache_e2e::images;
use kvcache_e2e::paths::{MOONCAKE_PACKAGE, cache_dir};

use crate::crds::root;

use super::base::BASE_NAME;
use super::buildah::{buildah, commit, container, files_digest, run_in};

/// The wheels of one Mooncake version and its dependencies, downloaded once (the image builds
/// install them without reaching the network).
/// The Mooncake version before multi-tenancy whose wheel setup keeps for the tests.
pub(super) const PRE_TENANCY_VERSION: &str = "0.3.11.post1";

/// The CUDA runtime library the 0.3.12 non-CUDA wheels link against (`libcudart.so.12`, loaded
/// at import; nothing calls into it without a GPU), from PyPI.
pub(super) const CUDA_RUNTIME: &str = "nvidia-cuda-runtime-cu12==12.9.79";

/// The image's Python environment (the store's and the stand-ins' Mooncake install).
const SITE_PACKAGES: &str = "/opt/mooncake/lib/python3.11/site-packages";

/// Downloads the wheels of Mooncake `version` (and of `extra` requirements) with their
/// dependencies, once, into the cache.
pub(super) fn wheels(version: &str, extra: &[&str]) -> anyhow::Result<PathBuf> {
    let dir = cache_dir().join("wheels").join(version);
    let marker = dir.join(".complete");
    let want = std::iter::once(version)
        .chain(extra.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == want) {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)?;
    let mut what = vec![format!("{MOONCAKE_PACKAGE}=={version}")];
    what.extend(extra.iter().map(|e| (*e).to_owned()));
    pip_download(&dir, &[], &what)?;
    std::fs::write(&marker, want)?;
    Ok(dir)
}

/// `pip download` of binary wheels for `what` (requirements and `-r FILE`) into `dir`, with
/// the further `flags`.
pub(super) fn pip_download(dir: &Path, flags: &[&str], what: &[String]) -> anyhow::Result<()> {
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--quiet", "--only-binary=:all:"])
        .args(flags)
        .arg("-d")
        .arg(dir)
        .args(what)
        .status()
        .context("running pip download")?;
    if !status.success() {
        bail!("pip download {} failed with {status}", what.join(" "));
    }
    Ok(())
}

/// Installs a Mooncake version into `/opt/mooncake` of container `c`, with the real binaries
/// on PATH (the `bin/` wrappers of the wheel are Python scripts; the processes a Pod runs should
/// be the binaries themselves).
fn install_mooncake(
    c: &str,
    version: &str,
    extra: &[&str],
    keep_bench: bool,
) -> anyhow::Result<()> {
    let wheels = wheels(version, extra)?;
    let extra = extra.join(" ");
    buildah(&["copy", c, &wheels.display().to_string(), "/tmp/wheels"])?;
    let site = SITE_PACKAGES;
    let bench = if keep_bench {
        String::new()
    } else {
        format!("rm -f {site}/mooncake/transfer_engine_bench\n")
    };
    run_in(
        c,
        &format!(
            "python3 -m venv /opt/mooncake\n/opt/mooncake/bin/pip install --quiet --no-index --find-links /tmp/wheels {MOONCAKE_PACKAGE}=={version} {extra}\nrm -rf /tmp/wheels {site}/pip {site}/pip-* {site}/setuptools {site}/setuptools-* /root/.cache\n{bench}for b in mooncake_master mooncake_client; do if [ -x {site}/mooncake/$b ]; then ln -sf {site}/mooncake/$b /usr/local/bin/$b; fi; done\nfind /opt/mooncake -name __pycache__ -prune -exec rm -rf {{}} +"
        ),
    )
}

pub(super) fn store_image(_dir: &Path, version: &str) -> anyhow::Result<()> {
    let c = container(BASE_NAME)?;
    buildah(&["config", "--user", "0:0", &c])?;
    install_mooncake(&c, version, &[], false)?;
    buildah(&[
        "config",
        "--user",
        "65532:65532",
        "--label",
        &format!("org.opencontainers.image.version={version}"),
        "--cmd",
        "mooncake_master",
        &c,
    ])?;
    commit(&c, images::STORE.name)
}

/// The engine stand-in on `from` (the store image, whose client it then shares), or on the base
/// with the older client `old` installed.
pub(super) fn engine_image(_dir: &Path, from: &str, old: Option<&str>) -> anyhow::Result<()> {
    let c = container(from)?;
    buildah(&["config", "--user", "0:0", &c])?;
    if let Some(version) = old {
        install_mooncake(&c, version, &[CUDA_RUNTIME], false)?;
        buildah(&[
            "config",
            "--env",
            // Where PyPI's CUDA runtime package puts the library.
            &format!("LD_LIBRARY_PATH={SITE_PACKAGES}/nvidia/cuda_runtime/lib"),
            &c,
        ])?;
    }
    let src = root().join("images/engine");
    for (file, to) in [
        ("standin.py", "/opt/standin/standin.py"),
        ("sglang/__init__.py", "/opt/standin/sglang/__init__.py"),
        (
            "sglang/launch_server.py",
            "/opt/standin/sglang/launch_server.py",
        ),
        ("vllm", "/usr/local/bin/vllm"),
        ("sglang-cli", "/usr/local/bin/sglang"),
    ] {
        buildah(&[
            "copy",
            "--chmod",
            "0755",
            &c,
            &src.join(file).display().to_string(),
            to,
        ])?;
    }
    let name = if old.is_some() {
        images::ENGINE_OLD_CLIENT.name
    } else {
        images::ENGINE.name
    };
    buildah(&[
        "config",
        "--user",
        "65532:65532",
        "--env",
        "PYTHONPATH=/opt/standin",
        "--env",
        "PYTHONUNBUFFERED=1",
        "--cmd",
        "vllm serve stand-in",
        &c,
    ])?;
    commit(&c, name)
}

/// A digest of the stand-in's files, so an edit rebuilds the engine images.
pub(super) fn standin_digest() -> anyhow::Result<String> {
    files_digest(
        "images/engine",
        &[
            "standin.py",
            "vllm",
            "sglang-cli",
            "sglang/__init__.py",
            "sglang/launch_server.py",
        ],
    )
}
