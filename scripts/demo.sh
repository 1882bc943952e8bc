#!/usr/bin/env bash
# The main job: set up the project's virtual environment (idempotent) and run the demo goal —
# the built-in model learning 3-digit addition on CPU, with a live progress bar.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec "$root/.venv/bin/swarm" train examples/addition_sft.yaml --name "addition-sft-$(date +%Y%m%d-%H%M%S)" "$@"
