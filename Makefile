# kubetrain — see README.md.
#   make deps    install what is missing (Debian 12 packages; idempotent)
#   make build   build everything; binaries land in bin/
#   make demo    train examples/fashion-mnist-sync.yaml locally
#   make images  build the operator and runtime images with buildah (docker/README.md)
#   make test    lint, Bazel unit tests, images, operator e2e (pods from the images) + scale,
#                packaging (images, chart, dashboards, docs), integration: docs/development.md
#                (E2E_IMAGES=0: the e2e with host binaries, no image build)
SHELL := /bin/bash
BAZEL ?= bazel
BAZEL_FLAGS ?=
DEB_PACKAGES := bazel-bootstrap g++ pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev \
  protobuf-compiler libcpprest-dev libeigen3-dev prometheus-cpp-dev libyaml-cpp-dev zlib1g-dev \
  libgtest-dev nlohmann-json3-dev libssl-dev dataset-fashion-mnist prometheus python3 python3-pytest curl openssl util-linux \
  clang-format
# Only for the tests and `make images` (`make deps`, not `make build-deps`), and
# only in a clone (the Dockerfiles' builder stage runs `make deps` with the
# Makefile alone): buildah and debootstrap build the images, ca-certificates
# for the Go module proxy, iproute2 for the node agent's pod network, nftables for its NetworkPolicy enforcement,
# python3-yaml for the operator, packaging and docs tests; Go >= 1.21 comes from bookworm-backports when
# missing (tests/cluster/install-go.sh).
TEST_DEB_PACKAGES := buildah debootstrap ca-certificates iproute2 nftables python3-yaml
BINARIES := cli/kubetrain ps/kubetrain-ps worker/kubetrain-worker operator/kubetrain-operator
# $(call apt_install,PACKAGES): a shell snippet installing them as root.
apt_install = echo "installing:" $(1); \
  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(1)
# E2E_IMAGES=0: the fast development mode of the e2e tests: no `make images`,
# every pod a host process from bin/ (node agent --host-binaries); by default
# the operator/chart e2e run pods from the images, as a user's cluster would.
E2E_IMAGES ?= 1
export KUBETRAIN_E2E_IMAGES := $(E2E_IMAGES)
export KUBETRAIN_HOST_BINARIES := $(if $(filter 0,$(E2E_IMAGES)),1,0)
E2E_DEPS := build $(if $(filter 0,$(E2E_IMAGES)),,images)
# The first python3 on PATH that has pytest and yaml (Debian's python3-pytest and
# python3-yaml otherwise); never empty: an empty $(PYTHON) would turn a recipe line
# `$(PYTHON) -m pytest ...` into `-m pytest ...`, whose failure make ignores.
PYTHON ?= $(or $(shell for p in python3 /usr/bin/python3; do $$p -c "import pytest, yaml" 2>/dev/null && { echo $$p; break; }; done),python3)

.PHONY: all deps build-deps images lint format build demo demo-async demo-softmax test cluster-prefetch unit-test integration-test operator-test scale-test tf-compat-test packaging-test \
  cluster-up cluster-down asan tsan fuzz clean

all: build

# deps: everything for building and testing; build-deps: only DEB_PACKAGES
# (what `make build` needs, also in the Dockerfiles' builder stage).
deps: build-deps
	@if [ -d tests/cluster ]; then \
	  missing=$$(for p in $(TEST_DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "install ok installed" || echo $$p; done); \
	  if [ -n "$$missing" ]; then $(call apt_install,$$missing); fi; \
	  tests/cluster/install-go.sh; \
	fi

build-deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "install ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then $(call apt_install,$$missing); \
	else echo "deps: all $(words $(DEB_PACKAGES)) packages present"; fi

# `make build BINARIES="cli/kubetrain ..."` builds (and copies into bin/) only
# those: docker/Dockerfile.runtime builds its three once per x86-64 level, not
# the operator with them.
build: build-deps
	$(BAZEL) build $(BAZEL_FLAGS) $(foreach b,$(BINARIES),//$(patsubst %/,%,$(dir $(b))):$(notdir $(b)))
	@mkdir -p bin
	@for b in $(BINARIES); do install -m 0755 bazel-bin/$$b bin/; done
	@echo "built: $$(ls bin | tr '\n' ' ')"

demo: build
	bin/kubetrain run examples/fashion-mnist-sync.yaml --summary-json demo-summary.json

demo-async: build
	bin/kubetrain run examples/fashion-mnist-async.yaml --summary-json demo-async-summary.json

demo-softmax: build
	bin/kubetrain run examples/softmax-seed.yaml --summary-json demo-softmax-summary.json

unit-test: deps
	$(BAZEL) test $(BAZEL_FLAGS) //...

integration-test: build
	@$(PYTHON) -c "import pytest, yaml" 2>/dev/null || { echo "no python3 with pytest and yaml: run make deps"; exit 1; }
	$(PYTHON) -m pytest -q tests/integration

# The operator against a real kube-apiserver + etcd (built from Go modules on
# first use, ~7 min cold, cached in ~/.cache/kubetrain): the C++ API client,
# the CRD's validation, the test node agent (and its NetworkPolicy enforcement), and kubectl end to end, with every
# PS/worker pod run from the runtime image (E2E_IMAGES=0: host binaries).
operator-test: $(E2E_DEPS)
	tests/cluster/build.sh
	tests/operator/run_client_test.sh
	$(PYTHON) -m pytest -q tests/cluster/test_node_agent.py tests/cluster/test_netpolicy.py
	$(PYTHON) -m pytest -q tests/operator
	tests/scale/build_kwok.sh
	$(PYTHON) -m pytest -q tests/scale

# The operator with 1000 jobs on kwok nodes (not in make test: about 10 minutes).
scale-test: build
	tests/cluster/build.sh
	tests/scale/run_scale.py --jobs 1000

# An unmodified TensorFlow 2 ParameterServerStrategy program (examples/tensorflow)
# as a TrainingJob on the test cluster. Opt-in, not in make test: it installs
# tensorflow-cpu and tf-keras from PyPI into a cached virtualenv (~2 GiB).
tf-compat-test: build
	tests/cluster/build.sh
	tests/tensorflow/setup-venv.sh >/dev/null
	$(PYTHON) -m pytest -q -s tests/tensorflow

# Images (every shared library the binaries need is installed by the image;
# the built images run: binaries as uid 65532 on a read-only root, training),
# the dashboards (every panel's query returns data from a real Prometheus), the
# deploy/ manifests and the Helm chart (against the real API server).
packaging-test: $(E2E_DEPS)
	helm/sync-chart-files.sh --check
	tests/cluster/build.sh
	tests/cluster/build_helm.sh
	$(PYTHON) -m pytest -q tests/packaging tests/dashboards

# The two images, built with buildah from the unchanged docker/Dockerfile.*
# (base images from debootstrap; caches in ~/.cache/kubetrain/images). See
# docker/README.md.
images: deps
	docker/build-images.sh

# The house rules: the layering of ps/, worker/, cli/, operator/ and core/,
# and the C++ format (.clang-format; `make format` applies it).
lint: deps
	tests/lint/layering.sh
	tests/lint/format.sh

format: deps
	tests/lint/format.sh --fix

# cluster-prefetch first: the Go builds of the e2e stages start in the
# background at nice 19 and use what the Bazel and image builds leave idle.
test: cluster-prefetch lint unit-test operator-test packaging-test integration-test

cluster-prefetch: deps
	tests/cluster/prefetch.sh

asan: deps
	$(BAZEL) test --config=asan //...

# The PS wire fuzzer for longer than the 60 s (+ 15 s against a PS that checks
# tokens) of `make test` (FUZZ_SECONDS, a quarter of it authenticated;
# FUZZ_SEED=N repeats a run; see tests/transport/ps_wire_fuzz_test.cc).
FUZZ_SECONDS ?= 600
fuzz: deps
	$(BAZEL) test $(BAZEL_FLAGS) //tests/transport:ps_wire_fuzz_test --nocache_test_results \
	  --test_env=FUZZ_SECONDS=$(FUZZ_SECONDS) --test_env=FUZZ_AUTH_SECONDS=$$(( $(FUZZ_SECONDS) / 4 )) \
	  $(if $(FUZZ_SEED),--test_env=FUZZ_SEED=$(FUZZ_SEED)) \
	  --test_timeout=$$(( $(FUZZ_SECONDS) * 5 / 4 + 600 )) --test_output=all

# ThreadSanitizer over the unit tests, with an instrumented Abseil built from
# Debian's source of the installed version (tests/sanitizers/build-tsan-absl.sh,
# cached) first on the test's library path, so absl::Mutex's synchronisation is
# visible. TSAN_TARGETS narrows it (e.g. "//ps/... //worker/...");
# tests/sanitizers/tsan.supp names the two reports in uninstrumented libraries.
# Left out by default: the tests whose every report lies between frames of the
# uninstrumented gRPC (tests/transport: its metadata copies, send buffers and
# callback tags race with its own threads to TSan) and cpprestsdk (the REST
# client and health server tests: its pplx task refcounts); suppressing those libraries would also hide races in our handlers
# that run on their threads.
TSAN_TARGETS ?= //... -//tests/transport/... -//operator:rest_kube_client_unit_test -//operator:health_server_test
tsan: deps
	@command -v cmake >/dev/null || { $(call apt_install,cmake); }
	absl=$$(tests/sanitizers/build-tsan-absl.sh) && \
	$(BAZEL) test --config=tsan $(BAZEL_FLAGS) --test_env=LD_LIBRARY_PATH=$$absl \
	  --test_env=TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/sanitizers/tsan.supp" \
	  -- $(TSAN_TARGETS)

# A real kube-apiserver + etcd (built from Go modules, cached in ~/.cache/kubetrain),
# the CRD, the operator and the test node agent, in the background.
cluster-up: build
	@tests/cluster/cluster-up.sh

cluster-down:
	@tests/cluster/cluster-down.sh

clean:
	$(BAZEL) clean
	rm -rf bin
