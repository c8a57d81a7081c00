#!/usr/bin/env bash
# Fuzzes the GGUF parser (and the config, weight binding and tokenizer behind it) and --tokenize's text path with
# libFuzzer, AddressSanitizer and UBSan, each target for SECONDS. Fails on any crash, leak, timeout or sanitizer
# report; the input that caused it is kept in build-fuzz/findings/ (turn it into a test in tests/data/fuzz/).
# usage: scripts/fuzz.sh [SECONDS] [gguf|tokenize]    (default: 60 seconds, both targets)
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
seconds=${1:-60}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "fuzz.sh: error: SECONDS must be a number" >&2; exit 1; }
targets=(gguf tokenize)
[[ -n ${2:-} ]] && targets=("$2")
[[ ${targets[0]} == gguf || ${targets[0]} == tokenize ]] ||
    { echo "fuzz.sh: error: unknown target '${targets[0]}' (gguf or tokenize)" >&2; exit 1; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# The test-data folder the seeds come from, where the tests and gpu-check.sh look for it.
shared=""
for d in "${KVGEN_SHARED:-}" ../shared shared .shared; do
    if [[ -n $d && -d $d/testdata ]]; then shared=$(cd "$d" && pwd); break; fi
done
[[ -n $shared ]] || { echo "fuzz.sh: error: no test-data folder with testdata/ (set KVGEN_SHARED)" >&2; exit 1; }
scripts/setup.sh --no-build
missing=()
for p in clang libclang-rt-14-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "fuzz: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
build="build-fuzz"
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVGEN_CUDA=OFF \
    -DKVGEN_FUZZ=ON -DBUILD_TESTING=OFF -DKVGEN_SANITIZE=address,undefined >"$build.log" 2>&1 ||
    { cat "$build.log" >&2; exit 1; }
rm -f "$build.log"
cmake --build "$build" -j "$(nproc)" --target fuzz_gguf fuzz_tokenize
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/gguf" "$tmp/tokenize" "$build/findings"
# Seeds: the head of every shared GGUF file (metadata and tensor infos live there), the all-types fixture and
# earlier findings; every golden tokenizer test string.
for f in "$shared"/testdata/*/*.gguf; do head -c 65536 "$f" >"$tmp/gguf/$(basename "$f")"; done
cp tests/data/dequant_golden.bin "$tmp/gguf/"
cp tests/data/fuzz/* "$tmp/gguf/" 2>/dev/null || true
python3 - "$shared/testdata/vocab" "$tmp/tokenize" <<'PY'
import glob, os, sys
n = 0
for inp in glob.glob(os.path.join(sys.argv[1], "*.inp")):
    for case in open(inp, "rb").read().split(b"\n__ggml_vocab_test__\n")[:-1]:
        open(os.path.join(sys.argv[2], f"case{n}"), "wb").write(case)
        n += 1
PY
export ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
for t in "${targets[@]}"; do
    echo "fuzz: fuzz_$t for $seconds s" >&2
    "$build/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="$build/findings/" "$tmp/$t" 2>"$tmp/$t.log" || {
        tail -n 60 "$tmp/$t.log" >&2
        echo "fuzz: fuzz_$t found a problem; the input is in $build/findings/" >&2
        exit 1
    }
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$tmp/$t.log" | sed "s/^/fuzz: fuzz_$t /" >&2
done
echo "fuzz: no findings" >&2
