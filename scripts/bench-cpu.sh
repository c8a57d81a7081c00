#!/usr/bin/env bash
# CPU speed, as a markdown report on stdout:
#  0. how it was run: the command, date, commit, machine (CPU model, the flags kvgen's kernels use, the kernels
#     chosen), the models and the prompts;
#  1. the machine's memory read bandwidth (kvgen --bench-memory), the ceiling for decode;
#  2. prefill (P tokens) and decode (N tokens) tokens/s per model from `kvgen --bench` (random token ids, 3 runs
#     after a warm-up, avg ± stddev) in each --math mode (exact, the default, and fast: 8-bit activations), with
#     decode's weight bandwidth and its share of the measured ceiling; with more than one thread, decode on one
#     thread too, and what the threads gain;
#  3. how far each mode's logits are from the exact math (--math f32) on three fixed prompts: normalized RMS error of
#     the prompt's next-token logits (rms(mode - f32) / rms(f32 - mean)), the worst of the three;
#  4. the cost of --no-kv-cache: total time to generate G tokens with and without the cache (first model).
# With no MODEL arguments it benchmarks the default model and TinyLlama-1.1B-shaped Q4_K_M and Q8_0 files made on
# the spot with kvgen-synth (random weights, the default model's vocabulary).
# LLAMA_BENCH=path/to/llama-bench adds llama.cpp's figures, measured right after kvgen's on each model with the same
# prompt length, generation length, repetitions and threads, and a side-by-side table with the ratios. llama.cpp is
# not part of kvgen; build its llama-bench yourself.
# --rounds R repeats each model's measurements R times (kvgen's modes and llama-bench alternating) and reports each
# program's best round for prefill and for decode: on a shared machine other work only slows a run down, so the best
# of several interleaved rounds compares the programs more fairly than one run each.
# usage: scripts/bench-cpu.sh [--threads T] [--prompt P] [--gen N] [--nocache-gen G] [--rounds R] [MODEL.gguf ...]
set -euo pipefail
# shellcheck source=lib/bench.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib/bench.sh"
invocation=$(words scripts/bench-cpu.sh "$@")
threads=2 prompt_len=128 gen=64 nocache_gen=256 rounds=1 models=()
while (($#)); do
    case $1 in
        -h | --help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
        --threads) need_value "$@"; threads=$2; shift 2 ;;
        --prompt) need_value "$@"; prompt_len=$2; shift 2 ;;
        --gen) need_value "$@"; gen=$2; shift 2 ;;
        --nocache-gen) need_value "$@"; nocache_gen=$2; shift 2 ;;
        --rounds) need_value "$@"; rounds=$2; shift 2 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) models+=("$1"); shift ;;
    esac
done
for v in "--rounds $rounds" "--prompt $prompt_len" "--gen $gen" "--nocache-gen $nocache_gen" "--threads $threads"; do
    [[ ${v#* } =~ ^[1-9][0-9]*$ ]] || die "${v%% *} takes a positive integer, not '${v#* }'"
done
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export KVGEN="$root/build/kvgen"
kvgen="$root/build/kvgen" synth="$root/build/kvgen-synth" default="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
for tool in "$kvgen" "$synth"; do
    [[ -x $tool ]] || die "$tool missing: run scripts/setup.sh"
done
command -v python3 >/dev/null || die "python3 is required"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
made=""
if ((${#models[@]} == 0)); then
    [[ -f $default ]] || die "$default missing: run models/fetch-default.sh"
    models=("$default")
    for type in Q4_K_M Q8_0; do
        echo "bench-cpu: making a TinyLlama-1.1B-shaped $type file" >&2
        "$synth" tinyllama-1.1b --type "$type" --vocab "$default" -o "$tmp/tinyllama-1.1b-$type.gguf" 2>/dev/null
        models+=("$tmp/tinyllama-1.1b-$type.gguf")
    done
    made="; tinyllama-1.1b-TYPE.gguf made by \`build/kvgen-synth tinyllama-1.1b --type TYPE --vocab ${default#"$root/"} -o FILE\`"
fi
for m in "${models[@]}"; do [[ -f $m ]] || die "$m: no such file"; done
llama_bench=${LLAMA_BENCH:-}
if [[ -n $llama_bench && ! -x $llama_bench ]]; then
    echo "bench-cpu.sh: LLAMA_BENCH=$llama_bench is not an executable" >&2
    exit 1
fi

fid_prompts=("The key-value cache of a transformer" "Once upon a time, in a small village by the sea, there lived"
    "def fibonacci(n):")

# The machine and the source.
run_context "$root"

echo "bench-cpu: memory bandwidth" >&2
bw=$("$kvgen" --bench-memory -t "$threads" | sed -n 's/^memory read bandwidth: \([0-9.]*\) GB\/s.*/\1/p')
modes=(exact fast)
# best.json OUT IN...: of the runs IN (kvgen's or llama-bench's JSON), the one with the highest average for prefill and
# the one for decode
best() {
    python3 - "$@" <<'PY'
import json, sys
runs = [json.load(open(p)) for p in sys.argv[2:]]
out = []
for gen in (False, True):
    tests = [t for r in runs for t in r if (t["n_gen"] > 0) == gen and (t["n_prompt"] > 0) != gen]
    if tests:
        out.append(max(tests, key=lambda t: t["avg_ts"]))
json.dump(out, open(sys.argv[1], "w"))
PY
}
for m in "${models[@]}"; do
    rm -f "$tmp"/r-*-*.json "$tmp"/r1-*-*.json "$tmp"/l-*.json  # the previous model's rounds
    for ((round = 1; round <= rounds; round++)); do
        for mode in "${modes[@]}"; do
            echo "bench-cpu: kvgen --bench --math $mode $(basename "$m") (round $round of $rounds)" >&2
            "$kvgen" --bench --device cpu -m "$m" -p "$prompt_len" -n "$gen" -r 3 -t "$threads" --math "$mode" \
                -o json >"$tmp/r-$mode-$round.json" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
            ((threads > 1)) || continue
            "$kvgen" --bench --device cpu -m "$m" -p 0 -n "$gen" -r 3 -t 1 --math "$mode" \
                -o json >"$tmp/r1-$mode-$round.json" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
        done
        [[ -n $llama_bench ]] || continue
        echo "bench-cpu: llama-bench $(basename "$m") (round $round of $rounds)" >&2
        "$llama_bench" -m "$m" -p "$prompt_len" -n "$gen" -r 3 -t "$threads" -o json >"$tmp/l-$round.json" \
            2>"$tmp/lerr" || { tail -n 5 "$tmp/lerr" >&2; exit 1; }
    done
    [[ -z $llama_bench ]] || best "$tmp/l.json" "$tmp"/l-*.json
    for mode in "${modes[@]}"; do
        best "$tmp/r-$mode.json" "$tmp"/r-"$mode"-*.json
        if ((threads > 1)); then
            best "$tmp/r1-$mode.json" "$tmp"/r1-"$mode"-*.json
            python3 - "$m" "$tmp/r-$mode.json" "$tmp/r1-$mode.json" "$bw" "$mode" >>"$tmp/threads.md" <<'PY'
import json, os, sys
from subprocess import run
m, bw, mode = sys.argv[1], float(sys.argv[4]), sys.argv[5]
tn = next(t for t in json.load(open(sys.argv[2])) if t["n_gen"] > 0)
t1 = next(t for t in json.load(open(sys.argv[3])) if t["n_gen"] > 0)
info = json.loads(run([os.environ["KVGEN"], "-m", m, "--inspect", "--json", "-"], capture_output=True, check=True).stdout)
size = info["weight_bytes_per_token"]
cells = [f"{t1['avg_ts']:.1f} ± {t1['stddev_ts']:.1f}", f"{100 * size * t1['avg_ts'] / 1e9 / bw:.0f}%",
         f"{tn['avg_ts']:.1f} ± {tn['stddev_ts']:.1f}", f"{100 * size * tn['avg_ts'] / 1e9 / bw:.0f}%",
         f"**{tn['avg_ts'] / t1['avg_ts']:.2f}x**"]
print(f"| {os.path.basename(m)} | {mode} | " + " | ".join(cells) + " |")
PY
        fi
        python3 - "$m" "$tmp/r-$mode.json" "$bw" "$tmp/device" "$mode" >>"$tmp/rows.md" <<'PY'
import json, os, sys
from subprocess import run
m, tests, bw, mode = sys.argv[1], json.load(open(sys.argv[2])), float(sys.argv[3]), sys.argv[5]
pp = next(t for t in tests if t["n_prompt"] > 0)
tg = next(t for t in tests if t["n_gen"] > 0)
open(sys.argv[4], "w").write(tg["device"].replace(", --math " + mode, ""))
# Weight bytes read per decoded token (kvgen --inspect: all but an untied embedding table).
info = json.loads(run([os.environ["KVGEN"], "-m", m, "--inspect", "--json", "-"], capture_output=True, check=True).stdout)
size = info["weight_bytes_per_token"]
gbs = size * tg["avg_ts"] / 1e9
print(f"| {os.path.basename(m)} | {mode} | {size / 1e6:.0f} MB | {pp['avg_ts']:.1f} ± {pp['stddev_ts']:.1f} "
      f"| {tg['avg_ts']:.1f} ± {tg['stddev_ts']:.1f} | {gbs:.2f} | {100 * gbs / bw:.0f}% |")
PY
    done
    # Distance from the exact math: each prompt's next-token logits in every mode against --math f32.
    echo "bench-cpu: logits of each --math mode against --math f32 $(basename "$m")" >&2
    for i in "${!fid_prompts[@]}"; do
        for mode in f32 "${modes[@]}"; do
            "$kvgen" --device cpu -m "$m" -p "${fid_prompts[$i]}" -n 1 --temp 0 -t "$threads" --math "$mode" \
                --dump-logits "$tmp/logits-$i-$mode.f32" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
        done
    done
    python3 - "$m" "$tmp" "${#fid_prompts[@]}" "${modes[@]}" >>"$tmp/fidelity.md" <<'PY'
import array, math, os, sys
m, tmp, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a
cells = []
for mode in sys.argv[4:]:
    errs = []
    for i in range(n):
        ref, got = load(f"{tmp}/logits-{i}-f32.f32"), load(f"{tmp}/logits-{i}-{mode}.f32")
        mean = sum(ref) / len(ref)
        num = math.sqrt(sum((a - b) ** 2 for a, b in zip(got, ref)) / len(ref))
        den = math.sqrt(sum((a - mean) ** 2 for a in ref) / len(ref))
        errs.append(100 * num / den)
    cells.append(f"{max(errs):.3f}% ({', '.join(f'{e:.3f}' for e in errs)})")
print(f"| {os.path.basename(m)} | " + " | ".join(cells) + " |")
PY
    [[ -n $llama_bench ]] || continue
    for mode in "${modes[@]}"; do
        python3 - "$m" "$tmp/r-$mode.json" "$tmp/l.json" "$mode" >>"$tmp/side.md" <<'PY'
import json, os, sys
k, l = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
def pick(tests, gen):
    t = next(t for t in tests if (t["n_gen"] > 0) == gen and (t["n_prompt"] > 0) != gen)
    return t["avg_ts"], t["stddev_ts"]
cells = []
for gen in (False, True):
    (ka, ks), (la, ls) = pick(k, gen), pick(l, gen)
    cells += [f"{ka:.1f} ± {ks:.1f}", f"{la:.1f} ± {ls:.1f}", f"**{ka / la:.2f}x**"]
print(f"| {os.path.basename(sys.argv[1])} | {sys.argv[4]} | " + " | ".join(cells) + " |")
PY
    done
done

m=${models[0]} names=""
for x in "${models[@]}"; do names+="${names:+, }$(basename "$x")"; done
echo "## kvgen CPU benchmark"
echo
echo "- command: \`$invocation\`"
echo "- date: $date"
echo "- commit: $commit"
echo "- machine: $machine; kvgen ran on $(cat "$tmp/device")"
echo "- models: $names$made"
rounds_note=""
((rounds == 1)) ||
    rounds_note=", the best of $rounds rounds (kvgen's modes and llama-bench alternating) for each program and test"
echo "- prompts: \`kvgen --bench --device cpu -m MODEL -p $prompt_len -n $gen -r 3 -t $threads\` times random token ids" \
    "(seeded, the same every run)$rounds_note; the \`--no-kv-cache\` part generates $nocache_gen tokens from" \
    "\`scripts/bench-kv.sh\`'s prompt, \"The key-value cache of a transformer\""
echo
echo "Memory read bandwidth (\`kvgen --bench-memory -t $threads\`): **$bw GB/s**."
echo
echo "| model | --math | weights read per token | prefill t/s (pp$prompt_len) | decode t/s (tg$gen) | decode weight GB/s | % of bandwidth |"
echo "|---|---|---|---|---|---|---|"
cat "$tmp/rows.md"
echo
if ((threads > 1)); then
    echo "Decode on one thread (\`-t 1\`, in the same rounds) and on $threads, each with its share of the measured" \
        "bandwidth, and what the threads gain: where one thread is far from the bandwidth, $threads threads should" \
        "come near ${threads}x; where they reach the bandwidth, no more is possible:"
    echo
    echo "| model | --math | tg$gen, 1 thread | % of bandwidth | tg$gen, $threads threads | % of bandwidth | gain |"
    echo "|---|---|---|---|---|---|---|"
    cat "$tmp/threads.md"
    echo
fi
echo "Distance from the exact math: normalized RMS error of the next-token logits against \`--math f32\` (f32" \
    "activations, exactly decoded weights), worst of the prompts \"${fid_prompts[0]}\", \"${fid_prompts[1]}\" and" \
    "\"${fid_prompts[2]}\" (each in parentheses):"
echo
echo "| model | --math exact | --math fast |"
echo "|---|---|---|"
cat "$tmp/fidelity.md"
echo
if [[ -n $llama_bench ]]; then
    # the whole --version text first: grep -m 1 in a pipe could end llama-bench by SIGPIPE and fail the pipe
    llama_version=$("$llama_bench" --version 2>&1 || true)
    llama_version=$(grep -m 1 -o 'version: .*' <<<"$llama_version" || echo 'version unknown')
    echo "Side by side with llama.cpp (\`$llama_bench -m MODEL -p $prompt_len -n $gen -r 3 -t $threads\`, run right after kvgen" \
        "on each model; $llama_version):"
    echo
    echo "| model | kvgen --math | kvgen pp$prompt_len | llama.cpp pp$prompt_len | ratio | kvgen tg$gen | llama.cpp tg$gen | ratio |"
    echo "|---|---|---|---|---|---|---|---|"
    cat "$tmp/side.md"
    echo
fi
echo "Cost of \`--no-kv-cache\` ($(basename "$m"), from \`scripts/bench-kv.sh MODEL --lengths $nocache_gen --runs 1 --threads $threads\`):"
echo
"$root/scripts/bench-kv.sh" "$m" --lengths "$nocache_gen" --runs 1 --threads "$threads" --out "$tmp/kv" >/dev/null
sed -n '/^| tokens generated/,/Identical tokens/p' "$tmp/kv/results.md"
