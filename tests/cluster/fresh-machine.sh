#!/usr/bin/env bash
# Check the fresh-machine set-up for real: a plain Debian 12 root filesystem
# (`debootstrap --variant=minbase bookworm`: no Go, no buildah, no compiler),
# this clone's tracked files copied in, then inside it (chroot, own mount
# namespace) `make deps` and `tests/cluster/build.sh`, each timed. Nothing of
# the host's toolchains or caches is visible inside. Opt-in (not in make test):
# it downloads ~1.5 GB of Debian packages and Go modules and takes ~15 min.
#
# Usage: tests/cluster/fresh-machine.sh [DIR]   (default: a new dir under /var/tmp;
#        kept afterwards for inspection: rm -rf it when done). Needs root.
# Env:   FRESH_STEPS  what to run inside, ;-separated (default: install make,
#                     `make deps`, tests/cluster/build.sh); the first failure stops
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
[ "$(id -u)" = 0 ] || { echo "fresh-machine.sh: needs root (debootstrap, chroot)" >&2; exit 1; }
DIR="${1:-$(mktemp -d /var/tmp/kubetrain-fresh.XXXXXX)}"
log() { echo "fresh-machine.sh: $*" >&2; }

if [ ! -x "$DIR/bin/bash" ]; then
  log "debootstrap --variant=minbase bookworm $DIR ..."
  t0=$SECONDS
  debootstrap --variant=minbase bookworm "$DIR" >"$DIR.debootstrap.log" 2>&1 ||
    { tail -20 "$DIR.debootstrap.log" >&2; exit 1; }
  log "debootstrap: $((SECONDS - t0))s"
fi
# The host's Debian sources (same mirror, updates and security suites).
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  rm -f "$DIR/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/debian.sources "$DIR/etc/apt/sources.list.d/"
fi
cp /etc/resolv.conf "$DIR/etc/resolv.conf"
# Local CA certificates (e.g. a TLS-intercepting egress proxy's, as in this
# workplace): a machine on the same network has them too. ca-certificates
# (installed by make deps) adds them to the bundle.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$DIR/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$DIR/usr/local/share/ca-certificates/"
  [ ! -x "$DIR/usr/sbin/update-ca-certificates" ] || chroot "$DIR" update-ca-certificates >/dev/null
fi
mkdir -p "$DIR/src/kubetrain"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -c) | tar -C "$DIR/src/kubetrain" -x

# make itself is the one prerequisite (the README says so); then the real steps.
STEPS="${FRESH_STEPS:-apt-get update -qq && apt-get install -y -qq --no-install-recommends make; make deps; tests/cluster/build.sh}"
log "inside: $STEPS"
unshare --mount --propagation private bash -c '
  set -e
  dir="$1"; steps="$2"
  mount -t proc proc "$dir/proc"
  mount --rbind /dev "$dir/dev"
  mount -t sysfs sys "$dir/sys"
  mount -t tmpfs tmpfs "$dir/tmp"
  exec chroot "$dir" /usr/bin/env -i HOME=/root TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "cd /src/kubetrain && IFS=\";\"; for s in \$0; do echo \"=== \$s\"; t0=\$SECONDS; eval \"\$s\" || exit 1; echo \"=== \$s: \$((SECONDS - t0))s\"; done" "$steps"
' fresh "$DIR" "$STEPS"
log "done; root filesystem kept at $DIR"
