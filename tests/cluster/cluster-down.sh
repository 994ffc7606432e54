#!/usr/bin/env bash
# Stops what cluster-up.sh started (operator, node agent, then the control plane).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export KUBETRAIN_STATE="${KUBETRAIN_STATE:-/tmp/kubetrain-cluster}"
for name in operator node-agent; do
  pidfile="$KUBETRAIN_STATE/$name.pid"
  [ -f "$pidfile" ] || continue
  pid="$(cat "$pidfile")"
  kill "$pid" 2>/dev/null && for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null
  rm -f "$pidfile"
done
"$root/tests/cluster/down.sh" "$@"
