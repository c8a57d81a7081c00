#!/usr/bin/env bash
# What the KV cache buys: the total time to generate N tokens from one short prompt with the cache and with
# --no-kv-cache, for each N in --lengths, plus the latency of every generated token.
#
# usage: scripts/bench-kv.sh [MODEL.gguf] [--device cpu|cuda|auto] [--lengths 64,128,256,512] [--runs 3]
#                            [--nocache-runs 1] [--threads T] [--out DIR]
#
# Each run generates the longest length from the prompt "The key-value cache of a transformer" (greedy,
# --ignore-eos) and reports every token's latency (--json token_ms); the total for a shorter length N is the same
# run's first N steps, which is exactly what a run of N tokens executes. Medians over --runs runs with the cache
# and --nocache-runs without it (recomputation is slow: about 7 minutes for 512 tokens of the default model on 2
# cores). The first run of each mode also dumps its logits (--dump-logits, outside the timed steps): where the cached
# and recomputed tokens first part, results.md gives that step, the cached run's top-2 logit margin there and the
# largest logit difference between the two runs, so a near-tie decided by rounding reads apart from a cache error.
# Writes to DIR (default bench-kv-out):
#   run.md             the command, each kvgen run's command line, prompt, date, commit and machine
#   results.md         run.md, then the table; results.csv the same table
#   token-latency.csv  per generated token: the median latency over the runs with the cache, and without
#   total-time.png     total time against N, both axes log scale (gnuplot; without it, no plots)
#   token-latency.png  the per-token medians, log-scale latency
# Plot titles name the model, the machine and the commit. KVGEN_BIN names another build's kvgen.
set -euo pipefail

usage() { sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; }
# shellcheck source=lib/bench.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib/bench.sh"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
invocation=$(words scripts/bench-kv.sh "$@")
[[ -n ${KVGEN_BIN:-} ]] && invocation="KVGEN_BIN=$(words "$KVGEN_BIN") $invocation"
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" device=cpu lengths=64,128,256,512 runs=3 nocache_runs=1
threads="" out="bench-kv-out"
while (($#)); do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --device) need_value "$@"; device=$2; shift 2 ;;
        --lengths) need_value "$@"; lengths=$2; shift 2 ;;
        --runs) need_value "$@"; runs=$2; shift 2 ;;
        --nocache-runs) need_value "$@"; nocache_runs=$2; shift 2 ;;
        --threads) need_value "$@"; threads=$2; shift 2 ;;
        --out) need_value "$@"; out=$2; shift 2 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) model=$1; shift ;;
    esac
done
kvgen="${KVGEN_BIN:-$root/build/kvgen}"  # KVGEN_BIN: another build's binary
[[ -x $kvgen ]] || die "$kvgen missing: run scripts/setup.sh"
[[ -f $model ]] || die "model '$model' not found (models/fetch-default.sh fetches the default)"
command -v python3 >/dev/null || die "python3 is required"
plots=1
if ! command -v gnuplot >/dev/null; then
    plots=0
    echo "bench-kv.sh: gnuplot is not installed (scripts/setup.sh installs it): tables only, no plots" >&2
fi
[[ $lengths =~ ^[0-9]+(,[0-9]+)*$ && ! ,$lengths, =~ ,0*[01], ]] ||
    die "--lengths takes numbers of at least 2, like 64,128,256"
[[ $runs =~ ^[1-9][0-9]*$ && $nocache_runs =~ ^[1-9][0-9]*$ ]] || die "--runs takes a number >= 1"
max=$(tr ',' '\n' <<<"$lengths" | sort -n | tail -n 1)
mkdir -p "$out"
rm -f "$out/total-time.png" "$out/token-latency.png"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The machine and the source, for run.md and the plot titles.
run_context "$root"
if [[ $device != cpu ]] && command -v nvidia-smi >/dev/null; then
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)
    [[ -n $driver ]] && machine+="; NVIDIA driver $driver"
fi

prompt="The key-value cache of a transformer"
args=(-m "$model" -p "$prompt" -n "$max" --ignore-eos --temp 0 --device "$device" --no-perf -c $((max + 64)))
[[ -n $threads ]] && args+=(-t "$threads")
shown=("${args[@]}")
shown[1]=${model#"$root/"}
run_line="$(words "${kvgen#"$root/"}" "${shown[@]}") [--no-kv-cache] --json RUN.json [--dump-logits RUN.f32]"
t0=$SECONDS
for mode in cache nocache; do
    n=$runs flag=()
    [[ $mode == nocache ]] && n=$nocache_runs flag=(--no-kv-cache)
    for ((r = 1; r <= n; r++)); do
        echo "bench-kv: $mode run $r/$n: $max tokens" >&2
        start=$SECONDS
        # The first run of each mode keeps its logits for the parting analysis; token_ms leaves the write out.
        dump=()
        ((r == 1)) && dump=(--dump-logits "$tmp/$mode-1.f32")
        "$kvgen" "${args[@]}" "${flag[@]}" "${dump[@]}" --json "$tmp/$mode-$r.json" >/dev/null 2>"$tmp/err" ||
            { cat "$tmp/err" >&2; exit 1; }
        echo "bench-kv: $mode run $r/$n done in $((SECONDS - start)) s" >&2
    done
done
elapsed=$((SECONDS - t0))

python3 - "$tmp" "$out" "$lengths" "$runs" "$nocache_runs" "$model" "$invocation" "$run_line" "$prompt" "$date" \
    "$commit" "$machine" "$((elapsed / 60)) min $((elapsed % 60)) s" <<'PY'
import array, heapq, json, operator, os, statistics, sys
tmp, out, lengths, runs, nc_runs, model, invocation, run_line, prompt, date, commit, machine, took = sys.argv[1:14]
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
first = cache[0]


# Where the first cached run and the first recomputed run part, read from their logits (float32 rows of n_vocab, one
# per generated token; row i is what token i was chosen from). Rows up to the parting step come from the same tokens,
# so their differences are the two paths' arithmetic alone. Standard library only (array), row by row.
def rows_of(path, n_tokens):
    size = os.path.getsize(path)
    n_vocab = size // 4 // max(1, n_tokens)
    with open(path, "rb") as f:
        for _ in range(n_tokens):
            a = array.array("f")
            a.fromfile(f, n_vocab)
            if sys.byteorder != "little":
                a.byteswap()
            yield a


def parting(c_run, u_run):
    tc, tu = c_run["tokens"], u_run["tokens"]
    n = min(len(tc), len(tu))
    part = next((i for i in range(n) if tc[i] != tu[i]), None)
    last = part if part is not None else n - 1
    d_all = d_at = scale = 0.0
    for i, (a, b) in enumerate(zip(rows_of(f"{tmp}/cache-1.f32", len(tc)), rows_of(f"{tmp}/nocache-1.f32", len(tu)))):
        if i > last:
            break
        d = max(map(abs, map(operator.sub, a, b)))
        d_all, d_at = max(d_all, d), d
        scale = max(scale, max(a), -min(a))
        if i == last:
            top = heapq.nlargest(2, a)
            margin = top[0] - top[1] if len(top) == 2 else 0.0
    rel = d_all / scale if scale else 0.0
    p = {"tokens": n, "part_at": None if part is None else part + 1, "max_diff": d_all, "max_diff_at_part": d_at,
         "largest_logit": scale, "relative_diff": rel}
    if part is None:
        p["text"] = (f"Cached vs recomputed: the same {n} tokens; their logits differ by at most {d_all:.3g} "
                     f"({rel:.1e} of the largest logit, {scale:.3g}).")
        return p
    p["top2_margin"] = margin
    # note: greedy runs part only where the cached top-2 margin is at most twice the logit difference, so the
    # margin alone proves nothing; what tells rounding from a cache error is how small the differences are on every
    # step up to the parting, against the size of the logits.
    verdict = ("arithmetic at a near-tie (the cached step and the recomputation round differently), not a cache error"
               if rel < 1e-2 else "the logits differ by more than rounding: look for a cache error")
    p["text"] = (f"Cached vs recomputed: the tokens part at generated token {part + 1} of {n}, where the cached run's "
                 f"top-2 logit margin is {margin:.3g} and the two runs' logits differ by at most {d_at:.3g} (at most "
                 f"{d_all:.3g} on tokens 1-{part + 1}, {rel:.1e} of the largest logit, {scale:.3g}): {verdict}.")
    return p


part = parting(cache[0], nocache[0])
agree = lambda runs: all(r["tokens"] == runs[0]["tokens"] for r in runs)
with open(f"{out}/run.md", "w") as f:
    f.write(f"- command: `{invocation}`\n"
            f"- each run: `{run_line}`\n"
            f"- prompt: \"{prompt}\" ({len(first['prompt_tokens'])} tokens), greedy, {lengths[-1]} tokens generated\n"
            f"- date: {date}; the whole script took {took}\n"
            f"- commit: {commit}\n"
            f"- machine: {machine}; kvgen ran on {first['device_name']}\n")
with open(f"{out}/results.csv", "w") as f:
    f.write("tokens,kv_cache_s,no_kv_cache_s,speedup\n")
    for n, c, u, s in rows:
        f.write(f"{n},{c:.4f},{u:.4f},{s:.3f}\n")
with open(f"{out}/results.md", "w") as f:
    f.write(f"# KV cache benchmark: {os.path.basename(model)}\n\n")
    f.write(open(f"{out}/run.md").read())
    f.write(f"\nMedians of {runs} runs with the cache and {nc_runs} without. Each length is the first N steps of a "
            f"{lengths[-1]}-token run.\n\n")
    f.write("| tokens generated | with KV cache | without (`--no-kv-cache`) | speed-up |\n|---:|---:|---:|---:|\n")
    for n, c, u, s in rows:
        f.write(f"| {n} | {c:.2f} s | {u:.2f} s | {s:.1f}x |\n")
    n, c, u, s = rows[-1]
    f.write(f"\n{n} tokens: {u:.1f} s vs {c:.1f} s, {s:.1f}x. Identical tokens in every run: {'yes' if same else 'no'}"
            f" (runs with the cache agree among themselves: {'yes' if agree(cache) else 'no'}; without: "
            f"{'yes' if agree(nocache) else 'no'}).\n\n{part['text']}\n\n")
    f.write("![total time](total-time.png)\n\n![per-token latency](token-latency.png)\n")
# Per generated token, the median over runs; the first token (its latency includes the prefill) is left out.
with open(f"{out}/token-latency.csv", "w") as f:
    f.write("token,kv_cache_ms,no_kv_cache_ms\n")
    for i in range(1, lengths[-1]):
        c = statistics.median(r["token_ms"][i] for r in cache)
        u = statistics.median(r["token_ms"][i] for r in nocache)
        f.write(f"{i + 1},{c:.3f},{u:.3f}\n")
# Titles for gnuplot: double-quoted strings (backslashes and quotes escaped), lines joined by \n.
q = lambda *lines: '"' + "\\n".join(l.replace("\\", "\\\\").replace('"', '\\"') for l in lines) + '"'
where = first["device_name"] if first["device"] != "cpu" else f"{machine.split(';')[0]}, {first['device_name']}"
sub = f"{where}, commit {commit}, {date[:10]}"
runs_word = lambda k: f"median of {k} runs" if int(k) > 1 else "1 run"
with open(f"{tmp}/titles.gp", "w") as f:
    name = os.path.basename(model)
    f.write(f"total_title = {q(f'Total time to generate N tokens: {name}', sub)}\n"
            f"latency_title = {q(f'Latency of each generated token: {name}', sub)}\n"
            f"cache_runs = {q(runs_word(runs))}\nnocache_runs = {q(runs_word(nc_runs))}\n")
PY

((plots)) || sed -i '/\.png)$/d' "$out/results.md"
cat "$out/results.md"
if ((!plots)); then
    echo "bench-kv: wrote $out/run.md, results.csv, results.md, token-latency.csv" >&2
    exit 0
fi
term="pngcairo size 900,560 font 'sans,11'"
gnuplot -e "set terminal $term" -e "print ''" >/dev/null 2>&1 || term="png size 900,560"
gnuplot <<GP
load "$tmp/titles.gp"
set terminal $term noenhanced
set datafile separator ","
set key top left
set grid
set output "$out/total-time.png"
set title total_title
set xlabel "tokens generated (log scale)"
set ylabel "total time (s, log scale)"
set logscale xy
set xtics ($lengths)
set autoscale xfix
set offsets graph 0.05, graph 0.05, 0, 0
plot "$out/results.csv" using 1:3 every ::1 with linespoints lw 2 pt 7 title "without KV cache (--no-kv-cache), ".nocache_runs, \
     "$out/results.csv" using 1:2 every ::1 with linespoints lw 2 pt 5 title "with KV cache, ".cache_runs
unset logscale
unset offsets
set autoscale x
set xtics autofreq
set output "$out/token-latency.png"
set title latency_title
set xlabel "generated token (from the second: the first one's time includes the prefill)"
set ylabel "latency (ms per token, log scale)"
set logscale y
plot "$out/token-latency.csv" using 1:3 every ::1 with lines lw 2 title "without KV cache: recomputes the sequence, ".nocache_runs, \
     "$out/token-latency.csv" using 1:2 every ::1 with lines lw 2 title "with KV cache: one token through the cache, ".cache_runs
GP
echo "bench-kv: wrote $out/run.md, results.csv, results.md, token-latency.csv, total-time.png, token-latency.png" >&2
