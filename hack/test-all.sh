#!/usr/bin/env bash
# Runs forewarn's test suites, a few at a time (FOREWARN_TEST_JOBS), longest
# first: the unit tests and every end-to-end test binary it finds in
# tests/*.rs and tests/*/main.rs (each starts a local cluster of its own
# name), plus the real-node binaries (those whose [[test]] entry in
# Cargo.toml requires the feature `real-node`) when the machine allows it.
# Each suite's output goes to target/test-logs/<suite>.log and is printed
# whole when the suite ends.
# At the end it prints one table (suite, passed, failed, when it started,
# seconds) with the run's peak load, and fails if any suite failed, or ran no
# test at all (a suite that runs 0 tests proves nothing), naming them.
#
# When they have ended, the Spot wave (a test of tests/scenarios.rs that its
# suite's run leaves out) runs alone, on the scenarios' cluster.
#
# Every cluster's API server writes an audit log by hack/audit-policy.yaml
# (a suite may set its own policy, as tests/faults.rs does). When the other
# suites have ended, the clusters this run created are torn down, each
# keeping its log in target/test-logs/audit/ (hack/cluster.sh down with
# FOREWARN_AUDIT_KEEP; the real-node cluster keeps its own as
# hack/real-node.sh tears it down), and then the audit suite
# (tests/audit.rs) replays those logs against the chart's RBAC, alone.
#
# Usage: hack/test-all.sh
# Environment:
#   FOREWARN_SKIP_REAL_NODE=1  skip the real-node binaries (machines without
#                              root or unshare); without it, a machine that
#                              cannot run them fails loudly.
#   FOREWARN_TEST_JOBS=N       suites run at once (default 4, measured on 2
#                              cores: see the comment above the slots)
#   CARGO                      cargo binary (default: cargo)
set -uo pipefail
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
logs=target/test-logs
mkdir -p "$logs"
rm -f "$logs"/*.log

# The suites: every tests/*.rs and tests/*/main.rs (a test binary of
# several files, named after its directory, as Cargo names it); those that
# need a real node apart.
real_tests=$(python3 - <<'EOF'
import tomllib
with open("Cargo.toml", "rb") as f:
    c = tomllib.load(f)
print(" ".join(t["name"] for t in c.get("test", []) if "real-node" in t.get("required-features", [])))
EOF
) || { echo "[test] cannot read Cargo.toml's [[test]] entries"; exit 1; }
# tests/audit.rs reads the audit logs of all the others: it runs last.
suites=(lib)
for f in tests/*.rs tests/*/main.rs; do
  [[ -f $f ]] || continue
  s=$(basename "$f" .rs)
  [[ $s == main ]] && s=$(basename "$(dirname "$f")")
  [[ " $real_tests " == *" $s "* || $s == audit ]] || suites+=("$s")
done

# The audit logs (absolute paths: hack/real-node.sh runs elsewhere). Only
# clusters created after audit/.since keep theirs (hack/cluster.sh).
audit_dir="$PWD/$logs/audit"
rm -rf "$audit_dir"
mkdir -p "$audit_dir"
touch "$audit_dir/.since"
export FOREWARN_KUBE_AUDIT_POLICY="$PWD/hack/audit-policy.yaml"
export FOREWARN_AUDIT_KEEP="$audit_dir" FOREWARN_AUDIT_DIR="$audit_dir"

# Each end-to-end binary starts local clusters of its own names; the ones
# this run creates are torn down at the end (clusters that existed before it,
# e.g. a demo's, are left alone).
kwok_clusters="${FOREWARN_KWOK_WORKDIR:-${FOREWARN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forewarn}/kwok}/clusters"
existing=" $(ls "$kwok_clusters" 2>/dev/null | tr '\n' ' ') "
# (A cluster of a name that existed before but was created again since
# the run started is this run's.)
teardown() {
  local c
  for c in $(ls "$kwok_clusters" 2>/dev/null); do
    if [[ $existing == *" $c "* ]] && ! [[ "$kwok_clusters/$c/kubeconfig.yaml" -nt "$audit_dir/.since" ]]; then
      continue
    fi
    bash hack/cluster.sh down --name "$c" >>"$logs/teardown.log" 2>&1 || true
  done
}

# The cross toolchains tests/platforms.rs builds and runs the agent with
# (Debian packages: a no-op when they are installed).
echo "[test] the cross toolchains (hack/toolchains.sh, log in $logs/toolchains.log)"
bash hack/toolchains.sh >"$logs/toolchains.log" 2>&1 ||
  { cat "$logs/toolchains.log"; echo "[test] FAILED: hack/toolchains.sh could not install the cross toolchains"; exit 1; }

echo "[test] building the tests"
$cargo build --bin forewarn || exit 1
$cargo test --no-run 2>&1 | tail -n 3 || exit 1
# The Kubernetes binaries are built (and cached) once, before the suites
# race to start their clusters.
bash hack/build-k8s.sh >/dev/null || exit 1
bash hack/build-helm.sh >/dev/null || exit 1
# The agents tests/platforms.rs runs under qemu-user and Wine: the release
# builds that go into the image (hack/build-image.sh), built before the
# suites start (a cold cross build takes minutes of both cores); the suite
# and the image then find them in their target dirs.
echo "[test] building the arm64 and Windows agents (log in $logs/platforms-build.log)"
for p in linux/arm64 windows/amd64; do
  bash hack/build-platform.sh "$p" release >>"$logs/platforms-build.log" 2>&1 ||
    { tail -n 40 "$logs/platforms-build.log"; echo "[test] FAILED: hack/build-platform.sh $p release"; exit 1; }
done

if [[ "${FOREWARN_SKIP_REAL_NODE:-}" != 1 && -n $real_tests ]]; then
  # Built before the suites start, so that a cold static release build does
  # not compete for the CPU with timing-sensitive end-to-end tests.
  echo "[test] building the real node (kubelet, images, test binaries: $real_tests)"
  FOREWARN_REAL_TESTS="$real_tests" bash hack/real-node.sh build >"$logs/real_node-build.log" 2>&1 ||
    { cat "$logs/real_node-build.log"; echo "[test] FAILED: the real node cannot be built here (FOREWARN_SKIP_REAL_NODE=1 skips it on machines without root or unshare)"; exit 1; }
fi

# Bounded parallelism, longest first. Every end-to-end suite runs a control
# plane of its own (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok) plus forewarn's processes, so each adds about one
# runnable process to the load; running all at once put the 1-minute load
# near 14 on 2 cores and stretched every wait in every test. The slots
# (FOREWARN_TEST_JOBS) are chosen from measured runs so that the load stays
# near the core count; the longest suites start first so that the short ones
# fill the gaps at the end instead of one long suite running on its own.
# The order comes from hack/test-durations.tsv (seconds each suite took in a
# measured run); a suite missing from it goes first, as if it were the
# longest, since nothing says it is short.
jobs=${FOREWARN_TEST_JOBS:-4}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "[test] FOREWARN_TEST_JOBS must be a positive integer, not '$jobs'"; exit 1; }
declare -A expected
if [[ -f hack/test-durations.tsv ]]; then
  while read -r name secs; do
    [[ -z $name || $name == \#* ]] && continue
    expected[$name]=$secs
  done <hack/test-durations.tsv
fi

real_node=skip
if [[ "${FOREWARN_SKIP_REAL_NODE:-}" == 1 ]]; then
  echo "[test] FOREWARN_SKIP_REAL_NODE=1: the real-node binaries ($real_tests) are skipped"
elif [[ -n $real_tests ]]; then
  real_node=run
  suites+=(real_node)
fi
mapfile -t queue < <(for s in "${suites[@]}"; do echo "${expected[$s]:-999999} $s"; done | sort -k1,1nr -k2 | awk '{ print $2 }')

start_suite() {
  local s=$1
  case $s in
    lib) $cargo test --workspace --lib >"$logs/$s.log" 2>&1 & ;;
    real_node) FOREWARN_REAL_TESTS="$real_tests" bash hack/real-node.sh test >"$logs/real_node.log" 2>&1 & ;;
    *) $cargo test --test "$s" >"$logs/$s.log" 2>&1 & ;;
  esac
  pid[$s]=$!
  began[$s]=$SECONDS
}

# The load, sampled every 2 s for the table's peak.
( while :; do read -r l1 _ </proc/loadavg; echo "$SECONDS $l1"; sleep 2; done ) >"$logs/load.log" 2>/dev/null &
sampler=$!
trap 'kill $sampler 2>/dev/null; teardown' EXIT

declare -A pid took began
started=$SECONDS
echo "[test] suites, longest first, $jobs at a time: ${queue[*]}"

# passed and failed test counts of one libtest output (every "test result:"
# line in it summed).
counts() {
  awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
       END { print p + 0, f + 0 }' "$1"
}

failed=()
running=()
while ((${#queue[@]} + ${#running[@]})); do
  while ((${#running[@]} < jobs && ${#queue[@]})); do
    start_suite "${queue[0]}"
    running+=("${queue[0]}")
    queue=("${queue[@]:1}")
  done
  next=()
  for s in "${running[@]}"; do
    if kill -0 "${pid[$s]}" 2>/dev/null; then
      next+=("$s")
      continue
    fi
    wait "${pid[$s]}"
    rc=$?
    took[$s]=$((SECONDS - began[$s]))
    echo
    echo "================ $s (exit $rc, ${took[$s]} s, started at +$((began[$s] - started)) s) ================"
    cat "$logs/$s.log"
    ((rc == 0)) || failed+=("$s")
  done
  running=("${next[@]}")
  ((${#running[@]})) && sleep 1
done

# The Spot wave (tests/scenarios.rs, ignored in that suite's own run):
# alone, once the other suites have ended, on the scenarios' cluster. Its
# 50 agents, the IMDS mock and 500 moving pods take both cores; beside
# other suites the agents missed their events' `Started`.
began[wave]=$SECONDS
$cargo test --test scenarios a_spot_wave -- --ignored --nocapture >"$logs/wave.log" 2>&1
rc=$?
took[wave]=$((SECONDS - began[wave]))
echo
echo "================ wave (exit $rc, ${took[wave]} s, started at +$((began[wave] - started)) s) ================"
cat "$logs/wave.log"
((rc == 0)) || failed+=(wave)
suites+=(wave)

# The audit suite, alone, once every other suite has ended and every
# cluster of this run is down (its log kept).
teardown
echo "[test] audit logs kept: $(cd "$audit_dir" && ls -- *.audit.log 2>/dev/null | tr '\n' ' ')"
began[audit]=$SECONDS
$cargo test --test audit >"$logs/audit.log" 2>&1
rc=$?
took[audit]=$((SECONDS - began[audit]))
kill $sampler 2>/dev/null
echo
echo "================ audit (exit $rc, ${took[audit]} s, started at +$((began[audit] - started)) s) ================"
cat "$logs/audit.log"
((rc == 0)) || failed+=(audit)
suites+=(audit)

# The table: one row per test binary. The real-node log holds several
# binaries, each after a line "running <name>-<hash>"; split it by them.
rows=()
for s in "${suites[@]}"; do
  if [[ $s == real_node ]]; then
    for t in $real_tests; do
      awk -v t="$t" '/ running [a-z_]+-[0-9a-f]+$/ { on = ($NF ~ "^" t "-[0-9a-f]+$") } on' \
        "$logs/real_node.log" >"$logs/real_node.$t.part"
      rows+=("$t $(counts "$logs/real_node.$t.part") $((began[$s] - started)) ${took[$s]}")
    done
  else
    rows+=("$s $(counts "$logs/$s.log") $((began[$s] - started)) ${took[$s]}")
  fi
done
empty=()
echo
peak=$(awk -v s="$started" 'BEGIN { m = 0 } $2 > m { m = $2; at = $1 - s } END { printf "%.2f at +%d s", m, at }' "$logs/load.log")
echo "[test] all suites ended in $((SECONDS - started)) s, $jobs at a time on $(nproc) cores; peak load (1-minute average) $peak"
printf '%-22s %7s %7s %8s %8s\n' suite passed failed started seconds
for r in "${rows[@]}"; do
  read -r name p f at secs <<<"$r"
  printf '%-22s %7s %7s %8s %8s\n' "$name" "$p" "$f" "+$at" "$secs"
  if ((p + f == 0)); then
    empty+=("$name")
  fi
done
if ((${#empty[@]})); then
  echo "[test] FAILED: ran no test at all: ${empty[*]}"
fi
if ((${#failed[@]})); then
  # What failed, again at the end: CI keeps only the tail of this output.
  for s in "${failed[@]}"; do
    f=$logs/$s.log
    echo
    echo "---------------- $s: what failed ----------------"
    if grep -q '^failures:$' "$f"; then
      # libtest's account: each failed test's panic, then their names.
      awk '/panicked at/ { on = 1; n = 0 }
           on && /^stack backtrace:|^note: run with/ { on = 0 }
           on { print; if (++n >= 30) on = 0 }' "$f" | head -n 150
      grep -E '^test [a-z_:0-9]+ \.\.\. FAILED$' "$f" || true
    else
      tail -n 40 "$f"
    fi
  done
  echo
  echo "[test] FAILED: ${failed[*]}; logs in $logs/"
fi
((${#failed[@]} + ${#empty[@]})) && exit 1
[[ $real_node == skip ]] && echo "[test] note: the real-node binaries did not run (FOREWARN_SKIP_REAL_NODE=1)"
echo "[test] every suite passed"
