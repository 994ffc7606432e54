#!/usr/bin/env bash
# Make the two base images the Dockerfiles start FROM, `debian:bookworm` and
# `debian:bookworm-slim`, in buildah's local storage without a registry:
# `debootstrap --variant=minbase bookworm` once, the root filesystem kept as a
# tarball under ${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}/images, then
# committed under both tags (buildah has no `import`: a scratch container with
# the tarball unpacked into it). The Dockerfiles stay unchanged (a Docker user
# pulls the real images instead).
#
#   bookworm       minbase + the host's Debian apt sources (incl. updates and
#                  security, so the images get the same package versions).
#   bookworm-slim  the same, plus what the official slim image adds: dpkg
#                  path excludes for docs, man pages and locales, and apt
#                  configured to keep no package files or lists.
#
# Idempotent: an image whose tag already exists with the current recipe (a
# label carrying its hash) is left alone; the tarball is reused.
#
# Usage: docker/base-images.sh [--force]
# Env:   KUBETRAIN_CACHE (default $HOME/.cache/kubetrain)
set -euo pipefail

CACHE="${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}/images"
FORCE=0
for a in "$@"; do
  case "$a" in
    --force) FORCE=1 ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "base-images.sh: unknown argument: $a" >&2; exit 2 ;;
  esac
done
log() { echo "base-images.sh: $*" >&2; }
for t in buildah debootstrap; do
  command -v "$t" >/dev/null || { echo "base-images.sh: $t not found (run make deps)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "base-images.sh: debootstrap and buildah import need root" >&2; exit 1; }

# The recipe's hash: this script and the host's Debian sources it copies.
HOST_SOURCES=/etc/apt/sources.list.d/debian.sources
RECIPE="$( { cat "$0"; [ -f "$HOST_SOURCES" ] && cat "$HOST_SOURCES"; } | sha256sum | cut -c1-16)"
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9

have_image() {  # have_image TAG: exists with this recipe
  [ "$FORCE" = 0 ] &&
    [ "$(buildah inspect --type image --format '{{index .OCIv1.Config.Labels "kubetrain.base-recipe"}}' "$1" 2>/dev/null)" = "$RECIPE" ]
}

# minbase_tar: the debootstrap root filesystem as a tarball in $CACHE (made once).
minbase_tar() {
  local tar="$CACHE/bookworm-minbase-$RECIPE.tar"
  if [ -f "$tar" ] && [ "$FORCE" = 0 ]; then echo "$tar"; return; fi
  local dir
  dir="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
  # shellcheck disable=SC2064
  trap "rm -rf '$dir'" RETURN
  log "debootstrap --variant=minbase bookworm (about a minute) ..."
  local t0=$SECONDS
  debootstrap --variant=minbase bookworm "$dir" >"$CACHE/debootstrap.log" 2>&1 || {
    tail -20 "$CACHE/debootstrap.log" >&2
    echo "base-images.sh: debootstrap failed (log: $CACHE/debootstrap.log)" >&2
    return 1
  }
  if [ -f "$HOST_SOURCES" ]; then
    rm -f "$dir/etc/apt/sources.list"
    cp "$HOST_SOURCES" "$dir/etc/apt/sources.list.d/debian.sources"
  fi
  # As the official images: apt keeps no .debs; no caches in the image.
  cat >"$dir/etc/apt/apt.conf.d/docker-clean" <<'EOF2'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF2
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/* "$dir"/var/log/*.log "$dir"/tmp/*
  tar --numeric-owner --xattrs -C "$dir" -cf "$tar.tmp" .
  mv -f "$tar.tmp" "$tar"
  log "root filesystem: $(du -sh "$tar" | cut -f1) in $((SECONDS - t0))s -> $tar"
  echo "$tar"
}

# slim ROOT: what the official slim image adds, no docs/man/locales now or later.
slim() {
  cat >"$1/etc/dpkg/dpkg.cfg.d/excludes" <<'EOF2'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOF2
  find "$1/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  rm -rf "$1/usr/share/man"/* "$1/usr/share/info"/*
  find "$1/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
}

for name in bookworm bookworm-slim; do
  tag="debian:$name"
  if have_image "$tag"; then
    log "$tag is up to date"
    continue
  fi
  tar="$(minbase_tar)"
  # buildah has no `import`: a scratch container, the tarball unpacked into
  # it, committed under the tag.
  ctr="$(buildah from --name "kubetrain-base-$name-$$" scratch)"
  mnt="$(buildah mount "$ctr")"
  tar --numeric-owner --xattrs -C "$mnt" -xf "$tar"
  [ "$name" = bookworm ] || slim "$mnt"
  buildah umount "$ctr" >/dev/null
  buildah config --label "kubetrain.base-recipe=$RECIPE" --cmd bash \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
  buildah rmi "$tag" >/dev/null 2>&1 || true
  buildah commit --quiet --rm "$ctr" "$tag" >/dev/null
  log "imported $tag ($(buildah images --format '{{.Size}}' "$tag"))"
done
# Old recipes' tarballs.
find "$CACHE" -maxdepth 1 -name 'bookworm*.tar' -not -name "bookworm-minbase-$RECIPE.tar" -delete
