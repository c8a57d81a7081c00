#!/usr/bin/env bash
# scripts/lib/bench.sh's run_context under the benchmark scripts' set -euo pipefail, on a /proc/cpuinfo as a container
# on a large host shows it (hundreds of CPUs, 300 KiB): it returns, with the first CPU's model and flags.
# Usage: bench_lib_test.sh REPO_ROOT
set -euo pipefail
root=$1
# shellcheck source=../scripts/lib/bench.sh source-path=SCRIPTDIR
source "$root/scripts/lib/bench.sh"
machine=""
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cpu_flags="fpu vme sse2 avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni $(printf 'x%d ' {1..200})"
for ((i = 0; i < 256; i++)); do
    printf 'processor\t: %d\nmodel name\t: Test CPU %d\nflags\t\t: %s\n\n' "$i" "$i" "$cpu_flags"
done >"$tmp/cpuinfo"
run_context "$root" "$tmp/cpuinfo"
want="Test CPU 0, "
[[ $machine == "$want"* ]] || { echo "FAIL: machine is '$machine', want it to start with '$want'"; exit 1; }
[[ $machine == *"CPU flags: avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni" ]] ||
    { echo "FAIL: machine is '$machine', want the flags of the first CPU"; exit 1; }
# no cpuinfo at all: the machine line still comes, from uname
run_context "$root" "$tmp/missing"
[[ $machine == "$(uname -m), "* ]] || { echo "FAIL: without cpuinfo, machine is '$machine'"; exit 1; }
echo "PASS: run_context on 256 CPUs and without cpuinfo"
