#!/usr/bin/env bash
# Builds kvgen with AddressSanitizer and UBSan (CPU only, into build-asan/) and runs the whole test suite there.
# usage: scripts/sanitize.sh [CTEST ARGS...]
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    sed -n '2,3p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh --no-build
models/fetch-default.sh
# note: warnings stay warnings here: the instrumented -O2 build makes GCC 12 report false -Wmaybe-uninitialized
# inside libstdc++ (<regex>, through Catch2). The plain build in scripts/test.sh is the one held to -Werror.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVGEN_CUDA=OFF \
    -DKVGEN_SANITIZE=address,undefined -DKVGEN_WERROR=OFF >build-asan.log 2>&1 ||
    { cat build-asan.log >&2; exit 1; }
rm -f build-asan.log
cmake --build build-asan -j "$(nproc)"
# note: allocator_may_return_null lets the "KV cache too large" test see a failed allocation, as a plain build does.
export ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
ctest --test-dir build-asan --output-on-failure -j "$(nproc)" "$@"
