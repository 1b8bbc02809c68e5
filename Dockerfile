# One small image with the three functions of oxide-controller in /usr/local/bin:
# bootstrap, reconcile-once and scale. The in-cluster manifests (k8s-cronjobs/, the chart)
# run /usr/local/bin/reconcile-once and /usr/local/bin/scale from it.
#
#   docker build -t ghcr.io/aifoundry-org/oxide-controller:0.1.0 .
#
# Without Docker, .ci/image.sh builds the same image with buildah (the base made from the
# Debian packages distroless cc-debian12 is made of) and CI runs it under runc against the
# simulator; tests/tests/image_recipe.rs fails when this file and that script disagree on
# the binaries, build command, install path, user or default command.

# Both bases by digest (audit security-2 N12): a tag can be moved, a digest names the bytes
# that were reviewed. To move to a newer base: `docker buildx imagetools inspect <name:tag>`
# prints the index digest; put it here with the tag (the tag is for people, the digest is what
# is pulled). tests/tests/image_recipe.rs refuses a FROM without one.
# Same toolchain as rust-toolchain.toml.
FROM rust:1.95.0-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
# Use the image's toolchain as is: rust-toolchain.toml would make rustup fetch rustfmt and
# clippy, which a release build does not need.
ENV RUSTUP_TOOLCHAIN=1.95.0 \
    CARGO_TERM_COLOR=never
WORKDIR /src
COPY . .
# The registry and target caches survive between builds (BuildKit); the binaries are copied
# out of the cached target directory in the same step, because a cache mount is not part of
# the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins -p bootstrap -p reconcile-once -p scale \
    && install -D -m 0755 -t /out \
        target/release/bootstrap target/release/reconcile-once target/release/scale

# glibc, libgcc, CA certificates and the nonroot user (65532), nothing else: no shell, no
# package manager.
FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
CMD ["/usr/local/bin/reconcile-once", "--help"]
