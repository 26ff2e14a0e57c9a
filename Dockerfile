# syntax=docker/dockerfile:1
# forewarn image: one static binary for both roles (agent and controller).
#
#   docker build -t ghcr.io/forewarn/forewarn:0.1.0 .
#   docker push ghcr.io/forewarn/forewarn:0.1.0
#
# Stage 1 builds a statically linked release binary for
# x86_64-unknown-linux-gnu (glibc >= 2.34 has the files and dns NSS modules
# built in, so name resolution works without shared libraries), with the
# build paths remapped so the binary does not depend on them. Stage 2 is the
# binary alone (FROM scratch: no shell, no package manager, no base image to
# float), running as the unprivileged user 65532:65532 the chart's
# securityContext expects.
#
# Docker was not available where this was written, so the file itself has
# not been run. Its build command was (`cargo build --release --locked
# --target x86_64-unknown-linux-gnu` with RUSTFLAGS below: a 23 MB
# static-pie binary, 9.5 min on 2 cores), and that binary ran as 65532:65532
# in an otherwise empty root (only /etc/hosts and /dev/{null,random,urandom},
# which every container runtime provides): the agent resolved `localhost`,
# reached the API server over TLS and IMDS, and wrote its report. Without
# /dev/urandom it panics (getrandom falls back to the file in a static
# binary).

FROM docker.io/library/rust:1.95.0-bookworm AS build
WORKDIR /src
ENV CARGO_TERM_COLOR=never \
    RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=/src=/forewarn --remap-path-prefix=/usr/local/cargo=/cargo"
# Dependencies first, so that a source change does not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src examples && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && echo 'fn main() {}' > examples/demo.rs \
    && cargo build --release --locked --target x86_64-unknown-linux-gnu --bin forewarn \
    && rm -rf src examples
COPY src ./src
COPY examples ./examples
# --target keeps build scripts and proc-macros dynamic while the binary is static.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --target x86_64-unknown-linux-gnu --bin forewarn \
    && cp target/x86_64-unknown-linux-gnu/release/forewarn /forewarn \
    && ! ldd /forewarn 2>/dev/null | grep -q '=>' \
    && /forewarn --version

# Nothing but the binary, as `make image` packs it (hack/oci-image.py): no
# base image to float.
FROM scratch
COPY --from=build /forewarn /usr/local/bin/forewarn
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/forewarn"]
