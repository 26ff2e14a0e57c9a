#!/usr/bin/env bash
# Builds forewarn's container image offline, without docker or a registry,
# plus the two images the real-node harness needs (hack/real-node.sh):
#
#   ghcr.io/forewarn/forewarn:dev   an image index of three images:
#     linux/amd64, linux/arm64      /usr/local/bin/forewarn, User 65532:65532,
#                                   Entrypoint ["/usr/local/bin/forewarn"]
#                                   (the Dockerfile's layout), FROM scratch
#     windows/amd64                 a HostProcess container's base layer:
#                                   C:\forewarn.exe (Files/forewarn.exe) and
#                                   the empty registry hives a base layer
#                                   carries, no Windows base image
#                                   (hack/oci-image.py says more)
#   forewarn.local/pause:dev        the pod sandbox: waits for SIGTERM
#                                   (examples/pause.rs)
#   forewarn.local/workload:dev     a tiny HTTP server with a SIGTERM handler
#                                   and a preStop command (examples/workload.rs)
#
# The binaries are hack/build-platform.sh's release builds, in target dirs
# of the cache (one per platform, outside the checkout, so the normal build
# cache stays valid; see hack/build-platform.sh for what a rebuild costs):
# linux/amd64's static (x86_64-unknown-linux-gnu with
# +crt-static: glibc's static libraries; no musl target needed), with the
# examples pause and workload; linux/arm64's and windows/amd64's with
# Debian's cross toolchains (hack/toolchains.sh, which this runs first), the
# very binaries tests/platforms.rs runs under qemu and Wine. Each image is
# an OCI archive written by hack/oci-image.py and cached in
# $FOREWARN_CACHE/images/ under the sha256 of its binaries:
# unchanged binaries give the same file, which `ctr images import` accepts as
# is (it imports the index's image for its own platform).
#
# Prints, on stdout, one line per image: `NAME ARCHIVE`; on stderr the
# digest of forewarn's image index (for the chart's image.digest).
#
# Reproducible: the image has no base image (nothing floats), its files and
# config carry SOURCE_DATE_EPOCH (default: the time of the commit checked
# out), and the binaries are built with the machine's paths remapped
# (--remap-path-prefix), so the same commit gives the same bytes wherever
# it is checked out; the build fails if a path of this machine is left in a
# binary. hack/image-repro.sh (make image-repro) checks it on two clones.
#
# Environment:
#   FOREWARN_CACHE     cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/forewarn)
#   CARGO              cargo for linux/amd64 (default: cargo)
#   SOURCE_DATE_EPOCH  timestamps of the image (default: the HEAD commit's time)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${FOREWARN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forewarn}
images="$cache/images"
log() { echo "[build-image] $*" >&2; }

if [[ -z ${SOURCE_DATE_EPOCH:-} ]]; then
  SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)
fi
export SOURCE_DATE_EPOCH
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)

# The three release builds (hack/build-platform.sh: cached target dirs
# outside the checkout, shared by every clone on this machine, every path
# of the machine remapped and checked); amd64's with the real node's two
# test images, pause and workload.
bash "$here/toolchains.sh" >&2
amd64_bin=$(bash "$here/build-platform.sh" linux/amd64 release --example pause --example workload)
arm64_bin=$(bash "$here/build-platform.sh" linux/arm64 release)
windows_bin=$(bash "$here/build-platform.sh" windows/amd64 release)
out=$(dirname "$amd64_bin")
for b in "$out/examples/pause" "$out/examples/workload"; do
  [[ -x "$b" ]] || { log "missing $b"; exit 1; }
  # A dynamic binary would start on this machine and fail in the image.
  file -b "$b" | grep -qE 'statically linked|static-pie linked' || { log "$b is not static: $(file -b "$b")"; exit 1; }
done

mkdir -p "$images"
# archive KEY ARGS...: runs hack/oci-image.py ARGS --out FILE unless FILE,
# named for KEY and the sha256 of what it is made of (the files ARGS name
# with --file and --index-of, the packer, the epoch, ARGS), is cached
# already; sets $packed to FILE. A named file that cannot be read fails the
# build.
archive() {
  local key=$1 sum sums file arg prev='' inputs=("$here/oci-image.py" "$here/regf.py")
  shift
  for arg in "$@"; do
    case $prev in
      --file) inputs+=("${arg%%:/*}") ;;
      --index-of) inputs+=("$arg") ;;
    esac
    prev=$arg
  done
  sums=$(sha256sum "${inputs[@]}" | cut -d' ' -f1)
  sum=$(printf '%s\n%s\n' "$sums" "$SOURCE_DATE_EPOCH $*" | sha256sum | cut -c1-16)
  file="$images/$key-$sum.tar"
  if [[ ! -f "$file" ]]; then
    python3 "$here/oci-image.py" "$@" --out "$file" >&2
    # Keep the newest few archives of each image.
    ls -t "$images/$key"-*.tar 2>/dev/null | tail -n +4 | xargs -r rm -f
  fi
  packed=$file
}

name=ghcr.io/forewarn/forewarn:dev
labels=(
  --label "org.opencontainers.image.version=$version"
  --label "org.opencontainers.image.revision=$revision"
  --label "org.opencontainers.image.source=https://github.com/forewarn/forewarn"
)
archive forewarn-linux-amd64 --name "$name" --platform linux/amd64 --file "$amd64_bin:/usr/local/bin/forewarn" \
  --entrypoint /usr/local/bin/forewarn --user 65532:65532 "${labels[@]}"
amd64=$packed
archive forewarn-linux-arm64 --name "$name" --platform linux/arm64 --file "$arm64_bin:/usr/local/bin/forewarn" \
  --entrypoint /usr/local/bin/forewarn --user 65532:65532 "${labels[@]}"
arm64=$packed
# A HostProcess container finds its image's files under
# $CONTAINER_SANDBOX_MOUNT_POINT, which the runtime expands in its command.
archive forewarn-windows-amd64 --name "$name" --platform windows/amd64 --file "$windows_bin:/forewarn.exe" \
  --entrypoint '$CONTAINER_SANDBOX_MOUNT_POINT/forewarn.exe' "${labels[@]}"
windows=$packed
archive forewarn --name "$name" --index-of "$amd64" --index-of "$arm64" --index-of "$windows"
forewarn_archive=$packed
echo "$name $forewarn_archive"
archive pause --name forewarn.local/pause:dev --file "$out/examples/pause:/pause" --entrypoint /pause --user 65535:65535
echo "forewarn.local/pause:dev $packed"
archive workload --name forewarn.local/workload:dev --file "$out/examples/workload:/usr/local/bin/workload" \
  --entrypoint /usr/local/bin/workload --user 65532:65532 --cmd serve
echo "forewarn.local/workload:dev $packed"

# The digest to pin: index.json's entry of forewarn's image, the index.
digest=$(python3 -c 'import json, sys, tarfile; print(json.load(tarfile.open(sys.argv[1]).extractfile("index.json"))["manifests"][0]["digest"])' "$forewarn_archive")
log "ghcr.io/forewarn/forewarn:dev (linux/amd64, linux/arm64, windows/amd64) is $digest (SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH, revision $revision): pin it with --set image.digest=$digest"
