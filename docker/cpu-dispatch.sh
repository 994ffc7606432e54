#!/bin/sh
# Installed in the runtime image as /usr/local/bin/kubetrain, kubetrain-ps and
# kubetrain-worker. The image holds one build of the binaries per x86-64
# micro-architecture level (/usr/local/lib/kubetrain/<level>/: x86-64-v2,
# -v3 with AVX2/FMA, -v4 with AVX-512; Eigen's kernels run about twice as fast
# on v3 as on v2); this runs the highest level the CPU supports, so one
# portable image trains at the host build's speed on any x86-64 node.
# Other architectures (and KUBETRAIN_MARCH builds) hold one build, run as is.
#
# KUBETRAIN_CPU_LEVEL=<level> picks a level (tests; a level the CPU lacks is
# refused, as its binaries would die of an illegal instruction). The choice is
# printed once to stderr, unless KUBETRAIN_CPU_LEVEL_QUIET=1 (set for the
# tasks a chosen binary starts itself, e.g. `kubetrain run`'s PS and workers,
# which run from the same level's directory anyway).
set -eu
# (The two overrides are for tests/packaging/test_cpu_dispatch.py.)
lib=${KUBETRAIN_LIB_DIR:-/usr/local/lib/kubetrain}
cpuinfo=${KUBETRAIN_CPUINFO:-/proc/cpuinfo}
name=$(basename "$0")

# The x86-64 psABI levels as the kernel names their flags (/proc/cpuinfo).
has_all() {
  for f in "$@"; do
    case " $flags " in *" $f "*) ;; *) return 1 ;; esac
  done
}
supported_levels() {
  flags=$(sed -n 's/^flags[[:space:]]*:[[:space:]]*//p' "$cpuinfo" 2>/dev/null | head -n 1)
  has_all cx16 lahf_lm popcnt sse4_1 sse4_2 ssse3 || return 0
  echo x86-64-v2
  has_all avx avx2 bmi1 bmi2 f16c fma abm movbe xsave || return 0
  echo x86-64-v3
  has_all avx512f avx512bw avx512cd avx512dq avx512vl || return 0
  echo x86-64-v4
}

level=""
if [ -d "$lib/x86-64-v2" ]; then
  supported=$(supported_levels | tr '\n' ' ')
  supported=${supported% }
  if [ -n "${KUBETRAIN_CPU_LEVEL:-}" ]; then
    case " $supported " in
      *" $KUBETRAIN_CPU_LEVEL "*) level=$KUBETRAIN_CPU_LEVEL ;;
      *) echo "$name: KUBETRAIN_CPU_LEVEL=$KUBETRAIN_CPU_LEVEL: this CPU supports only: ${supported:-none of x86-64-v2/v3/v4}" >&2
         exit 2 ;;
    esac
  else
    for l in $supported; do [ -d "$lib/$l" ] && level=$l; done
  fi
  if [ -z "$level" ]; then
    echo "$name: this CPU lacks x86-64-v2 (SSE4.2, POPCNT), the oldest level this image has" >&2
    exit 2
  fi
else
  for d in "$lib"/*/; do level=$(basename "$d"); done
fi
if [ "${KUBETRAIN_CPU_LEVEL_QUIET:-0}" != 1 ]; then
  echo "$name: running the $level build (CPU levels: ${supported:-n/a})" >&2
fi
export KUBETRAIN_CPU_LEVEL_QUIET=1
exec "$lib/$level/$name" "$@"
