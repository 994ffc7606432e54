#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok, Kubernetes WithOut Kubelet) from the Go module
# proxy into ${KUBETRAIN_CACHE:-~/.cache/kubetrain}/bin/kwok, the way
# tests/cluster/build.sh builds the control plane: a wrapper module
# (go/kwok: go.mod with `tool sigs.k8s.io/kwok/cmd/kwok`, go.sum), GOMODCACHE
# and GOCACHE under the cache (outside the clone), a stamp so an up-to-date
# binary is not rebuilt, go.mod never rewritten. Idempotent.
#   tests/scale/build_kwok.sh [--force] [--quiet]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}"
force=0 quiet=0
for a in "$@"; do
  case "$a" in
    --force) force=1 ;;
    --quiet) quiet=1 ;;
    *) echo "build_kwok.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
MOD="$HERE/go/kwok"
mkdir -p "$CACHE/bin" "$CACHE/go/mod" "$CACHE/go/build"
export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build"
export GOFLAGS="-modcacherw -mod=readonly"
# GO, GOTOOLCHAIN (local, or a newer one fetched once into GOMODCACHE), GOVER:
# the same toolchain choice as the control plane's (a fresh machine has only
# Debian's golang-1.23, which fetches the newer toolchain go.mod needs).
# shellcheck source=tests/cluster/go-env.sh
. "$HERE/../cluster/go-env.sh"
setup_go "$(need_minor "$MOD/go.mod")" build_kwok.sh
export CGO_ENABLED=0
out="$CACHE/bin/kwok"
stamp="$( { echo "kwok $GOVER"; (cd "$MOD" && sha256sum go.mod go.sum); } | sha256sum | cut -d' ' -f1)"
exec 9>"$CACHE/.build.lock"
flock 9
if [ "$force" = 0 ] && [ -x "$out" ] && [ "$(cat "$CACHE/bin/.kwok.stamp" 2>/dev/null)" = "$stamp" ]; then
  [ "$quiet" = 1 ] || echo "build_kwok.sh: $out is up to date" >&2
  exit 0
fi
[ "$quiet" = 1 ] || echo "build_kwok.sh: building kwok ($(grep -o 'sigs.k8s.io/kwok v[^ ]*' "$MOD/go.mod")) ..." >&2
(cd "$MOD" && nice -n 10 "$GO" build -trimpath -ldflags "-s -w" -o "$out.tmp.$$" sigs.k8s.io/kwok/cmd/kwok)
mv "$out.tmp.$$" "$out"
echo "$stamp" >"$CACHE/bin/.kwok.stamp"
[ "$quiet" = 1 ] || echo "build_kwok.sh: built $out" >&2
