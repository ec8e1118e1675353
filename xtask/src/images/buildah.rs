//! buildah (each call on the `vfs` storage driver), the archives it writes into the image
//! cache, and the inputs recorded beside each archive that say when it is stale.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use kvcache_e2e::images::Image;

use crate::crds::root;

pub(super) fn stale(dir: &Path, image: &Image, inputs: &str) -> bool {
    !dir.join(image.archive).exists()
        || std::fs::read_to_string(inputs_file(dir, image))
            .ok()
            .as_deref()
            != Some(inputs)
}

fn inputs_file(dir: &Path, image: &Image) -> PathBuf {
    dir.join(format!("{}.inputs", image.archive))
}

/// Writes the image's archive (layers uncompressed: the nodes import them faster) and records
/// its inputs.
pub(super) fn save(dir: &Path, image: &Image, inputs: &str) -> anyhow::Result<()> {
    let archive = dir.join(image.archive);
    let _ = std::fs::remove_file(&archive);
    buildah(&[
        "push",
        "--disable-compression",
        image.name,
        &format!("oci-archive:{}:{}", archive.display(), image.name),
    ])?;
    std::fs::write(inputs_file(dir, image), inputs)?;
    Ok(())
}

pub(super) fn buildah(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("buildah")
        .args(args)
        .env("STORAGE_DRIVER", "vfs")
        .output()
        .with_context(|| format!("running buildah {args:?}"))?;
    if !out.status.success() {
        bail!(
            "buildah {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A working container from `from`; its id.
pub(super) fn container(from: &str) -> anyhow::Result<String> {
    let out = buildah(&["from", "--pull-never", from])?;
    Ok(out.lines().last().unwrap_or_default().to_owned())
}

pub(super) fn run_in(c: &str, script: &str) -> anyhow::Result<()> {
    buildah(&["run", "--isolation", "chroot", c, "--", "sh", "-ec", script]).map(drop)
}

/// Like [`run_in`], with the host folder `from` mounted read-only at `at` (what the script
/// installs from stays out of the image's layers).
pub(super) fn run_in_with(c: &str, (from, at): (&Path, &str), script: &str) -> anyhow::Result<()> {
    let volume = format!("{}:{at}:ro", from.display());
    buildah(&[
        "run",
        "--isolation",
        "chroot",
        "--volume",
        &volume,
        c,
        "--",
        "sh",
        "-ec",
        script,
    ])
    .map(drop)
}

pub(super) fn commit(c: &str, name: &str) -> anyhow::Result<()> {
    buildah(&["commit", "-q", "--rm", c, name]).map(drop)
}

/// A digest (FNV-1a) of the names and bytes of `files` under the repository folder `folder`.
pub(super) fn files_digest(folder: &str, files: &[&str]) -> anyhow::Result<String> {
    let dir = root().join(folder);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for file in files {
        let bytes =
            std::fs::read(dir.join(file)).with_context(|| format!("reading {folder}/{file}"))?;
        for b in file.bytes().chain(bytes) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(format!("{h:016x}"))
}
