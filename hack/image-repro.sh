#!/usr/bin/env bash
# Checks that `make image` is reproducible: the same commit, cloned into two
# directories, gives the same image index digest (and the same digest for
# each platform's image).
#
#   1. clones HEAD of this checkout twice (committed work only), into
#      $WORK/a and $WORK/a-clone-with-a-longer-path/b, paths of different
#      lengths;
#   2. runs hack/build-image.sh (what `make image` runs) in each, each with
#      a cache of its own under $WORK (FOREWARN_CACHE), so that no target dir
#      is shared: a cold build of the three platforms in each (about 25
#      minutes of both cores each);
#   3. compares the digests each printed and the platforms' manifests, and
#      exits 1 when they differ, naming the images that do.
#
# Usage: hack/image-repro.sh        (make image-repro)
# Environment:
#   WORK            where the clones go (default: a new temporary directory,
#                   removed at the end unless KEEP=1)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
log() { echo "[image-repro] $*" >&2; }

commit=$(git -C "$root" rev-parse HEAD)
if [[ -n $(git -C "$root" status --porcelain --untracked-files=no) ]]; then
  log "note: uncommitted changes in $root are not in the clones (they build $commit)"
fi
work=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/forewarn-repro.XXXXXX")}
if [[ -z ${WORK:-} && ${KEEP:-} != 1 ]]; then
  trap 'rm -rf "$work"' EXIT
fi
a="$work/a"
b="$work/a-clone-with-a-longer-path/b"
rm -rf "$a" "$b"
mkdir -p "$(dirname "$b")"
git clone -q "$root" "$a"
git clone -q "$root" "$b"
git -C "$a" checkout -q "$commit"
git -C "$b" checkout -q "$commit"

# build DIR LOG [ENV...]: hack/build-image.sh in DIR; prints forewarn's archive.
build() {
  local dir=$1 logf=$2
  shift 2
  log "building in $dir (log: $logf)"
  local start=$SECONDS
  (cd "$dir" && env "$@" bash hack/build-image.sh >"$logf.out" 2>"$logf") ||
    { tail -n 30 "$logf"; log "hack/build-image.sh failed in $dir"; exit 1; }
  log "built in $dir in $((SECONDS - start)) s"
  awk '$1 == "ghcr.io/forewarn/forewarn:dev" { print $2 }' "$logf.out"
}
for c in cache-a cache-b; do
  rm -rf "${work:?}/$c"
  mkdir -p "$work/$c"
done
first=$(build "$a" "$work/a.log" FOREWARN_CACHE="$work/cache-a")
second=$(build "$b" "$work/b.log" FOREWARN_CACHE="$work/cache-b")

# digests ARCHIVE: the index's digest, then each platform's manifest digest.
digests() {
  python3 - "$1" <<'PY'
import json, sys, tarfile
t = tarfile.open(sys.argv[1])
top = json.load(t.extractfile("index.json"))["manifests"][0]
print("index", top["digest"])
index = json.load(t.extractfile("blobs/sha256/" + top["digest"][7:]))
for m in index["manifests"]:
    print(m["platform"]["os"] + "/" + m["platform"]["architecture"], m["digest"])
PY
}
da=$(digests "$first")
db=$(digests "$second")
echo "$a:"
sed 's/^/  /' <<<"$da"
echo "$b:"
sed 's/^/  /' <<<"$db"
if [[ $da != "$db" ]]; then
  log "NOT reproducible: the two clones' images differ:"
  diff <(echo "$da") <(echo "$db") >&2 || true
  exit 1
fi
log "reproducible: commit $commit gives $(head -n 1 <<<"$da" | cut -d' ' -f2) in both clones"
