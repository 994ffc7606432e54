#!/usr/bin/env bash
# Regenerate go/kube-apiserver/go.mod + go.sum for another k8s.io/kubernetes release.
# The replace block is generated from that release's own go.mod: every
# `k8s.io/X => ./staging/src/k8s.io/X` becomes `k8s.io/X => k8s.io/X v0.MINOR.PATCH`.
# Usage: tests/cluster/bump-k8s.sh 1.36.5     (needs the Go module proxy)
set -euo pipefail
V="${1:?usage: bump-k8s.sh 1.MINOR.PATCH}"; V="${V#v}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}"
GO="${KUBETRAIN_GO:-/usr/local/go/bin/go}"
export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOFLAGS=-modcacherw GOTOOLCHAIN=local
D="$HERE/go/kube-apiserver"

GOMOD="$(cd /tmp && "$GO" mod download -json "k8s.io/kubernetes@v$V" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
[ -f "$GOMOD" ] || { echo "bump-k8s.sh: could not download k8s.io/kubernetes@v$V" >&2; exit 1; }
GOLINE="$(awk '$1=="go" {print $2; exit}' "$GOMOD")"
{
  echo "// Wrapper module: builds kube-apiserver (and kubectl) from k8s.io/kubernetes v$V."
  echo "// The replace block is generated (tests/cluster/bump-k8s.sh) from k8s.io/kubernetes v$V's"
  echo "// go.mod (its ./staging/src replaces), pointing each staging module at its published v0.${V#1.}."
  echo "module kubetrain.local/testbins/kube-apiserver"
  echo
  echo "go $GOLINE"
  echo
  awk '$1=="godebug" {print; exit}' "$GOMOD"
  echo
  echo "require k8s.io/kubernetes v$V"
  echo
  echo "replace ("
  awk -v m="v0.${V#1.}" '$2=="=>" && $3 ~ /^\.\/staging\/src\// {print "\t"$1" => "$1" "m}' "$GOMOD"
  echo ")"
} > "$D/go.mod"
rm -f "$D/go.sum"
(cd "$D" && GOFLAGS=-modcacherw "$GO" mod tidy)
echo "bump-k8s.sh: $D/go.mod now uses k8s.io/kubernetes v$V; run tests/cluster/build.sh"
