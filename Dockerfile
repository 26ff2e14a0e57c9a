# syntax=docker/dockerfile:1
# forewarn image: one static binary for both roles (agent and controller),
# for linux/amd64 and linux/arm64:
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     -t ghcr.io/forewarn/forewarn:0.1.0 --push .
#
# Stage 1 runs on the build machine's own platform (BUILDPLATFORM: no
# emulation) and cross-compiles a statically linked release binary for the
# platform asked for (TARGETARCH amd64 -> x86_64-unknown-linux-gnu, arm64 ->
# aarch64-unknown-linux-gnu) with Debian's cross gcc and static glibc
# (glibc >= 2.34 has the files and dns NSS modules built in, so name
# resolution works without shared libraries), the build paths remapped so
# the binary does not depend on them. Stage 2 is the binary alone (FROM
# scratch: no shell, no package manager, no base image to float), running
# as the unprivileged user 65532:65532 the chart's securityContext expects.
#
# What was run and what was not. Docker was not available where this was
# written, so docker has not run this file, for either platform, and the
# arm64 cross build (its toolchain step, linker and static glibc) has not run
# at all. tests/release.rs (`dockerfile_builds_the_binary_from_what_it_copies`)
# does what the build stage does, for x86_64 on the host: it checks every
# COPY source exists and is not excluded by .dockerignore, lays out a
# directory holding only what this file copies plus the stub files its RUN
# lines create, and runs both RUN lines that build there as written, with
# this file's ENV (RUSTFLAGS included) and /rust-target holding the host's
# x86_64-unknown-linux-gnu (the toolchain step, apt-get and rustup, is the
# one step not run): both cargo builds passed (cold, on 2 cores shared with
# other builds: 8m54s for the dependencies, 6m20s for the binary), the
# binary has no program interpreter, is 10,683,912 bytes and prints its
# version. Earlier, the binary of the same cargo command ran as 65532:65532
# in an otherwise empty root (only /etc/hosts and /dev/{null,random,urandom},
# which every container runtime provides): the agent resolved `localhost`,
# reached the API server over TLS and IMDS, and wrote its report. Without
# /dev/urandom it panics (getrandom falls back to the file in a static
# binary). The Rust build image is pinned by tag only (no registry could be
# asked for its digest here).

FROM --platform=$BUILDPLATFORM docker.io/library/rust:1.95.0-bookworm AS build
ARG TARGETARCH
WORKDIR /src
# The cross toolchain of the target (its gcc links, ring's C compiles; its
# static glibc): Debian's gcc-<triple> and libc6-dev-<arch>-cross, named by
# the same amd64/arm64 as Docker's TARGETARCH. The Rust target's name goes
# to /rust-target for the cargo commands below.
RUN case "$TARGETARCH" in \
      amd64) triple=x86_64-unknown-linux-gnu; gcc=gcc-x86-64-linux-gnu ;; \
      arm64) triple=aarch64-unknown-linux-gnu; gcc=gcc-aarch64-linux-gnu ;; \
      *) echo "unsupported TARGETARCH $TARGETARCH" >&2; exit 1 ;; \
    esac \
    && apt-get update \
    && apt-get install -y --no-install-recommends "$gcc" "libc6-dev-$TARGETARCH-cross" \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add "$triple" \
    && echo "$triple" > /rust-target
# Each target's linker and C compiler: the cross gcc (on a build machine of
# the same architecture, the native gcc under the same name).
ENV CARGO_TERM_COLOR=never \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=x86_64-linux-gnu-gcc \
    CC_x86_64_unknown_linux_gnu=x86_64-linux-gnu-gcc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=/src=/forewarn --remap-path-prefix=/usr/local/cargo=/cargo"
# Dependencies first, so that a source change does not rebuild them. The
# workspace needs the manifest of its member harness/ (a dev-dependency:
# nothing of it is built here) and the files of the [[test]] targets
# Cargo.toml names; stubs stand in for their sources.
COPY Cargo.toml Cargo.lock ./
COPY harness/Cargo.toml ./harness/
RUN mkdir -p src harness/src tests \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs harness/src/lib.rs tests/real_node.rs tests/real_node_chart.rs \
    && cargo build --release --locked --target "$(cat /rust-target)" --bin forewarn \
    && rm -rf src
COPY src ./src
# --target keeps build scripts and proc-macros dynamic while the binary is
# static. A static binary has no program interpreter (readelf reads either
# architecture); it runs here only when built for this machine.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --target "$(cat /rust-target)" --bin forewarn \
    && cp "target/$(cat /rust-target)/release/forewarn" /forewarn \
    && ! readelf -l /forewarn | grep -q 'program interpreter' \
    && if [ "$TARGETARCH" = "$(dpkg --print-architecture)" ]; then /forewarn --version; fi

# Nothing but the binary, as `make image` packs it (hack/oci-image.py): no
# base image to float.
FROM scratch
COPY --from=build /forewarn /usr/local/bin/forewarn
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/forewarn"]
