#!/usr/bin/env bash
# Stop the control plane started by up.sh (only the PIDs it recorded in the state dir).
# Usage: tests/cluster/down.sh [--purge] [--quiet]
#   --purge  also delete the state dir (etcd data, certs, logs, kubeconfig)
# Env: KUBETRAIN_STATE (default /tmp/kubetrain-cluster)
set -uo pipefail

STATE="${KUBETRAIN_STATE:-/tmp/kubetrain-cluster}"
PURGE=0
QUIET=0
for a in "$@"; do
  case "$a" in
    --purge) PURGE=1 ;;
    --quiet|-q) QUIET=1 ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "down.sh: unknown argument: $a" >&2; exit 2 ;;
  esac
done
log() { [ "$QUIET" = 1 ] || echo "down.sh: $*" >&2; }

# stop NAME: TERM the recorded pid (only if it still runs that binary), wait, then KILL.
stop() {
  local name="$1" pf="$STATE/$1.pid" pid i
  [ -f "$pf" ] || return 0
  pid="$(cat "$pf" 2>/dev/null)"
  if [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "/$name "; then
    kill -TERM "$pid" 2>/dev/null
    for i in $(seq 1 100); do
      [ -d "/proc/$pid" ] || break
      # a zombie (already exited, not yet reaped by its parent) counts as stopped
      [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && break
      sleep 0.1
    done
    if [ -d "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]; then
      log "$name (pid $pid) did not stop on TERM; sending KILL"
      kill -KILL "$pid" 2>/dev/null
    fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$pf"
}

stop kube-controller-manager
stop kube-apiserver
stop etcd
rm -f "$STATE/env"

if [ "$PURGE" = 1 ] && [ -d "$STATE" ]; then
  rm -rf "$STATE"
  log "removed $STATE"
fi
exit 0
