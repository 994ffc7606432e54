#!/usr/bin/env bash
# Starts, in the background and at the lowest CPU priority, the Go builds that
# `make test` needs only later: tests/cluster/build.sh (etcd, kube-apiserver,
# kubectl), tests/scale/build_kwok.sh and tests/cluster/build_helm.sh. Returns
# at once.
#
# Why: from nothing these take about half an hour of CPU on two cores, and
# `make test` used to start them only after the Bazel tests and the images.
# Started first, at the lowest priority, they take only the CPU that the Bazel
# build, the unit tests and the image builds leave idle (tests waiting, module
# and package downloads), so they slow none of them much. Each build script
# takes $KUBETRAIN_CACHE/.build.lock, so the later foreground call waits for
# the background one and then finds its binary up to date; if the background
# build failed, the foreground call builds again and reports the error there.
#
# Low priority needs more than `nice` where the kernel groups tasks by session
# (sched_autogroup, on by default in Debian): a nice value only ranks tasks of
# one session against each other, and every Bazel action runs in a session of
# its own. So the builds get a session of their own (setsid) whose weight is
# set to the lowest (nice 19 in /proc/self/autogroup), and nice 19 inside it.
# Being in another session, Ctrl-C on make does not reach them: a watcher ends
# them when the make that started them is gone.
#
# Output: $KUBETRAIN_CACHE/prefetch.log.  KUBETRAIN_PREFETCH=0: do nothing.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}"
[ "${KUBETRAIN_PREFETCH:-1}" != 0 ] || exit 0
mkdir -p "$CACHE"
log="$CACHE/prefetch.log"

# The make this runs under (the nearest ancestor called make), if any.
owner=$PPID
while [ "$owner" -gt 1 ] && [ "$(cat "/proc/$owner/comm" 2>/dev/null)" != make ]; do
  owner=$(awk '{print $4}' "/proc/$owner/stat" 2>/dev/null || echo 1)
done
[ "$owner" -gt 1 ] || owner=0

setsid bash -c '
  set -u
  echo 19 >/proc/self/autogroup 2>/dev/null || true
  renice -n 19 -p $$ >/dev/null
  here=$1 owner=$2
  if [ "$owner" != 0 ]; then
    (while kill -0 "$owner" 2>/dev/null; do sleep 5; done
     echo "prefetch: $(date -u +%H:%M:%S) make (pid $owner) is gone: stopping"
     kill -TERM -- -$$ 2>/dev/null) &
    watcher=$!
  fi
  echo "prefetch: $(date -u +%H:%M:%S) start"
  for step in "$here/build.sh" "$here/../scale/build_kwok.sh" "$here/build_helm.sh"; do
    t0=$SECONDS
    if $step; then st=ok; else st="failed (exit $?)"; fi
    echo "prefetch: $(date -u +%H:%M:%S) ${step##*/} $st after $((SECONDS - t0))s"
  done
  [ -z "${watcher:-}" ] || kill "$watcher" 2>/dev/null
' prefetch "$HERE" "$owner" </dev/null >"$log" 2>&1 &
echo "prefetch.sh: building the control plane, kwok and helm in the background (log: $log)" >&2
