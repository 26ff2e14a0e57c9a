#!/usr/bin/env bash
# Builds the Kubernetes control-plane binaries forewarn's demo and tests run
# against (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, kwok, kwokctl) from their Go modules, and caches them outside the
# repository, keyed by version. A second run finds them and returns at once.
#
# Prints the absolute path of the bin directory on its last line of stdout.
#
# Environment:
#   FOREWARN_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/forewarn)
set -euo pipefail

K8S_VERSION=1.36.3
ETCD_VERSION=3.6.14
KWOK_VERSION=0.8.0

cache=${FOREWARN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forewarn}
bin="$cache/bin/k8s-v$K8S_VERSION-etcd-v$ETCD_VERSION-kwok-v$KWOK_VERSION"
want=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kwokctl)

have_all() {
  for b in "${want[@]}"; do [[ -x "$bin/$b" ]] || return 1; done
}
if have_all; then
  echo "$bin"
  exit 0
fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$bin" "$cache/build"
log() { echo "[build-k8s] $*" >&2; }

# --- Kubernetes: a wrapper module that pins every staging module to its tag,
# since k8s.io/kubernetes's own go.mod replaces them with ./staging paths and
# so cannot be `go install`ed directly.
build_kubernetes() {
  local dir="$cache/build/k8s-v$K8S_VERSION" minor=${K8S_VERSION#1.}
  minor=${minor%%.*}
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  go mod init local.test/k8s-binaries >/dev/null 2>&1
  go mod edit -require="k8s.io/kubernetes@v$K8S_VERSION"
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [[ -f "$gomod" ]] || { log "could not download k8s.io/kubernetes@v$K8S_VERSION"; exit 1; }
  local goline
  goline=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")
  go mod edit -go="$goline"
  for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/.*#\1#p' "$gomod"); do
    go mod edit -replace="$m=$m@v0.${K8S_VERSION#1.}"
  done
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  log "resolving Kubernetes v$K8S_VERSION modules"
  go mod tidy >&2
  local ld="-s -w" date
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ld="$ld -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=$date"
  done
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [[ -x "$bin/$c" ]] && continue
    log "building $c (the first build takes several minutes)"
    go build -trimpath -tags notest -ldflags "$ld" -o "$bin/$c.tmp" "k8s.io/kubernetes/cmd/$c" >&2
    mv "$bin/$c.tmp" "$bin/$c"
  done
}

# --- etcd: server/go.mod has relative replaces, so it also needs a wrapper.
build_etcd() {
  local dir="$cache/build/etcd-v$ETCD_VERSION"
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  go mod init local.test/etcd-binaries >/dev/null 2>&1
  go mod edit -require="go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
  log "building etcd v$ETCD_VERSION"
  go mod tidy >&2
  go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3 >&2
  mv "$bin/etcd.tmp" "$bin/etcd"
}

# --- kwok: a plain module, installable as is.
build_kwok() {
  log "building kwok and kwokctl v$KWOK_VERSION"
  GOBIN="$cache/build/kwok-bin" go install "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@v$KWOK_VERSION" >&2
  mv "$cache/build/kwok-bin/kwok" "$cache/build/kwok-bin/kwokctl" "$bin/"
}

[[ -x "$bin/etcd" ]] || (build_etcd)
{ [[ -x "$bin/kwok" ]] && [[ -x "$bin/kwokctl" ]]; } || (build_kwok)
{ [[ -x "$bin/kube-apiserver" ]] && [[ -x "$bin/kube-controller-manager" ]] && [[ -x "$bin/kube-scheduler" ]] && [[ -x "$bin/kubectl" ]]; } || (build_kubernetes)

have_all || { log "some binaries are missing from $bin"; exit 1; }
echo "$bin"
