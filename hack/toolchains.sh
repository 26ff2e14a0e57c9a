#!/usr/bin/env bash
# Installs what the cross builds of the agent (hack/build-platform.sh) and
# their tests (tests/platforms.rs) need, from Debian's packages, unattended
# and idempotently, on Debian 12 as root:
#
#   linux/arm64    rustc-web, cargo-web (Debian's Rust, /usr/bin/rustc and
#                  /usr/bin/cargo), libstd-rust-web-dev:arm64 (its arm64
#                  standard library), gcc-aarch64-linux-gnu (the linker) and
#                  libc6-dev-arm64-cross (static glibc for +crt-static);
#                  qemu-user-static runs the result
#   windows/amd64  rust-web-src (the standard library's source, built with
#                  -Zbuild-std: Debian has no prebuilt Windows std),
#                  gcc-mingw-w64-x86-64 (the linker, and the test-only
#                  bcryptprimitives.dll shim); wine64 runs the result
#   the image      libhivex-bin (hivexsh: the test that opens the registry
#                  hives of the Windows image's base layer, hack/regf.py)
#
# When every package is installed it does nothing and calls no apt at all
# (fast: one dpkg-query). Otherwise it adds the arm64 architecture, runs
# `apt-get update` once and installs the missing ones.
#
# Usage: hack/toolchains.sh        (exit 0 when everything is present)
#        hack/toolchains.sh --check (exit 1, listing what is missing, and
#                                    install nothing)
set -euo pipefail

packages=(
  rustc-web cargo-web libstd-rust-web-dev:arm64 rust-web-src
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross
  gcc-mingw-w64-x86-64
  qemu-user-static wine64
  libhivex-bin
)
log() { echo "[toolchains] $*" >&2; }

# missing: the packages not installed (dpkg's "install ok installed").
missing() {
  local p status
  for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || echo "$p"
  done
}

mapfile -t todo < <(missing)
if ((${#todo[@]} == 0)); then
  log "all present: ${packages[*]}"
  exit 0
fi
if [[ ${1:-} == --check ]]; then
  log "missing: ${todo[*]}"
  exit 1
fi
if ((EUID != 0)); then
  log "missing: ${todo[*]}; installing them needs root (apt-get)"
  exit 1
fi

log "installing: ${todo[*]}"
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q --no-install-recommends "${todo[@]}" >&2

mapfile -t todo < <(missing)
if ((${#todo[@]})); then
  log "still missing after apt-get install: ${todo[*]}"
  exit 1
fi
log "installed; rustc for cross builds: $(/usr/bin/rustc --version)"
