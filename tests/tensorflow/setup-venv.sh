#!/usr/bin/env bash
# A cached virtualenv with TensorFlow (CPU) and tf-keras for `make tf-compat-test`, in
# $KUBETRAIN_CACHE/tf-venv (default ~/.cache/kubetrain). About 2 GiB and a few minutes the first
# time (PyPI); nothing when it is there. Prints the venv's python on stdout.
set -euo pipefail
TF_VERSION="${TF_VERSION:-2.21.0}"
cache="${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}"
venv="$cache/tf-venv"
py=/usr/bin/python3
[ -x "$py" ] || py="$(command -v python3)"
want="tensorflow-cpu==$TF_VERSION tf-keras==$TF_VERSION"
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.kubetrain-packages" 2>/dev/null)" = "$want" ]; then
  echo "$venv/bin/python"; exit 0
fi
if ! "$py" -c 'import ensurepip' 2>/dev/null; then
  echo "setup-venv: installing python3-venv" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv >&2
fi
echo "setup-venv: $want into $venv (from PyPI)" >&2
rm -rf "$venv"
"$py" -m venv "$venv"
# shellcheck disable=SC2086
"$venv/bin/pip" install -q --disable-pip-version-check $want >&2
echo "$want" >"$venv/.kubetrain-packages"
echo "$venv/bin/python"
