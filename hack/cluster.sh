#!/usr/bin/env bash
# Runs a local Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler) plus KWOK fake nodes, as plain
# processes on 127.0.0.1, from the binaries hack/build-k8s.sh builds. Offline.
#
# Usage:
#   hack/cluster.sh up [--name NAME] [--nodes N]  create (or re-create) the cluster
#                                                 with N Ready nodes; last stdout
#                                                 line = kubeconfig path
#   hack/cluster.sh down [--name NAME]            delete it (success when absent)
#   hack/cluster.sh kubeconfig [--name NAME]      print the kubeconfig path
#   hack/cluster.sh env [--name NAME]             print `export` lines for a shell:
#                                                 eval "$(hack/cluster.sh env)"
# Defaults: --name forewarn, --nodes 3.
#
# Environment:
#   FOREWARN_CACHE        cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/forewarn);
#                         clusters live in $FOREWARN_CACHE/kwok/clusters/NAME/
#   FOREWARN_KWOK_WORKDIR overrides that kwok work dir (e.g. /dev/shm/forewarn-kwok)
#   FOREWARN_UP_TIMEOUT   seconds allowed for each step of `up` (default 180)
#
# Your ~/.kube/config is never read or written.
#
# ---------------------------------------------------------------------------
# Facts checked by running this (kwok v0.8.0, Kubernetes v1.36.3, etcd v3.6.14,
# Debian 12, 2 cores):
#   FACTS-PLACEHOLDER
# ---------------------------------------------------------------------------
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${FOREWARN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forewarn}
export KWOK_WORKDIR=${FOREWARN_KWOK_WORKDIR:-$cache/kwok}
# kubectl (ours and the one kwokctl runs) would otherwise cache in ~/.kube/cache.
export KUBECACHEDIR=$KWOK_WORKDIR/kubectl-cache
step_timeout=${FOREWARN_UP_TIMEOUT:-180}

log() { echo "[cluster] $*" >&2; }
die() { echo "[cluster] ERROR: $*" >&2; exit 1; }

usage() {
  sed -n '/^# Usage:/,/^# Defaults/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# Puts the bin dir (built once, then cached) first on PATH. kwokctl looks
# kubectl up on PATH and would download it otherwise.
use_binaries() {
  bin=$("$here/build-k8s.sh" | tail -n 1)
  [[ -x "$bin/kwokctl" ]] || die "hack/build-k8s.sh did not print a bin dir (got '$bin')"
  export PATH="$bin:$PATH" KWOK_KUBECTL_BINARY="$bin/kubectl"
}

cluster_dir() { echo "$KWOK_WORKDIR/clusters/$name"; }
kubeconfig_path() { echo "$(cluster_dir)/kubeconfig.yaml"; }

# kwokctl, with its JSON logs reduced to "level msg key=value" on stderr.
kwokctl_q() {
  local rc=0
  kwokctl "$@" 2>&1 >/dev/null | sed -u -E \
    -e 's/"source":\{[^}]*\},?//; s/"time":"[^"]*",?//' \
    -e 's/^\{"level":"([A-Z]+)","msg":"([^"]*)",?(.*)\}$/  kwokctl \1 \2 \3/' >&2 || rc=$?
  return "$rc"
}

cmd_down() {
  local dir pidfile pid
  dir=$(cluster_dir)
  [[ -e "$dir" ]] || { log "cluster '$name' is absent"; return 0; }
  [[ -n "${bin:-}" ]] || use_binaries
  log "deleting cluster '$name'"
  # kwokctl delete removes the cluster's context from a kubeconfig file; by
  # default ~/.kube/config, and it rejects --kubeconfig "" ("empty path"). Give
  # it a file that does not exist inside the directory it is about to delete.
  timeout "$step_timeout" kwokctl --name "$name" delete cluster --kubeconfig "$dir/.no-kubeconfig" >/dev/null 2>&1 ||
    log "kwokctl delete cluster failed; cleaning up from the pid files"
  # A run killed half-way can leave processes or a directory kwokctl does not
  # recognise: kill (-9, as kwokctl does) whatever the pid files still name,
  # then remove the dir.
  for pidfile in "$dir"/pids/*.pid; do
    [[ -f "$pidfile" ]] || continue
    pid=$(<"$pidfile")
    if [[ "$pid" =~ ^[0-9]+$ ]] && grep -qF -- "$dir" "/proc/$pid/cmdline" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$dir"
  [[ ! -e "$dir" ]] || die "could not remove $dir"
}

cmd_up() {
  local dir kubeconfig config started ready
  [[ "$nodes" =~ ^[0-9]+$ ]] || die "--nodes wants a number, got '$nodes'"
  started=$SECONDS
  use_binaries
  dir=$(cluster_dir)
  kubeconfig=$(kubeconfig_path)
  [[ -e "$dir" ]] && cmd_down
  mkdir -p "$KWOK_WORKDIR"

  # kwokctl binds every component to 0.0.0.0 unless told otherwise, and the
  # bind address has no flag: only the configuration file sets it.
  config="$KWOK_WORKDIR/forewarn-kwokctl.yaml"
  cat >"$config" <<'YAML'
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  bindAddress: 127.0.0.1
YAML

  log "creating cluster '$name' in $dir"
  kwokctl_q --name "$name" create cluster \
    --config "$config" \
    --runtime binary \
    --etcd-binary "$bin/etcd" \
    --kube-apiserver-binary "$bin/kube-apiserver" \
    --kube-controller-manager-binary "$bin/kube-controller-manager" \
    --kube-scheduler-binary "$bin/kube-scheduler" \
    --kwok-controller-binary "$bin/kwok" \
    --extra-args etcd=unsafe-no-fsync=true \
    --disable-qps-limits \
    --kubeconfig "" \
    --wait "${step_timeout}s" \
    --timeout "${step_timeout}s" ||
    die "kwokctl create cluster failed or timed out after ${step_timeout}s (logs: $dir/logs/)"
  [[ -f "$kubeconfig" ]] || die "no kubeconfig at $kubeconfig"

  log "scaling to $nodes node(s)"
  timeout "$step_timeout" kwokctl --name "$name" scale node --replicas "$nodes" >/dev/null 2>&1 ||
    die "kwokctl scale node --replicas $nodes failed or timed out after ${step_timeout}s"

  # Wait until every node is Ready *and* untainted: kube-controller-manager
  # puts node.kubernetes.io/not-ready:NoSchedule on new nodes and lifts it a
  # moment after kwok reports Ready; until then nothing schedules there.
  local deadline=$((SECONDS + step_timeout))
  while :; do
    ready=$(kubectl --kubeconfig "$kubeconfig" get nodes --no-headers \
      -o 'custom-columns=R:.status.conditions[?(@.type=="Ready")].status,T:.spec.taints' 2>/dev/null |
      grep -cE '^True +<none>$' || true)
    [[ "$ready" -eq "$nodes" ]] && break
    ((SECONDS < deadline)) ||
      die "only $ready of $nodes nodes Ready and untainted after ${step_timeout}s (logs: $dir/logs/)"
    sleep 0.5
  done
  log "cluster '$name' is up: $nodes node(s) Ready in $((SECONDS - started))s"
  echo "$kubeconfig"
}

cmd_kubeconfig() {
  local kubeconfig
  kubeconfig=$(kubeconfig_path)
  [[ -f "$kubeconfig" ]] || die "cluster '$name' does not exist (run: hack/cluster.sh up --name $name)"
  echo "$kubeconfig"
}

cmd_env() {
  use_binaries
  # shellcheck disable=SC2016 # $PATH is for the caller's shell to expand
  printf 'export PATH=%q:"$PATH"\n' "$bin"
  printf 'export KUBECONFIG=%q\n' "$(kubeconfig_path)"
}

[[ $# -ge 1 ]] || usage
sub=$1
shift
name=forewarn
nodes=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) [[ $# -ge 2 ]] || usage; name=$2; shift 2 ;;
    --name=*) name=${1#*=}; shift ;;
    --nodes) [[ $# -ge 2 ]] || usage; nodes=$2; shift 2 ;;
    --nodes=*) nodes=${1#*=}; shift ;;
    -h|--help) usage ;;
    *) echo "[cluster] unknown argument: $1" >&2; usage ;;
  esac
done
[[ "$name" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "bad cluster name '$name'"

case "$sub" in
  up) cmd_up ;;
  down) cmd_down ;;
  kubeconfig) cmd_kubeconfig ;;
  env) cmd_env ;;
  *) usage ;;
esac
