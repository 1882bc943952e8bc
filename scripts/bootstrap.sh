#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install the project into it.
# Idempotent: re-running after a successful install only checks that the install is current.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${SWARM_VENV:-$root/.venv}"
py="${PYTHON:-python3}"
stamp="$venv/.swarmlab-installed"
want="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  echo "[bootstrap] creating virtual environment in $venv"
  "$py" -m venv "$venv"
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[bootstrap] installing swarmlab and its dependencies (first time: a few minutes)"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -c constraints.txt -e ".[test]"
  echo "$want" > "$stamp"
else
  echo "[bootstrap] environment up to date ($venv)"
fi
