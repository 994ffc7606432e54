#!/usr/bin/env bash
# Runs the RestKubeClient integration test (//operator:rest_kube_client_test)
# against a real kube-apiserver: tests/cluster/up.sh -> bazel test -> down.sh.
#
# Usage: tests/operator/run_client_test.sh [extra bazel test args, e.g. --test_filter=...]
# Env:   KUBETRAIN_STATE          cluster state dir (default /tmp/kubetrain-operator-client-test,
#                                 separate from the default cluster so both can coexist)
#        KUBETRAIN_KEEP_CLUSTER=1 leave the control plane running afterwards
#        (other tests/cluster/up.sh variables pass through, e.g. KUBETRAIN_SKIP_BUILD=1)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export KUBETRAIN_STATE="${KUBETRAIN_STATE:-/tmp/kubetrain-operator-client-test}"

cleanup() {
  if [ "${KUBETRAIN_KEEP_CLUSTER:-0}" != 1 ]; then
    "$ROOT/tests/cluster/down.sh" --quiet || true
  else
    echo "run_client_test.sh: cluster left running (state $KUBETRAIN_STATE; stop: tests/cluster/down.sh)" >&2
  fi
}
trap cleanup EXIT

# PodTemplate watches bypass the watch cache so that, after the test compacts
# etcd, an ancient resourceVersion really yields 410 Expired.
export KUBETRAIN_APISERVER_EXTRA_ARGS="${KUBETRAIN_APISERVER_EXTRA_ARGS:-} --watch-cache-sizes=podtemplates#0"
# A cluster already running in this state dir (maybe without that flag) is replaced.
"$ROOT/tests/cluster/down.sh" --quiet || true
exports="$("$ROOT/tests/cluster/up.sh")"
eval "$exports"

cd "$ROOT"
bazel test //operator:rest_kube_client_test \
  --cache_test_results=no --test_output=errors \
  --test_env=KUBETRAIN_TEST_KUBECONFIG="$KUBECONFIG" \
  --test_env=KUBETRAIN_TEST_CLIENT_CERT="$KUBETRAIN_CLIENT_CERT_FILE" \
  --test_env=KUBETRAIN_TEST_CLIENT_KEY="$KUBETRAIN_CLIENT_KEY_FILE" \
  --test_env=KUBETRAIN_TEST_ETCD_URL="$KUBETRAIN_ETCD_URL" \
  "$@"
