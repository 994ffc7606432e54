#!/usr/bin/env bash
# Builds Abseil with -fsanitize=thread and prints the directory of its shared
# libraries, for `make tsan` to put first on LD_LIBRARY_PATH.
#
# Why: Debian's libabsl is not instrumented, so TSan cannot see absl::Mutex's
# happens-before edges and reports every access guarded by one as a race. The
# build is Debian's own source of the installed libabsl-dev (same version, same
# patches), so the SONAMEs and ABI match and the test binaries need no rebuild
# against it: only the loader picks the instrumented copy. Cached in
# ~/.cache/kubetrain/absl-tsan-<version>; ~2 minutes on 2 cores the first time.
set -euo pipefail

version=$(dpkg-query -W -f='${Version}' libabsl-dev)
cache=${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}
out="$cache/absl-tsan-$version"
if [ -f "$out/.complete" ]; then echo "$out/lib"; exit 0; fi

for tool in cmake patch; do
  command -v "$tool" >/dev/null || { echo "build-tsan-absl.sh: $tool is missing (make tsan installs it)" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A private apt state with deb-src entries for the machine's own archives, so
# the system's apt configuration and package lists are left untouched.
mkdir -p "$work/apt/sources.list.d" "$work/apt/lists/partial" "$work/apt/cache/archives/partial"
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] && sed 's/^Types:.*/Types: deb-src/' "$f" > "$work/apt/sources.list.d/$(basename "$f")"
done
if [ -f /etc/apt/sources.list ]; then
  sed -n 's/^deb \(.*\)/deb-src \1/p' /etc/apt/sources.list > "$work/apt/sources.list.d/from-sources-list.list"
fi
apt_opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$work/apt/sources.list.d"
          -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache" -o "APT::Get::Only-Source=true" -o "APT::Sandbox::User=root")
echo "build-tsan-absl.sh: fetching the abseil $version source package" >&2
apt-get "${apt_opts[@]}" -qq update >&2
(cd "$work" && apt-get "${apt_opts[@]}" -qq source --download-only "abseil=$version" >&2)

# Unpack and patch by hand (the quilt series), so dpkg-dev is not needed.
src="$work/src"
mkdir -p "$src"
tar -xf "$work"/abseil_*.orig.tar.* -C "$src" --strip-components=1
tar -xf "$work"/abseil_*.debian.tar.* -C "$src"
if [ -f "$src/debian/patches/series" ]; then
  while read -r p _; do
    case "$p" in ''|'#'*) continue ;; esac
    patch -d "$src" -p1 -s < "$src/debian/patches/$p"
  done < "$src/debian/patches/series"
fi

echo "build-tsan-absl.sh: building with -fsanitize=thread into $out" >&2
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_CXX_STANDARD=17 -DABSL_PROPAGATE_CXX_STD=ON -DBUILD_TESTING=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -O1 -g" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
  -DCMAKE_INSTALL_PREFIX="$out" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
# GCC warns that TSan does not model atomic_thread_fence; the log is shown on failure.
if ! { cmake --build "$work/build" -j "$(nproc)" && cmake --install "$work/build"; } > "$work/build.log" 2>&1; then
  tail -40 "$work/build.log" >&2
  echo "build-tsan-absl.sh: the Abseil build failed (log above)" >&2
  exit 1
fi

# Every SONAME the system's libabsl ships must exist here, or the loader would
# silently mix instrumented and uninstrumented copies.
missing=0
for so in /usr/lib/x86_64-linux-gnu/libabsl_*.so.*; do
  name=$(basename "$so")
  case "$name" in *.so.[0-9]*.[0-9]*) continue ;; esac   # only the SONAME links
  [ -e "$out/lib/$name" ] || { echo "build-tsan-absl.sh: $name not built" >&2; missing=1; }
done
[ "$missing" = 0 ] || exit 1
touch "$out/.complete"
echo "$out/lib"
