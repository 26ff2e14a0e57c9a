#!/usr/bin/env bash
# Builds helm v3 from its Go module (helm.sh/helm/v3/cmd/helm at a released
# tag) into the same cache as hack/build-k8s.sh, keyed by version. A second
# run finds it and returns at once. The chart tests (tests/chart/) and
# `make manifests` use it.
#
# Prints the absolute path of the bin directory (holding `helm`) on its last
# line of stdout.
#
# Environment:
#   FOREWARN_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/forewarn)
set -euo pipefail

HELM_VERSION=3.22.0

cache=${FOREWARN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forewarn}
bin="$cache/bin/helm-v$HELM_VERSION"

if [[ -x "$bin/helm" ]]; then
  echo "$bin"
  exit 0
fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
log() { echo "[build-helm] $*" >&2; }
mkdir -p "$bin" "$cache/build"

# helm's go.mod has no replace directives, so `go install mod@version` works.
# The version variables mirror helm's own Makefile: the version, and the
# Kubernetes version `helm lint`/`helm template` assume (client-go's minor + 1.0).
mod=helm.sh/helm/v3
log "resolving $mod@v$HELM_VERSION"
gomod=$(go mod download -json "$mod@v$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
[[ -f "$gomod" ]] || { log "could not download $mod@v$HELM_VERSION"; exit 1; }
clientgo=$(sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$gomod" | head -n 1)
[[ "$clientgo" =~ ^[0-9]+$ ]] || { log "could not read the client-go version from $gomod"; exit 1; }
ld="-s -w -X $mod/internal/version.version=v$HELM_VERSION -X $mod/internal/version.gitTreeState=clean"
for p in pkg/lint/rules pkg/chartutil; do
  ld="$ld -X $mod/$p.k8sVersionMajor=1 -X $mod/$p.k8sVersionMinor=$clientgo"
done

log "building helm v$HELM_VERSION (the first build takes a few minutes)"
GOBIN="$cache/build/helm-v$HELM_VERSION-bin" go install -trimpath -ldflags "$ld" "$mod/cmd/helm@v$HELM_VERSION" >&2
mv "$cache/build/helm-v$HELM_VERSION-bin/helm" "$bin/helm"
"$bin/helm" version --short >&2
echo "$bin"
