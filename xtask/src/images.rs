//! The nodes' images, built locally without a registry (table: `kvcache_e2e::images`):
//! - pause and busybox from Debian's static busybox;
//! - a Debian bookworm base made by `debootstrap` (python3 and the store's shared libraries,
//!   a non-root user `mooncake`, uid 65532 as the published image), from which the store image (the PyPI wheel in
//!   `/opt/mooncake`) and the engine stand-ins (`images/engine`, with the store's client or an
//!   older one) are layered;
//! - the operator image from the repository's `Dockerfile` and the elector image from
//!   `images/elector/Dockerfile` (a release binary each on an empty base).
//!
//! Each is written as an OCI archive into the image cache and rebuilt only when its inputs
//! change (a `.inputs` file beside the archive records them).

mod base;
mod binary;
mod buildah;
mod mooncake;
mod vllm;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use kvcache_e2e::images::{self, Image};
use kvcache_e2e::paths::{MOONCAKE_PACKAGE, MOONCAKE_VERSION, cache_dir};

use base::{BASE_NAME, BASE_PACKAGES, RECIPE, SUITE, base_image, busybox_images};
use binary::{etcd_image, operator_image};
use buildah::{buildah, save, stale};
use mooncake::{
    CUDA_RUNTIME, PRE_TENANCY_VERSION, engine_image, standin_digest, store_image, wheels,
};
use vllm::vllm_image;

/// Builds every image that is missing or stale; returns the image cache.
pub fn all() -> anyhow::Result<PathBuf> {
    let dir = cache_dir().join("images");
    std::fs::create_dir_all(&dir)?;
    busybox_images(&dir)?;
    let base = format!("{SUITE} {BASE_PACKAGES} recipe {RECIPE}");
    let store_inputs = format!("{base}; {MOONCAKE_PACKAGE}=={MOONCAKE_VERSION}");
    let standin = standin_digest()?;
    let old = images::OLD_CLIENT_VERSION;
    // The 0.3.11.post1 wheel: the webhook test runs its real (pre-multi-tenancy) master.
    wheels(PRE_TENANCY_VERSION, &[])?;
    let plans: [(Image, String); 3] = [
        (images::STORE, store_inputs.clone()),
        (
            images::ENGINE,
            format!("{store_inputs}; stand-in {standin}"),
        ),
        (
            images::ENGINE_OLD_CLIENT,
            format!("{base}; {MOONCAKE_PACKAGE}=={old} {CUDA_RUNTIME}; stand-in {standin}"),
        ),
    ];
    let stale: Vec<&(Image, String)> = plans.iter().filter(|(i, w)| stale(&dir, i, w)).collect();
    if !stale.is_empty() {
        base_image(&dir, &base)?;
        for (image, inputs) in stale {
            let started = Instant::now();
            match image.archive {
                a if a == images::STORE.archive => store_image(&dir, MOONCAKE_VERSION)?,
                a if a == images::ENGINE.archive => engine_image(&dir, images::STORE.name, None)?,
                _ => engine_image(&dir, BASE_NAME, Some(old))?,
            }
            save(&dir, image, inputs)?;
            println!(
                "setup: image {} built in {:.0?}",
                image.name,
                started.elapsed()
            );
        }
    }
    operator_image(&dir)?;
    etcd_image(&dir)?;
    vllm_image(&dir, &base)?;
    // Superseded builds stay in buildah's storage as unnamed images (a few hundred MB each):
    // remove them. The archives above are what the nodes load.
    buildah(&["rmi", "--prune"]).context("pruning superseded image builds")?;
    Ok(dir)
}
