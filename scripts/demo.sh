#!/usr/bin/env bash
# The main job: set up the project's virtual environment (idempotent) and run `swarm demo` — a
# short swarm run on the embedded defaults (private Ray head on 127.0.0.1, sqlite, a local git
# workspace, built-in policies unless an LLM is configured) where the run starts badly, the swarm
# diagnoses and fixes it, and the goal is reached. The report's path is printed at the end.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec "$root/.venv/bin/swarm" demo "$@"
