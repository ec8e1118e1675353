//! Where the installed parts are.

use std::path::PathBuf;

use crate::{Error, Result};

/// The Kubernetes release the control plane is built from (`cargo xtask setup` builds it).
pub const KUBERNETES_VERSION: &str = "v1.34.4";
/// The etcd release Kubernetes v1.34.4 pins.
pub const ETCD_VERSION: &str = "v3.6.4";
/// The store package on PyPI.
pub const MOONCAKE_PACKAGE: &str = "mooncake-transfer-engine-non-cuda";
/// The pinned store version.
pub const MOONCAKE_VERSION: &str = "0.3.13.post1";

/// The Prometheus release `xtask/go/prometheus` pins (its server and promtool, for the
/// monitoring tests).
pub const PROMETHEUS_VERSION: &str = "v0.316.0";

/// Where `cargo xtask setup` puts Prometheus's `promtool` (and the server, once a test uses it).
pub fn prometheus_dir() -> PathBuf {
    cache_dir().join("prometheus").join(PROMETHEUS_VERSION)
}

/// Where the project caches what it builds and installs (outside the checkout).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join("kvcache-operator")
}

/// The directory with etcd and the Kubernetes control-plane binaries.
pub fn k8s_bin() -> Result<PathBuf> {
    let dir = std::env::var_os("KVCACHE_K8S_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("k8s").join(KUBERNETES_VERSION).join("bin"));
    let apiserver = dir.join("kube-apiserver");
    if !apiserver.exists() {
        return Err(Error::Missing {
            what: "kube-apiserver".into(),
            path: apiserver,
        });
    }
    Ok(dir)
}

/// The locally built images (OCI archives: `pause.tar`, `busybox.tar`).
pub fn images_dir() -> Result<PathBuf> {
    let dir = std::env::var_os("KVCACHE_IMAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("images"));
    let pause = dir.join("pause.tar");
    if !pause.exists() {
        return Err(Error::Missing {
            what: "the node images".into(),
            path: pause,
        });
    }
    Ok(dir)
}

/// The store's virtualenv (`$KVCACHE_MOONCAKE_VENV`, else `mooncake-<version>` in the cache);
/// [`Error::Missing`] when it has no `bin/python`.
pub fn mooncake_venv() -> Result<PathBuf> {
    let dir = std::env::var_os("KVCACHE_MOONCAKE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join(format!("mooncake-{MOONCAKE_VERSION}")));
    let python = dir.join("bin/python");
    if !python.exists() {
        return Err(Error::Missing {
            what: "the store's virtualenv".into(),
            path: dir,
        });
    }
    Ok(dir)
}

/// The real `mooncake_master` binary inside the virtualenv (not the Python wrapper).
pub fn mooncake_master() -> Result<PathBuf> {
    let venv = mooncake_venv()?;
    let lib = venv.join("lib");
    let entries =
        std::fs::read_dir(&lib).map_err(crate::io(format!("reading {}", lib.display())))?;
    for entry in entries.filter_map(std::result::Result::ok) {
        let candidate = entry.path().join("site-packages/mooncake/mooncake_master");
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    Err(Error::Missing {
        what: "mooncake_master".into(),
        path: lib,
    })
}

/// A fresh scratch directory for one harness instance.
pub fn scratch(prefix: &str) -> Result<PathBuf> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kvcache-{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(crate::io(format!("creating {}", dir.display())))?;
    Ok(dir)
}

/// The workspace's root folder.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

static RELEASE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, workspace binaries are built and run in release (benchmarks measure what
/// ships). Call before the first binary is asked for.
pub fn use_release_builds() {
    RELEASE.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The packages the operator image is built from, in one `cargo build`.
const OPERATOR_PACKAGES: [&str; 2] = ["kvcache-operator", "kvcache-elector"];

/// A binary of this workspace, built on first use per test process: debug, or release after
/// [`use_release_builds`].
fn workspace_bin(package: &'static str) -> Result<PathBuf> {
    use std::sync::Mutex;
    static BUILT: Mutex<Vec<(&'static str, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, path)) = built.iter().find(|(p, _)| *p == package) {
        return Ok(path.clone());
    }
    let root = workspace_root();
    let release = RELEASE.load(std::sync::atomic::Ordering::Relaxed);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // The operator and the elector are always built together, as the operator image's build
    // (`xtask/src/images.rs`) builds them: one of them alone unifies other features of their
    // shared dependencies, and alternating the two sets rebuilt both (minutes each time).
    let packages: &[&str] = if OPERATOR_PACKAGES.contains(&package) {
        &OPERATOR_PACKAGES
    } else {
        std::slice::from_ref(&package)
    };
    let status = std::process::Command::new(cargo)
        .current_dir(&root)
        .args(["build", "--quiet"])
        .args(packages.iter().flat_map(|p| ["-p", p]))
        .args(release.then_some("--release"))
        .status()
        .map_err(|e| Error::Build {
            what: package,
            reason: format!("running cargo build: {e}"),
        })?;
    if !status.success() {
        return Err(Error::Build {
            what: package,
            reason: format!("cargo build -p {package} failed ({status})"),
        });
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let path = target
        .join(if release { "release" } else { "debug" })
        .join(package);
    built.push((package, path.clone()));
    Ok(path)
}

/// The `kvcache-elector` binary of this workspace, built on first use.
pub fn elector_bin() -> Result<PathBuf> {
    workspace_bin("kvcache-elector")
}

/// The `kvcache-operator` binary of this workspace, built on first use.
pub fn operator_bin() -> Result<PathBuf> {
    workspace_bin("kvcache-operator")
}

/// The `xtask` binary (what `cargo xtask` runs): the one running `cargo xtask test`
/// (`KVCACHE_XTASK_BIN`), else built on first use.
pub fn xtask_bin() -> Result<PathBuf> {
    match std::env::var_os("KVCACHE_XTASK_BIN").map(PathBuf::from) {
        Some(path) if path.is_file() => Ok(path),
        _ => workspace_bin("xtask"),
    }
}

/// `kubectl`, as `cargo xtask setup` builds it, for a test that does what an admin types
/// (`kubectl drain`, `kubectl apply --dry-run=server`), with `kubeconfig`.
pub fn kubectl(kubeconfig: &std::path::Path) -> std::process::Command {
    let bin = cache_dir()
        .join("k8s")
        .join(KUBERNETES_VERSION)
        .join("bin")
        .join("kubectl");
    let mut c = std::process::Command::new(bin);
    c.env("KUBECONFIG", kubeconfig);
    c
}
