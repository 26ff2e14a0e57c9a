#!/usr/bin/env bash
# Builds the two OCI registry tools `make release` and the real-node chart
# test use, from their Go modules at released tags, into the same cache as
# hack/build-k8s.sh, keyed by version. A second run finds them and returns at
# once; the first needs the Go module proxy and nothing else.
#
#   registry  CNCF distribution's registry (github.com/distribution/distribution/v3/cmd/registry):
#             the real-node test serves the image and the chart from it on loopback
#   crane     go-containerregistry's crane (github.com/google/go-containerregistry/cmd/crane):
#             pushes the OCI layout `make image` writes (an image or an image
#             index of N manifests) as is, so every digest is preserved
#
# Usage: hack/build-registry.sh
# Prints the absolute path of the bin directory (holding `registry` and
# `crane`) on its last line of stdout; build logs go to stderr.
#
# Environment:
#   FOREWARN_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/forewarn)
set -euo pipefail

DISTRIBUTION_VERSION=3.1.2
CRANE_VERSION=0.22.1

cache=${FOREWARN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forewarn}
bin="$cache/bin/registry-v$DISTRIBUTION_VERSION-crane-v$CRANE_VERSION"

if [[ -x "$bin/registry" && -x "$bin/crane" ]]; then
  echo "$bin"
  exit 0
fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
log() { echo "[build-registry] $*" >&2; }
mkdir -p "$bin" "$cache/build"

# install PACKAGE VERSION LDFLAGS NAME: `go install pkg@version` (neither
# go.mod has replace directives), then moved into the versioned bin dir.
install() {
  local pkg=$1 version=$2 ld=$3 name=$4 gobin="$cache/build/registry-tools-bin"
  [[ -x "$bin/$name" ]] && return 0
  log "building $name ($pkg@v$version; the first build takes a few minutes)"
  GOBIN="$gobin" go install -trimpath -ldflags "$ld" "$pkg@v$version" >&2 ||
    { log "could not build $pkg@v$version (is the Go module proxy reachable?)"; exit 1; }
  mv "$gobin/$name" "$bin/$name"
}

d=github.com/distribution/distribution/v3
install "$d/cmd/registry" "$DISTRIBUTION_VERSION" \
  "-s -w -X $d/version.version=v$DISTRIBUTION_VERSION -X $d/version.mainpkg=$d" registry
g=github.com/google/go-containerregistry
install "$g/cmd/crane" "$CRANE_VERSION" "-s -w -X $g/cmd/crane/cmd.Version=v$CRANE_VERSION" crane

"$bin/registry" --version >&2
"$bin/crane" version >&2
[[ -x "$bin/registry" && -x "$bin/crane" ]] || { log "some binaries are missing from $bin"; exit 1; }
echo "$bin"
