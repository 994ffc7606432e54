#!/usr/bin/env bash
# Build the real control-plane binaries used by kubetrain's cluster tests:
#   kube-apiserver + kubectl  (k8s.io/kubernetes, wrapper module go/kube-apiserver)
#   etcd                      (go.etcd.io/etcd/server/v3, wrapper module go/etcd)
# into ${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}/bin, outside the repo.
#
# Idempotent: each binary carries a stamp (hash of its wrapper module files, the
# Go version and the ldflags); an up-to-date binary is not rebuilt.
# GOMODCACHE/GOCACHE live under $KUBETRAIN_CACHE/go so warm rebuilds are fast.
#
# Usage: tests/cluster/build.sh [--force] [--no-kubectl] [--quiet]
# Env:   KUBETRAIN_CACHE   cache root (default $HOME/.cache/kubetrain)
#        KUBETRAIN_GO      go binary >= 1.21 (default: the newest found; see go-env.sh)
#        KUBETRAIN_GOTOOLCHAIN  toolchain fetched when that Go is older than go.mod needs
#        KUBETRAIN_BUILD_KUBECTL=0   same as --no-kubectl
#        KUBETRAIN_BUILD_CONTROLLER_MANAGER=1  also build kube-controller-manager
#                          (up.sh sets it when KUBETRAIN_CONTROLLER_MANAGER=1)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}"
BIN="$CACHE/bin"
FORCE=0
QUIET=0
WANT_KUBECTL="${KUBETRAIN_BUILD_KUBECTL:-1}"

for a in "$@"; do
  case "$a" in
    --force) FORCE=1 ;;
    --no-kubectl) WANT_KUBECTL=0 ;;
    --quiet|-q) QUIET=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument: $a" >&2; exit 2 ;;
  esac
done

log() { [ "$QUIET" = 1 ] || echo "build.sh: $*" >&2; }

# --- Go toolchain -----------------------------------------------------------
export GOMODCACHE="$CACHE/go/mod"
export GOCACHE="$CACHE/go/build"
export GOFLAGS="-modcacherw -mod=readonly"   # cache deletable with rm -rf; never edit go.mod
# GO, GOTOOLCHAIN (local, or a newer one fetched once into GOMODCACHE), GOVER.
# shellcheck source=tests/cluster/go-env.sh
. "$HERE/go-env.sh"
setup_go "$(need_minor "$HERE"/go/kube-apiserver/go.mod "$HERE"/go/etcd/go.mod)" build.sh
export CGO_ENABLED=0
mkdir -p "$BIN" "$GOMODCACHE" "$GOCACHE"

# Serialize concurrent builds sharing the same cache.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$CACHE/.build.lock"
  flock 9
fi

NICE=()
command -v nice >/dev/null 2>&1 && NICE=(nice -n 10)

# --- versions ----------------------------------------------------------------
KMOD="$HERE/go/kube-apiserver"
EMOD="$HERE/go/etcd"
K8S_VERSION="$(awk '($1=="require" && $2=="k8s.io/kubernetes") {print $3; exit} ($1=="k8s.io/kubernetes" && $2 ~ /^v/) {print $2; exit}' "$KMOD/go.mod")"
[ -n "$K8S_VERSION" ] || { echo "build.sh: cannot find k8s.io/kubernetes in $KMOD/go.mod" >&2; exit 1; }
K8S_MAJOR="$(echo "${K8S_VERSION#v}" | cut -d. -f1)"
K8S_MINOR="$(echo "${K8S_VERSION#v}" | cut -d. -f2)"

# Same variables upstream's hack/lib/version.sh stamps.
kver_ldflags() {
  local out="" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    out+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$K8S_MAJOR -X $pkg.gitMinor=$K8S_MINOR"
    out+=" -X $pkg.gitTreeState=clean"
  done
  echo "-s -w$out"
}
KLDFLAGS="$(kver_ldflags)"

# --- build one binary if its stamp changed ----------------------------------
# build_one NAME MODULE_DIR PACKAGE LDFLAGS FILES...
build_one() {
  local name="$1" dir="$2" pkg="$3" ldflags="$4"; shift 4
  local stampf="$BIN/.$name.stamp" out="$BIN/$name" stamp
  stamp="$( { echo "$name $pkg $GOVER $ldflags"; (cd "$dir" && sha256sum "$@"); } | sha256sum | cut -d' ' -f1)"
  if [ "$FORCE" = 0 ] && [ -x "$out" ] && [ -f "$stampf" ] && [ "$(cat "$stampf")" = "$stamp" ]; then
    log "$name is up to date ($out)"
    return 0
  fi
  log "building $name ($pkg) with $GOVER ..."
  local t0=$SECONDS
  rm -f "$stampf"
  (cd "$dir" && "${NICE[@]}" "$GO" build -trimpath -ldflags "$ldflags" -o "$out.tmp.$$" "$pkg")
  mv -f "$out.tmp.$$" "$out"
  echo "$stamp" > "$stampf"
  log "built $name in $((SECONDS - t0))s -> $out"
}

build_one etcd "$EMOD" go.etcd.io/etcd/server/v3 "-s -w" go.mod go.sum
build_one kube-apiserver "$KMOD" . "$KLDFLAGS" go.mod go.sum main.go
if [ "${KUBETRAIN_BUILD_CONTROLLER_MANAGER:-0}" != 0 ]; then
  build_one kube-controller-manager "$KMOD" ./cmd/kube-controller-manager "$KLDFLAGS" go.mod go.sum cmd/kube-controller-manager/main.go
fi
if [ "$WANT_KUBECTL" != 0 ]; then
  build_one kubectl "$KMOD" ./cmd/kubectl "$KLDFLAGS" go.mod go.sum cmd/kubectl/main.go
fi

if [ "$QUIET" = 0 ]; then
  echo "kubetrain control-plane binaries (kubernetes $K8S_VERSION):"
  for b in etcd kube-apiserver kube-controller-manager kubectl; do
    [ -x "$BIN/$b" ] && echo "  $BIN/$b"
  done
  echo "export KUBETRAIN_BIN=$BIN"
fi
