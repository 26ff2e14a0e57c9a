#!/usr/bin/env bash
# Checks a Grafana dashboard JSON file against Grafana's published schema
# package, @grafana/schema: the TypeScript types of the dashboard model that
# Grafana generates from its own (CUE) schema. The file is compiled as an
# object literal of type `Dashboard` by the TypeScript compiler in strict
# mode, so a field the model does not have, a value of the wrong type or a
# missing required field fails, with the line (the file's line + 1).
#
# Usage: hack/check-dashboard.sh [FILE]   (default: charts/forewarn/files/dashboard.json)
#
# Needs Node.js and npm (the npm registry). The two packages, at pinned
# versions, are installed once into $FOREWARN_CACHE/grafana-schema/ (never
# globally, no install scripts run); tests/alerts.rs runs this.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
file=$(realpath "${1:-$here/../charts/forewarn/files/dashboard.json}")
cache=${FOREWARN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forewarn}
schema_version=13.2.3
ts_version=5.9.3
dir=$cache/grafana-schema/schema-$schema_version-typescript-$ts_version

if [[ ! -x $dir/node_modules/.bin/tsc || ! -d $dir/node_modules/@grafana/schema ]]; then
  command -v npm >/dev/null || { echo "check-dashboard: npm (Node.js) is needed" >&2; exit 1; }
  mkdir -p "$cache/grafana-schema"
  tmp=$(mktemp -d "$cache/grafana-schema/install.XXXXXX")
  echo '{"private": true}' >"$tmp/package.json"
  (cd "$tmp" && npm install --no-audit --no-fund --ignore-scripts \
    "@grafana/schema@$schema_version" "typescript@$ts_version" >&2) ||
    { rm -rf "$tmp"; echo "check-dashboard: npm install failed" >&2; exit 1; }
  rm -rf "$dir"
  mv "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp" # another run installed it meanwhile
fi

work=$(mktemp -d "$dir/check.XXXXXX")
trap 'rm -rf "$work"' EXIT
{
  echo "import type { Dashboard } from '@grafana/schema';"
  printf 'const dashboard: Dashboard = '
  cat "$file"
  echo ';'
  echo 'export default dashboard;'
} >"$work/check.ts"
cat >"$work/tsconfig.json" <<'JSON'
{
  "compilerOptions": {
    "strict": true,
    "noEmit": true,
    "module": "esnext",
    "moduleResolution": "bundler",
    "target": "es2022",
    "skipLibCheck": true
  },
  "files": ["check.ts"]
}
JSON
if ! "$dir/node_modules/.bin/tsc" -p "$work/tsconfig.json"; then
  echo "check-dashboard: $file does not match @grafana/schema $schema_version's Dashboard (line numbers are the file's + 1)" >&2
  exit 1
fi
echo "check-dashboard: $file matches @grafana/schema $schema_version's Dashboard"
