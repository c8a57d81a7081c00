#!/usr/bin/env bash
# What each KV cache type costs and buys: for every --kv-type, its bytes per token, perplexity and KL divergence
# against the first type (f16) on a real English text, and decode speed at depth 0 and at a deep cache.
#
# usage: scripts/bench-kv-types.sh [MODEL.gguf] [--types f16,q8_0,q8_0/q4_0,q4_0] [--ctx 512] [--depth 4096]
#                                  [--threads T] [--text FILE] [--out DIR]
#
# A type K/V (q8_0/q4_0) gives the K and V caches their own types, as --kv-type K/V (or -ctk K -ctv V) does.
# The text: usr/share/games/fortunes/people from the Debian package `fortunes` (quotations by and about people,
# about 40,000 tokens for the default model), fetched with `apt-get download fortunes` and unpacked with dpkg-deb
# into the output folder; --text FILE uses another. Perplexity as llama-perplexity measures it (kvgen --perplexity
# -c CTX), the first type's run saved with --kl-divergence-base and every other type compared with it
# (--kl-divergence: mean KL over the base's top 32 tokens and the rest, same top token, PPL change). Decode:
# kvgen --bench -p 0 -n 16 -d 0,DEPTH -r 2 (DEPTH at most the model's context less 16). CPU device.
# Writes to DIR (default bench-kv-types-out): results.md (command, date, commit, machine, the table), results.csv,
# kv-types.png (perplexity against bytes per token; gnuplot, when installed), and each type's raw reports
# (TYPE.ppl.json, TYPE.bench.json) and the model's --inspect report (inspect.json). KVGEN_BIN names another build.
set -euo pipefail

usage() { sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; }
# shellcheck source=lib/bench.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib/bench.sh"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
invocation=$(words scripts/bench-kv-types.sh "$@")
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" types=f16,q8_0,q8_0/q4_0,q4_0 ctx=512 depth=4096 threads="" text=""
out="bench-kv-types-out"
while (($#)); do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --types) need_value "$@"; types=$2; shift 2 ;;
        --ctx) need_value "$@"; ctx=$2; shift 2 ;;
        --depth) need_value "$@"; depth=$2; shift 2 ;;
        --threads) need_value "$@"; threads=$2; shift 2 ;;
        --text) need_value "$@"; text=$2; shift 2 ;;
        --out) need_value "$@"; out=$2; shift 2 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) model=$1; shift ;;
    esac
done
kvgen="${KVGEN_BIN:-$root/build/kvgen}"
[[ -x $kvgen ]] || die "$kvgen missing: run scripts/setup.sh"
[[ -f $model ]] || die "model '$model' not found (models/fetch-default.sh)"
[[ $ctx =~ ^[0-9]+$ && $depth =~ ^[0-9]+$ ]] || die "--ctx and --depth take numbers"
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$out/base.kld"' EXIT
run_context "$root"
targs=()
[[ -n $threads ]] && targs=(-t "$threads")

if [[ -z $text ]]; then
    if [[ ! -f $out/text/usr/share/games/fortunes/people ]]; then
        echo "bench-kv-types: fetching the Debian package fortunes" >&2
        (cd "$out" && rm -f fortunes_*.deb && apt-get download fortunes >/dev/null) ||
            die "apt-get download fortunes failed (give --text FILE)"
        dpkg-deb -x "$out"/fortunes_*.deb "$out/text"
    fi
    text="$out/text/usr/share/games/fortunes/people"
    text_name="usr/share/games/fortunes/people (Debian package fortunes)"
else
    text_name=$text
fi
n_text=$("$kvgen" -m "$model" --tokenize -f "$text" | wc -w)
n_ctx_train=$("$kvgen" -m "$model" --inspect --json - | python3 -c 'import json,sys; print(json.load(sys.stdin)["n_ctx_train"])')
((depth + 16 > n_ctx_train)) && depth=$((n_ctx_train - 16))
echo "bench-kv-types: $n_text tokens of text, -c $ctx, decode at depths 0 and $depth" >&2
"$kvgen" -m "$model" --inspect --json "$out/inspect.json" >/dev/null

first=""
IFS=, read -r -a type_list <<<"$types"
for t in "${type_list[@]}"; do
    f=${t//\//-}  # q8_0/q4_0 (K/V) -> q8_0-q4_0 in file names
    kl=(--kl-divergence-base "$out/base.kld")
    [[ -n $first ]] && kl=(--kl-divergence "$out/base.kld")
    echo "bench-kv-types: $t: perplexity" >&2
    run_logged "$tmp/err" "$kvgen" -m "$model" --device cpu --perplexity -f "$text" -c "$ctx" --kv-type "$t" \
        "${targs[@]}" "${kl[@]}" --json "$out/$f.ppl.json" >"$tmp/$f.ppl.txt"
    echo "bench-kv-types: $t: decode" >&2
    run_logged "$tmp/err" "$kvgen" -m "$model" --device cpu --bench -p 0 -n 16 -d "0,$depth" -r 2 --kv-type "$t" \
        "${targs[@]}" -o json >"$out/$f.bench.json"
    first=${first:-$t}
done

python3 - "$out" "$types" "$invocation" "$date" "$commit" "$machine" "$text_name" "$n_text" "$ctx" "$depth" \
    "$(basename "$model")" <<'PY'
import json, sys
out, types, invocation, date, commit, machine, text_name, n_text, ctx, depth, model = sys.argv[1:12]
types = types.split(",")
inspect = json.load(open(f"{out}/inspect.json"))["kv_cache_types"]
rows = []
for t in types:
    f = t.replace("/", "-")
    p = json.load(open(f"{out}/{f}.ppl.json"))
    b = {e["n_depth"]: e["avg_ts"] for e in json.load(open(f"{out}/{f}.bench.json"))}
    k, v = (t.split("/") * 2)[:2]  # K/V types; half of each type's bytes per token is K, half V
    rows.append({"type": t, "bytes": (inspect[k]["bytes_per_token"] + inspect[v]["bytes_per_token"]) // 2, "ppl": p["ppl"], "ppl_se": p["ppl_stderr"],
                 "kl": p.get("kl_divergence"), "kl_se": p.get("kl_divergence_stderr"), "top1": p.get("same_top_token"),
                 "tg0": b.get(0), "tgd": b.get(int(depth))})
base = rows[0]
with open(f"{out}/results.csv", "w") as f:
    f.write("type,bytes_per_token,positions_per_byte_vs_base,ppl,ppl_stderr,ppl_change_pct,kl,kl_stderr,same_top,"
            "tg_d0,tg_deep\n")
    for r in rows:
        f.write(f"{r['type']},{r['bytes']},{base['bytes'] / r['bytes']:.3f},{r['ppl']:.4f},{r['ppl_se']:.4f},"
                f"{100 * (r['ppl'] / base['ppl'] - 1):.3f},{r['kl'] or 0:.6f},{r['kl_se'] or 0:.6f},"
                f"{r['top1'] if r['top1'] is not None else 1:.4f},{r['tg0']:.2f},{r['tgd']:.2f}\n")
L = [f"- command: `{invocation}`", f"- model: {model}; text: {text_name}, {n_text} tokens; perplexity -c {ctx}",
     f"- date: {date}; commit: {commit}", f"- machine: {machine}", "",
     f"| KV type | bytes / token | positions per byte vs {base['type']} | perplexity | change | KL divergence vs "
     f"{base['type']} | same top token | decode tok/s, depth 0 | depth {depth} |",
     "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
for r in rows:
    kl = "-" if r["kl"] is None else f"{r['kl']:.5f} ± {r['kl_se']:.5f}"
    top = "-" if r["top1"] is None else f"{100 * r['top1']:.2f}%"
    L.append(f"| {r['type']} | {r['bytes']} | {base['bytes'] / r['bytes']:.2f}x | {r['ppl']:.4f} ± {r['ppl_se']:.4f} | "
             f"{100 * (r['ppl'] / base['ppl'] - 1):+.2f}% | {kl} | {top} | {r['tg0']:.1f} | {r['tgd']:.1f} |")
open(f"{out}/results.md", "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
machine_short=${machine%%;*}
if command -v gnuplot >/dev/null; then
    gnuplot <<GNUPLOT
set terminal pngcairo size 800,500 noenhanced
set output "$out/kv-types.png"
set title "KV cache type: perplexity against bytes per token\n$(basename "$model"), -c $ctx, $machine_short, $commit"
set xlabel "KV cache bytes per token"
set ylabel "perplexity (-c $ctx)"
set datafile separator ","
set key off
set grid
plot "$out/results.csv" every ::1 using 2:4 with points pt 7 ps 1.5, \
     "" every ::1 using 2:4:1 with labels offset 1.5,0.8
GNUPLOT
fi
echo "bench-kv-types: results in $out/results.md" >&2
