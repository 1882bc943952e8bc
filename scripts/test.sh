#!/usr/bin/env bash
# The test suite: set up the project's virtual environment (idempotent) and run pytest.
# Extra arguments go to pytest (e.g. `-m slow` for the slow tests, `-k resume`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec "$root/.venv/bin/python" -m pytest "$@"
