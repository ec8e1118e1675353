# The operator image: kvcache-operator with the few glibc files it links, on an empty base (no
# shell, no package manager), running as a non-root user. It suits a read-only root filesystem:
# nothing is written inside it.
#
# `cargo xtask setup` builds it with buildah (no registry is needed) after staging the build
# context in target/image-context/kvcache-operator: rootfs/usr/local/bin holds the release
# binary, and rootfs/ the libraries `ldd` names for it (libc, libm, libgcc_s, the loader). The
# elector store Pods run comes from its own image (images/elector/Dockerfile).
FROM scratch
COPY rootfs/ /
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kvcache-operator"]
CMD ["run"]
