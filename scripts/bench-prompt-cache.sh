#!/usr/bin/env bash
# What a prompt-cache file saves: a long shared prefix (a "system prompt" of about --tokens tokens, taken from the
# GNU GPL 3 text every Debian system has at /usr/share/common-licenses/GPL-3) followed by a question. The first run
# computes prefix + question A and saves the prompt's K/V with --prompt-cache; the second asks question B with the
# file (--prompt-cache-ro), so only the question is computed; the third asks B cold. Reports the prompt times, the
# file's load time and size, and whether the second and third runs generated the same tokens with the same logits.
# Then a conversation (-cnv) with the same text as its system message and three questions: each turn's prompt time
# with the cache kept across turns, against a cold prefill of the whole transcript at that turn (kvgen --bench -p N).
#
# usage: scripts/bench-prompt-cache.sh [MODEL.gguf] [--tokens 1000] [--threads T] [--device cpu|cuda] [--out DIR]
#
# Writes DIR/results.md (command, date, commit, machine, the table); default DIR bench-prompt-cache-out. Beside it
# stay what the runs read and wrote: prefix.txt, a.txt, b.txt, prefix.cache, cold.txt and the JSON reports.
# KVGEN_BIN names another build.
set -euo pipefail

usage() { sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; }
# shellcheck source=lib/bench.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib/bench.sh"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
invocation=$(words scripts/bench-prompt-cache.sh "$@")
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" tokens=1000 threads="" device=cpu out="bench-prompt-cache-out"
while (($#)); do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --tokens) need_value "$@"; tokens=$2; shift 2 ;;
        --threads) need_value "$@"; threads=$2; shift 2 ;;
        --device) need_value "$@"; device=$2; shift 2 ;;
        --out) need_value "$@"; out=$2; shift 2 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) model=$1; shift ;;
    esac
done
kvgen="${KVGEN_BIN:-$root/build/kvgen}"
text=/usr/share/common-licenses/GPL-3
[[ -x $kvgen ]] || die "$kvgen missing: run scripts/setup.sh"
[[ -f $model ]] || die "model '$model' not found (models/fetch-default.sh)"
[[ -f $text ]] || die "$text missing (Debian package base-files)"
[[ $tokens =~ ^[1-9][0-9]*$ ]] || die "--tokens takes a positive number"
[[ -z $threads || $threads =~ ^[1-9][0-9]*$ ]] || die "--threads takes a positive number"
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run_context "$root"
args=(-m "$model" --device "$device" -n 16 --temp 0 --no-display-prompt)
[[ -n $threads ]] && args+=(-t "$threads")

# The prefix: the first lines of the text whose token count first reaches --tokens.
lines=1
while :; do
    head -n "$lines" "$text" >"$out/prefix.txt"
    n=$(run_logged "$tmp/err" "$kvgen" -m "$model" --tokenize -f "$out/prefix.txt" | wc -w)
    ((n >= tokens || lines > 700)) && break
    lines=$((lines + 10))
done
{ cat "$out/prefix.txt"; printf '\nQuestion: may I sell copies of the program?\nAnswer:'; } >"$out/a.txt"
{ cat "$out/prefix.txt"; printf '\nQuestion: must I give the source code with the program?\nAnswer:'; } >"$out/b.txt"
rm -f "$out/prefix.cache"
echo "bench-prompt-cache: prefix of $n tokens; run 1 (computes and saves)" >&2
run_logged "$tmp/err" "$kvgen" "${args[@]}" -f "$out/a.txt" --prompt-cache "$out/prefix.cache" --json "$out/1.json" \
    >/dev/null
echo "bench-prompt-cache: run 2 (another question, the prefix from the file)" >&2
run_logged "$tmp/err" "$kvgen" "${args[@]}" -f "$out/b.txt" --prompt-cache "$out/prefix.cache" --prompt-cache-ro \
    --json "$out/2.json" --dump-logits "$tmp/2.logits" >/dev/null
echo "bench-prompt-cache: run 3 (the same question, cold)" >&2
run_logged "$tmp/err" "$kvgen" "${args[@]}" -f "$out/b.txt" --json "$out/3.json" --dump-logits "$tmp/3.logits" >/dev/null
same_logits=no
cmp -s "$tmp/2.logits" "$tmp/3.logits" && same_logits=yes
file_bytes=$(stat -c %s "$out/prefix.cache")
echo "bench-prompt-cache: a three-turn conversation with the prefix as its system message" >&2
printf '%s\n' "May I sell copies of the program?" "Must I give the source code with it?" \
    "May I add my own terms to the license?" |
    run_logged "$tmp/err" "$kvgen" -m "$model" --device "$device" -n 32 --temp 0 ${threads:+-t "$threads"} -cnv \
        -sysf "$out/prefix.txt" --json "$out/cnv.json" >/dev/null
: >"$out/cold.txt"
for n_turn in $(python3 -c 'import json,sys; print(" ".join(str(t["reused_tokens"] + t["prefilled_tokens"]) for t in json.load(open(sys.argv[1]))["turns"]))' "$out/cnv.json"); do
    run_logged "$tmp/err" "$kvgen" -m "$model" --device "$device" ${threads:+-t "$threads"} --bench -p "$n_turn" -n 0 \
        -r 1 -o json |
        python3 -c 'import json,sys; e=json.load(sys.stdin)[0]; print(1000.0 * e["n_prompt"] / e["avg_ts"])' >>"$out/cold.txt"
done

python3 - "$out" "$invocation" "$date" "$commit" "$machine" "$(basename "$model")" "$device" "$file_bytes" \
    "$same_logits" <<'PY'
import json, sys
out, invocation, date, commit, machine, model, device, file_bytes, same_logits = sys.argv[1:10]
r = [json.load(open(f"{out}/{i}.json")) for i in (1, 2, 3)]
pc = r[1]["prompt_cache"]
n_prompt = len(r[1]["prompt_tokens"])
hit_ms = pc["load_ms"] + r[1]["prefill_ms"]
L = [f"- command: `{invocation}`", f"- model: {model}; device: {device}; date: {date}; commit: {commit}",
     f"- machine: {machine}", "",
     "| run | prompt tokens | from the file | computed | file load ms | prompt eval ms | time to the first token's logits, ms |",
     "|---|---:|---:|---:|---:|---:|---:|",
     f"| 1: question A, computes and saves | {len(r[0]['prompt_tokens'])} | 0 | {len(r[0]['prompt_tokens'])} | - | "
     f"{r[0]['prefill_ms']:.1f} | {r[0]['prefill_ms']:.1f} |",
     f"| 2: question B, prefix from the file | {n_prompt} | {pc['reused_tokens']} | {n_prompt - pc['reused_tokens']} | "
     f"{pc['load_ms']:.1f} | {r[1]['prefill_ms']:.1f} | {hit_ms:.1f} |",
     f"| 3: question B, cold | {n_prompt} | 0 | {n_prompt} | - | {r[2]['prefill_ms']:.1f} | {r[2]['prefill_ms']:.1f} |",
     "",
     f"Run 2 against run 3: {r[2]['prefill_ms'] / hit_ms:.1f}x faster to the first token; the file is "
     f"{int(file_bytes) / 1e6:.1f} MB; generated tokens {'identical' if r[1]['tokens'] == r[2]['tokens'] else 'DIFFERENT'}; "
     f"logits of every step {'bit for bit identical' if same_logits == 'yes' else 'not bit-identical'}."]
c = json.load(open(f"{out}/cnv.json"))["turns"]
cold = [float(x) for x in open(f"{out}/cold.txt").read().split()]
L += ["", "A conversation with the same text as its system message (`-cnv -sysf`, `-n 32`):", "",
      "| turn | conversation tokens | from the cache | computed (previous answer's end + new) | prompt ms | "
      "a cold prefill of the whole transcript, ms | saved |",
      "|---:|---:|---:|---:|---:|---:|---:|"]
for i, (t, cms) in enumerate(zip(c, cold)):
    n = t["reused_tokens"] + t["prefilled_tokens"]
    L.append(f"| {i + 1} | {n} | {t['reused_tokens']} | {t['prefilled_tokens']} ({t['prefilled_tokens'] - t['new_tokens']} + "
             f"{t['new_tokens']}) | {t['prefill_ms']:.1f} | {cms:.1f} | {cms / t['prefill_ms']:.1f}x |")
open(f"{out}/results.md", "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
echo "bench-prompt-cache: results in $out/results.md" >&2
