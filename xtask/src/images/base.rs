//! The bases: pause and busybox from Debian's static busybox, and the Debian base the store,
//! engine stand-in and vLLM images are layered on.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use kvcache_e2e::images;

use super::buildah::{buildah, commit, save, stale};

/// Debian packages of the base: the interpreter and what the wheel's binaries link.
pub(super) const BASE_PACKAGES: &str =
    "python3,python3-venv,libibverbs1,libcurl4,libnuma1,ca-certificates";

/// The Debian release and mirror of the base (the machine's own apt source).
pub(super) const SUITE: &str = "bookworm";

const MIRROR: &str = "http://deb.debian.org/debian";

/// Bumped when a recipe below changes in a way its inputs do not show.
pub(super) const RECIPE: u32 = 2;

pub(super) const BASE_NAME: &str = "localhost/kvcache/base:bookworm";

/// The sandbox image and the busybox image, from Debian's static busybox.
pub(super) fn busybox_images(dir: &Path) -> anyhow::Result<()> {
    let busybox = std::fs::read("/bin/busybox").context("reading /bin/busybox (busybox-static)")?;
    let inputs = format!("{} bytes of busybox", busybox.len());
    for (image, entrypoint, cmd) in [
        (
            images::PAUSE,
            r#"["/bin/busybox","sleep","2147483647"]"#,
            "[]",
        ),
        (images::BUSYBOX, r#"["/bin/busybox"]"#, r#"["sh"]"#),
    ] {
        if !stale(dir, &image, &inputs) {
            continue;
        }
        let c = buildah(&["from", "scratch"])?;
        let c = c.lines().last().unwrap_or_default().to_owned();
        buildah(&["copy", &c, "/bin/busybox", "/bin/busybox"])?;
        buildah(&["config", "--entrypoint", entrypoint, "--cmd", cmd, &c])?;
        commit(&c, image.name)?;
        save(dir, &image, &inputs)?;
    }
    Ok(())
}

/// The Debian base: `debootstrap --variant=minbase` with the store's packages, trimmed (no
/// documentation, locales or apt lists), with the user `mooncake` (uid 65532). Kept as an image
/// in buildah's storage; rebuilt when its inputs change.
pub(super) fn base_image(dir: &Path, inputs: &str) -> anyhow::Result<()> {
    let marker = dir.join("base.inputs");
    let present = buildah(&["images", "-q", BASE_NAME]).is_ok_and(|o| !o.is_empty());
    if present && std::fs::read_to_string(&marker).ok().as_deref() == Some(inputs) {
        return Ok(());
    }
    let started = Instant::now();
    let rootfs = dir.join("rootfs.tmp");
    let _ = std::fs::remove_dir_all(&rootfs);
    println!("setup: debootstrap {SUITE} ({BASE_PACKAGES}), about a minute");
    let out = Command::new("debootstrap")
        .args([
            "--variant=minbase",
            &format!("--include={BASE_PACKAGES}"),
            SUITE,
        ])
        .arg(&rootfs)
        .arg(MIRROR)
        .output()
        .context("running debootstrap")?;
    if !out.status.success() {
        bail!(
            "debootstrap failed: {}",
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let status = Command::new("chroot")
        .arg(&rootfs)
        .args([
            "sh",
            "-ec",
            "useradd --uid 65532 --user-group --create-home --shell /bin/sh mooncake\nrm -rf /usr/share/doc/* /usr/share/man/* /usr/share/locale/* /usr/share/info/* /var/cache/apt/* /var/lib/apt/lists/* /var/log/* /dev/* /proc/* /sys/* /run/*",
        ])
        .status()
        .context("chroot into the base")?;
    if !status.success() {
        bail!("preparing the base root filesystem failed with {status}");
    }
    let tar = dir.join("rootfs.tar");
    let status = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .context("tar of the base")?;
    if !status.success() {
        bail!("packing the base root filesystem failed with {status}");
    }
    let c = buildah(&["from", "scratch"])?;
    let c = c.lines().last().unwrap_or_default().to_owned();
    buildah(&["add", &c, &tar.display().to_string(), "/"])?;
    buildah(&[
        "config",
        "--user",
        "65532:65532",
        "--workingdir",
        "/home/mooncake",
        "--env",
        "PATH=/opt/mooncake/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--cmd",
        "/bin/sh",
        &c,
    ])?;
    commit(&c, BASE_NAME)?;
    std::fs::remove_dir_all(&rootfs)?;
    std::fs::remove_file(&tar)?;
    std::fs::write(&marker, inputs)?;
    println!("setup: base image built in {:.0?}", started.elapsed());
    Ok(())
}
