#!/usr/bin/env bash
# Copy the files the chart ships but does not own into helm/kubetrain/:
#   deploy/crd/kubetrain.io_trainingjobs.yaml -> helm/kubetrain/files/crds/   (the CRD, rendered by templates/crds/)
#   dashboards/*.json                         -> helm/kubetrain/dashboards/   (Grafana dashboards ConfigMaps)
# Run it (the Makefile's chart step should) before `helm package`/`helm install`.
# Usage: helm/sync-chart-files.sh [--check]   (--check: exit 1 if the chart is out of date)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
chart="$root/helm/kubetrain"
check=0
[ "${1:-}" = "--check" ] && check=1
stale=0
sync() {  # src dst
  if ! cmp -s "$1" "$2"; then
    if [ "$check" = 1 ]; then echo "out of date: $2 (from $1)" >&2; stale=1
    else mkdir -p "$(dirname "$2")"; cp "$1" "$2"; echo "copied $1 -> $2" >&2; fi
  fi
}
sync "$root/deploy/crd/kubetrain.io_trainingjobs.yaml" "$chart/files/crds/kubetrain.io_trainingjobs.yaml"
shopt -s nullglob
for f in "$root"/dashboards/*.json; do
  sync "$f" "$chart/dashboards/$(basename "$f")"
done
# Dashboards removed from dashboards/ leave the chart too.
for f in "$chart"/dashboards/*.json; do
  if [ ! -e "$root/dashboards/$(basename "$f")" ]; then
    if [ "$check" = 1 ]; then echo "stale: $f" >&2; stale=1; else rm -f "$f"; echo "removed $f" >&2; fi
  fi
done
exit "$stale"
