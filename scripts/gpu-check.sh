#!/usr/bin/env bash
# The one prepared run on a GPU machine (budget: 8 minutes on one H200). Builds Release for the visible GPU, runs
# the [cuda] tests, compares CPU and CUDA generations, benchmarks, and writes OUTDIR/report.md + OUTDIR/report.json.
#
# usage: scripts/gpu-check.sh OUTDIR
#
#   1. build (build-gpu/, CUDA arch of the visible GPU) and the [cuda] tests (kernels against their CPU twins,
#      whole forward against the CPU backend, the reference cases' fidelity rules);
#   2. correctness: greedy tokens and logits, --device cpu vs --device cuda, on the shared reference models and on
#      synthetic files of every weight type (the default model's shape);
#   3. speed: synthetic LLaMA-2-7B and 13B shapes in F16, Q8_0, Q4_0 and Q4_K_M (made here with kvgen-synth, one at a
#      time, deleted after use): pp512 and tg128 at depths 0, 1024 and 4096, with achieved bandwidth
#      ((weight bytes + KV bytes read) x tokens/s) beside the card's peak (KVGEN_PEAK_GBS, default 4800 for H200);
#   4. the KV cache comparison (scripts/bench-kv.sh, --device cuda) on the first shape's Q4_K_M file (7B): 128, 256,
#      512 tokens.
# Later stages are skipped, and the report says so, when the time budget (KVGEN_GPU_BUDGET_S, default 450) runs out.
# KVGEN_GPU_CHECK_DRY=1 rehearses the script on a machine without a GPU (CPU device, tiny shapes): it checks the
# script, not the GPU. Needs the team's shared folder (../shared, ./shared or .shared, or KVGEN_SHARED) for test data, and unpacks its
# device-deps/ when this machine lacks the libraries.
set -euo pipefail

usage() { sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; }
if [[ ${1:-} == -h || ${1:-} == --help ]]; then usage; exit 0; fi
[[ $# -eq 1 && $1 != -* ]] || { usage >&2; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
budget=${KVGEN_GPU_BUDGET_S:-450}
peak=${KVGEN_PEAK_GBS:-4800}
t0=$SECONDS
log() { echo "gpu-check [$((SECONDS - t0)) s]: $*" | tee -a "$out/log.txt" >&2; }
left() { echo $((budget - (SECONDS - t0))); }
: >"$out/log.txt"

shared=""
for d in "${KVGEN_SHARED:-}" ../shared shared .shared; do
    if [[ -n $d && -d $d/testdata ]]; then shared=$(cd "$d" && pwd); break; fi
done
[[ -n $shared ]] || { echo "gpu-check: error: no shared folder with testdata/ (set KVGEN_SHARED)" >&2; exit 1; }
dev=cuda shapes=(llama2-7b llama2-13b) cmp_shape=smollm2-135m kv_lengths=128,256,512
if [[ ${KVGEN_GPU_CHECK_DRY:-0} == 1 ]]; then
    dev=cpu shapes=(tiny) cmp_shape=tiny kv_lengths=16,32 gpu="dry run on the CPU, 9.0" arch=90
else
    command -v nvidia-smi >/dev/null || { echo "gpu-check: error: nvidia-smi not found: no GPU here" >&2; exit 1; }
    gpu=$(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader | head -n 1)
    arch=$(cut -d, -f2 <<<"$gpu" | tr -d ' .')
fi
log "GPU: $gpu (building for sm_$arch); shared data: $shared"

# --- 1. build and [cuda] tests ------------------------------------------------------------------------------------
if [[ ! -f /usr/include/fmt/core.h && -f $shared/device-deps/unpack.sh ]]; then
    eval "$(bash "$shared/device-deps/unpack.sh" /opt/kvgen-deps)"
    log "libraries unpacked from $shared/device-deps"
fi
build="build-gpu"
# note: what comes back from a lent machine is at most 8 files, so logs go into log.txt and the work folder.
work=$(mktemp -d "${TMPDIR:-/tmp}/kvgen-gpu.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGEN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DKVGEN_SHARED_DIR="$shared" >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log" | tee -a "$out/log.txt"; exit 1; }
if ! cmake --build "$build" -j "$(nproc)" >>"$work/build.log" 2>&1; then
    grep -m 30 -E -A3 "error|Error" "$work/build.log" | tee -a "$out/log.txt"
    exit 1
fi
kvgen="$root/$build/kvgen" synth="$root/$build/kvgen-synth"
log "built"

set +e
"$build/tests/kvgen_cuda_host_tests" >>"$out/log.txt" 2>&1
host_rc=$?
"$build/tests/kvgen_cuda_tests" --durations yes >"$out/cuda-tests.txt" 2>&1
cuda_rc=$?
set -e
log "[cuda] tests: exit $cuda_rc ($(tail -n 2 "$out/cuda-tests.txt" | tr '\n' ' ')); host decoders: exit $host_rc"

vocab="$shared/testdata/vocab/ggml-vocab-llama-spm.gguf"

# --- 2. correctness: CPU vs CUDA generations --------------------------------------------------------------------
mkdir -p "$work/cmp"
cmp_models=()
for f in "$shared"/testdata/ref/*.gguf "$shared"/testdata/tiny/*.gguf; do cmp_models+=("$f"); done
for t in F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K Q4_K_M; do
    "$synth" "$cmp_shape" --type "$t" --vocab "$vocab" -o "$work/cmp/$cmp_shape-$t.gguf" >/dev/null 2>&1
    cmp_models+=("$work/cmp/$cmp_shape-$t.gguf")
done
for m in "${cmp_models[@]}"; do
    name=$(basename "$m" .gguf)
    for d in cpu cuda; do
        "$kvgen" -m "$m" -p "Once upon a time, there was a little" -n 32 --temp 0 --ignore-eos \
            --device "$([[ $d == cuda ]] && echo "$dev" || echo cpu)" \
            --json "$work/cmp/$name.$d.json" --dump-logits "$work/cmp/$name.$d.f32" >/dev/null \
            2>"$work/cmp/$name.$d.err" || log "$name on $d failed: $(tail -n 1 "$work/cmp/$name.$d.err")"
    done
done
log "correctness runs done (${#cmp_models[@]} models)"

# --- 3. speed -----------------------------------------------------------------------------------------------------
mkdir -p "$work/speed"
skipped=()
for shape in "${shapes[@]}"; do
    for t in F16 Q8_0 Q4_0 Q4_K_M; do
        name="$shape-$t"
        if (($(left) < 60)); then skipped+=("$name"); continue; fi
        f="$work/speed/$name.gguf"
        "$synth" "$shape" --type "$t" --vocab "$vocab" --threads "$(nproc)" -o "$f" >/dev/null 2>&1
        "$kvgen" -m "$f" --inspect --json "$work/speed/$name.inspect.json" >/dev/null
        "$kvgen" -m "$f" --bench --device "$dev" -p 512 -n 128 -d 0,1024,4096 -r 2 -o json \
            >"$work/speed/$name.bench.json" 2>>"$out/log.txt" || log "$name: bench failed"
        if [[ $name == "${shapes[0]}-Q4_K_M" ]]; then mv "$f" "$work/kv-model.gguf"; else rm -f "$f"; fi
        log "$name benchmarked"
    done
done

# --- 4. the KV cache comparison -----------------------------------------------------------------------------------
kv_status="not run"
if [[ -f $work/kv-model.gguf ]] && (($(left) > 30)); then
    if KVGEN_BIN="$kvgen" scripts/bench-kv.sh "$work/kv-model.gguf" --device "$dev" --lengths "$kv_lengths" --runs 1 \
        --nocache-runs 1 --out "$out/kv" >>"$out/log.txt" 2>&1; then
        kv_status="ok"
    else
        kv_status="failed (log.txt)"
    fi
    log "KV cache comparison: $kv_status"
elif [[ -f $work/kv-model.gguf ]]; then
    kv_status="skipped: time budget"
fi

# --- report -------------------------------------------------------------------------------------------------------
python3 - "$out" "$work" "$gpu" "$peak" "$cuda_rc" "$host_rc" "$kv_status" "$((SECONDS - t0))" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "${skipped[*]:-}" "${shapes[0]}" <<'PY'
import glob, json, os, sys, datetime
import numpy as np

out, work, gpu, peak, cuda_rc, host_rc, kv_status, secs, commit, skipped, kv_shape = sys.argv[1:12]
peak = float(peak)
rep = {"date": datetime.date.today().isoformat(), "gpu": gpu.strip(), "commit": commit, "seconds": int(secs),
       "cuda_tests_exit": int(cuda_rc), "host_tests_exit": int(host_rc), "peak_gbs": peak,
       "correctness": [], "speed": [], "kv_cache": kv_status, "skipped": skipped.split() if skipped else []}

# correctness: the CUDA run against the CPU run, logits compared while the two greedy paths agree
for cj in sorted(glob.glob(f"{work}/cmp/*.cpu.json")):
    name = os.path.basename(cj)[:-len(".cpu.json")]
    gj = f"{work}/cmp/{name}.cuda.json"
    row = {"model": name}
    try:
        c, g = json.load(open(cj)), json.load(open(gj))
        lc = np.fromfile(f"{work}/cmp/{name}.cpu.f32", dtype=np.float32)
        lg = np.fromfile(f"{work}/cmp/{name}.cuda.f32", dtype=np.float32)
        n_vocab = lc.size // len(c["tokens"])
        same = 0
        while same < min(len(c["tokens"]), len(g["tokens"])) and c["tokens"][same] == g["tokens"][same]:
            same += 1
        rows = min(same + 1, len(c["tokens"]), len(g["tokens"]))  # logits of step i depend on tokens < i
        a, b = lc[: rows * n_vocab].reshape(rows, n_vocab), lg[: rows * n_vocab].reshape(rows, n_vocab)
        rel = float(np.max(np.abs(a - b)) / max(1e-9, float(np.max(np.abs(a)))))
        nrmse = float(np.sqrt(np.mean((a - b) ** 2)) / max(1e-9, float(np.std(a))))
        row.update({"tokens": len(c["tokens"]), "same_tokens": same, "max_rel_diff": rel, "nrmse": nrmse,
                    "cpu_decode_tok_s": c["decode_tok_s"], "cuda_decode_tok_s": g["decode_tok_s"]})
    except Exception as e:  # a run that failed: say so in the report
        row["error"] = str(e)
    rep["correctness"].append(row)

# speed: tokens/s and bandwidth (weights + the KV cache read at that depth) against the peak
for ij in sorted(glob.glob(f"{work}/speed/*.inspect.json")):
    name = os.path.basename(ij)[:-len(".inspect.json")]
    info = json.load(open(ij))
    wbytes = info["weight_bytes_per_token"]
    kv_tok = info.get("kv_cache", {}).get("bytes_per_token", 0)
    row = {"model": name, "weight_bytes_per_token": wbytes, "tests": []}
    for part in ("bench",):
        p = f"{work}/speed/{name}.{part}.json"
        if not os.path.exists(p) or os.path.getsize(p) == 0:
            continue
        for t in json.load(open(p)):
            e = {"test": t["test"], "n_depth": t["n_depth"], "tok_s": t["avg_ts"], "stddev": t["stddev_ts"]}
            if t["n_gen"] > 0:
                read = wbytes + kv_tok * (t["n_depth"] + t["n_gen"] / 2)
                e["gb_s"] = read * t["avg_ts"] / 1e9
                e["pct_peak"] = 100.0 * e["gb_s"] / peak
            row["tests"].append(e)
    rep["speed"].append(row)

json.dump(rep, open(f"{out}/report.json", "w"), indent=2)

L = [f"# kvgen GPU check, {rep['date']}", "",
     f"GPU: {rep['gpu']}; commit {commit}; {secs} s; peak bandwidth taken as {peak:.0f} GB/s.", "",
     f"- `[cuda]` tests: {'passed' if rep['cuda_tests_exit'] == 0 else 'FAILED (exit %s)' % cuda_rc} "
     f"(cuda-tests.txt); host-compiled decoders: {'passed' if rep['host_tests_exit'] == 0 else 'FAILED'}",
     f"- KV cache comparison ({kv_shape} Q4_K_M shape): {kv_status}" + (" (kv/results.md)" if kv_status == "ok" else ""),
     ]
if rep["skipped"]:
    L.append(f"- skipped for time: {', '.join(rep['skipped'])}")
L += ["", "## CPU vs CUDA (greedy, 32 tokens)", "",
      "| model | same tokens | max abs logit diff / max abs logit | nrmse | CPU tg t/s | CUDA tg t/s |",
      "| --- | ---: | ---: | ---: | ---: | ---: |"]
for r in rep["correctness"]:
    if "error" in r:
        L.append(f"| {r['model']} | error: {r['error']} | | | | |")
    else:
        L.append(f"| {r['model']} | {r['same_tokens']}/{r['tokens']} | {r['max_rel_diff']:.2e} | {r['nrmse']:.2e} "
                 f"| {r['cpu_decode_tok_s']:.1f} | {r['cuda_decode_tok_s']:.1f} |")
L += ["", "## Speed (`kvgen --bench --device cuda`)", "",
      "| model | weights GB | test | t/s | GB/s read | % of peak |", "| --- | ---: | --- | ---: | ---: | ---: |"]
for r in rep["speed"]:
    for e in r["tests"]:
        bw = f"{e['gb_s']:.0f} | {e['pct_peak']:.0f}%" if "gb_s" in e else " | "
        L.append(f"| {r['model']} | {r['weight_bytes_per_token'] / 1e9:.2f} | {e['test']} | "
                 f"{e['tok_s']:.1f} ± {e['stddev']:.1f} | {bw} |")
if kv_status == "ok" and os.path.exists(f"{out}/kv/results.md"):
    L += ["", "## KV cache on the GPU (7B Q4_K_M shape)", "", open(f"{out}/kv/results.md").read()]
open(f"{out}/report.md", "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
log "report: $out/report.md"
[[ $cuda_rc -eq 0 && $host_rc -eq 0 ]]
