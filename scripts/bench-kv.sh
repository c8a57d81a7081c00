#!/usr/bin/env bash
# What the KV cache buys: the total time to generate N tokens from one short prompt with the cache and with
# --no-kv-cache, for each N in --lengths, plus the latency of every generated token.
#
# usage: scripts/bench-kv.sh [MODEL.gguf] [--device cpu|cuda|auto] [--lengths 64,128,256,512] [--runs 3]
#                            [--nocache-runs 1] [--threads T] [--out DIR]
#
# Each run generates the longest length (greedy, --ignore-eos) and reports every token's latency (--json
# token_ms); the total for a shorter length N is the same run's first N steps, which is exactly what a run of N
# tokens executes. Medians over --runs runs with the cache and --nocache-runs without it (recomputation is slow:
# about 7 minutes for 512 tokens of the default model on 2 cores).
# Writes DIR/results.csv, DIR/results.md, DIR/total-time.png and DIR/token-latency.png (gnuplot; without it, the
# tables alone). KVGEN_BIN names another build's kvgen.
set -euo pipefail

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" device=cpu lengths=64,128,256,512 runs=3 nocache_runs=1
threads="" out="bench-kv-out"
while (($#)); do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --device) device=$2; shift 2 ;;
        --lengths) lengths=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --nocache-runs) nocache_runs=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -*) echo "bench-kv.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) model=$1; shift ;;
    esac
done
kvgen="${KVGEN_BIN:-$root/build/kvgen}"  # KVGEN_BIN: another build's binary
[[ -x $kvgen ]] || { echo "bench-kv.sh: $kvgen missing: run scripts/setup.sh" >&2; exit 1; }
[[ -f $model ]] || { echo "bench-kv.sh: model '$model' not found (models/fetch-default.sh fetches the default)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench-kv.sh: python3 is required" >&2; exit 1; }
plots=1
if ! command -v gnuplot >/dev/null; then
    plots=0
    echo "bench-kv.sh: gnuplot is not installed (scripts/setup.sh installs it): tables only, no plots" >&2
fi
[[ $lengths =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "bench-kv.sh: --lengths takes numbers like 64,128,256" >&2; exit 2; }
[[ $runs =~ ^[1-9][0-9]*$ && $nocache_runs =~ ^[1-9][0-9]*$ ]] || { echo "bench-kv.sh: --runs takes a number >= 1" >&2; exit 2; }
max=$(tr ',' '\n' <<<"$lengths" | sort -n | tail -n 1)
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

prompt="The key-value cache of a transformer"
args=(-m "$model" -p "$prompt" -n "$max" --ignore-eos --temp 0 --device "$device" --no-perf -c $((max + 64)))
[[ -n $threads ]] && args+=(-t "$threads")
for mode in cache nocache; do
    n=$runs flag=()
    [[ $mode == nocache ]] && n=$nocache_runs flag=(--no-kv-cache)
    for ((r = 1; r <= n; r++)); do
        echo "bench-kv: $mode run $r/$n: $max tokens" >&2
        start=$(date +%s)
        "$kvgen" "${args[@]}" "${flag[@]}" --json "$tmp/$mode-$r.json" >/dev/null 2>"$tmp/err" ||
            { cat "$tmp/err" >&2; exit 1; }
        echo "bench-kv: $mode run $r/$n done in $(($(date +%s) - start)) s" >&2
    done
done

python3 - "$tmp" "$out" "$lengths" "$runs" "$nocache_runs" "$model" "$device" <<'PY'
import json, os, statistics, sys, datetime, subprocess
tmp, out, lengths, runs, nc_runs, model, device = sys.argv[1:8]
lengths = sorted(int(x) for x in lengths.split(","))
load = lambda mode, n: [json.load(open(f"{tmp}/{mode}-{r}.json")) for r in range(1, int(n) + 1)]
cache, nocache = load("cache", runs), load("nocache", nc_runs)
def total_s(run, n):  # prefill + first n token latencies (token_ms[0] includes the prefill)
    return sum(run["token_ms"][:n]) / 1000.0
rows = []
for n in lengths:
    c = statistics.median(total_s(r, n) for r in cache)
    u = statistics.median(total_s(r, n) for r in nocache)
    rows.append((n, c, u, u / c))
same = all(r["tokens"] == cache[0]["tokens"] for r in cache + nocache)
with open(f"{out}/results.csv", "w") as f:
    f.write("tokens,kv_cache_s,no_kv_cache_s,speedup\n")
    for n, c, u, s in rows:
        f.write(f"{n},{c:.4f},{u:.4f},{s:.3f}\n")
first = cache[0]
with open(f"{out}/results.md", "w") as f:
    f.write(f"# KV cache benchmark: {os.path.basename(model)}\n\n")
    f.write(f"{datetime.date.today()}, device {first['device']}, {first['threads']} threads, prompt of "
            f"{len(first['prompt_tokens'])} tokens, greedy, medians of {runs} runs with the cache and {nc_runs} "
            f"without. Each length is the first N steps of a {lengths[-1]}-token run.\n\n")
    f.write("| tokens generated | with KV cache | without (`--no-kv-cache`) | speed-up |\n|---:|---:|---:|---:|\n")
    for n, c, u, s in rows:
        f.write(f"| {n} | {c:.2f} s | {u:.2f} s | {s:.1f}x |\n")
    n, c, u, s = rows[-1]
    f.write(f"\n{n} tokens: {u:.1f} s vs {c:.1f} s, {s:.1f}x. Identical tokens in every run: {same}.\n\n")
    f.write("![total time](total-time.png)\n\n![per-token latency](token-latency.png)\n")
with open(f"{tmp}/totals.dat", "w") as f:
    for n, c, u, s in rows:
        f.write(f"{n} {c} {u}\n")
# Per-token latency of the median-length run of each mode (the first run; token 0 includes the prefill).
for name, run in (("cache", cache[0]), ("nocache", nocache[0])):
    with open(f"{tmp}/lat-{name}.dat", "w") as f:
        for i, ms in enumerate(run["token_ms"][1:], start=1):
            f.write(f"{i} {ms}\n")
print(open(f"{out}/results.md").read())
PY

if ((!plots)); then
    sed -i '/total-time.png/d' "$out/results.md"
    echo "bench-kv: wrote $out/results.csv, results.md" >&2
    exit 0
fi
term="pngcairo size 900,560 font 'sans,11'"
gnuplot -e "set terminal $term" -e "print ''" >/dev/null 2>&1 || term="png size 900,560"
name=$(basename "$model")
gnuplot <<GP
set terminal $term noenhanced
set output "$out/total-time.png"
set title "Total time to generate N tokens: $name"
set xlabel "tokens generated"
set ylabel "total time (s)"
set key top left
set grid
plot "$tmp/totals.dat" using 1:3 with linespoints lw 2 pt 7 title "without KV cache (--no-kv-cache)", \
     "$tmp/totals.dat" using 1:2 with linespoints lw 2 pt 5 title "with KV cache"
set output "$out/token-latency.png"
set title "Latency of each generated token: $name"
set xlabel "token position (generated tokens)"
set ylabel "latency (ms per token, log scale)"
set logscale y
set key top left
plot "$tmp/lat-nocache.dat" using 1:2 with lines lw 2 title "without KV cache: recomputes the sequence", \
     "$tmp/lat-cache.dat" using 1:2 with lines lw 2 title "with KV cache: one token through the cache"
GP
echo "bench-kv: wrote $out/results.csv, results.md, total-time.png, token-latency.png" >&2
