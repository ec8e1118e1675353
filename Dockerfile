# The operator image: kvcache-operator and kvcache-elector with the few glibc files they link,
# on an empty base (no shell, no package manager), running as a non-root user. It suits a
# read-only root filesystem: nothing is written inside it.
#
# `cargo xtask setup` builds it with buildah (no registry is needed) after staging the build
# context in target/image-context: rootfs/usr/local/bin holds the two release binaries, and
# rootfs/ the libraries `ldd` names for them (libc, libm, libgcc_s, the loader).
FROM scratch
COPY rootfs/ /
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kvcache-operator"]
CMD ["run"]
