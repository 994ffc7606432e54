#!/usr/bin/env bash
# The house's C++ format (.clang-format at the root), checked on every .cc/.h
# file git knows of. `make format` applies it.
#   tests/lint/format.sh          check; exits 1 naming each file that differs
#   tests/lint/format.sh --fix    rewrite the files in place
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v clang-format >/dev/null || { echo "format: clang-format not found (make deps installs it)" >&2; exit 1; }
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.cc' '*.h' | grep -v '^third_party/')
if [ "${1:-}" = --fix ]; then
  clang-format -i "${files[@]}"
  echo "format: applied to ${#files[@]} files"
  exit 0
fi
fail=0
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "format: $f differs from .clang-format (run: make format)" >&2
    fail=1
  fi
done
[ "$fail" = 0 ] && echo "format: ok (${#files[@]} files)"
exit "$fail"
