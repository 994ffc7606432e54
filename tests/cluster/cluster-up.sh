#!/usr/bin/env bash
# A whole test cluster for trying kubetrain by hand or in e2e tests:
# etcd + kube-apiserver (up.sh), the TrainingJob CRD, the kubetrain operator
# and the test node agent (which runs pods as local processes), all on
# 127.0.0.1, in the background. Prints `export KUBECONFIG=...` on stdout.
#   eval "$(tests/cluster/cluster-up.sh)"; kubectl apply -f examples/softmax-seed.yaml
#   tests/cluster/cluster-down.sh
# Env: KUBETRAIN_STATE (default /tmp/kubetrain-cluster), KUBETRAIN_BIN (default <repo>/bin).
#   KUBETRAIN_OPERATOR=chart: a cluster to install the Helm chart into. It adds
#     kube-controller-manager (KUBETRAIN_CONTROLLER_MANAGER=1: Deployments get their pods)
#     and gives pods service-account tokens (node agent --service-account-tokens), but
#     starts no operator process and applies no CRD: `helm install` brings both, and the
#     operator runs as the chart's Deployment pod (kubetrain-operator --in-cluster).
#   KUBETRAIN_HOST_BINARIES=1: the node agent runs every container as a host process
#     from $KUBETRAIN_BIN even when its image is in local storage (make images); by
#     default a pod whose image exists runs from that image, and the operator process
#     names the runtime image of docker/images.env (--runtime_image).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export KUBETRAIN_STATE="${KUBETRAIN_STATE:-/tmp/kubetrain-cluster}"
bin="${KUBETRAIN_BIN:-$root/bin}"
kubectl="${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}/bin/kubectl"
mode="${KUBETRAIN_OPERATOR:-process}"
case "$mode" in
  process|chart) ;;
  *) echo "cluster-up: KUBETRAIN_OPERATOR must be 'chart' or unset, not '$mode'" >&2; exit 2 ;;
esac
for b in kubetrain-operator kubetrain-ps kubetrain-worker; do
  [ -x "$bin/$b" ] || { echo "cluster-up: $bin/$b missing: run make build" >&2; exit 1; }
done
agent_args=()
[ "${KUBETRAIN_HOST_BINARIES:-0}" = 0 ] || agent_args+=(--host-binaries)
if [ "$mode" = chart ]; then
  "$root/tests/cluster/build_helm.sh" >&2  # helm lands beside kubectl, on the PATH printed below
  exports="$(KUBETRAIN_CONTROLLER_MANAGER=1 "$root/tests/cluster/up.sh")"
  agent_args+=(--service-account-tokens)
else
  exports="$("$root/tests/cluster/up.sh")"
fi
eval "$exports"
if [ "$mode" != chart ]; then
  "$kubectl" apply -f "$root/deploy/crd/kubetrain.io_trainingjobs.yaml" >&2
  "$kubectl" wait --for=condition=Established crd/trainingjobs.kubetrain.io --timeout=60s >&2
fi
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
  --bin-dir "$bin" --state-dir "$KUBETRAIN_STATE/node-agent" "${agent_args[@]}"
if [ "$mode" = chart ]; then
  echo "cluster-up: ready for the Helm chart (no operator process, no CRD yet):" >&2
  echo "  helm install kubetrain helm/kubetrain -n kubetrain-system --create-namespace --wait" >&2
else
  # shellcheck source=docker/images.env
  . "$root/docker/images.env"
  start operator "$bin/kubetrain-operator" --kubeconfig "$KUBECONFIG" \
    --runtime_image="$KUBETRAIN_RUNTIME_IMAGE" \
    --metrics_address=127.0.0.1:0 --health_address=127.0.0.1:0 --leader_elect \
    --leader_election_namespace=kube-system
fi
echo "cluster-up: ready; kubectl is $kubectl" >&2
echo "$exports"
echo "export PATH=\"$(dirname "$kubectl"):\$PATH\""
