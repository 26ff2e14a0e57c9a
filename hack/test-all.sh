#!/usr/bin/env bash
# Runs forewarn's test suites side by side: the unit tests and each
# end-to-end test binary (each on a local cluster of its own name), plus the
# real-node test when the machine allows it. Each suite's output goes to
# target/test-logs/<suite>.log and is printed whole when the suite ends; the
# script fails if any suite fails, and names them.
#
# Usage: hack/test-all.sh
# Environment:
#   FOREWARN_SKIP_REAL_NODE=1  skip the real-node test (machines without root
#                              or unshare); without it, a machine that cannot
#                              run it fails loudly.
#   CARGO                      cargo binary (default: cargo)
set -uo pipefail
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
logs=target/test-logs
mkdir -p "$logs"
rm -f "$logs"/*.log

# Each end-to-end binary starts its own cluster; these names are torn down at the end.
clusters=(forewarn-test forewarn-test-b forewarn-drain forewarn-agent forewarn-chart forewarn-leader forewarn-prom forewarn-life)
teardown() {
  for c in "${clusters[@]}"; do bash hack/cluster.sh down --name "$c" >/dev/null 2>&1 || true; done
}
trap teardown EXIT

echo "[test] building the tests"
$cargo build --features harness --bin forewarn || exit 1
$cargo test --features harness --no-run 2>&1 | tail -n 3 || exit 1
# The Kubernetes binaries are built (and cached) once, before the suites
# race to start their clusters.
bash hack/build-k8s.sh >/dev/null || exit 1
bash hack/build-helm.sh >/dev/null || exit 1

# The real-node part: the image and agent on a real kubelet (tests/real_node.rs)
# and the Helm chart end to end there (tests/real_node_chart.rs).
real_tests="real_node real_node_chart"
if [[ "${FOREWARN_SKIP_REAL_NODE:-}" != 1 ]]; then
  # Built before the suites start, so that a cold static release build does
  # not compete for the CPU with timing-sensitive end-to-end tests.
  echo "[test] building the real node (kubelet, images, test binary)"
  FOREWARN_REAL_TESTS="$real_tests" bash hack/real-node.sh build >"$logs/real_node-build.log" 2>&1 ||
    { cat "$logs/real_node-build.log"; echo "[test] FAILED: the real node cannot be built here (FOREWARN_SKIP_REAL_NODE=1 skips it on machines without root or unshare)"; exit 1; }
fi

suites=(lib imds_mock scenarios drain agent_imds leader alerts lifecycle)
[[ -f tests/chart.rs ]] && suites+=(chart)
declare -A pid
started=$SECONDS
for s in "${suites[@]}"; do
  if [[ $s == lib ]]; then
    $cargo test --features harness --lib >"$logs/$s.log" 2>&1 &
  else
    $cargo test --features harness --test "$s" >"$logs/$s.log" 2>&1 &
  fi
  pid[$s]=$!
done

real_node=skip
if [[ "${FOREWARN_SKIP_REAL_NODE:-}" == 1 ]]; then
  echo "[test] FOREWARN_SKIP_REAL_NODE=1: the real-node test is skipped"
else
  real_node=run
  FOREWARN_REAL_TESTS="$real_tests" bash hack/real-node.sh test >"$logs/real_node.log" 2>&1 &
  pid[real_node]=$!
  suites+=(real_node)
fi

failed=()
remaining=("${suites[@]}")
while ((${#remaining[@]})); do
  next=()
  for s in "${remaining[@]}"; do
    if kill -0 "${pid[$s]}" 2>/dev/null; then
      next+=("$s")
      continue
    fi
    wait "${pid[$s]}"
    rc=$?
    echo
    echo "================ $s (exit $rc, $((SECONDS - started)) s) ================"
    cat "$logs/$s.log"
    ((rc == 0)) || failed+=("$s")
  done
  remaining=("${next[@]}")
  ((${#remaining[@]})) && sleep 1
done

echo
echo "[test] all suites ended in $((SECONDS - started)) s"
if ((${#failed[@]})); then
  echo "[test] FAILED: ${failed[*]}; logs in $logs/"
  exit 1
fi
[[ $real_node == skip ]] && echo "[test] note: the real-node test did not run (FOREWARN_SKIP_REAL_NODE=1)"
echo "[test] every suite passed"
