#!/usr/bin/env bash
# make venv: the project's virtualenv, made by a Python the pinned packages accept.
#
# Why a script and not `python3 -m venv .venv`: Ubuntu 22.04's python3 (README step 1's apt line)
# is 3.10, and pip then stops on a pinned wheel's Requires-Python (rpds-py, pycparser: >=3.11)
# with a message that names neither the interpreter nor the fix; the half-made .venv stayed, and
# the next `make up` reused it even after a newer Python was installed. So the interpreter is
# checked before anything is created, and a virtualenv made by another (too old or gone) Python
# is rebuilt.
#
# Usage: scripts/make-venv.sh PYTHON VENV
set -euo pipefail
python=${1:?usage: make-venv.sh PYTHON VENV}
venv=${2:?usage: make-venv.sh PYTHON VENV}
need=3.11  # pyproject.toml's ruff target-version; requirements.txt's wheels say >=3.11

version_of() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}

new_enough() {
  [ "$(printf '%s\n' "$need" "$1" | sort -V | head -n 1)" = "$need" ]
}

how_to_get_it() {
  local found="" candidate version
  for candidate in python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null && version=$(version_of "$candidate") && new_enough "$version"; then
      found=$candidate
      break
    fi
  done
  if [ -n "$found" ]; then
    echo "  $found is installed here: make up PYTHON=$found   (or: export PYTHON=$found)"
  fi
  echo "  Debian 12:     sudo apt-get install -y python3-venv   (its python3 is 3.11)"
  echo "  Ubuntu 22.04:  sudo apt-get install -y python3.11 python3.11-venv   then: make up PYTHON=python3.11"
  echo "  Ubuntu 24.04:  sudo apt-get install -y python3-venv   (its python3 is 3.12)"
  echo "  macOS:         brew install python@3.12   then: make up PYTHON=python3.12"
}

if [ -e "$venv/bin/python" ] || [ -L "$venv/bin/python" ]; then
  if have=$(version_of "$venv/bin/python") && new_enough "$have"; then
    exit 0
  fi
  echo "make: $venv was made by Python ${have:-that is no longer installed}; this project needs $need or newer:" \
       "removing it and making it again" >&2
  rm -rf "$venv"
fi

if ! version=$(version_of "$python"); then
  echo "make: no Python at PYTHON=$python; this project needs Python $need or newer with venv:" >&2
  how_to_get_it >&2
  exit 2
fi
if ! new_enough "$version"; then
  echo "make: $python is Python $version; this project's pinned packages need Python $need or newer" \
       "(nothing was created):" >&2
  how_to_get_it >&2
  exit 2
fi
if ! "$python" -m venv "$venv"; then
  rm -rf "$venv"
  echo "make: $python -m venv failed (nothing was kept). On Debian and Ubuntu the venv module is its own" \
       "package: sudo apt-get install -y python$version-venv" >&2
  exit 2
fi
