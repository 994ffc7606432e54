#!/usr/bin/env bash
# Starts, in the background and at the lowest CPU priority, the Go builds that
# `make test` needs only later: tests/cluster/build.sh (etcd, kube-apiserver,
# kubectl), tests/scale/build_kwok.sh and tests/cluster/build_helm.sh. Returns
# at once.
#
# Why: from nothing these take about half an hour of CPU on two cores, and
# `make test` used to start them only after the Bazel tests and the images.
# Started first, at nice 19, they take only the CPU that the Bazel build, the
# unit tests and the image builds leave idle (tests waiting, module and
# package downloads), so they slow none of them much. Each build script takes
# $KUBETRAIN_CACHE/.build.lock, so the later foreground call waits for the
# background one and then finds its binary up to date; if the background build
# failed, the foreground call builds again and reports the error there.
#
# The background job stays in make's process group, so Ctrl-C stops it too.
# Output: $KUBETRAIN_CACHE/prefetch.log.  KUBETRAIN_PREFETCH=0: do nothing.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}"
[ "${KUBETRAIN_PREFETCH:-1}" != 0 ] || exit 0
mkdir -p "$CACHE"
log="$CACHE/prefetch.log"
nice -n 19 bash -c '
  set -u
  echo "prefetch: $(date -u +%H:%M:%S) start"
  for step in "$1/build.sh" "$1/../scale/build_kwok.sh" "$1/build_helm.sh"; do
    t0=$SECONDS
    if $step; then st=ok; else st="failed (exit $?)"; fi
    echo "prefetch: $(date -u +%H:%M:%S) ${step##*/} $st after $((SECONDS - t0))s"
  done
' prefetch "$HERE" </dev/null >"$log" 2>&1 &
echo "prefetch.sh: building the control plane, kwok and helm in the background (log: $log)" >&2
