#!/usr/bin/env bash
# Publishes forewarn to an OCI registry of one's own (an Azure Container
# Registry, say): the image `make image` builds and the Helm chart pinned to
# it, so that one `helm install oci://...` installs exactly this build.
#
#   1. builds the image with hack/build-image.sh (as `make image` does) and
#      pushes its OCI layout, as is, to REGISTRY/forewarn:VERSION with crane
#      (hack/build-registry.sh): an image index of N platform manifests (or a
#      single image) keeps every digest, and the digest the registry then
#      serves for the tag is checked against the archive's;
#   2. packages charts/forewarn as version VERSION (appVersion VERSION) with
#      image.repository=REGISTRY/forewarn and image.digest=<that digest>, so
#      every pod runs REGISTRY/forewarn:VERSION@sha256:..., and checks that
#      `helm template` of the package renders exactly that reference;
#   3. `helm push`es the package to oci://REGISTRY/charts (helm from
#      hack/build-helm.sh);
#   4. prints what to pin: the image reference with its digest, the chart's
#      digest, and the one `helm install` command.
#
# Usage:
#   hack/release.sh REGISTRY VERSION      (make release REGISTRY=... VERSION=...)
#     REGISTRY  host[:port][/path], no scheme (e.g. myacr.azurecr.io or
#               myacr.azurecr.io/team)
#     VERSION   SemVer 2 without a leading v (e.g. 0.1.0, 0.2.0-rc.1): the
#               image tag, the chart's version and its appVersion
#
# Log in first (crane and helm keep their own credentials; both also read
# docker's config.json): `crane auth login HOST -u USER -p PASSWORD` and
# `helm registry login HOST -u USER --password-stdin` (see docs/install.md,
# "From your own registry", for an ACR).
#
# Plain HTTP is used for a registry on loopback only (localhost, 127.0.0.0/8,
# [::1]), or anywhere with PLAIN_HTTP=1; everything else is HTTPS.
#
# Output: human-readable lines on stdout, ending with these, one per line
# (hack/real-node.sh reads them):
#   archive: <the OCI archive pushed>
#   image:   REGISTRY/forewarn:VERSION@sha256:<digest>
#   chart:   oci://REGISTRY/charts/forewarn:VERSION@sha256:<digest>
#   install: helm install forewarn oci://REGISTRY/charts/forewarn --version VERSION ...
#
# Environment:
#   PLAIN_HTTP         1: plain HTTP to REGISTRY even off loopback
#   FOREWARN_CACHE     cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/forewarn)
#   CARGO              cargo to use (default: cargo; passed to hack/build-image.sh)
#   SOURCE_DATE_EPOCH  the image's timestamps (default: the HEAD commit's time)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
log() { echo "[release] $*" >&2; }
die() { echo "[release] ERROR: $*" >&2; exit 1; }

[[ $# -eq 2 ]] || die "usage: hack/release.sh REGISTRY VERSION (e.g. make release REGISTRY=myacr.azurecr.io VERSION=0.1.0)"
registry=${1%/}
version=$2
[[ -n $registry && $registry != *://* && $registry != */ && $registry != *' '* ]] ||
  die "REGISTRY must be host[:port][/path] without a scheme, got '$1'"
[[ $version =~ ^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$ ]] ||
  die "VERSION must be SemVer 2 without a leading v (e.g. 0.1.0), got '$version'"
# An OCI tag cannot hold '+' (build metadata); helm pushes such a chart
# version as '_', the image tag must do the same.
tag=${version//+/_}

host=${registry%%/*}
plain=()
if [[ ${PLAIN_HTTP:-} == 1 ]] || [[ $host =~ ^(localhost|127\.[0-9]+\.[0-9]+\.[0-9]+|\[::1\])(:[0-9]+)?$ ]]; then
  plain=(--plain-http)
  log "$host: plain HTTP (loopback or PLAIN_HTTP=1)"
fi

image_repo="$registry/forewarn"
chart_repo="oci://$registry/charts"

# --- Tools (cached after the first run)
crane="$(bash "$here/build-registry.sh" | tail -n 1)/crane"
helm="$(bash "$here/build-helm.sh" | tail -n 1)/helm"
[[ -x $crane ]] || die "hack/build-registry.sh built no crane"
[[ -x $helm ]] || die "hack/build-helm.sh built no helm"
crane_flags=()
((${#plain[@]} == 0)) || crane_flags=(--insecure)

# --- 1. The image, as `make image` builds it
log "building the image (hack/build-image.sh, as make image)"
images=$(bash "$here/build-image.sh")
# forewarn's own image: the line whose name's last path element is forewarn.
archive=$(awk '{ n = $1; sub(/[:@].*$/, "", n); sub(/^.*\//, "", n); if (n == "forewarn") { print $2; exit } }' <<<"$images")
[[ -n $archive && -f $archive ]] || die "hack/build-image.sh named no forewarn image archive: $images"

work=$(mktemp -d "${TMPDIR:-/tmp}/forewarn-release.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/layout"
tar -xf "$archive" -C "$work/layout"
[[ -f $work/layout/index.json && -f $work/layout/oci-layout ]] || die "$archive is not an OCI image layout"

# What the tag must point to, read from the archive: the one entry of
# index.json (an image index or an image manifest) by its digest, or
# index.json itself when it lists several manifests (crane push --index
# pushes it as the index). The blob's bytes must hash to that digest.
read -r want entries < <(python3 - "$work/layout" <<'PY'
import hashlib, json, os, sys
layout = sys.argv[1]
raw = open(os.path.join(layout, "index.json"), "rb").read()
entries = json.loads(raw)["manifests"]
if len(entries) == 1:
    digest = entries[0]["digest"]
    algo, hexd = digest.split(":", 1)
    blob = open(os.path.join(layout, "blobs", algo, hexd), "rb").read()
    if "sha256:" + hashlib.sha256(blob).hexdigest() != digest:
        sys.exit(f"blob {digest} does not match its digest")
    print(digest, 1)
else:
    print("sha256:" + hashlib.sha256(raw).hexdigest(), len(entries))
PY
)
[[ $want =~ ^sha256:[0-9a-f]{64}$ ]] || die "could not read the digest of $archive"
push_flags=()
((entries == 1)) || push_flags=(--index)

log "pushing $archive ($want) to $image_repo:$tag"
"$crane" "${crane_flags[@]}" push "${push_flags[@]}" "$work/layout" "$image_repo:$tag" >&2 ||
  die "crane push to $image_repo:$tag failed (logged in? crane auth login $host)"
served=$("$crane" "${crane_flags[@]}" digest "$image_repo:$tag") || die "crane digest $image_repo:$tag failed"
[[ $served == "$want" ]] || die "the registry serves $served for $image_repo:$tag, the archive holds $want"
digest=$want

# --- 2. The chart, pinned to that image
cp -r "$root/charts/forewarn" "$work/chart"
python3 - "$work/chart/values.yaml" "$image_repo" "$digest" <<'PY'
import re, sys
path, repo, digest = sys.argv[1:]
text = open(path).read()
# Only the top-level image: block's own keys (two-space indent).
m = re.search(r"^image:\n((?:  .*\n|\s*\n)+)", text, re.M)
if not m:
    sys.exit("values.yaml has no top-level image: block")
block = m.group(1)
new, n1 = re.subn(r"^  repository: .*$", f"  repository: {repo}", block, count=1, flags=re.M)
new, n2 = re.subn(r"^  digest: .*$", f'  digest: "{digest}"', new, count=1, flags=re.M)
new, n3 = re.subn(r"^  tag: .*$", '  tag: ""', new, count=1, flags=re.M)
if (n1, n2, n3) != (1, 1, 1):
    sys.exit("values.yaml's image block lacks repository, tag or digest")
open(path, "w").write(text[: m.start(1)] + new + text[m.end(1):])
PY
helm_env=(env HELM_CACHE_HOME="$work/helm-cache")
"${helm_env[@]}" "$helm" package "$work/chart" --version "$version" --app-version "$version" \
  --destination "$work/pkg" >&2 || die "helm package failed"
pkg="$work/pkg/forewarn-$version.tgz"
[[ -f $pkg ]] || die "helm package wrote no $pkg"
# Every image the package renders (both roles, the hook Job, the test Pod)
# must be the pinned one.
rendered=$("${helm_env[@]}" "$helm" template forewarn "$pkg" --namespace forewarn \
  --api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy |
  sed -n 's/^[[:space:]]*image: *"\{0,1\}\([^"]*\)"\{0,1\}[[:space:]]*$/\1/p' | sort -u)
[[ $rendered == "$image_repo:$tag@$digest" ]] ||
  die "the packaged chart renders the image(s) '$rendered', not $image_repo:$tag@$digest"

# --- 3. Push the chart
log "pushing the chart forewarn-$version.tgz to $chart_repo"
out=$("${helm_env[@]}" "$helm" push "$pkg" "$chart_repo" "${plain[@]}" 2>&1) || {
  echo "$out" >&2
  die "helm push to $chart_repo failed (logged in? helm registry login $host)"
}
echo "$out" >&2
chart_digest=$(sed -n 's/^Digest: *\(sha256:[0-9a-f]\{64\}\)$/\1/p' <<<"$out")
[[ -n $chart_digest ]] || die "helm push printed no digest"

# --- 4. What to pin
install="helm install forewarn $chart_repo/forewarn --version $version --namespace forewarn"
((${#plain[@]} == 0)) || install="$install --plain-http"
cat <<EOF
Published forewarn $version to $registry. Pin:
  the image    $image_repo:$tag@$digest
  the chart    $chart_repo/forewarn:$tag@$chart_digest
Install (after kubectl create namespace forewarn and labelling it
pod-security.kubernetes.io/enforce=privileged, see the README):
  $install

archive: $archive
image: $image_repo:$tag@$digest
chart: $chart_repo/forewarn:$tag@$chart_digest
install: $install
EOF
