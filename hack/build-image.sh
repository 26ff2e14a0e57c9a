#!/usr/bin/env bash
# Builds forewarn's container image offline, without docker or a registry,
# plus the two images the real-node harness needs (hack/real-node.sh):
#
#   ghcr.io/forewarn/forewarn:dev   /usr/local/bin/forewarn, User 65532:65532,
#                                   Entrypoint ["/usr/local/bin/forewarn"]
#                                   (the Dockerfile's layout)
#   forewarn.local/pause:dev        the pod sandbox: waits for SIGTERM
#                                   (examples/pause.rs)
#   forewarn.local/workload:dev     a tiny HTTP server with a SIGTERM handler
#                                   and a preStop command (examples/workload.rs)
#
# The binaries are the release build, static (x86_64-unknown-linux-gnu with
# +crt-static: glibc's static libraries; no musl target needed), in their own
# target dir (target/static) so the normal build cache stays valid. Each image
# is an OCI archive written by hack/oci-image.py and cached in
# $FOREWARN_CACHE/images/ under the sha256 of its binary: unchanged binaries
# give the same file, which `ctr images import` accepts as is.
#
# Prints, on stdout, one line per image: `NAME ARCHIVE`; on stderr the
# manifest digest of forewarn's image (for the chart's image.digest).
#
# Reproducible: the image has no base image (nothing floats), its files and
# config carry SOURCE_DATE_EPOCH (default: the time of the commit checked
# out), and the binary is built with the checkout and cargo home paths
# remapped (--remap-path-prefix), so the same commit gives the same bytes
# wherever it is checked out; the build fails if a path of this machine is
# left in the binary.
#
# Environment:
#   FOREWARN_CACHE     cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/forewarn)
#   CARGO              cargo to use (default: cargo)
#   SOURCE_DATE_EPOCH  timestamps of the image (default: the HEAD commit's time)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${FOREWARN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forewarn}
images="$cache/images"
target=x86_64-unknown-linux-gnu
out="$root/target/static/$target/release"
log() { echo "[build-image] $*" >&2; }

cargo_home=${CARGO_HOME:-$HOME/.cargo}
if [[ -z ${SOURCE_DATE_EPOCH:-} ]]; then
  SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)
fi
export SOURCE_DATE_EPOCH
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)

log "building static release binaries (target/static)"
(
  cd "$root"
  # SOURCE_DATE_EPOCH dates the image, not the binary: some build scripts
  # (ring's, psm's) rerun when it changes, and with it the whole fat-LTO
  # link, at every commit.
  unset SOURCE_DATE_EPOCH
  RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=$root=/forewarn --remap-path-prefix=$cargo_home=/cargo" \
    "${CARGO:-cargo}" build --release --locked \
    --target "$target" --target-dir target/static \
    --bin forewarn --example pause --example workload >&2
)
for b in "$out/forewarn" "$out/examples/pause" "$out/examples/workload"; do
  [[ -x "$b" ]] || { log "missing $b"; exit 1; }
  # A dynamic binary would start on this machine and fail in the image.
  file -b "$b" | grep -qE 'statically linked|static-pie linked' || { log "$b is not static: $(file -b "$b")"; exit 1; }
  # Reproducible wherever it is built: no path of this machine inside.
  for p in "$root" "$cargo_home"; do
    if grep -qaF "$p/" "$b"; then
      log "$b holds the path $p: not reproducible (RUSTFLAGS --remap-path-prefix)"
      exit 1
    fi
  done
done

mkdir -p "$images"
# pack NAME BINARY DEST [oci-image.py flags...]
pack() {
  local name=$1 bin=$2 dest=$3 sum file
  shift 3
  sum=$( { sha256sum "$bin" "$here/oci-image.py" | cut -d' ' -f1; echo "$name $dest $SOURCE_DATE_EPOCH $*"; } | sha256sum | cut -c1-16)
  file="$images/$(basename "$dest")-$sum.tar"
  if [[ ! -f "$file" ]]; then
    python3 "$here/oci-image.py" --name "$name" --out "$file" --file "$bin:$dest" \
      --entrypoint "$dest" "$@" >&2
    # Keep the newest few archives of each image.
    ls -t "$images/$(basename "$dest")"-*.tar 2>/dev/null | tail -n +4 | xargs -r rm -f
  fi
  echo "$name $file"
  packed=$file
}

pack ghcr.io/forewarn/forewarn:dev "$out/forewarn" /usr/local/bin/forewarn --user 65532:65532 \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.source=https://github.com/forewarn/forewarn"
forewarn_archive=$packed
pack forewarn.local/pause:dev "$out/examples/pause" /pause --user 65535:65535
pack forewarn.local/workload:dev "$out/examples/workload" /usr/local/bin/workload --user 65532:65532 --cmd serve

# The digest to pin: index.json's manifest of forewarn's image.
digest=$(python3 -c 'import json, sys, tarfile; print(json.load(tarfile.open(sys.argv[1]).extractfile("index.json"))["manifests"][0]["digest"])' "$forewarn_archive")
log "ghcr.io/forewarn/forewarn:dev is $digest (SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH, revision $revision): pin it with --set image.digest=$digest"
