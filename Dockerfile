# gpuguard image: built on Debian bookworm with the same steps `make test` runs, shipped on distroless.
#   docker build -t gpuguard:dev .
# Build stage: the project's own install script and CMake, with the whole test suite run as part of it,
# so an image only exists for a tree that passes `make test`.
FROM debian:bookworm AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/go-toolchain.sh scripts/
RUN ./scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
# scripts/image-rootfs.sh says what the image adds to its base; `make test-image` runs the binaries in
# the same tree, read-only, as UID 65532.
RUN make test JOBS=2 && scripts/image-rootfs.sh build /out

# Runtime: distroless "cc" (glibc, libstdc++, no shell, no package manager), user 65532. All four
# binaries; the webhook is the default entry point, the device plugin and node enforcer DaemonSets and
# the scheduler extender Deployment name their own command.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/usr/local/bin/gpuguard-webhook"]
CMD ["--tls-cert-file=/etc/gpuguard/tls/tls.crt", "--tls-private-key-file=/etc/gpuguard/tls/tls.key"]
