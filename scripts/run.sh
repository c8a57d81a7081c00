#!/usr/bin/env bash
# Set-up, fetch the default model if missing, then one generation with the KV cache and the same one without it
# (--no-kv-cache), printing both timings. Arguments, when given, replace the default ones in both kvgen runs.
set -euo pipefail
default_args=(--chat -p "What is the capital of France? Answer in two sentences." -n 64 --temp 0)
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    echo "usage: scripts/run.sh [KVGEN ARGS...]   (default: ${default_args[*]:0:2} '${default_args[2]}' ${default_args[*]:3})"
    exit 0
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh >&2  # its progress on stderr: stdout carries only the generated text
models/fetch-default.sh
args=("$@")
if ((${#args[@]} == 0)); then args=("${default_args[@]}"); fi
kvgen="${KVGEN_BUILD_DIR:-build}/kvgen"
echo "== with the KV cache ==" >&2
"$kvgen" "${args[@]}"
echo >&2
echo "== without the KV cache (every step recomputes the whole sequence) ==" >&2
"$kvgen" --no-kv-cache "${args[@]}"
