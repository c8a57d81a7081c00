#!/usr/bin/env bash
# CPU speed: prefill (a P-token prompt) and decode (N tokens) tokens per second for each model, plus the slowdown
# without the KV cache at 256 generated tokens, as a markdown table on stdout.
# usage: scripts/bench-cpu.sh [--threads T] [--prompt P] [--gen N] [MODEL.gguf ...]   (default: the default model)
set -euo pipefail
threads=2 prompt_len=128 gen=64 models=()
while (($#)); do
    case $1 in
        -h | --help) sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        --threads) threads=$2; shift 2 ;;
        --prompt) prompt_len=$2; shift 2 ;;
        --gen) gen=$2; shift 2 ;;
        -*) echo "bench-cpu.sh: unknown option $1" >&2; exit 2 ;;
        *) models+=("$1"); shift ;;
    esac
done
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kvgen="$root/build/kvgen"
[[ -x $kvgen ]] || { echo "bench-cpu.sh: $kvgen missing: run scripts/setup.sh" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench-cpu.sh: python3 is required" >&2; exit 1; }
((${#models[@]})) || models=("$root/models/SmolLM2-135M-Instruct.Q4_1.gguf")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A prompt of about prompt_len tokens: repeated plain words (each is one token in common vocabularies).
prompt=$(python3 -c "import sys; print(' '.join(['the cache'] * (int(sys.argv[1]) // 2)))" "$prompt_len")

echo "| model | size | threads | prefill t/s (${prompt_len}-token prompt) | decode t/s (${gen} tokens) | weight GB/s at decode |"
echo "|---|---|---|---|---|---|"
for m in "${models[@]}"; do
    [[ -f $m ]] || { echo "bench-cpu.sh: $m: no such file" >&2; exit 1; }
    echo "bench-cpu: $(basename "$m")" >&2
    "$kvgen" -m "$m" -p "$prompt" -n "$gen" --ignore-eos --temp 0 -t "$threads" --no-perf \
        --json "$tmp/r.json" >/dev/null
    python3 - "$m" "$tmp/r.json" "$threads" <<'PY'
import json, os, sys
m, r, threads = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
size = os.path.getsize(m)
print(f"| {os.path.basename(m)} | {size / 1e6:.0f} MB | {threads} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.1f} "
      f"| {size * r['decode_tok_s'] / 1e9:.2f} |")
PY
done
