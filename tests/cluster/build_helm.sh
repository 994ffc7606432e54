#!/usr/bin/env bash
# Build the helm CLI (helm.sh/helm/v3, wrapper module go/helm) from the Go module
# proxy into ${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}/bin/helm, outside the repo.
# Used by tests/packaging/test_helm.py. Mirrors build.sh: a stamp (hash of the
# wrapper module files, the Go version and the ldflags) skips an up-to-date
# binary; GOMODCACHE/GOCACHE live under $KUBETRAIN_CACHE/go.
#
# The ldflags stamp what upstream's Makefile stamps: helm's version, and the
# Kubernetes version `helm template`/`helm lint` assume without a cluster
# (derived from the k8s.io/client-go version, as upstream does; without it helm
# would assume v1.20 and refuse the chart's kubeVersion ">=1.29.0-0").
#
# Usage: tests/cluster/build_helm.sh [--force] [--quiet]   (prints the path of helm on stdout)
# Env:   KUBETRAIN_CACHE (default $HOME/.cache/kubetrain), KUBETRAIN_GO
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}"
BIN="$CACHE/bin"
MOD="$HERE/go/helm"
FORCE=0
QUIET=0
for a in "$@"; do
  case "$a" in
    --force) FORCE=1 ;;
    --quiet|-q) QUIET=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "build_helm.sh: unknown argument: $a" >&2; exit 2 ;;
  esac
done
log() { [ "$QUIET" = 1 ] || echo "build_helm.sh: $*" >&2; }

export GOMODCACHE="$CACHE/go/mod"
export GOCACHE="$CACHE/go/build"
export GOFLAGS="-modcacherw -mod=readonly"   # cache deletable with rm -rf; never edit go.mod
# GO, GOTOOLCHAIN (local, or a newer one fetched once into GOMODCACHE), GOVER.
# shellcheck source=tests/cluster/go-env.sh
. "$HERE/go-env.sh"
setup_go "$(need_minor "$MOD/go.mod")" build_helm.sh
export CGO_ENABLED=0
mkdir -p "$BIN" "$GOMODCACHE" "$GOCACHE"

# Versions from the wrapper go.mod (no network needed).
modver() { awk -v m="$1" '$1==m && $2 ~ /^v/ {print $2; exit}' "$MOD/go.mod"; }
HELM_VERSION="$(modver helm.sh/helm/v3)"
CLIENT_GO="$(modver k8s.io/client-go)"         # e.g. v0.37.0 -> Kubernetes 1.37
[ -n "$HELM_VERSION" ] && [ -n "$CLIENT_GO" ] || {
  echo "build_helm.sh: cannot read helm.sh/helm/v3 / k8s.io/client-go versions from $MOD/go.mod" >&2; exit 1; }
K8S_MAJOR=$(( $(echo "${CLIENT_GO#v}" | cut -d. -f1) + 1 ))
K8S_MINOR="$(echo "${CLIENT_GO#v}" | cut -d. -f2)"
LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
LDFLAGS+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  LDFLAGS+=" -X $p.k8sVersionMajor=$K8S_MAJOR -X $p.k8sVersionMinor=$K8S_MINOR"
done

if command -v flock >/dev/null 2>&1; then
  exec 9>"$CACHE/.build.lock"
  flock 9
fi
NICE=()
command -v nice >/dev/null 2>&1 && NICE=(nice -n 10)

out="$BIN/helm"
stampf="$BIN/.helm.stamp"
stamp="$( { echo "helm $GOVER $LDFLAGS"; (cd "$MOD" && sha256sum go.mod go.sum); } | sha256sum | cut -d' ' -f1)"
if [ "$FORCE" = 0 ] && [ -x "$out" ] && [ -f "$stampf" ] && [ "$(cat "$stampf")" = "$stamp" ]; then
  log "helm is up to date ($out)"
else
  log "building helm $HELM_VERSION with $GOVER ..."
  t0=$SECONDS
  rm -f "$stampf"
  (cd "$MOD" && "${NICE[@]}" "$GO" build -trimpath -ldflags "$LDFLAGS" -o "$out.tmp.$$" helm.sh/helm/v3/cmd/helm)
  mv -f "$out.tmp.$$" "$out"
  echo "$stamp" > "$stampf"
  log "built helm in $((SECONDS - t0))s -> $out"
fi
echo "$out"   # stdout: the binary's path (also with --quiet)
