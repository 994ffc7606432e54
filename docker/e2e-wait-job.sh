#!/usr/bin/env bash
# Wait until TrainingJob $1 reaches .status.state Succeeded (exit 0); give up
# at once if it reaches Failed, or after $2 (default 15m) (exit 1).
# Used by .github/workflows/e2e-kind.yaml; runs the same check as
#   kubectl wait --for=jsonpath='{.status.state}'=Succeeded tj/$1 --timeout=$2
# but does not sit out the whole timeout on a failed job.
# Usage: docker/e2e-wait-job.sh JOB [TIMEOUT] [NAMESPACE]
set -euo pipefail
job="${1:?usage: $0 JOB [TIMEOUT e.g. 15m] [NAMESPACE]}"
timeout="${2:-15m}"
ns_args=()
[ -n "${3:-}" ] && ns_args=(--namespace "$3")

kubectl wait "${ns_args[@]}" --for=jsonpath='{.status.state}'=Succeeded "tj/$job" --timeout="$timeout" &
waiter=$!
trap 'kill "$waiter" 2>/dev/null || true' EXIT
last=""
while kill -0 "$waiter" 2>/dev/null; do
  line="$(kubectl get "${ns_args[@]}" "tj/$job" --no-headers 2>/dev/null || true)"
  if [ "$line" != "$last" ]; then echo "$(date -u +%H:%M:%S) $line"; last="$line"; fi
  state="$(kubectl get "${ns_args[@]}" "tj/$job" -o jsonpath='{.status.state}' 2>/dev/null || true)"
  if [ "$state" = Failed ]; then
    echo "TrainingJob $job Failed:" >&2
    kubectl get "${ns_args[@]}" "tj/$job" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' >&2 || true
    exit 1
  fi
  sleep 10
done
trap - EXIT
if wait "$waiter"; then
  kubectl get "${ns_args[@]}" "tj/$job" -o wide
  exit 0
fi
echo "TrainingJob $job did not succeed within $timeout (state: $(kubectl get "${ns_args[@]}" "tj/$job" -o jsonpath='{.status.state}' 2>/dev/null || echo unknown))" >&2
exit 1
