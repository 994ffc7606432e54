#!/usr/bin/env bash
# `make images`: build docker/Dockerfile.runtime and docker/Dockerfile.operator
# with buildah (no Docker engine needed), unchanged, from the repository root:
#
#   buildah bud --isolation chroot --network host --layers --pull=never -f docker/Dockerfile.X -t NAME .
#
# The `debian:bookworm` / `debian:bookworm-slim` bases come from
# docker/base-images.sh (debootstrap, cached). Names and tags come from
# docker/images.env. `--layers` keeps each step's result, so the second image
# reuses the first one's builder stage and an unchanged Makefile skips the
# builder's `make deps`; the Dockerfiles' Bazel cache mount lives under
# $KUBETRAIN_CACHE/images/tmp (buildah keeps cache mounts under TMPDIR), so a
# source change rebuilds incrementally. Intermediate images of older builds are
# removed afterwards (only the current chain is kept).
#
# On a failed build the last lines of buildah's output (its error) are printed
# and the script exits non-zero; the whole log stays in $KUBETRAIN_CACHE/images.
#
# Usage: docker/build-images.sh [--only DOCKERFILE=IMAGE] [--no-base]
#   --only   build just this Dockerfile as IMAGE (repeatable; tests use it)
# Env:   KUBETRAIN_CACHE (default $HOME/.cache/kubetrain)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CACHE="${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}/images"
# shellcheck source=docker/images.env
. "$HERE/images.env"
BUILDS=()
BASE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --only) BUILDS+=("$2"); shift ;;
    --no-base) BASE=0 ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "build-images.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
[ ${#BUILDS[@]} -gt 0 ] || BUILDS=(
  "docker/Dockerfile.runtime=$KUBETRAIN_RUNTIME_IMAGE"
  "docker/Dockerfile.operator=$KUBETRAIN_OPERATOR_IMAGE"
)
log() { echo "build-images.sh: $*" >&2; }
command -v buildah >/dev/null || { echo "build-images.sh: buildah not found (run make deps)" >&2; exit 1; }

[ "$BASE" = 0 ] || "$HERE/base-images.sh"
mkdir -p "$CACHE/tmp"
exec 8>"$CACHE/.build.lock"
flock 8

ids=()
for b in "${BUILDS[@]}"; do
  dockerfile="${b%%=*}" image="${b#*=}"
  name="$(basename "$dockerfile")"
  logf="$CACHE/build-$name.log"
  log "buildah bud -f $dockerfile -t $image (log: $logf) ..."
  t0=$SECONDS
  # In its own PID namespace: with chroot isolation a RUN step's daemons (the
  # builder's Bazel server) would otherwise outlive the build; here the kernel
  # ends them when buildah exits. 8>&-: they must not hold the lock either.
  if ! (cd "$ROOT" && TMPDIR="$CACHE/tmp" unshare --pid --fork --kill-child --mount-proc \
    buildah bud --isolation chroot --network host --layers --pull=never \
    -f "$dockerfile" -t "$image" . >"$logf" 2>&1 8>&-); then
    echo "build-images.sh: buildah bud -f $dockerfile failed; its last lines:" >&2
    tail -25 "$logf" | sed 's/^/  | /' >&2
    exit 1
  fi
  log "built $image in $((SECONDS - t0))s"
  # Every step's image id of this build ("--> Using cache ID" / "--> ID").
  while read -r id; do ids+=("$id"); done < <(sed -nE 's/^--> (Using cache )?([0-9a-f]{11,64})$/\2/p' "$logf")
done

# Drop untagged intermediates that the builds above did not use (older source
# trees' builder layers hold a whole Bazel output base each). `buildah rmi`
# also drops a removed image's untagged parents unless another image still
# builds on them, so the current chain (kept) protects the layers it shares.
for id in $(buildah images --quiet --no-trunc --filter dangling=true 2>/dev/null); do
  id="${id#sha256:}"
  hit=0
  for k in ${ids[@]+"${ids[@]}"}; do
    case "$id" in "$k"*) hit=1; break ;; esac
  done
  [ "$hit" = 1 ] || buildah rmi "$id" >/dev/null 2>&1 || true
done

echo "images:"
for b in "${BUILDS[@]}"; do
  image="${b#*=}"
  printf '  %-32s %s\n' "$image" "$(buildah images --format '{{.Size}}' "$image" | head -1)"
done
