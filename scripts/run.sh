#!/usr/bin/env bash
# Set-up, fetch the default model if missing, then show it: what kvgen knows about the model and its KV cache.
# Extra arguments go to kvgen.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    echo "usage: scripts/run.sh [KVGEN ARGS...]"
    exit 0
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh
models/fetch-default.sh
build/kvgen -m models/SmolLM2-135M-Instruct.Q4_1.gguf --inspect "$@"
