#!/usr/bin/env bash
# A REAL node next to the KWOK nodes of a local cluster: kubelet v1.36.3 (built
# from its Go module) with containerd and runc (Debian packages), running
# images built here (hack/build-image.sh) without any registry. The whole
# real-node cluster (control plane, containerd, kubelet, IMDS mock, test) runs
# in a network namespace of its own, so nothing it does can leave the machine,
# and a mount namespace of its own, so /etc/hosts and the kubelet's
# hard-coded paths are private copies.
#
# Usage (as root; needs unshare, ip, mount):
#   hack/real-node.sh build    build everything the run needs (kubelet, the
#                              control plane, the images, the test binary)
#   hack/real-node.sh test [TEST ARGS...]
#                              build, enter a fresh net+mount namespace, start
#                              the cluster `forewarn-real` (KWOK nodes +
#                              real-node-0), run tests/real_node.rs there,
#                              tear everything down, verify nothing is left,
#                              and exit with the test's status
#   hack/real-node.sh run CMD [ARGS...]
#                              the same, running CMD instead of the test (e.g.
#                              `bash` for a shell next to the real node, with
#                              KUBECONFIG, kubectl on PATH and FOREWARN_REAL_*)
#   hack/real-node.sh down     tear everything down (also after a crash or a
#                              kill half-way through `test`) and verify
#
# Environment:
#   FOREWARN_REAL_TESTS  test targets `test` runs, space-separated (default:
#                    real_node; `real_node real_node_chart` adds the Helm chart
#                    on the real node, which needs charts/forewarn and
#                    hack/build-helm.sh)
#   FOREWARN_CACHE   cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/forewarn)
#                    kubelet:  $FOREWARN_CACHE/bin/kubelet-v1.36.3/kubelet
#                    images:   $FOREWARN_CACHE/images/
#                    run dir:  $FOREWARN_CACHE/real-node/ (removed by down)
#                    logs:     $FOREWARN_CACHE/real-node-logs/ (kept; last run)
#
# What the namespace holds: lo (127.0.0.1 and 169.254.169.254, where the test
# serves the IMDS mock on port 80) and the CNI bridge fwreal0 (10.244.77.1/24,
# the node's InternalIP; pods get 10.244.77.0/24). There is no default route,
# so a connection to the `kubernetes` Service IP fails at once. Pods reach the
# API server through KUBERNETES_SERVICE_HOST=127.0.0.1 with hostNetwork.
#
# With real_node_chart among the tests, the namespace also holds an OCI
# registry (CNCF distribution, hack/build-registry.sh) on 127.0.0.1:<free
# port>, storage under the run dir; `make release`'s script (hack/release.sh)
# pushes the image and the chart there before the tests, and containerd pulls
# from it over plain HTTP (a hosts.toml for that address only). The test
# installs the chart from oci://127.0.0.1:<port>/... and containerd pulls the
# image by digest: the copy of forewarn's image imported for
# tests/real_node.rs is removed by the chart test first.
#
# One real node per machine: the kubelet's ports 10250/10248 and some of its
# paths are fixed.
set -euo pipefail

K8S_VERSION=1.36.3
NODE=real-node-0
CLUSTER=forewarn-real
BRIDGE=fwreal0
BRIDGE_IP=10.244.77.1
SUBNET=10.244.77.0/24
CGROUP=forewarn-real
IMDS_IP=169.254.169.254
# Paths the kubelet, containerd or libcni use whatever the configuration says.
# Inside the mount namespace each gets a private tmpfs; a path that did not
# exist is created for the mount point and removed by `down`.
FIXED_PATHS=(/var/lib/kubelet /var/log/containers /var/log/pods /run/containerd /var/lib/cni /opt/containerd)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${FOREWARN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forewarn}
W="$cache/real-node"
LOGS="$cache/real-node-logs"
STATE="$cache/real-node-state"
SOCK="$W/run/containerd.sock"
kubelet_bin="$cache/bin/kubelet-v$K8S_VERSION/kubelet"
# The test targets `test` runs (tests/<name>.rs, feature real-node).
REAL_TESTS=${FOREWARN_REAL_TESTS:-real_node}

log() { echo "[real-node] $(date -u +%H:%M:%S.%3N) $*" >&2; }
die() { echo "[real-node] ERROR: $*" >&2; exit 1; }

usage() {
  sed -n '/^# Usage/,/^# Environment/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# --------------------------------------------------------------------------
# Build (outside the namespace: it needs the Go module proxy and crates.io)

# kubelet from k8s.io/kubernetes, with the same wrapper module and version
# ldflags as hack/build-k8s.sh (which builds the control plane), in its own
# build dir.
build_kubelet() {
  [[ -x "$kubelet_bin" ]] && return 0
  local dir="$cache/build/kubelet-v$K8S_VERSION" minor=${K8S_VERSION#1.} gomod goline ld date m
  minor=${minor%%.*}
  log "building kubelet v$K8S_VERSION (about 30 s with a warm Go cache, 4 min cold)"
  (
    export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
    rm -rf "$dir" && mkdir -p "$dir" "$(dirname "$kubelet_bin")" && cd "$dir"
    go mod init local.test/kubelet >/dev/null 2>&1
    go mod edit -require="k8s.io/kubernetes@v$K8S_VERSION"
    gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
    [[ -f "$gomod" ]] || die "could not download k8s.io/kubernetes@v$K8S_VERSION"
    goline=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")
    go mod edit -go="$goline"
    for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/.*#\1#p' "$gomod"); do
      go mod edit -replace="$m=$m@v0.${K8S_VERSION#1.}"
    done
    printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n' >tools.go
    go mod tidy >&2
    ld="-s -w"
    date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
      ld="$ld -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=$date"
    done
    go build -trimpath -tags notest -ldflags "$ld" -o "$kubelet_bin.tmp" k8s.io/kubernetes/cmd/kubelet >&2
    mv "$kubelet_bin.tmp" "$kubelet_bin"
  )
}

# containerd, runc and the CNI plugins from Debian; no service is started.
ensure_packages() {
  if command -v containerd >/dev/null && command -v ctr >/dev/null && command -v runc >/dev/null &&
    [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]]; then
    return 0
  fi
  log "installing containerd, runc and containernetworking-plugins from Debian"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    containerd runc containernetworking-plugins >&2
  command -v containerd >/dev/null || die "containerd did not install"
}

cmd_build() {
  [[ $EUID -eq 0 ]] || die "the real node needs root (kubelet, containerd, namespaces)"
  ensure_packages
  K8S_BIN=$("$here/build-k8s.sh" | tail -n 1)
  [[ -x "$K8S_BIN/kubectl" ]] || die "hack/build-k8s.sh printed no bin dir"
  build_kubelet
  IMAGES=$("$here/build-image.sh")
  local t bin
  TEST_BINS=""
  for t in $REAL_TESTS; do
    log "building tests/$t.rs"
    bin=$(cd "$root" && cargo test --locked --features real-node --test "$t" --no-run \
      --message-format=json 2>/dev/null | T=$t python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == os.environ["T"]:
        print(m["executable"])')
    if [[ -z "$bin" || ! -x "$bin" ]]; then
      (cd "$root" && cargo test --locked --features real-node --test "$t" --no-run) >&2 || true
      die "could not build tests/$t.rs"
    fi
    TEST_BINS="$TEST_BINS $bin"
  done
  # The chart test installs the chart with helm from a registry on
  # loopback (CNCF distribution) that hack/release.sh pushes to with crane:
  # all built outside the namespace (they need the Go module proxy).
  FOREWARN_HELM=""
  REGISTRY_BIN=""
  if [[ " $REAL_TESTS " == *" real_node_chart "* ]]; then
    [[ -x "$here/build-helm.sh" || -f "$here/build-helm.sh" ]] || die "tests/real_node_chart.rs needs hack/build-helm.sh (the chart's helm build)"
    FOREWARN_HELM="$(bash "$here/build-helm.sh" | tail -n 1)/helm"
    [[ -x "$FOREWARN_HELM" ]] || die "hack/build-helm.sh built no helm"
    REGISTRY_BIN=$(bash "$here/build-registry.sh" | tail -n 1)
    [[ -x "$REGISTRY_BIN/registry" && -x "$REGISTRY_BIN/crane" ]] ||
      die "hack/build-registry.sh built no registry or crane (tests/real_node_chart.rs needs both)"
  fi
  FOREWARN_BIN="$root/target/debug/forewarn"
  [[ -x "$FOREWARN_BIN" ]] || die "cargo did not build $FOREWARN_BIN"
}

# --------------------------------------------------------------------------
# Teardown (works from inside or outside the namespace, after any failure)

state_get() { [[ -f "$STATE/$1" ]] && cat "$STATE/$1" || true; }

# PIDs of the processes started in the recorded network namespace, except
# this shell: in that namespace AND carrying the marker variable the
# namespace's first shell exported (a namespace's inode number can be reused
# once it is gone, so the inode alone could match someone else's).
# Containers do not inherit it; they are found by their cgroups.
ns_pids() {
  local netns p
  netns=$(state_get netns)
  [[ -n "$netns" ]] || return 0
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ "$p" == "$$" || "$p" == "${BASHPID:-}" ]] && continue
    [[ "$(readlink "/proc/$p/ns/net" 2>/dev/null)" == "$netns" ]] || continue
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qxF "FOREWARN_REAL_NS=$netns" && echo "$p"
  done
  return 0
}

# PIDs in the node's cgroups (every container and pause process).
cgroup_pids() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -d "$h$CGROUP" ]] || continue
    find "$h$CGROUP" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -un
}

# kill_wait SIGNAL SECONDS PID...: signals the PIDs, waits until they are gone.
kill_wait() {
  local sig=$1 secs=$2 p deadline
  shift 2
  [[ $# -gt 0 ]] || return 0
  kill "-$sig" "$@" 2>/dev/null || true
  deadline=$((SECONDS + secs))
  for p in "$@"; do
    while [[ -e "/proc/$p" ]] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; do
      ((SECONDS < deadline)) || return 1
      sleep 0.1
    done
  done
}

# pid_of NAME: the PID recorded for a daemon we started, if still that daemon.
pid_of() {
  local pid
  pid=$(state_get "$1.pid")
  [[ "$pid" =~ ^[0-9]+$ ]] && [[ -e "/proc/$pid" ]] && grep -qF -- "$W" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
  return 0
}

# Runs kubectl against the real-node cluster, from inside or outside the
# namespace (outside: through nsenter into a process of the namespace).
ns_kubectl() {
  local kubeconfig="$cache/kwok/clusters/$CLUSTER/kubeconfig.yaml" bin pid
  bin=$(state_get k8s_bin)
  [[ -f "$kubeconfig" && -x "$bin/kubectl" ]] || return 1
  if in_ns; then
    KUBECACHEDIR="$W/kubectl-cache" timeout 40 "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"
  else
    pid=$(ns_pids | head -n 1)
    [[ -n "$pid" ]] || return 1
    KUBECACHEDIR="$W/kubectl-cache" timeout 40 nsenter -t "$pid" -n -- "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"
  fi
}

cmd_down() {
  local pids p h m
  [[ $EUID -eq 0 ]] || die "needs root"
  if [[ ! -d "$STATE" && ! -d "$W" ]] && [[ -z "$(cgroup_dirs)" ]]; then
    verify_down
    return
  fi
  log "tearing the real node down"
  # 1. Pods first, through the API, so the kubelet stops them and CNI tears
  #    their network down cleanly.
  if [[ -n "$(pid_of kubelet)" ]] && ns_kubectl get --raw /readyz >/dev/null 2>&1; then
    ns_kubectl delete pods --all-namespaces --field-selector "spec.nodeName=$NODE" \
      --grace-period=2 --wait=true --timeout=30s >/dev/null 2>&1 ||
      log "deleting the node's pods through the API did not finish; killing them"
    ns_kubectl delete node "$NODE" --wait=false >/dev/null 2>&1 || true
  fi
  # 2. kubelet, then every container and pause process, then containerd and
  #    its shims, then the registry.
  p=$(pid_of kubelet)
  [[ -z "$p" ]] || kill_wait TERM 10 "$p" || kill_wait KILL 5 "$p" || true
  # shellcheck disable=SC2046 # one PID per word
  kill_wait KILL 10 $(cgroup_pids) || true
  p=$(pid_of containerd)
  [[ -z "$p" ]] || kill_wait TERM 10 "$p" || kill_wait KILL 5 "$p" || true
  p=$(pid_of registry)
  [[ -z "$p" ]] || kill_wait TERM 10 "$p" || kill_wait KILL 5 "$p" || true
  # 3. The control plane (kwokctl's pid files), then anything else still in
  #    the namespace (shims, the IMDS mock, a test).
  if [[ -d "$cache/kwok/clusters/$CLUSTER" ]]; then
    bash "$here/cluster.sh" down --name "$CLUSTER" >&2 || log "hack/cluster.sh down failed"
  fi
  pids=$(ns_pids)
  # The namespace's first shell (it exported the marker after it started).
  p=$(state_get inner.pid)
  if [[ "$p" =~ ^[0-9]+$ && "$p" != "$$" && -n "$(state_get netns)" ]] &&
    [[ "$(readlink "/proc/$p/ns/net" 2>/dev/null)" == "$(state_get netns)" ]]; then
    pids="$pids $p"
  fi
  if [[ -n "${pids// /}" ]]; then
    # shellcheck disable=SC2086
    kill_wait TERM 5 $pids || kill_wait KILL 5 $(ns_pids) || true
  fi
  # 4. Mounts, deepest first: under the run dir, and inside the namespace
  #    also the private /etc/hosts and fixed paths (outside they are the
  #    machine's own; the namespace's mounts vanish with it).
  local pattern="$W"
  if in_ns; then
    pattern="$W|$(printf '%s|' "${FIXED_PATHS[@]}")/etc/hosts"
  fi
  for m in $(findmnt -rn -o TARGET | grep -E "^($pattern)(/|$)" | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  # 5. cgroups, deepest first, in every hierarchy.
  for h in $(cgroup_dirs); do
    # shellcheck disable=SC2046
    kill_wait KILL 5 $(cgroup_pids) || true
    find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  # 6. The bridge, if this is the namespace (elsewhere it dies with it).
  if in_ns; then ip link del "$BRIDGE" 2>/dev/null || true; fi
  # 7. State: the run dir, and the fixed paths that did not exist before.
  rm -rf --one-file-system "$W"
  local created=()
  if [[ -f "$STATE/created" ]]; then
    while read -r p; do
      [[ -n "$p" ]] || continue
      created+=("$p")
      rmdir "$p" 2>/dev/null || log "could not remove $p (not empty?)"
    done < <(sort -r "$STATE/created")
  fi
  rm -rf "$STATE"
  verify_down "${created[@]}"
}

# True inside the recorded network namespace (the one `test` created).
in_ns() {
  local netns
  netns=$(state_get netns)
  [[ -n "$netns" && "$(readlink /proc/$$/ns/net)" == "$netns" ]]
}

# The arguments that are PIDs of processes still running (not zombies).
live() {
  local p
  for p in "$@"; do
    [[ -e "/proc/$p" ]] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null && echo "$p"
  done
  return 0
}

cgroup_dirs() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -d "$h$CGROUP" ]] && echo "$h$CGROUP"
  done
  return 0
}

# Fails unless nothing of the real node is left on the machine. Arguments:
# paths that must not exist (the fixed paths this run created).
verify_down() {
  local left=() p
  for p in "$@"; do
    [[ ! -e "$p" ]] || left+=("$p")
  done
  [[ -z "$(cgroup_dirs)" ]] || left+=("cgroups: $(cgroup_dirs | tr '\n' ' ')")
  [[ ! -e "$W" ]] || left+=("$W")
  [[ ! -e "$STATE" ]] || left+=("$STATE")
  [[ ! -e "$cache/kwok/clusters/$CLUSTER" ]] || left+=("cluster dir $cache/kwok/clusters/$CLUSTER")
  [[ -z "$(findmnt -rn -o TARGET | grep -E "^$W(/|$)" || true)" ]] || left+=("mounts under $W")
  # (Zombies do not count: an orphan waits for the machine's init to reap it.)
  local procs
  # shellcheck disable=SC2046
  procs=$(live $(pgrep -f -- "$W/") $(pgrep -x kubelet) $(pgrep -x containerd) $(ns_pids))
  [[ -z "$procs" ]] || left+=("processes: $(echo $procs)")
  # Outside the namespace its bridge never exists; inside, step 6 removed it.
  if ip link show "$BRIDGE" >/dev/null 2>&1; then left+=("bridge $BRIDGE"); fi
  if ((${#left[@]})); then
    printf '[real-node] ERROR: left behind: %s\n' "${left[@]}" >&2
    return 1
  fi
  log "down: verified nothing is left (processes, mounts, cgroups, bridge, state dirs, fixed paths)"
}

# --------------------------------------------------------------------------
# Inside the namespace

write_configs() {
  mkdir -p "$W"/{run,containerd/certs.d,containerd/root,containerd/state,containerd/opt,runc,cni/conf,cni/ipam,kubelet/root,kubelet/pki,pod-logs,kubectl-cache}
  cat >"$W/containerd/config.toml" <<EOF
version = 2
root = "$W/containerd/root"
state = "$W/containerd/state"
oom_score = 0
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$W/run/containerd-ttrpc.sock"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$W/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  sandbox_image = "forewarn.local/pause:dev"
  # The VM lacks CAP_SYS_RESOURCE: without this runc fails every sandbox.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$W/runc"
  # Per-registry hosts (hosts.toml): plain HTTP for the loopback registry
  # only (release_to_registry writes it).
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$W/containerd/certs.d"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$W/cni/conf"
    max_conf_num = 1
EOF
  cat >"$W/cni/conf/10-forewarn-real.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "forewarn-real",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$W/cni/ipam",
        "ranges": [[{"subnet": "$SUBNET", "gateway": "$BRIDGE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
  cat >"$W/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
podLogsDir: $W/pod-logs
# The local API server sends no client certificate to kubelets; the kubelet
# listens on 127.0.0.1 of a private network namespace.
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
# Imported images cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
resolvConf: ""
staticPodPath: ""
serializeImagePulls: false
nodeStatusUpdateFrequency: 2s
shutdownGracePeriod: 0s
EOF
}

wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
  local secs=$1 what=$2 deadline
  shift 2
  deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "$what not reached after ${secs}s (logs: $LOGS/)"
    sleep 0.2
  done
}

node_ready_untainted() {
  [[ "$(kc get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}|{.spec.taints}')" == "True|" ]]
}

kc() { KUBECACHEDIR="$W/kubectl-cache" "$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

# Starts containerd and the kubelet; the cluster must be up.
node_up() {
  local img h f started=$SECONDS
  write_configs
  for h in /sys/fs/cgroup/*/; do
    [[ "$h" == */unified/ ]] && continue
    mkdir -p "$h$CGROUP"
    for f in cpuset.cpus cpuset.mems; do
      [[ -f "$h$f" ]] && cat "$h$f" >"$h$CGROUP/$f"
    done
  done
  log "starting containerd"
  containerd --config "$W/containerd/config.toml" >"$LOGS/containerd.log" 2>&1 &
  echo $! >"$STATE/containerd.pid"
  wait_for 30 "containerd socket" ctr -a "$SOCK" version
  local name
  while read -r name img; do
    ctr -a "$SOCK" -n k8s.io images import "$img" >>"$LOGS/ctr-import.log" 2>&1 ||
      die "ctr import $img failed (log: $LOGS/ctr-import.log)"
    # Pinned: the CRI plugin never removes it (it cannot be pulled again).
    ctr -a "$SOCK" -n k8s.io images label "$name" io.cri-containerd.pinned=pinned >>"$LOGS/ctr-import.log" 2>&1 ||
      die "ctr could not label $name (log: $LOGS/ctr-import.log)"
  done <<<"$IMAGES"
  log "images imported: $(ctr -a "$SOCK" -n k8s.io images ls -q | grep -v '^sha256:' | tr '\n' ' ')"
  cp "$KUBECONFIG_PATH" "$W/kubelet/kubeconfig"
  log "starting kubelet $NODE"
  "$kubelet_bin" --config "$W/kubelet/config.yaml" --kubeconfig "$W/kubelet/kubeconfig" \
    --hostname-override "$NODE" --node-ip "$BRIDGE_IP" --root-dir "$W/kubelet/root" \
    --cert-dir "$W/kubelet/pki" --node-labels forewarn.dev/real-node=true \
    --v 2 >"$LOGS/kubelet.log" 2>&1 &
  echo $! >"$STATE/kubelet.pid"
  wait_for 90 "node $NODE Ready and untainted" node_ready_untainted
  log "node $NODE Ready in $((SECONDS - started))s"
}

# Starts the OCI registry on 127.0.0.1:<a free port> (the namespace's own
# loopback), tells containerd to reach it over plain HTTP, and runs `make
# release`'s script against it. Exports what the chart test reads:
# FOREWARN_REAL_REGISTRY (host:port), FOREWARN_REAL_REGISTRY_LOG (its log,
# with one access-log line per request), FOREWARN_REAL_RELEASE_{IMAGE,CHART,
# VERSION} (what hack/release.sh printed), FOREWARN_REAL_IMAGE_ARCHIVE
# (forewarn's archive as `make image` wrote it) and
# FOREWARN_REAL_CONTAINERD_SOCK.
release_to_registry() {
  local port addr out archive version started=$SECONDS
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  addr="127.0.0.1:$port"
  mkdir -p "$W/registry/storage"
  cat >"$W/registry/config.yml" <<EOF
version: 0.1
log:
  level: info
  formatter: text
storage:
  filesystem:
    rootdirectory: $W/registry/storage
  delete:
    enabled: false
http:
  addr: $addr
EOF
  log "starting the OCI registry on $addr"
  OTEL_TRACES_EXPORTER=none "$REGISTRY_BIN/registry" serve "$W/registry/config.yml" >"$LOGS/registry.log" 2>&1 &
  echo $! >"$STATE/registry.pid"
  # (No proxy, whatever the environment says: the registry is on loopback.)
  wait_for 30 "the registry answering on http://$addr/v2/" python3 -c \
    'import sys, urllib.request as u; u.build_opener(u.ProxyHandler({})).open(sys.argv[1], timeout=2)' "http://$addr/v2/"
  mkdir -p "$W/containerd/certs.d/$addr"
  cat >"$W/containerd/certs.d/$addr/hosts.toml" <<EOF
server = "http://$addr"

[host."http://$addr"]
  capabilities = ["pull", "resolve"]
EOF
  # forewarn's archive, as `make image` wrote it (cmd_build).
  archive=$(awk '$1 ~ /\/forewarn:/ { print $2; exit }' <<<"$IMAGES")
  [[ -f "$archive" ]] || die "no forewarn archive among the images: $IMAGES"
  version="$(sed -n 's/^version: *//p' "$root/charts/forewarn/Chart.yaml")-real-node"
  log "make release REGISTRY=$addr/forewarn-test VERSION=$version (hack/release.sh)"
  # Offline here: every build it runs is cached (cmd_build), and cargo must
  # not look for the network. helm and crane keep their config in the run dir.
  out=$(CARGO_NET_OFFLINE=true HELM_CONFIG_HOME="$W/helm/config" HELM_CACHE_HOME="$W/helm/cache" \
    DOCKER_CONFIG="$W/docker" bash "$here/release.sh" "$addr/forewarn-test" "$version" 2>"$LOGS/release.log") ||
    die "hack/release.sh failed (log: $LOGS/release.log)"
  echo "$out" >>"$LOGS/release.log"
  FOREWARN_REAL_RELEASE_IMAGE=$(sed -n 's/^image: //p' <<<"$out")
  FOREWARN_REAL_RELEASE_CHART=$(sed -n 's/^chart: //p' <<<"$out")
  [[ -n "$FOREWARN_REAL_RELEASE_IMAGE" && -n "$FOREWARN_REAL_RELEASE_CHART" ]] ||
    die "hack/release.sh printed no image: or chart: line (log: $LOGS/release.log)"
  [[ "$(sed -n 's/^archive: //p' <<<"$out")" == "$archive" ]] ||
    die "hack/release.sh pushed $(sed -n 's/^archive: //p' <<<"$out"), not the archive make image wrote ($archive)"
  FOREWARN_REAL_REGISTRY=$addr
  FOREWARN_REAL_REGISTRY_LOG="$LOGS/registry.log"
  FOREWARN_REAL_RELEASE_VERSION=$version
  FOREWARN_REAL_IMAGE_ARCHIVE=$archive
  FOREWARN_REAL_CONTAINERD_SOCK=$SOCK
  export FOREWARN_REAL_REGISTRY FOREWARN_REAL_REGISTRY_LOG FOREWARN_REAL_RELEASE_IMAGE FOREWARN_REAL_RELEASE_CHART \
    FOREWARN_REAL_RELEASE_VERSION FOREWARN_REAL_IMAGE_ARCHIVE FOREWARN_REAL_CONTAINERD_SOCK
  log "released to $addr in $((SECONDS - started))s: $FOREWARN_REAL_RELEASE_IMAGE"
}

cmd_inner() {
  local status=0 kubeconfig started=$SECONDS
  # (PID 1's namespaces are not readable on every machine: compare with the
  # namespace `test` ran in.)
  [[ -n "${HOST_NETNS:-}" && "$(readlink /proc/$$/ns/net)" != "$HOST_NETNS" ]] ||
    die "__inner must run in a network namespace of its own (use: hack/real-node.sh test)"
  readlink /proc/$$/ns/net >"$STATE/netns"
  echo $$ >"$STATE/inner.pid"
  # Every process started from here carries it (see ns_pids).
  FOREWARN_REAL_NS=$(readlink /proc/$$/ns/net)
  export FOREWARN_REAL_NS
  trap 'status=$?; log "tearing down inside the namespace"; cmd_down || status=1; exit $status' EXIT

  ip link set lo up
  ip addr add "$IMDS_IP/32" dev lo
  # The bridge exists before the kubelet so its address is the node's
  # InternalIP (the kubelet refuses 127.0.0.1); CNI reuses it.
  ip link add "$BRIDGE" type bridge
  ip addr add "$BRIDGE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  [[ -z "$(ip route show default)" ]] || die "the namespace has a default route"
  log "network namespace: $(ip -o -4 addr show | awk '{print $2, $4}' | tr '\n' ' ')"

  # The API server reaches the kubelet by the node's Hostname address.
  mkdir -p "$W"
  cp /etc/hosts "$W/hosts"
  printf '127.0.0.1 %s\n' "$NODE" >>"$W/hosts"
  mount --bind "$W/hosts" /etc/hosts
  local p top
  for p in "${FIXED_PATHS[@]}"; do
    if [[ ! -e "$p" ]]; then
      top=$p
      while [[ ! -e "$(dirname "$top")" ]]; do top=$(dirname "$top"); done
      echo "$top" >>"$STATE/created"
      mkdir -p "$p"
    fi
    mount -t tmpfs -o mode=0755,size=256m forewarn-real "$p"
  done

  log "starting cluster $CLUSTER"
  kubeconfig=$(FOREWARN_KWOK_FAKE_NODES_ONLY=1 bash "$here/cluster.sh" up --name "$CLUSTER" --nodes 2 | tail -n 1)
  [[ -f "$kubeconfig" ]] || die "hack/cluster.sh up gave no kubeconfig"
  KUBECONFIG_PATH=$kubeconfig
  node_up
  [[ -z "$REGISTRY_BIN" ]] || release_to_registry
  log "real-node cluster ready in $((SECONDS - started))s; running the test"
  local t0=$SECONDS
  export FOREWARN_REAL_KUBECONFIG=$kubeconfig FOREWARN_REAL_K8S_BIN=$K8S_BIN FOREWARN_REAL_NODE=$NODE \
    FOREWARN_REAL_LOGS=$LOGS FOREWARN_REAL_IMDS_IP=$IMDS_IP FOREWARN_REAL_BIN=$FOREWARN_BIN \
    FOREWARN_REAL_HOST_NETNS=$HOST_NETNS FOREWARN_REAL_KUBELET_ROOT="$W/kubelet/root" RUST_BACKTRACE=0 \
    FOREWARN_HELM
  if [[ "${RUN_MODE:-test}" == test ]]; then
    local bin rc
    for bin in $TEST_BINS; do
      rc=0
      log "running $(basename "$bin")"
      timeout 600 "$bin" --test-threads=1 --nocapture "$@" || rc=$?
      ((rc == 0)) || { log "$(basename "$bin") failed with status $rc"; status=$rc; }
    done
  else
    KUBECONFIG=$kubeconfig KUBECACHEDIR="$W/kubectl-cache" PATH="$K8S_BIN:$PATH" "$@" || status=$?
  fi
  log "${RUN_MODE:-test} finished with status $status in $((SECONDS - t0))s"
  exit "$status"
}

cmd_test() {
  local status=0 started=$SECONDS
  if [[ "${RUN_MODE:-test}" == run && $# -eq 0 ]]; then
    die "run wants a command, e.g.: hack/real-node.sh run bash"
  fi
  [[ $EUID -eq 0 ]] || die "the real node needs root (kubelet, containerd, namespaces)"
  command -v unshare >/dev/null || die "unshare (util-linux) is missing"
  cmd_build
  log "built in $((SECONDS - started))s"
  cmd_down
  rm -rf "$LOGS"
  mkdir -p "$LOGS" "$STATE"
  echo "$K8S_BIN" >"$STATE/k8s_bin"
  HOST_NETNS=$(readlink /proc/$$/ns/net)
  export K8S_BIN IMAGES TEST_BINS FOREWARN_BIN FOREWARN_HELM REGISTRY_BIN HOST_NETNS RUN_MODE
  unshare --net --mount --propagation private -- bash "${BASH_SOURCE[0]}" __inner "$@" || status=$?
  # Whatever happened inside, nothing may be left outside.
  cmd_down || status=1
  log "done in $((SECONDS - started))s (status $status; logs: $LOGS/)"
  exit "$status"
}

[[ $# -ge 1 ]] || usage
sub=$1
shift
case "$sub" in
  build) cmd_build ;;
  __kubelet) build_kubelet; echo "$kubelet_bin" ;;
  test) RUN_MODE=test cmd_test "$@" ;;
  run) RUN_MODE=run cmd_test "$@" ;;
  down) cmd_down ;;
  __inner) cmd_inner "$@" ;;
  -h|--help) usage ;;
  *) usage ;;
esac
