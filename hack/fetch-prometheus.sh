#!/usr/bin/env bash
# Prints the directory holding `prometheus` and `promtool` for the alert
# tests (tests/alerts.rs): /usr/bin when Debian's `prometheus` package is
# installed, else the package's files unpacked (never installed: no service
# starts, no root needed) into ~/.cache/forewarn/bin/prometheus-<version>/.
#
# Usage: hack/fetch-prometheus.sh
set -euo pipefail
if [[ -x /usr/bin/prometheus && -x /usr/bin/promtool ]]; then
  echo /usr/bin
  exit 0
fi
command -v apt-get >/dev/null || { echo "need Debian's prometheus package (apt-get) for the alert tests" >&2; exit 1; }
version=$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')
if [[ -z "$version" || "$version" == "(none)" ]]; then
  echo "apt knows no prometheus package; run apt-get update" >&2
  exit 1
fi
dir="${XDG_CACHE_HOME:-$HOME/.cache}/forewarn/bin/prometheus-${version//[^A-Za-z0-9.+-]/_}"
if [[ ! -x "$dir/usr/bin/prometheus" ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download "prometheus=$version" >&2)
  mkdir -p "$dir"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$dir"
fi
echo "$dir/usr/bin"
