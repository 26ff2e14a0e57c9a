#!/usr/bin/env bash
# Builds actionlint (the GitHub Actions workflow checker) from its Go module
# (github.com/rhysd/actionlint/cmd/actionlint at a released tag) into the
# same cache as hack/build-k8s.sh, keyed by version. A second run finds it
# and returns at once. tests/release.rs runs it on .github/workflows/.
#
# Prints the absolute path of the bin directory (holding `actionlint`) on its
# last line of stdout.
#
# Environment:
#   FOREWARN_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/forewarn)
set -euo pipefail

ACTIONLINT_VERSION=1.7.12

cache=${FOREWARN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forewarn}
bin="$cache/bin/actionlint-v$ACTIONLINT_VERSION"

if [[ -x "$bin/actionlint" ]]; then
  echo "$bin"
  exit 0
fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
log() { echo "[build-actionlint] $*" >&2; }
mkdir -p "$bin" "$cache/build"

# actionlint's go.mod has no replace directives, so `go install mod@version`
# works. The version variable is the one its own release build sets.
mod=github.com/rhysd/actionlint
log "building actionlint v$ACTIONLINT_VERSION"
GOBIN="$cache/build/actionlint-v$ACTIONLINT_VERSION-bin" go install -trimpath \
  -ldflags "-s -w -X $mod.version=v$ACTIONLINT_VERSION" "$mod/cmd/actionlint@v$ACTIONLINT_VERSION" >&2
mv "$cache/build/actionlint-v$ACTIONLINT_VERSION-bin/actionlint" "$bin/actionlint"
"$bin/actionlint" -version >&2
echo "$bin"
