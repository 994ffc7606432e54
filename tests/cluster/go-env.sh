#!/usr/bin/env bash
# The Go toolchain for building tests/cluster's Go modules, in one place.
#
# Sourced by build.sh and build_helm.sh: sets GO (a go binary >= 1.21) and
# exports GOTOOLCHAIN and GOVER. The wrapper modules need the Go version of
# their `go` line (1.26); a local Go that is older but >= 1.21 (Debian's
# golang-1.23 from bookworm-backports, which `make deps` installs) builds with
# GOTOOLCHAIN=$KUBETRAIN_GOTOOLCHAIN, which the go command fetches once from the
# Go module proxy into GOMODCACHE (the caller's cache). A new enough local Go
# builds with GOTOOLCHAIN=local.
#
# Run directly: `go-env.sh --have-go` exits 0 when a Go >= 1.21 is found (used
# by `make deps` to decide whether to install one); `go-env.sh` prints GO,
# GOTOOLCHAIN and GOVER.
#
# Env: KUBETRAIN_GO           go binary to use (default: the newest of
#                             /usr/local/go/bin/go, `go` on PATH, /usr/lib/go-1.*/bin/go)
#      KUBETRAIN_GOTOOLCHAIN  toolchain when the local Go is too old (default below)

# The toolchain fetched when the local Go is older than the modules need. Keep it
# a version the module proxy serves (`go list -m -versions golang.org/toolchain`
# lists them) and >= every wrapper go.mod's `go` line.
KUBETRAIN_DEFAULT_GOTOOLCHAIN=go1.26.8
KUBETRAIN_GO_MIN_MINOR=21 # the first Go that switches toolchains by itself

# go_minor GO: the minor version of a go binary (e.g. 23 for go1.23.4), or empty.
go_minor() {
  local v
  v="$(GOTOOLCHAIN=local "$1" env GOVERSION 2>/dev/null)" || return 0
  v="${v#go1.}"
  echo "${v%%[!0-9]*}"
}

# find_go: prints the go binary to use (KUBETRAIN_GO, else the newest >= 1.21).
find_go() {
  if [ -n "${KUBETRAIN_GO:-}" ]; then
    echo "$KUBETRAIN_GO"
    return
  fi
  local best="" best_minor=-1 c m
  for c in /usr/local/go/bin/go "$(command -v go 2>/dev/null)" /usr/lib/go-1.*/bin/go; do
    [ -n "$c" ] && [ -x "$c" ] || continue
    m="$(go_minor "$c")"
    [ -n "$m" ] || continue
    if [ "$m" -gt "$best_minor" ]; then best="$c" best_minor="$m"; fi
  done
  [ "$best_minor" -ge "$KUBETRAIN_GO_MIN_MINOR" ] && echo "$best"
}

# setup_go NEED_MINOR CALLER: sets GO, exports GOTOOLCHAIN and GOVER, or exits.
setup_go() {
  local need="$1" caller="$2" m
  GO="$(find_go || true)"
  if [ -z "$GO" ] || [ ! -x "$GO" ]; then
    echo "$caller: no Go >= 1.$KUBETRAIN_GO_MIN_MINOR found (make deps installs golang-1.23 from bookworm-backports; or set KUBETRAIN_GO)" >&2
    exit 1
  fi
  m="$(go_minor "$GO")"
  if [ -z "$m" ] || [ "$m" -lt "$KUBETRAIN_GO_MIN_MINOR" ]; then
    echo "$caller: $GO is $(GOTOOLCHAIN=local "$GO" env GOVERSION 2>/dev/null || echo unknown); need Go >= 1.$KUBETRAIN_GO_MIN_MINOR to fetch Go 1.$need" >&2
    exit 1
  fi
  if [ "$m" -ge "$need" ]; then
    export GOTOOLCHAIN=local
  else
    export GOTOOLCHAIN="${KUBETRAIN_GOTOOLCHAIN:-$KUBETRAIN_DEFAULT_GOTOOLCHAIN}"
  fi
  # With a newer GOTOOLCHAIN this fetches it (once) and reports its version.
  if ! GOVER="$("$GO" env GOVERSION)"; then
    echo "$caller: $GO could not switch to GOTOOLCHAIN=$GOTOOLCHAIN (needs the Go module proxy)" >&2
    exit 1
  fi
  export GOVER
  m="${GOVER#go1.}"
  m="${m%%[!0-9]*}"
  if [ "$m" -lt "$need" ]; then
    echo "$caller: Go $GOVER (GOTOOLCHAIN=$GOTOOLCHAIN) is older than the 1.$need the modules need" >&2
    exit 1
  fi
}

# need_minor GOMOD...: the highest minor of the `go 1.N` lines.
need_minor() {
  awk '$1 == "go" { split($2, v, "."); if (v[2] + 0 > max) max = v[2] + 0 } END { print max + 0 }' "$@"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-}" in
    --have-go) [ -n "$(find_go || true)" ] ;;
    "")
      here="$(cd "$(dirname "$0")" && pwd)"
      setup_go "$(need_minor "$here"/go/*/go.mod)" go-env.sh
      echo "GO=$GO GOTOOLCHAIN=$GOTOOLCHAIN GOVER=$GOVER"
      ;;
    *) echo "go-env.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
fi
