# shellcheck shell=bash
# --against REV for the benchmark wrappers (tests/bench/step, tests/bench/transport;
# tests/bench/example uses bench_against_prepare alone):
# the same benchmark built from REV, side by side, run alternately with this
# tree's, then the medians compared. Sourced by a wrapper, which calls
#   bench_against TARGET HEADLINE_KEYS "$@"
# with $root (the clone) and $BAZEL set. Without --against in the arguments it
# returns at once and the wrapper goes on as before; with it, it never returns.
#   TARGET          the bench binary's name in //tests/bench (step_bench, ...)
#   HEADLINE_KEYS   keys of the bench's last line for the summary line, the
#                   first one also as <key without unit>_vs_against = current / REV
# Flags it takes (all others go to both builds' benchmark):
#   --against REV          a git revision (sha, tag, HEAD~3, ...)
#   --rounds-against N     runs of each build (default 3), alternating
# REV's worktree lives in $KUBETRAIN_BENCH_AGAINST_DIR/<full sha> (default
# ~/.cache/kubetrain/bench-against) and is reused by later runs.

bench_against() {
  local target="$1" headline="$2"
  shift 2
  local rev="" rounds=3 want=0
  local -a pass=()
  while (($#)); do
    case "$1" in
      --against) want=1; rev="${2:-}"; shift $(($# > 1 ? 2 : 1)) ;;
      --against=*) want=1; rev="${1#*=}"; shift ;;
      --rounds-against) rounds="${2:-}"; shift $(($# > 1 ? 2 : 1)) ;;
      --rounds-against=*) rounds="${1#*=}"; shift ;;
      *) pass+=("$1"); shift ;;
    esac
  done
  ((want)) || return 0
  # From here on this function ends the wrapper's process: a subshell keeps
  # its traps and variables away from the wrapper's.
  (bench_against_run "$target" "$headline" "$rev" "$rounds" "${pass[@]+"${pass[@]}"}")
  exit $?
}

bench_against_fail() {
  echo "bench --against: $*" >&2
  exit 1
}

# bench_against_build DIR LOG CMD...: CMD in DIR, quiet; on failure its last
# 40 lines and exit.
bench_against_build() {
  local dir="$1" log="$2"
  shift 2
  # 9>&-: the lock's descriptor must not leak into a bazel server started
  # here (it daemonises and lives for hours): it would hold the lock after we
  # end and the next bench --against would wait for it forever.
  if ! (cd "$dir" && "$@" 9>&-) >"$log" 2>&1; then
    echo "bench --against: '$*' failed in $dir:" >&2
    tail -n 40 "$log" >&2
    return 1
  fi
}

# bench_against_prepare TARGET REV TMP: REV's worktree (created or reused) and
# both trees built (make build, and //tests/bench:TARGET unless TARGET is
# empty); copies of each build's bin/kubetrain* (and TARGET) in TMP/current
# and TMP/against, so a rebuild of either tree during the runs cannot swap a
# binary under the comparison; REV's short sha in TMP/short.
bench_against_prepare() {
  local target="$1" rev="$2" tmp="$3"
  [[ -n "$rev" ]] || bench_against_fail "--against needs a git revision (e.g. --against HEAD~1)"
  local sha short
  sha="$(git -C "$root" rev-parse --verify --quiet "${rev}^{commit}")" ||
    bench_against_fail "'$rev' is not a commit of $root"
  short="$(git -C "$root" rev-parse --short "$sha")"
  printf '%s\n' "$short" >"$tmp/short"
  local cache="${KUBETRAIN_BENCH_AGAINST_DIR:-$HOME/.cache/kubetrain/bench-against}"
  local dir="$cache/$sha"
  mkdir -p "$cache"

  # One builder per revision at a time: two benches against the same REV
  # would otherwise race on its worktree and its bazel output base.
  exec 9>"$cache/$sha.lock"
  if ! flock -n 9; then
    echo "bench --against: waiting for another bench --against $short ($cache/$sha.lock)..." >&2
    flock 9
  fi

  if [[ -e "$dir" ]]; then
    local head
    head="$(git -C "$dir" rev-parse --verify --quiet HEAD 2>/dev/null || true)"
    [[ "$head" == "$sha" ]] ||
      bench_against_fail "$dir exists but is not a worktree of $short (HEAD: ${head:-none});" \
        "remove it with 'git worktree remove --force $dir' (or rm -rf it and 'git worktree prune')"
    # The worktree is a cache of REV's code: edits there would be measured as REV.
    if [[ -n "$(git -C "$dir" status --porcelain --untracked-files=no)" ]]; then
      echo "bench --against: warning: $dir has local changes; they are measured as $short" >&2
    fi
  else
    echo "bench --against: creating a worktree of $short in $dir" >&2
    git -C "$root" worktree add --detach "$dir" "$sha" >"$tmp/worktree.log" 2>&1 9>&- || {
      cat "$tmp/worktree.log" >&2
      bench_against_fail "could not create the worktree of $short in $dir"
    }
  fi
  # Old revisions may predate the benchmark: say so rather than let bazel fail.
  if [[ -n "$target" ]]; then
    grep -q "name = \"$target\"" "$dir/tests/bench/BUILD" 2>/dev/null ||
      bench_against_fail "$short has no //tests/bench:$target (it came later); pick a newer revision"
  fi

  echo "bench --against: building this tree (make build${target:+, $BAZEL build //tests/bench:$target})..." >&2
  bench_against_build "$root" "$tmp/build.log" make build BAZEL="$BAZEL"
  if [[ -n "$target" ]]; then
    bench_against_build "$root" "$tmp/build.log" "$BAZEL" build "//tests/bench:$target"
  fi
  echo "bench --against: building $short in $dir (the first time takes minutes: a new bazel" \
    "output base, the disk cache helps)..." >&2
  bench_against_build "$dir" "$tmp/build.log" make build BAZEL="$BAZEL" ||
    bench_against_fail "$short does not build (its own code or deps, see above)"
  if [[ -n "$target" ]]; then
    bench_against_build "$dir" "$tmp/build.log" "$BAZEL" build "//tests/bench:$target" ||
      bench_against_fail "$short's //tests/bench:$target does not build (see above)"
  fi

  # Copies of both builds' binaries: a rebuild of either tree while the rounds
  # run (someone editing) cannot swap a binary under the comparison.
  local side bin_dir src
  for side in current against; do
    if [[ "$side" == current ]]; then src="$root"; else src="$dir"; fi
    mkdir -p "$tmp/$side"
    cp -L "$src"/bin/kubetrain* "$tmp/$side/"
    if [[ -n "$target" ]]; then
      bin_dir="$(cd "$src" && "$BAZEL" info bazel-bin 2>/dev/null 9>&-)"
      cp "$bin_dir/tests/bench/$target" "$tmp/$side/"
    fi
  done
  # REV's bazel server is not needed any more: end it so its memory does not
  # sit idle for hours next to the runs (bazel's default idle timeout is 3 h).
  (cd "$dir" && "$BAZEL" shutdown 9>&-) >/dev/null 2>&1 || true
  exec 9>&-
}

bench_against_run() {
  set -euo pipefail
  local target="$1" headline="$2" rev="$3" rounds="$4"
  shift 4
  local -a pass=("$@")
  [[ "$rounds" =~ ^[1-9][0-9]*$ ]] ||
    bench_against_fail "--rounds-against needs a positive integer, got '$rounds'"

  local tmp short
  tmp="$(mktemp -d -t kubetrain-bench-against.XXXXXX)"
  # shellcheck disable=SC2064  # $tmp is fixed now; expand it now
  trap "rm -rf '$tmp'" EXIT
  bench_against_prepare "$target" "$rev" "$tmp"
  short="$(cat "$tmp/short")"

  # Alternate the builds so load drifts on the (shared) machine hit both alike.
  local i out
  for ((i = 1; i <= rounds; i++)); do
    for side in current against; do
      out="$tmp/$side-$i.out"
      if ! "$tmp/$side/$target" --ps_binary="$tmp/$side/kubetrain-ps" \
        "${pass[@]+"${pass[@]}"}" >"$out"; then
        echo "bench --against: the $side build's run $i failed (exit code above); its output:" >&2
        tail -n 40 "$out" >&2
        exit 1
      fi
      # The last line with a key=value pair is the bench's machine-readable one.
      local last
      last="$(grep -E '^[A-Za-z_][A-Za-z0-9_]*=' "$out" | tail -n 1 || true)"
      [[ -n "$last" ]] || bench_against_fail "the $side build's run $i printed no key=value line"
      printf '%s\n' "$last" >"$tmp/$side-$i.kv"
      if [[ "$side" == current ]]; then
        printf 'current %d/%d: %s\n' "$i" "$rounds" "$last"
      else
        printf '%s %d/%d: %s\n' "$short" "$i" "$rounds" "$last"
      fi
    done
  done

  # The comparison: the median of each numeric key over the runs of each build.
  local -a files=()
  for ((i = 1; i <= rounds; i++)); do
    files+=("$tmp/current-$i.kv" "$tmp/against-$i.kv")
  done
  awk -v short="$short" -v rounds="$rounds" -v headline="$headline" '
    function median(side, key,    n, i, j, v, a) {
      n = cnt[side, key]
      for (i = 1; i <= n; i++) a[i] = val[side, key, i]
      for (i = 2; i <= n; i++) {  # insertion sort: a handful of values, no gawk asort
        v = a[i]
        for (j = i - 1; j >= 1 && a[j] > v; j--) a[j + 1] = a[j]
        a[j + 1] = v
      }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function fmt(x) { return sprintf("%.6g", x) }
    function ratio(c, r) { return r != 0 ? sprintf("%.3f", c / r) : "-" }
    {
      side = FILENAME ~ /\/current-[0-9]+\.kv$/ ? "current" : "against"
      for (f = 1; f <= NF; f++) {
        eq = index($f, "=")
        if (eq < 2) continue
        key = substr($f, 1, eq - 1); v = substr($f, eq + 1)
        # Only numbers have a median; anything else (a name, a path) is left out.
        if (v !~ /^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$/) continue
        if (!((side, key) in cnt)) {
          cnt[side, key] = 0
          order[side, ++nkeys[side]] = key
        }
        val[side, key, ++cnt[side, key]] = v + 0
      }
    }
    END {
      printf "\nmedians of %d runs each (current/%s: < 1 means a smaller figure now)\n", rounds, short
      printf "%-22s %14s %14s %12s\n", "key", "current", short, "current/" short
      for (k = 1; k <= nkeys["current"]; k++) {
        key = order["current", k]
        if (!(("against", key) in cnt)) { only_current = only_current " " key; continue }
        c = median("current", key); r = median("against", key)
        med["current", key] = c; med["against", key] = r; both[key] = 1
        printf "%-22s %14s %14s %12s\n", key, fmt(c), fmt(r), ratio(c, r)
      }
      for (k = 1; k <= nkeys["against"]; k++) {
        key = order["against", k]
        if (!(("current", key) in cnt)) only_against = only_against " " key
      }
      if (only_current != "") printf "only in current:%s\n", only_current
      if (only_against != "") printf "only in %s:%s\n", short, only_against
      # The summary line: the headline keys both builds have (never fail on a
      # missing one: old revisions print fewer keys).
      line = ""
      n = split(headline, keys, " ")
      for (k = 1; k <= n; k++) {
        key = keys[k]
        if (!(key in both)) continue
        c = med["current", key]; r = med["against", key]
        line = line sprintf(" %s=%s against_%s=%s", key, fmt(c), key, fmt(r))
        if (k == 1) {
          base = key; sub(/_(ms|us|gbps)$/, "", base)
          line = line sprintf(" %s_vs_against=%s", base, ratio(c, r))
        }
      }
      printf "%srev=%s rounds=%d\n", (line == "" ? "" : substr(line, 2) " "), short, rounds
    }
  ' "${files[@]}"
}
