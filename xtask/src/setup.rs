//! Installing what the end-to-end tests, the demo and the benchmarks run: Debian packages (the
//! store's one library; containerd, runc, the CNI plugins, buildah and static busybox for the
//! nodes), the store's Python virtualenv, the Kubernetes control plane and kubelet built from
//! published Go modules, and the nodes' images built locally.
//! Everything lands in a cache outside the checkout, so a fresh clone on the same machine reuses it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

use crate::crds::root;

// One home for the pinned versions and the cache: the harness, which the tests read too.
pub use kvcache_e2e::paths::{
    ETCD_VERSION, KUBERNETES_VERSION, MOONCAKE_PACKAGE, MOONCAKE_VERSION, cache_dir,
};

/// The directory holding etcd, kube-apiserver, kube-controller-manager and kube-scheduler.
pub fn k8s_bin_dir() -> PathBuf {
    cache_dir().join("k8s").join(KUBERNETES_VERSION).join("bin")
}

/// Where `cargo xtask setup` installs the store's virtualenv: `mooncake-<version>` in the cache.
pub fn mooncake_venv() -> PathBuf {
    cache_dir().join(format!("mooncake-{MOONCAKE_VERSION}"))
}

/// What the tests are told about the installed parts.
pub struct Installed {
    pub k8s_bin: PathBuf,
    pub mooncake_venv: PathBuf,
    pub images: PathBuf,
}

/// Installs everything missing; fast when all is in place.
pub fn all() -> anyhow::Result<Installed> {
    debian_packages()?;
    let mooncake_venv = store_venv()?;
    let k8s_bin = control_plane()?;
    helm()?;
    prometheus()?;
    let images = crate::images::all()?;
    Ok(Installed {
        k8s_bin,
        images,
        mooncake_venv,
    })
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {shown}"))?;
    if !status.success() {
        bail!("{shown} failed with {status}");
    }
    Ok(())
}

/// `libibverbs1` (the one shared library the store's binaries need), and what the nodes run:
/// containerd, runc, the CNI plugins, iptables, ipset (the NetworkPolicy enforcer's sets);
/// buildah, static busybox and debootstrap build their images.
const DEBIAN_PACKAGES: [&str; 9] = [
    "libibverbs1",
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "ipset",
    "buildah",
    "busybox-static",
    "debootstrap",
];

fn debian_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
                .unwrap_or(false)
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("setup: installing Debian packages {}", missing.join(" "));
    let apt = |args: &[&str]| {
        let mut c = Command::new("apt-get");
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    run(&mut apt(&["update", "-qq"]))?;
    let mut install = apt(&["install", "-y", "-qq", "--no-install-recommends"]);
    install.args(&missing);
    run(&mut install)
}

fn store_venv() -> anyhow::Result<PathBuf> {
    let venv = mooncake_venv();
    let marker = venv.join(".kvcache-installed");
    if marker.exists() {
        return Ok(venv);
    }
    println!(
        "setup: creating the store virtualenv {} ({MOONCAKE_PACKAGE}=={MOONCAKE_VERSION}, ~50 MB)",
        venv.display()
    );
    let started = Instant::now();
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .arg(format!("{MOONCAKE_PACKAGE}=={MOONCAKE_VERSION}")))?;
    std::fs::write(&marker, MOONCAKE_VERSION)?;
    println!("setup: store virtualenv ready in {:.0?}", started.elapsed());
    Ok(venv)
}

/// The kube-router release `xtask/go/kube-router` pins (the harness's NetworkPolicy enforcer).
const KUBE_ROUTER_VERSION: &str = "v2.10.0";

/// The kube-score release `xtask/go/kube-score` pins (the static checker of
/// `tests/tests/kube_score.rs`).
const KUBE_SCORE_VERSION: &str = "v1.20.0";

/// The CoreDNS release `xtask/go/coredns` pins.
const COREDNS_VERSION: &str = "v1.15.0";

const COMPONENTS: [&str; 6] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    // For the demo and for people looking at a running cluster (`cargo xtask cluster env`).
    "kubectl",
];

fn control_plane() -> anyhow::Result<PathBuf> {
    let bin = k8s_bin_dir();
    let marker = bin.join(".kvcache-built");
    let want = format!(
        "kubernetes {KUBERNETES_VERSION}, etcd {ETCD_VERSION}, {}, coredns {COREDNS_VERSION}, kube-router {KUBE_ROUTER_VERSION}, kube-score {KUBE_SCORE_VERSION}\n",
        COMPONENTS.join(" ")
    );
    let all_there = ["etcd", "coredns", "kube-router", "kube-score"]
        .iter()
        .chain(COMPONENTS.iter())
        .all(|b| bin.join(b).exists());
    if all_there && std::fs::read_to_string(&marker).is_ok_and(|m| m == want) {
        return Ok(bin);
    }
    std::fs::create_dir_all(&bin)?;
    let version = Command::new("go")
        .arg("version")
        .env("GOTOOLCHAIN", "local")
        .output();
    match version {
        Ok(out) if out.status.success() => {
            print!("setup: using {}", String::from_utf8_lossy(&out.stdout))
        }
        _ => bail!(
            "the Go toolchain is not on PATH: the control plane is built from Go modules with the machine's Go (1.24 or newer); install Go or add it to PATH"
        ),
    }
    let go = root().join("xtask/go");
    println!(
        "setup: building the control plane from Go modules into {} (first time only: about 10 minutes on 2 cores)",
        bin.display()
    );
    // What a previous setup built stays (a new component is built alone).
    if !bin.join("etcd").exists() {
        go_build(&go.join("etcd"), ".", &bin.join("etcd"), "-s -w")?;
    }
    // The harness's NetworkPolicy enforcer (kube-router's firewall; never shipped).
    if !bin.join("kube-router").exists() {
        go_build(
            &go.join("kube-router"),
            "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router",
            &bin.join("kube-router"),
            "-s -w",
        )?;
    }
    // The static checker of the installation and the rendered objects (never shipped).
    if !bin.join("kube-score").exists() {
        go_build(
            &go.join("kube-score"),
            "github.com/zegl/kube-score/cmd/kube-score",
            &bin.join("kube-score"),
            "-s -w",
        )?;
    }
    // Cluster DNS for the nodes: CoreDNS with only the kubernetes, cache and errors plugins.
    if !bin.join("coredns").exists() {
        go_build(&go.join("coredns"), ".", &bin.join("coredns"), "-s -w")?;
    }
    let minor = KUBERNETES_VERSION
        .trim_start_matches('v')
        .split('.')
        .nth(1)
        .unwrap_or("0");
    let stamp = format!(
        "-s -w -X k8s.io/component-base/version.gitVersion={v} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor={minor} -X k8s.io/client-go/pkg/version.gitVersion={v} -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor={minor}",
        v = KUBERNETES_VERSION
    );
    for component in COMPONENTS {
        if bin.join(component).exists() {
            continue;
        }
        go_build(
            &go.join("k8s"),
            &format!("k8s.io/kubernetes/cmd/{component}"),
            &bin.join(component),
            &stamp,
        )?;
    }
    std::fs::write(&marker, want)?;
    Ok(bin)
}

/// The Helm release `xtask/go/helm` pins (the chart test runs `helm template`).
pub const HELM_VERSION: &str = "v3.22.0";

/// Builds `helm` from the Go module proxy once, into the cache.
fn helm() -> anyhow::Result<PathBuf> {
    let bin = cache_dir().join("helm").join(HELM_VERSION).join("helm");
    if bin.exists() {
        return Ok(bin);
    }
    if let Some(dir) = bin.parent() {
        std::fs::create_dir_all(dir)?;
    }
    go_build(
        &root().join("xtask/go/helm"),
        "helm.sh/helm/v3/cmd/helm",
        &bin,
        &format!("-s -w -X helm.sh/helm/v3/internal/version.version={HELM_VERSION}"),
    )?;
    Ok(bin)
}

/// Builds Prometheus and its promtool from the Go module proxy once, into the cache: promtool
/// checks and unit-tests the alert rules, the server scrapes the operator (the stores' series
/// re-exported) and the engines in `tests/tests/real_engine/monitoring.rs`. Without service
/// discovery (`remove_all_sd`): the tests give it static targets.
fn prometheus() -> anyhow::Result<PathBuf> {
    let dir = kvcache_e2e::paths::prometheus_dir();
    std::fs::create_dir_all(&dir)?;
    for command in ["promtool", "prometheus"] {
        let bin = dir.join(command);
        if bin.exists() {
            continue;
        }
        go_build_tagged(
            &root().join("xtask/go/prometheus"),
            &format!("github.com/prometheus/prometheus/cmd/{command}"),
            &bin,
            "-s -w",
            "remove_all_sd",
        )?;
    }
    Ok(dir)
}

fn go_build(module: &Path, package: &str, out: &Path, ldflags: &str) -> anyhow::Result<()> {
    go_build_tagged(module, package, out, ldflags, "")
}

fn go_build_tagged(
    module: &Path,
    package: &str,
    out: &Path,
    ldflags: &str,
    tags: &str,
) -> anyhow::Result<()> {
    let name = out.file_name().and_then(|n| n.to_str()).unwrap_or("?");
    println!("setup: go build {name} …");
    let started = Instant::now();
    run(Command::new("go")
        .current_dir(module)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .env("CGO_ENABLED", "0")
        .args([
            "build",
            "-trimpath",
            "-tags",
            tags,
            "-ldflags",
            ldflags,
            "-o",
        ])
        .arg(out)
        .arg(package))?;
    println!("setup: built {name} in {:.0?}", started.elapsed());
    Ok(())
}
