#!/usr/bin/env bash
# CPU speed, as a markdown report on stdout:
#  1. the machine's memory read bandwidth (kvgen --bench-memory), the ceiling for decode;
#  2. prefill (a P-token prompt) and decode (N tokens) tokens/s per model, with decode's weight bandwidth and its
#     share of the measured ceiling;
#  3. the cost of --no-kv-cache: total time to generate G tokens with and without the cache (first model).
# With no MODEL arguments it benchmarks the default model and TinyLlama-1.1B-shaped Q4_K_M and Q8_0 files made on
# the spot with kvgen-synth (random weights, the default model's vocabulary).
# usage: scripts/bench-cpu.sh [--threads T] [--prompt P] [--gen N] [--nocache-gen G] [MODEL.gguf ...]
set -euo pipefail
threads=2 prompt_len=128 gen=64 nocache_gen=256 models=()
while (($#)); do
    case $1 in
        -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        --threads) threads=$2; shift 2 ;;
        --prompt) prompt_len=$2; shift 2 ;;
        --gen) gen=$2; shift 2 ;;
        --nocache-gen) nocache_gen=$2; shift 2 ;;
        -*) echo "bench-cpu.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) models+=("$1"); shift ;;
    esac
done
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export KVGEN="$root/build/kvgen"
kvgen="$root/build/kvgen" synth="$root/build/kvgen-synth" default="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
for tool in "$kvgen" "$synth"; do
    [[ -x $tool ]] || { echo "bench-cpu.sh: $tool missing: run scripts/setup.sh" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "bench-cpu.sh: python3 is required" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ((${#models[@]} == 0)); then
    [[ -f $default ]] || { echo "bench-cpu.sh: $default missing: run models/fetch-default.sh" >&2; exit 1; }
    models=("$default")
    for type in Q4_K_M Q8_0; do
        echo "bench-cpu: making a TinyLlama-1.1B-shaped $type file" >&2
        "$synth" tinyllama-1.1b --type "$type" --vocab "$default" -o "$tmp/tinyllama-1.1b-$type.gguf" 2>/dev/null
        models+=("$tmp/tinyllama-1.1b-$type.gguf")
    done
fi
for m in "${models[@]}"; do [[ -f $m ]] || { echo "bench-cpu.sh: $m: no such file" >&2; exit 1; }; done

echo "bench-cpu: memory bandwidth" >&2
bw=$("$kvgen" --bench-memory -t "$threads" | sed -n 's/^memory read bandwidth: \([0-9.]*\) GB\/s.*/\1/p')
echo "## kvgen CPU benchmark"
echo
echo "$(date -u +%Y-%m-%d), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $threads threads;"
echo "memory read bandwidth (\`kvgen --bench-memory -t $threads\`): **$bw GB/s**."
echo
echo "| model | weights read per token | prefill t/s ($prompt_len-token prompt) | decode t/s ($gen tokens) | decode weight GB/s | % of bandwidth |"
echo "|---|---|---|---|---|---|"
# A prompt of about prompt_len tokens: repeated plain words (each one token in common vocabularies).
prompt=$(python3 -c "import sys; print(' '.join(['the cache'] * (int(sys.argv[1]) // 2)))" "$prompt_len")
for m in "${models[@]}"; do
    echo "bench-cpu: $(basename "$m")" >&2
    "$kvgen" -m "$m" -p "$prompt" -n "$gen" --ignore-eos --temp 0 -t "$threads" --no-perf --json "$tmp/r.json" \
        >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
    python3 - "$m" "$tmp/r.json" "$bw" <<'PY'
import json, os, sys
from subprocess import run
m, r, bw = sys.argv[1], json.load(open(sys.argv[2])), float(sys.argv[3])
# Weight bytes read per decoded token (kvgen --inspect: all but an untied embedding table).
info = json.loads(run([os.environ["KVGEN"], "-m", m, "--inspect", "--json", "-"], capture_output=True, check=True).stdout)
size = info["weight_bytes_per_token"]
gbs = size * r["decode_tok_s"] / 1e9
print(f"| {os.path.basename(m)} | {size / 1e6:.0f} MB | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.1f} "
      f"| {gbs:.2f} | {100 * gbs / bw:.0f}% |")
PY
done

m=${models[0]}
echo
echo "Cost of \`--no-kv-cache\` ($(basename "$m"), $nocache_gen generated tokens, 8-token prompt):"
echo
echo "| mode | total time | decode t/s |"
echo "|---|---|---|"
for mode in cache nocache; do
    echo "bench-cpu: $nocache_gen tokens, $mode" >&2
    flag=()
    [[ $mode == nocache ]] && flag=(--no-kv-cache)
    "$kvgen" -m "$m" -p "The key-value cache of a transformer" -n "$nocache_gen" --ignore-eos --temp 0 \
        -t "$threads" --no-perf "${flag[@]}" --json "$tmp/$mode.json" >/dev/null 2>"$tmp/err" ||
        { cat "$tmp/err" >&2; exit 1; }
done
python3 - "$tmp/cache.json" "$tmp/nocache.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
total = lambda r: (r["prefill_ms"] + r["decode_ms"]) / 1000
print(f"| KV cache | {total(a):.1f} s | {a['decode_tok_s']:.1f} |")
print(f"| --no-kv-cache | {total(b):.1f} s | {b['decode_tok_s']:.1f} |")
print(f"\nWithout the cache the same {len(a['tokens'])} tokens take {total(b) / total(a):.1f}x as long "
      f"(identical tokens: {a['tokens'] == b['tokens']}).")
PY
