#!/usr/bin/env bash
# The house's layering rule, checked on every include: ps/, worker/, cli/ and
# operator/ never include one another, and core/ includes none of them. The one
# exception is the PS's published channel API, which worker/ builds on
# (ps/shard_channel.h; in tests also the in-process PS). Bazel visibility
# enforces the same on BUILD deps; this also catches transitive includes.
set -euo pipefail
cd "$(dirname "$0")/../.."
fail=0
for dir in core ps worker cli operator; do
  while IFS= read -r hit; do
    file=${hit%%:*}
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"${hit#*:}")
    target=${inc%%/*}
    [ "$target" = "$dir" ] && continue
    case "$target" in ps|worker|cli|operator) ;; *) continue ;; esac
    if [ "$dir" = worker ] && [ "$inc" = ps/shard_channel.h ]; then continue; fi
    if [ "$dir" = worker ] && [ "$inc" = ps/in_process_shard_channel.h ] &&
       [[ "$file" == *_test.cc || "$file" == worker/testing* ]]; then continue; fi
    echo "layering: $file includes $inc ($dir/ may not depend on $target/)" >&2
    fail=1
  done < <(grep -rHn --include='*.h' --include='*.cc' -E '^#include "(ps|worker|cli|operator)/' "$dir" | cut -d: -f1,3-)
done
[ "$fail" = 0 ] && echo "layering: ok (core, ps, worker, cli, operator)"
exit "$fail"
