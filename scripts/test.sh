#!/usr/bin/env bash
# Set-up, build, fetch the default model, then every test through CTest. Non-zero on any failure.
# CUDA tests skip, with the reason printed, where no GPU is visible.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    echo "usage: scripts/test.sh [CTEST ARGS...]   (e.g. -R gguf, -L cuda)"
    exit 0
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh
models/fetch-default.sh
build_dir=${KVGEN_BUILD_DIR:-build}
ctest --test-dir "$build_dir" --output-on-failure --no-tests=error -j "$(nproc)" "$@"
# CTest shows a skipped test without its reason: say why the [cuda] tests did not run.
cuda_tests="$build_dir/tests/kvgen_cuda_tests"
if [[ -x $cuda_tests ]]; then
    reason=$("$cuda_tests" --list-test-names-only 2>&1 | head -n 1) || true
    [[ $reason == SKIP* ]] && echo "$reason"
fi
exit 0
