#!/usr/bin/env bash
# Runs a local Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler) plus KWOK fake nodes, as plain
# processes on 127.0.0.1, from the binaries hack/build-k8s.sh builds. Offline.
#
# Usage:
#   hack/cluster.sh up [--name NAME] [--nodes N]  create (or re-create) the cluster
#          [--fake-nodes-only]                    with N Ready nodes; last stdout
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
#   FOREWARN_KUBE_AUDIT_POLICY=FILE
#                         kube-apiserver writes an audit log by this policy to
#                         $FOREWARN_CACHE/kwok/clusters/NAME/logs/audit.log
#                         (kwokctl --kube-audit-policy; `make bench` counts
#                         requests per process with it; hack/test-all.sh sets
#                         hack/audit-policy.yaml for every suite)
#   FOREWARN_AUDIT_KEEP=DIR
#                         `down` first appends the cluster's audit log (the
#                         files kube-apiserver rotated away, oldest first,
#                         then audit.log; complete lines only) to
#                         DIR/NAME.audit.log, and copies kube-apiserver's log
#                         to DIR/NAME.kube-apiserver.log. When DIR/.since exists, only
#                         clusters created after it are kept (not one left
#                         over from an earlier run). hack/test-all.sh sets it
#                         for tests/audit.rs.
#   FOREWARN_KUBE_APF=1   kube-apiserver runs API Priority and Fairness with its
#                         default limits (400 + 200 requests in flight), as a
#                         production API server does; otherwise off, with no
#                         limit (kwokctl --disable-qps-limits). The chart's
#                         tests set it to see where its FlowSchema puts the
#                         controller's requests.
#   FOREWARN_KWOK_FAKE_NODES_ONLY=1
#                         kwok-controller manages only the nodes kwokctl creates
#                         (annotation kwok.x-k8s.io/node=fake) instead of every
#                         node, so a real kubelet can join (hack/real-node.sh).
#                         Same as the flag --fake-nodes-only of `up`.
#
# Your ~/.kube/config is never read or written.
#
# ---------------------------------------------------------------------------
# Facts checked by running this (kwok v0.8.0, Kubernetes v1.36.3, etcd v3.6.14,
# Debian 12, 2 cores, Nov 2026):
#  1. Deployment pods are scheduled onto the kwok nodes by kube-scheduler and
#     are Running with Ready=True within ~0.2-1 s (kwok's pod-ready stage).
#     DaemonSet pods too. kube-controller-manager (KCM) creates the default
#     ServiceAccount, so pods in a fresh namespace are admitted at once.
#  2. KCM's disruption controller fills in PDB status: 6 pods, minAvailable 5
#     -> observedGeneration 1, currentHealthy 6, desiredHealthy 5,
#     expectedPods 6, disruptionsAllowed 1, DisruptionAllowed=True, about 1 s
#     after the pods are Ready.
#  3. `kubectl drain --ignore-daemonsets` of a node holding 2 of those 6 pods
#     works, in ~6 s. The first eviction gets 201 and the second gets 429
#     ("Cannot evict pod as it would violate the pod's disruption budget").
#     kubectl retries after 5 s and the retry gets 201. Sometimes both
#     succeed in under 2 s: the apiserver retries a conflicting PDB update
#     internally for ~0.5 s, and in that time the replacement becomes Ready.
#     An evicted pod is gone 10-30 ms after it turns Terminating: kwok's
#     default pod-delete stage deletes it with grace 0 and ignores
#     terminationGracePeriodSeconds. The ReplicaSet's replacement is
#     scheduled onto an uncordoned node and Running within ~20 ms. The
#     DaemonSet pod stays on the cordoned node. A pod with a finalizer stays
#     Terminating until the finalizer is removed: kwok does not strip it.
#  4. `up` with a warm cache takes 4.2-5.8 s, including deleting a previous
#     cluster of the same name. The steps: create ~0.3 s, start ~1.3-2 s,
#     apiserver ready ~1.6 s, nodes Ready and untainted ~1 s. `down` takes
#     ~0.1 s. A KWOK_WORKDIR on /dev/shm measured the same (4.8-5.6 s) because
#     etcd runs with --unsafe-no-fsync, so it stays on disk. A cold
#     hack/build-k8s.sh took 12m20s.
#  5. RSS with 3 nodes and ~10 pods: kube-apiserver ~270 MiB, KCM ~110 MiB,
#     kube-scheduler ~73 MiB, kwok-controller ~53 MiB, etcd ~44 MiB. Total
#     ~545 MiB; the highest value sampled was 556 MiB.
#  6. spec.providerID is unset on the nodes (node-000000, node-000001, ...).
#     Their labels: beta.kubernetes.io/arch=amd64, beta.kubernetes.io/os=linux,
#     kubernetes.io/arch=amd64, kubernetes.io/os=linux,
#     kubernetes.io/hostname=<name>, kubernetes.io/role=agent,
#     node-role.kubernetes.io/agent="", kwok.x-k8s.io/kwokctl-scale=node,
#     type=kwok. Annotations: kwok.x-k8s.io/node=fake,
#     node.alpha.kubernetes.io/ttl=0. There are no taints once settled: KCM's
#     node.kubernetes.io/not-ready:NoSchedule is on for ~1 s after creation.
#     InternalIPs 192.0.2.N and 2001:db8::N (documentation ranges, never
#     bound). Capacity: cpu 32, memory 256Gi, pods 110.
#  Loopback and offline:
#   - kwokctl binds etcd, kube-apiserver, KCM, kube-scheduler and
#     kwok-controller to 0.0.0.0 by default, and no flag changes that; only
#     options.bindAddress in a KwokctlConfiguration file does. With it,
#     `ss -ltnup` shows 6 TCP listeners, all on 127.0.0.1, and no UDP.
#   - Fully offline: `up` and the checks above pass in `unshare -n` (loopback
#     only; nothing is downloaded: local paths are symlinked, kubectl comes
#     from PATH). With no default route, kube-apiserver refuses to start
#     ("Unable to find suitable network address"), hence advertise-address=
#     127.0.0.1. Then endpoint-reconciler-type=none stops the endless
#     "Endpoints kubernetes is invalid: may not be in the loopback range".
#   - `kwokctl delete cluster --kubeconfig ""` fails with "empty path".
#     `kwokctl create cluster --wait` exits 0 even when the wait times out.
#   - kwokctl starts each component in its own session, so killing `up`
#     leaves them running; the next `up`/`down` kills them via the pid files.
#   - Clusters with different names run side by side, each on its own ports.
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

# kwokctl, bounded in time, with its JSON logs reduced to "level msg
# key=value" on stderr.
kwokctl_q() {
  local rc=0
  timeout "$step_timeout" kwokctl "$@" 2>&1 >/dev/null | sed -u -E \
    -e 's/"source":\{[^}]*\},?//; s/"time":"[^"]*",?//' \
    -e 's/^\{"level":"([A-Z]+)","msg":"([^"]*)",?(.*)\}$/  kwokctl \1 \2 \3/' >&2 || rc=$?
  return "$rc"
}

# live_pid FILE: the pid a pid file of the cluster names, if it is a live
# process of this cluster (its command line names the cluster's directory);
# fails otherwise.
live_pid() {
  local pid
  pid=$(<"$1") || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && grep -qF -- "$(cluster_dir)" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

# kwokctl stop/delete SIGKILLs whatever pid a pid file names, unchecked. A
# component that exited (or that a fault test stopped) leaves a file whose
# pid the system may since have given to any process: another suite's test
# binary, say (pid_max is 32768 here, and a test run spawns far more). So
# before kwokctl stops or deletes a cluster, every pid file that does not
# name a live process of this cluster is removed (kwokctl skips a component
# without one).
drop_stale_pid_files() {
  local pidfile
  for pidfile in "$(cluster_dir)"/pids/*.pid; do
    [[ -f "$pidfile" ]] || continue
    live_pid "$pidfile" >/dev/null || rm -f "$pidfile"
  done
}

# Kills (-9, as kwokctl does) the processes the cluster's pid files still name.
kill_from_pid_files() {
  local pidfile pid
  for pidfile in "$(cluster_dir)"/pids/*.pid; do
    [[ -f "$pidfile" ]] || continue
    if pid=$(live_pid "$pidfile"); then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

# With FOREWARN_AUDIT_KEEP set: appends the cluster's audit log to
# $FOREWARN_AUDIT_KEEP/NAME.audit.log (see the header). The API server may
# be writing as it is read: a last line without its newline is left out,
# so that the next append starts on a line of its own.
keep_audit_log() {
  local dir=$1 keep=${FOREWARN_AUDIT_KEEP:-} f out part
  [[ -n "$keep" ]] || return 0
  [[ -f "$dir/logs/audit.log" ]] || return 0
  if [[ -e "$keep/.since" ]] && ! [[ "$dir/kubeconfig.yaml" -nt "$keep/.since" ]]; then
    log "not keeping the audit log of '$name': created before $keep/.since"
    return 0
  fi
  mkdir -p "$keep" || return 1
  out="$keep/$name.audit.log"
  part=$(mktemp "$keep/.$name.XXXXXX") || return 1
  # audit-<time>.log sort in time order; audit.log is the newest.
  for f in $(ls "$dir/logs" | grep -E '^audit-.*\.log$' | sort) audit.log; do
    cat "$dir/logs/$f" >"$part" || { rm -f "$part"; return 1; }
    # (The substitution drops a final newline: non-empty = a partial line.)
    if [[ -n "$(tail -c 1 "$part")" ]]; then
      sed -i '$d' "$part" || { rm -f "$part"; return 1; }
    fi
    cat "$part" >>"$out" || { rm -f "$part"; return 1; }
  done
  rm -f "$part"
  log "kept the audit log of '$name' in $out"
  # The API server's own log beside it: its errors and warnings (at the
  # verbosity it runs with here it logs no traces of slow requests).
  if [[ -f "$dir/logs/kube-apiserver.log" ]]; then
    cp "$dir/logs/kube-apiserver.log" "$keep/$name.kube-apiserver.log" || return 1
  fi
}

cmd_down() {
  local dir
  dir=$(cluster_dir)
  [[ -e "$dir" ]] || { log "cluster '$name' is absent"; return 0; }
  keep_audit_log "$dir" || log "could not keep the audit log of '$name'"
  [[ -n "${bin:-}" ]] || use_binaries
  log "deleting cluster '$name'"
  # kwokctl delete removes the cluster's context from a kubeconfig file; by
  # default ~/.kube/config, and it rejects --kubeconfig "" ("empty path"). Give
  # it a file that does not exist inside the directory it is about to delete.
  drop_stale_pid_files
  timeout "$step_timeout" kwokctl --name "$name" delete cluster --kubeconfig "$dir/.no-kubeconfig" >/dev/null 2>&1 ||
    log "kwokctl delete cluster failed; cleaning up from the pid files"
  # A run killed half-way can leave processes or a directory kwokctl does not
  # recognise.
  kill_from_pid_files
  rm -rf "$dir" "$KWOK_WORKDIR/$name.kwokctl.yaml"
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
  # The Stages (hack/kwok-stages.yaml) make deleted pods honour their grace
  # period, as a kubelet does.
  config="$KWOK_WORKDIR/$name.kwokctl.yaml"
  {
    cat <<'YAML'
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  bindAddress: 127.0.0.1
YAML
    # kwok-controller's default --manage-all-nodes=true would take over a real
    # kubelet's node (its port, addresses, conditions and pod statuses). Two
    # `--extra-args kwok-controller=...` flags crash kwokctl v0.8.0 (index out
    # of range), hence a componentsPatches entry.
    if [[ "$fake_nodes_only" == 1 ]]; then
      cat <<'YAML'
componentsPatches:
- name: kwok-controller
  extraArgs:
  - key: manage-all-nodes
    value: "false"
  - key: manage-nodes-with-annotation-selector
    value: kwok.x-k8s.io/node=fake
YAML
    fi
    echo "---"
    cat "$here/kwok-stages.yaml"
  } >"$config"

  # On failure, stop the processes but keep the directory for its logs/.
  trap 'on_up_exit $?' EXIT
  # One replica of each: no leader election for kube-controller-manager and
  # kube-scheduler, which otherwise exit when the API server stops answering
  # for their renew deadline (the fault tests pause it), and, restarted,
  # could find their port taken meanwhile by another cluster's process.
  # kwokctl picks free ports when it creates a cluster and binds them when
  # it starts it: two clusters created at once can pick the same ports (then
  # one's kubectl reaches the other's API server: "certificate signed by
  # unknown authority"). Creations take turns on this lock.
  take_up_lock
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
    --extra-args kube-apiserver=advertise-address=127.0.0.1 \
    --extra-args kube-apiserver=endpoint-reconciler-type=none \
    --extra-args kube-controller-manager=leader-elect=false \
    --extra-args kube-scheduler=leader-elect=false \
    --disable-qps-limits \
    ${FOREWARN_KUBE_APF:+--extra-args kube-apiserver=enable-priority-and-fairness=true} \
    ${FOREWARN_KUBE_APF:+--extra-args kube-apiserver=max-requests-inflight=400} \
    ${FOREWARN_KUBE_APF:+--extra-args kube-apiserver=max-mutating-requests-inflight=200} \
    ${FOREWARN_KUBE_AUDIT_POLICY:+--kube-audit-policy "$FOREWARN_KUBE_AUDIT_POLICY"} \
    --kubeconfig "" \
    --wait "${step_timeout}s" \
    --timeout "${step_timeout}s" ||
    die "kwokctl create cluster failed or timed out after ${step_timeout}s (logs: $dir/logs/)"
  release_up_lock
  [[ -f "$kubeconfig" ]] || die "no kubeconfig at $kubeconfig (logs: $dir/logs/)"

  # kwokctl exits 0 even when its --wait gives up, so check for ourselves.
  local deadline=$((SECONDS + step_timeout))
  until kubectl --kubeconfig "$kubeconfig" get --raw /readyz >/dev/null 2>&1; do
    ((SECONDS < deadline)) ||
      die "kube-apiserver not ready after ${step_timeout}s (logs: $dir/logs/kube-apiserver.log)"
    sleep 0.5
  done

  log "scaling to $nodes node(s)"
  kwokctl_q --name "$name" scale node --replicas "$nodes" ||
    die "kwokctl scale node --replicas $nodes failed or timed out after ${step_timeout}s"

  # Wait until every node is Ready *and* untainted: kube-controller-manager
  # puts node.kubernetes.io/not-ready:NoSchedule on new nodes and lifts it a
  # moment after kwok reports Ready; until then nothing schedules there.
  deadline=$((SECONDS + step_timeout))
  while :; do
    ready=$(kubectl --kubeconfig "$kubeconfig" get nodes --no-headers \
      -o 'custom-columns=R:.status.conditions[?(@.type=="Ready")].status,T:.spec.taints' 2>/dev/null |
      grep -cE '^True +<none>$' || true)
    [[ "$ready" -eq "$nodes" ]] && break
    ((SECONDS < deadline)) ||
      die "only $ready of $nodes nodes Ready and untainted after ${step_timeout}s (logs: $dir/logs/)"
    sleep 0.5
  done
  trap - EXIT
  log "cluster '$name' is up: $nodes node(s) Ready in $((SECONDS - started))s"
  echo "$kubeconfig"
}

# A directory as a lock (mkdir is atomic); its pid file lets a later run
# break a lock whose holder died. Not flock: kwokctl's children (etcd, the
# API server) would inherit the descriptor and hold the lock for good.
up_lock="$KWOK_WORKDIR/.up.lock"
take_up_lock() {
  local waited=0 holder
  until mkdir "$up_lock" 2>/dev/null; do
    holder=$(cat "$up_lock/pid" 2>/dev/null || true)
    if [[ -n "$holder" ]] && ! kill -0 "$holder" 2>/dev/null; then
      rm -rf "$up_lock"
      continue
    fi
    ((waited++ % 50 == 0)) && log "waiting for another cluster's creation to finish"
    sleep 0.2
  done
  echo $$ >"$up_lock/pid"
}
release_up_lock() {
  [[ "$(cat "$up_lock/pid" 2>/dev/null)" == "$$" ]] && rm -rf "$up_lock"
  return 0
}

on_up_exit() {
  release_up_lock
  (($1 == 0)) && return
  drop_stale_pid_files
  timeout 60 kwokctl --name "$name" stop cluster >/dev/null 2>&1 || true
  kill_from_pid_files
  log "stopped cluster '$name'; logs kept in $(cluster_dir)/logs/ (\`hack/cluster.sh down --name $name\` removes them)"
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
fake_nodes_only=${FOREWARN_KWOK_FAKE_NODES_ONLY:-0}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) [[ $# -ge 2 ]] || usage; name=$2; shift 2 ;;
    --name=*) name=${1#*=}; shift ;;
    --nodes) [[ $# -ge 2 ]] || usage; nodes=$2; shift 2 ;;
    --nodes=*) nodes=${1#*=}; shift ;;
    --fake-nodes-only) fake_nodes_only=1; shift ;;
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
