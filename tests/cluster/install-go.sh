#!/usr/bin/env bash
# `make deps` on a fresh Debian 12: install golang-1.23 from bookworm-backports
# when no Go >= 1.21 is found (go-env.sh --have-go). Debian 12's own golang is
# 1.19, too old to fetch the newer toolchain the wrapper modules need; 1.23
# fetches it by itself (go-env.sh sets GOTOOLCHAIN). Adds the backports suite
# to apt's sources when it is missing, on the mirror the `bookworm` suite uses.
# Idempotent; needs root (or sudo).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if "$HERE/go-env.sh" --have-go; then
  echo "deps: Go >= 1.21 present"
  exit 0
fi
SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
PKG=golang-1.23-go

# Is bookworm-backports already an apt source? (one-line or deb822 format)
has_backports() {
  grep -rhsE '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/ >/dev/null
}
# The URI of the main `bookworm` suite (the first one found).
bookworm_mirror() {
  {
    grep -hsE '^deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
      awk '{ i = 2; if ($i ~ /^\[/) while ($i !~ /\]$/) i++; if ($i ~ /^\[/ || $i ~ /\]$/) i++; if ($(i + 1) == "bookworm") print $i }'
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -f "$f" ] || continue
      awk 'BEGIN { RS = ""; FS = "\n" }
        { uri = ""; ok = 0
          for (i = 1; i <= NF; i++) {
            if ($i ~ /^URIs:/) { split($i, u, /[[:space:]]+/); uri = u[2] }
            if ($i ~ /^Suites:/ && $i ~ /[[:space:]]bookworm([[:space:]]|$)/) ok = 1
          }
          if (ok && uri != "") print uri }' "$f"
    done
  } | head -1
}

if ! has_backports; then
  mirror="$(bookworm_mirror)"
  [ -n "$mirror" ] || { echo "install-go.sh: no bookworm suite in apt's sources to add bookworm-backports beside" >&2; exit 1; }
  echo "deps: adding bookworm-backports ($mirror) to apt's sources"
  printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$mirror" |
    $SUDO tee /etc/apt/sources.list.d/kubetrain-bookworm-backports.sources >/dev/null
fi
echo "deps: installing $PKG from bookworm-backports"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends -t bookworm-backports "$PKG"
"$HERE/go-env.sh" --have-go || { echo "install-go.sh: $PKG installed but no Go >= 1.21 found" >&2; exit 1; }
