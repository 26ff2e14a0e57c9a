# forewarn: the two commands a fresh machine needs are `make demo` and `make test`.
CARGO ?= cargo
SCENARIO ?= tests/fixtures/platform-redeploy.yaml
# Where cargo puts what it builds (CARGO_TARGET_DIR when set).
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)

.PHONY: demo test soak test-wave test-real test-real-chart real-node-down image image-repro release lint unit generate manifests bench bench-drain cluster-up cluster-down

## demo: local cluster + Azure scenario + agents + controller, with a live timeline (SCENARIO=path to pick another)
demo:
	$(CARGO) build --bin forewarn --example demo
	./target/debug/examples/demo --scenario $(SCENARIO)

## test: formatting, lints, unit tests and the end-to-end tests on a local control plane
## (the suites run side by side, each on its own local cluster: hack/test-all.sh;
##  FOREWARN_SKIP_REAL_NODE=1 skips the real-node test on machines without root)
test: lint
	CARGO=$(CARGO) bash hack/test-all.sh

## bench: detection, 100-VM burst, drain ratio, footprint, API load, 1,000-VM scale, 200- and 20-VM Spot waves on local
## clusters with the release binary; prints one table (figures next to their goals and same-run references; a missed
## goal does not fail) and writes BENCHMARKS.md: the runs, the table, notes, sizing, history (about 40 minutes).
## BENCH_ARGS="--only wave,scale" runs some parts and replaces their figures in BENCHMARKS.md, keeping the other
## parts' with their runs (--out FILE writes elsewhere)
bench:
	$(CARGO) build --release --bin forewarn
	$(CARGO) build --example bench --example bench_drain
	$(TARGET_DIR)/debug/examples/bench $(BENCH_ARGS)

## soak: the fault-injection soak (forewarn_harness::soak, docs/reliability.md) on a local cluster of its own: rounds of
## random scenarios with faults injected for DURATION (10m, 1h...), invariants checked from the audit log, the IMDS
## mock's log and the objects; prints one table and writes RELIABILITY.md; fails on any violation. SEED replays a run;
## FAULTS (comma-separated kinds, default all) picks the faults
SEED ?= 1
DURATION ?= 10m
FAULTS ?= all
soak:
	$(CARGO) build --bin forewarn --example soak
	$(TARGET_DIR)/debug/examples/soak --seed $(SEED) --duration $(DURATION) --faults $(FAULTS)

## bench-drain: forewarn vs `kubectl drain` on a 105-pod node with a PDB, medians and their ratio (a figure, not a test)
bench-drain:
	$(CARGO) build --release --bin forewarn --example bench_drain
	$(TARGET_DIR)/release/examples/bench_drain

## test-wave: the 50-VM Spot wave scenario alone (tests/scenarios.rs; `make test` runs it last, alone: see docs/development.md)
test-wave:
	$(CARGO) test --test scenarios a_spot_wave -- --ignored --nocapture

## test-real: the image in real containers on a real kubelet, in a network namespace of its own (root; see docs/development.md)
test-real:
	bash hack/real-node.sh test

## test-real-chart: test-real plus `helm install charts/forewarn` on the real node (needs the chart and hack/build-helm.sh)
test-real-chart:
	FOREWARN_REAL_TESTS="real_node real_node_chart" bash hack/real-node.sh test

## real-node-down: remove everything a real-node run left (also after a crash)
real-node-down:
	bash hack/real-node.sh down

## image: one reproducible OCI image index (linux/amd64, linux/arm64, windows/amd64) as an archive (no docker, no
## registry); prints its path and digest
image:
	bash hack/build-image.sh

## image-repro: `make image` in two fresh clones of HEAD, each with its own cache (two cold builds); fails unless
## the digests match
image-repro:
	bash hack/image-repro.sh

## release: build the image (as `make image`), push it to REGISTRY/forewarn:VERSION and the chart, pinned to its
## digest, to oci://REGISTRY/charts; prints the `helm install` command and the digest to pin (log in first: docs/install.md)
## (plain HTTP for a loopback REGISTRY only, or with PLAIN_HTTP=1)
release:
	@test -n "$(REGISTRY)" -a -n "$(VERSION)" || { echo "usage: make release REGISTRY=host[:port][/path] VERSION=x.y.z" >&2; exit 2; }
	PLAIN_HTTP=$(PLAIN_HTTP) CARGO=$(CARGO) bash hack/release.sh "$(REGISTRY)" "$(VERSION)"

## lint: cargo fmt --check, clippy and rustdoc (no broken intra-doc link) with warnings as errors, and no import circle among the modules (hack/module-graph.py)
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --features forewarn/real-node -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --lib --document-private-items
	python3 hack/module-graph.py

## unit: the unit tests only (no cluster)
unit:
	$(CARGO) test --lib

## generate: regenerate crds/ and the controller.policy part of the chart's values.schema.json from the Rust types
generate:
	$(CARGO) run --quiet -- crd > crds/scheduledevents.forewarn.dev.yaml
	$(CARGO) run --quiet -- crd --reports > crds/scheduledeventreports.forewarn.dev.yaml
	$(CARGO) run --quiet -- crd --vm-reports > crds/virtualmachinereports.forewarn.dev.yaml
	cp crds/scheduledevents.forewarn.dev.yaml crds/scheduledeventreports.forewarn.dev.yaml crds/virtualmachinereports.forewarn.dev.yaml charts/forewarn/crds/
	$(CARGO) run --quiet -- values-schema --splice charts/forewarn/values.schema.json > charts/forewarn/values.schema.json.tmp
	mv charts/forewarn/values.schema.json.tmp charts/forewarn/values.schema.json

## manifests: regenerate manifests/forewarn.yaml from the chart's default values (helm template)
manifests:
	bash hack/render-manifests.sh > manifests/forewarn.yaml.tmp && mv manifests/forewarn.yaml.tmp manifests/forewarn.yaml

cluster-up:
	bash hack/cluster.sh up
cluster-down:
	bash hack/cluster.sh down
