#!/usr/bin/env bash
# Snapshots the chart of an earlier commit into
# tests/chart-fixtures/previous-release/, for the upgrade test in
# tests/chart/upgrade.rs (`helm install` of that chart, then `helm upgrade` to
# charts/forewarn): CI then needs no git history. There are no release tags;
# the "previous release" is the commit just before the reports CRD was added
# (bb0fc75), found with `git log -- crds/ charts/forewarn/crds/`:
#
#   hack/snapshot-previous-chart.sh 55729a8
#
# Usage: hack/snapshot-previous-chart.sh COMMIT
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
commit=${1:?usage: hack/snapshot-previous-chart.sh COMMIT}
full=$(git -C "$root" rev-parse --verify "$commit^{commit}")
dest="$root/tests/chart-fixtures/previous-release"
rm -rf "$dest"
mkdir -p "$dest"
git -C "$root" archive "$full" charts/forewarn | tar -x -C "$dest" --strip-components=2
[[ -f "$dest/Chart.yaml" && -d "$dest/crds" ]] || { echo "no chart at $commit" >&2; exit 1; }
cat > "$dest/SNAPSHOT" <<TXT
charts/forewarn of commit $full
($(git -C "$root" log -1 --format='%cs %s' "$full" | cut -c1-120))
written by hack/snapshot-previous-chart.sh; do not edit.
TXT
echo "$dest"
