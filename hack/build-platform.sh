#!/usr/bin/env bash
# Builds the `forewarn` binary for one platform and prints its path on
# stdout (one line, nothing else; the build's output goes to stderr).
#
# Usage: hack/build-platform.sh PLATFORM PROFILE [--example NAME]...
#   PLATFORM  linux/amd64 | linux/arm64 | windows/amd64
#   PROFILE   debug | release
#   --example also builds that example (in examples/ beside the binary,
#             checked like it)
#
# Prints e.g. $FOREWARN_CACHE/target-windows-amd64/x86_64-pc-windows-gnu/release/forewarn.exe
#
# What each platform is built with:
#   linux/amd64    the normal (rustup) cargo, x86_64-unknown-linux-gnu,
#                  static (+crt-static: glibc's static libraries)
#   linux/arm64    Debian's cargo and rustc (/usr/bin: rustc-web, which ships
#                  an arm64 standard library), aarch64-unknown-linux-gnu,
#                  static, linker aarch64-linux-gnu-gcc
#   windows/amd64  Debian's cargo and rustc with the standard library built
#                  from its source (rust-web-src: -Zbuild-std, which needs
#                  RUSTC_BOOTSTRAP=1), x86_64-pc-windows-gnu, linker
#                  x86_64-w64-mingw32-gcc
# The cross toolchains come from hack/toolchains.sh (Debian packages); the
# linker is passed through CARGO_TARGET_<TRIPLE>_LINKER so that normal
# builds of the repository are unchanged.
#
# Each platform has its own target dir outside the checkout,
# $FOREWARN_CACHE/target-<os>-<arch>, so that a second run rebuilds only
# what changed, as does a fresh clone at the same path. A checkout at
# another path changes the remapping flags below (they name the checkout
# and the target dir), and with them every crate's fingerprint: it rebuilds
# everything of that platform, once.
#
# Reproducible: the checkout, the cargo home, the target dir and the
# standard library's source are remapped (--remap-path-prefix) to fixed
# names; a release build fails if one of those paths of this machine is
# left in the binary. A Windows executable carries no link time (the build
# fails if its PE header has one).
#
# Environment:
#   FOREWARN_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/forewarn)
#   CARGO           cargo for linux/amd64 (default: cargo)
#   CARGO_HOME      as cargo reads it (default: $HOME/.cargo)
set -euo pipefail

usage() { echo "usage: $0 linux/amd64|linux/arm64|windows/amd64 debug|release [--example NAME]..." >&2; exit 2; }
(($# >= 2)) || usage
platform=$1 profile=$2
shift 2
case $profile in debug | release) ;; *) usage ;; esac
examples=() example_flags=()
while (($#)); do
  [[ $1 == --example && -n ${2:-} ]] || usage
  examples+=("$2")
  example_flags+=(--example "$2")
  shift 2
done

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${FOREWARN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forewarn}
cargo_home=${CARGO_HOME:-$HOME/.cargo}
target_dir="$cache/target-${platform//\//-}"
log() { echo "[build-platform] $*" >&2; }

# linux/amd64's cargo, as the caller chose it (before the clean-up below).
host_cargo=${CARGO:-cargo}
# What a calling cargo (a test run: CARGO, CARGO_PKG_*, RUSTUP_TOOLCHAIN...)
# or the shell may have set must not redirect or alter this build, nor
# make a build script run again (a build from a test and one from a shell
# must find each other's results up to date). Kept: cargo's home and its
# network and registry settings.
for v in $(compgen -e); do
  case $v in
    CARGO_HOME | CARGO_HTTP_* | CARGO_NET_* | CARGO_REGISTRIES_* | CARGO_REGISTRY_*) ;;
    CARGO | CARGO_* | RUSTUP_TOOLCHAIN | RUSTC | RUSTC_* | RUSTDOC* | RUSTFLAGS | OUT_DIR | TARGET | HOST) unset "$v" ;;
  esac
done
# SOURCE_DATE_EPOCH dates an image, not a binary: some build scripts
# (ring's, psm's) rerun when it changes, and with them the whole fat-LTO
# link, at every commit.
unset SOURCE_DATE_EPOCH

# The machine's paths that must not stay in a release binary, each
# remapped to a fixed name (the more specific ones last: rustc applies the
# last matching remap).
rust_src=/usr/lib/rustlib/src/rust
remaps=("$cargo_home=/cargo" "$root=/forewarn" "$target_dir=/target")
checked=("$root" "$cargo_home" "$target_dir")
rustflags=()
cargo=(cargo)
build_std=()
exe=forewarn
case $platform in
  linux/amd64)
    triple=x86_64-unknown-linux-gnu
    cargo=("$host_cargo")
    rustflags+=(-C target-feature=+crt-static)
    ;;
  linux/arm64)
    triple=aarch64-unknown-linux-gnu
    cargo=(/usr/bin/cargo)
    export RUSTC=/usr/bin/rustc
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    rustflags+=(-C target-feature=+crt-static)
    ;;
  windows/amd64)
    triple=x86_64-pc-windows-gnu
    cargo=(/usr/bin/cargo)
    export RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1
    export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc
    build_std=(-Zbuild-std=std,panic_abort)
    exe=forewarn.exe
    # GNU ld writes the time of the link into the PE header (and the
    # header's checksum covers it): two builds of one commit would differ
    # in those bytes alone.
    rustflags+=(-C link-arg=-Wl,--no-insert-timestamp)
    # std is compiled here, from Debian's source: its path (and the
    # directory the link points to) is remapped too.
    src_real=$(readlink -f "$rust_src")
    remaps+=("$src_real=/rustc/src" "$rust_src=/rustc/src")
    checked+=("$src_real" "$rust_src")
    ;;
  *) usage ;;
esac
for tool in "${cargo[0]}" ${RUSTC:+"$RUSTC"}; do
  command -v "$tool" >/dev/null || { log "$tool not found: run hack/toolchains.sh"; exit 1; }
done
for r in "${remaps[@]}"; do rustflags+=("--remap-path-prefix=$r"); done

profile_flag=()
[[ $profile == release ]] && profile_flag=(--release)
log "building $platform ($triple, $profile) in $target_dir"
(
  cd "$root"
  # Flags of the target only: with --target, build scripts and proc macros
  # (built for this machine) do not get RUSTFLAGS.
  RUSTFLAGS="${rustflags[*]}" "${cargo[@]}" build "${profile_flag[@]}" --locked \
    "${build_std[@]}" --target "$triple" --target-dir "$target_dir" --bin forewarn \
    "${example_flags[@]}" >&2
)
dir="$target_dir/$triple/$profile"
bin="$dir/$exe"
built=("$bin")
for e in "${examples[@]}"; do built+=("$dir/examples/$e${exe#forewarn}"); done
for b in "${built[@]}"; do
  [[ -f $b ]] || { log "missing $b"; exit 1; }
  if [[ $platform == linux/* ]]; then
    # A dynamic binary would need a loader and libraries the image lacks.
    file -b "$b" | grep -qE 'statically linked|static-pie linked' ||
      { log "$b is not static: $(file -b "$b")"; exit 1; }
  fi
  if [[ $platform == windows/* ]]; then
    # The PE header's TimeDateStamp (COFF header, 8 bytes into the "PE\0\0"
    # signature that e_lfanew, at 0x3c, points to) must be 0.
    pe=$(od -An -tu4 -j60 -N4 "$b" | tr -d ' ')
    stamp=$(od -An -tu4 -j$((pe + 8)) -N4 "$b" | tr -d ' ')
    [[ $stamp == 0 ]] || { log "$b carries a link time ($stamp) in its PE header: not reproducible"; exit 1; }
  fi
  if [[ $profile == release ]]; then
    for p in "${checked[@]}"; do
      if grep -qaF "$p/" "$b"; then
        log "$b holds the path $p: not reproducible (--remap-path-prefix)"
        exit 1
      fi
    done
  fi
done
echo "$bin"
