#!/usr/bin/env bash
# A whole test cluster for trying kubetrain by hand or in e2e tests:
# etcd + kube-apiserver (up.sh), the TrainingJob CRD, the kubetrain operator
# and the test node agent (which runs pods as local processes), all on
# 127.0.0.1, in the background. Prints `export KUBECONFIG=...` on stdout.
#   eval "$(tests/cluster/cluster-up.sh)"; kubectl apply -f examples/softmax-seed.yaml
#   tests/cluster/cluster-down.sh
# Env: KUBETRAIN_STATE (default /tmp/kubetrain-cluster), KUBETRAIN_BIN (default <repo>/bin).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export KUBETRAIN_STATE="${KUBETRAIN_STATE:-/tmp/kubetrain-cluster}"
bin="${KUBETRAIN_BIN:-$root/bin}"
kubectl="${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}/bin/kubectl"
for b in kubetrain-operator kubetrain-ps kubetrain-worker; do
  [ -x "$bin/$b" ] || { echo "cluster-up: $bin/$b missing: run make build" >&2; exit 1; }
done
exports="$("$root/tests/cluster/up.sh")"
eval "$exports"
"$kubectl" apply -f "$root/deploy/crd/kubetrain.io_trainingjobs.yaml" >&2
"$kubectl" wait --for=condition=Established crd/trainingjobs.kubetrain.io --timeout=60s >&2
logs="$KUBETRAIN_STATE/logs"
mkdir -p "$logs"
start() {  # name, command...: start in the background unless already running
  local name="$1"; shift
  local pidfile="$KUBETRAIN_STATE/$name.pid"
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then return; fi
  nohup "$@" >"$logs/$name.log" 2>&1 &
  echo $! >"$pidfile"
  echo "cluster-up: started $name (pid $!, log $logs/$name.log)" >&2
}
start node-agent python3 "$root/tests/cluster/node_agent.py" --kubeconfig "$KUBECONFIG" \
  --bin-dir "$bin" --state-dir "$KUBETRAIN_STATE/node-agent"
start operator "$bin/kubetrain-operator" --kubeconfig "$KUBECONFIG" \
  --metrics_address=127.0.0.1:0 --health_address=127.0.0.1:0 --leader_elect \
  --leader_election_namespace=kube-system
echo "cluster-up: ready; kubectl is $kubectl" >&2
echo "$exports"
echo "export PATH=\"$(dirname "$kubectl"):\$PATH\""
