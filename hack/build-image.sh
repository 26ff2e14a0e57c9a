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
# Prints, on stdout, one line per image: `NAME ARCHIVE`.
#
# Environment:
#   FOREWARN_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/forewarn)
#   CARGO           cargo to use (default: cargo)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${FOREWARN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forewarn}
images="$cache/images"
target=x86_64-unknown-linux-gnu
out="$root/target/static/$target/release"
log() { echo "[build-image] $*" >&2; }

log "building static release binaries (target/static)"
(
  cd "$root"
  RUSTFLAGS="-C target-feature=+crt-static" "${CARGO:-cargo}" build --release --locked \
    --target "$target" --target-dir target/static \
    --bin forewarn --example pause --example workload >&2
)
for b in "$out/forewarn" "$out/examples/pause" "$out/examples/workload"; do
  [[ -x "$b" ]] || { log "missing $b"; exit 1; }
  # A dynamic binary would start on this machine and fail in the image.
  file -b "$b" | grep -qE 'statically linked|static-pie linked' || { log "$b is not static: $(file -b "$b")"; exit 1; }
done

mkdir -p "$images"
# pack NAME BINARY DEST [oci-image.py flags...]
pack() {
  local name=$1 bin=$2 dest=$3 sum file
  shift 3
  sum=$( { sha256sum "$bin" "$here/oci-image.py" | cut -d' ' -f1; echo "$name $dest $*"; } | sha256sum | cut -c1-16)
  file="$images/$(basename "$dest")-$sum.tar"
  if [[ ! -f "$file" ]]; then
    python3 "$here/oci-image.py" --name "$name" --out "$file" --file "$bin:$dest" \
      --entrypoint "$dest" "$@" >&2
    # Keep the newest few archives of each image.
    ls -t "$images/$(basename "$dest")"-*.tar 2>/dev/null | tail -n +4 | xargs -r rm -f
  fi
  echo "$name $file"
}

pack ghcr.io/forewarn/forewarn:dev "$out/forewarn" /usr/local/bin/forewarn --user 65532:65532
pack forewarn.local/pause:dev "$out/examples/pause" /pause --user 65535:65535
pack forewarn.local/workload:dev "$out/examples/workload" /usr/local/bin/workload --user 65532:65532 --cmd serve
