#!/usr/bin/env bash
# A whole check of a GPU machine (about 8 minutes on one H200, the default budget's bound; --quick: about 2).
# Builds Release for the visible GPU, runs the [cuda] tests, compares CPU and CUDA generations, benchmarks, profiles
# per kernel, and writes OUTDIR/report.md + OUTDIR/report.json (with each variant below beside the default run of the
# same file, test by test: "Variants against the defaults").
#
# usage: scripts/gpu-check.sh [--quick] [--types T,T] OUTDIR
#
#   1. build (build-gpu/, CUDA arch of the visible GPU) and the [cuda] tests (kernels against their CPU twins,
#      whole forward against the CPU backend, the reference cases' fidelity rules);
#   2. correctness: greedy tokens and logits, --device cpu vs --device cuda, on the shared reference models and on
#      synthetic files of every weight type (the default model's shape);
#   3. speed: synthetic LLaMA-2-7B and 13B shapes in F16, Q8_0, Q4_0 and Q4_K_M (made here with kvgen-synth, one at a
#      time, deleted after use): pp16 (a chat turn), pp64, pp512 and tg128 at depths 0, 1024 and 4096, with achieved
#      bandwidth ((weight bytes + KV bytes read) x tokens/s) beside the card's peak (KVGEN_PEAK_GBS; by default the
#      card's, from its memory clock and bus width, as kvgen --list-devices prints it; else 4800, an H200's); per
#      kernel, when Nsight Compute's ncu is there (/usr/local/cuda/bin/ncu or on PATH), the 7B shape in Q4_K_M (with
#      --quick: in every --types) over a 3-token prompt and 3 generated tokens: launches, GPU time, share of the step,
#      GB read and GB/s of each kernel in one decode step and in the prefill, with its registers, block and grid size,
#      waves per SM and achieved occupancy (scripts/lib/ncu_sum.py; without those where this ncu does not know them),
#      the raw CSV as OUTDIR/ncu-SHAPE-TYPE.csv.gz, and for the first quantized type profiled the first 200 kernels of a
#      prefill of about 500 tokens (SHAPE-TYPE-prefill: time and bytes per kernel, nothing raw kept) and under ncu's
#      sections (throughput, tensor pipes, shared memory, occupancy, warp stalls) a decode step's attention and SwiGLU
#      product (SHAPE-TYPE-decode) and one of flash attention in a 512-token batch at depth 4096 (SHAPE-TYPE-flash); and
#      for the first type of each shape, pp16 and pp512 at depths 0 and 4096 with --cuda-attention warp (the CUDA-core
#      prefill attention) beside the default tensor-core one (SHAPE-T-warpattn), pp512 at those depths with
#      --cuda-flash-pipeline off (SHAPE-T-flashsync: flash attention's cache tiles loaded through registers, not copied
#      in two stages), pp16 at those depths with --cuda-flash-warps rows (SHAPE-T-flashrows: a short prompt's block over
#      each whole tile by one warp, not a quarter by each), and pp512 / tg128 at those depths with --kv-type q8_0 and
#      q4_0 (SHAPE-T-kvq8_0, -kvq4_0), tg128 with q8_0/f16 (-kvq8_0-f16);
#      for every file, tg128 with --cuda-pdl off (SHAPE-T-nopdl: the decode products launched without programmatic
#      dependent launch) and with --cuda-prefetch off (SHAPE-T-noprefetch: the output projection's and gate's and up's
#      first weights read from memory, not asked of the L2 cache by decode attention), for F16 and BF16 pp16 and tg128
#      with --cuda-f16-matvec warp --cuda-short-prompt lanes (SHAPE-T-warpf16: one token's products by a warp over 2
#      rows instead of a block of warps over 4, a short prompt's by the f32 lanes instead of cuBLAS on split
#      activations) and tg128 with --cuda-matvec-stages 0 and with --cuda-ring-carveout max (SHAPE-T-ring0, -carvemax,
#      as below), for Q5_K pp16 with --cuda-short-prompt lanes (SHAPE-Q5_K-lanes: a short prompt's products in integers,
#      not on split activations), for Q4_0, Q8_0, Q4_K_M and Q5_K pp16 and tg128 with --cuda-matvec-stages 0
#      (SHAPE-T-ring0: the products' weights through registers, a block a row group, not through rings of shared memory
#      in blocks that stay; with --quick also the per-kernel table of the first of Q8_0 and Q4_K_M) and with
#      --cuda-ring-carveout max (SHAPE-T-carvemax: the rings with all the shared memory an SM allows, 28 KiB of L1 left
#      on an H200, not what their blocks need), for Q4_0, Q8_0 and Q4_K_M tg128 with --cuda-matvec-stages 0
#      --cuda-matvec-rows 4 (SHAPE-T-rows4: that path with 4 rows a block of the one-token products instead of 8), and
#      for the first type tg128 with --cuda-matvec-stages 2 and 4 (SHAPE-T-ring2, -ring4: rings of 2 and 4 stages
#      instead of 3), for Q4_0 pp16 and tg128 with --cuda-matvec-unit 32 (SHAPE-Q4_0-unit32: a lane's step one block of
#      a row, not two; with --quick also its per-kernel table), for Q4_0, Q8_0 and Q4_K_M pp4, pp16 and pp64 with
#      --cuda-matvec-mma on (SHAPE-T-intmma: a short prompt's products on the tensor cores in one launch, not on the
#      CUDA cores 8 tokens a launch, nor at 64 tokens the GEMM), and for the quantized ones pp512 with --cuda-gemm mma
#      (SHAPE-T-mmagemm: the prefill products in one kernel that decodes each weight tile into shared memory, against
#      cuBLAS on decoded chunks), pp512 with --cuda-gemm-chunk 16 and 0 (SHAPE-T-chunk16, -chunk0: cuBLAS on fixed 16
#      MiB chunks of decoded rows and on whole matrices, against the default auto, chunks from the tokens and the SMs),
#      pp512 with --cuda-gemm-overlap off (SHAPE-T-nooverlap: each chunk decoded and multiplied in turn on one stream,
#      not the next, or the next product's first, decoded on a second while one is multiplied) and pp16 and tg128 with
#      --cuda-kv-store kernel (SHAPE-T-storekernel: RoPE and the K/V store in their own launch, not in the Q|K|V
#      products; for F16 pp16 alone, not in the sums of the products on split activations), and tg128 with --cuda-norm
#      kernel (SHAPE-T-normkernel: each RMSNorm in its own launch, not folded into the residual product before it);
#   4. the KV cache comparison (scripts/bench-kv.sh, --device cuda) on the first shape's Q4_K_M file (7B; without
#      Q4_K_M in --types, the first type's): 128, 256, 512 tokens, and where the cached and recomputed tokens part
#      (step, top-2 logit margin, logit difference).
#
#   --quick       the loop while tuning kernels (about 2 minutes): the incremental build, the [cuda] tests, the 7B
#                 shape in each --types with pp4, pp16, pp64, pp512 and tg128 at depth 0 (pp4, pp16 and tg128 also with
#                 --cuda-matvec f32, pp512 with --cuda-gemm mma), for the first type pp16 and pp512 at depth 4096,
#                 and the per-kernel table; no stage 2 or 4
#   --types T,T   weight types of stage 3 (default F16,Q8_0,Q4_0,Q4_K_M; with --quick, Q4_K_M); any type kvgen-synth
#                 writes, such as BF16 and Q5_K
#
# Later stages are skipped, and the report says so, when the time budget (KVGEN_GPU_BUDGET_S, default 420; 240 with
# --quick) runs out; any one command is stopped 60 s past it, and the report is rewritten after every stage and every
# speed run (marked partial until the end), so a run cut short still leaves its figures. A type's variants run after
# its main runs, those that decide a default not yet measured on a GPU first (rings, the tensor cores' short-prompt
# products, the GEMM's overlap, flash attention's pipeline, the folded norm, the K/V store, the L2 prefetch), then its
# per-kernel table, then the rest; each is skipped where it would leave less than 70 s for each type after it (and
# 60 s for the profile still to come). OUTDIR gets at most 8 files: log.txt,
# cuda-tests.txt (read its first failure: a device fault fails every later test case too; that case is rerun alone
# under compute-sanitizer's memcheck, where the tool is, and its output ends the file), report.md, report.json,
# ncu-SHAPE-TYPE.csv.gz per profile, kv-results.md. KVGEN_GPU_CHECK_DRY=1 rehearses the script on a machine without a
# GPU (CPU device, tiny shapes): it checks the script, not the GPU; there KVGEN_GPU_CHECK_NCU_CSV=FILE (an earlier
# ncu CSV, .gz or not) stands in for the profile. Needs the test-data folder (../shared, ./shared or .shared, or
# KVGEN_SHARED; on a lent machine that receives the checkout alone, copy it into the checkout as ./shared): its
# testdata/ holds the reference models, and its device-deps/, when there, prebuilt libraries for a machine without a
# package registry (unpacked into build-gpu/deps).
set -euo pipefail

# shellcheck source=lib/catch_spec.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib/catch_spec.sh"

usage() { sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; }
quick=0 types="" outdir=""
while (($#)); do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --quick) quick=1; shift ;;
        --types) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; types=$2; shift 2 ;;
        -*) echo "gpu-check: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) [[ -z $outdir ]] || { usage >&2; exit 2; }; outdir=$1; shift ;;
    esac
done
[[ -n $outdir ]] || { usage >&2; exit 2; }
[[ $types =~ ^([A-Z0-9_]+(,[A-Z0-9_]+)*)?$ ]] || { echo "gpu-check: --types takes names like Q4_0,Q4_K_M" >&2; exit 2; }
if ((quick)); then types=${types:-Q4_K_M}; else types=${types:-F16,Q8_0,Q4_0,Q4_K_M}; fi
IFS=, read -r -a speed_types <<<"$types"
mkdir -p "$outdir"
out=$(cd "$outdir" && pwd)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
budget=${KVGEN_GPU_BUDGET_S:-$((quick ? 240 : 420))}
peak=${KVGEN_PEAK_GBS:-4800}
t0=$SECONDS
# cuda_tool NAME: the path of a CUDA toolkit program (on PATH, or in /usr/local/cuda/bin), or nothing.
cuda_tool() {
    command -v "$1" || { [[ -x /usr/local/cuda/bin/$1 ]] && echo "/usr/local/cuda/bin/$1"; } || true
}
log() { echo "gpu-check [$((SECONDS - t0)) s]: $*" | tee -a "$out/log.txt" >&2; }
left() { echo $((budget - (SECONDS - t0))); }
# bounded CMD...: CMD, stopped if it runs until 60 s past the budget (a hang must not take a lent machine's time)
bounded() { timeout -k 5 "$(($(left) + 60 > 10 ? $(left) + 60 : 10))" "$@"; }
: >"$out/log.txt"

shared=""
for d in "${KVGEN_SHARED:-}" ../shared shared .shared; do
    if [[ -n $d && -d $d/testdata ]]; then shared=$(cd "$d" && pwd); break; fi
done
# note: on a lent device machine only the checkout travels: copy the test-data folder into it as ./shared first.
[[ -n $shared ]] || {
    echo "gpu-check: error: no test-data folder with testdata/ (../shared, ./shared, .shared or KVGEN_SHARED)" >&2
    exit 1
}
dry=0 dev=cuda shapes=(llama2-7b llama2-13b) cmp_shape=smollm2-135m kv_lengths=128,256,512 depths=0,1024,4096
attn_depth=4096
((quick)) && shapes=(llama2-7b) depths=0
if [[ ${KVGEN_GPU_CHECK_DRY:-0} == 1 ]]; then
    dry=1 dev=cpu shapes=(tiny) cmp_shape=tiny kv_lengths=16,32 gpu="dry run on the CPU, 9.0" arch=90 attn_depth=64
else
    command -v nvidia-smi >/dev/null || { echo "gpu-check: error: nvidia-smi not found: no GPU here" >&2; exit 1; }
    gpu=$(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader | head -n 1)
    arch=$(cut -d, -f2 <<<"$gpu" | tr -d ' .')
fi
mode=$( ((quick)) && echo quick || echo full)
log "GPU: $gpu (building for sm_$arch); $mode run, types $types; shared data: $shared"

# --- 1. build and [cuda] tests ------------------------------------------------------------------------------------
build="build-gpu"
# Always, even where some of the libraries are installed: the GPU image has fmt and nlohmann-json but not PCRE2. The
# prefix stays at one place inside the build folder, since CMake's cache keeps the paths it found there.
if [[ -f $shared/device-deps/unpack.sh ]]; then
    eval "$(bash "$shared/device-deps/unpack.sh" "$root/$build/deps")"
    log "libraries unpacked from $shared/device-deps into $build/deps"
fi
# note: what comes back from a lent machine is at most 8 files, so logs go into log.txt and the work folder.
work=$(mktemp -d "${TMPDIR:-/tmp}/kvgen-gpu.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGEN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DKVGEN_SHARED_DIR="$shared" >"$work/build.log" 2>&1 ||
    { tail -n 30 "$work/build.log" | tee -a "$out/log.txt"; exit 1; }
# Only what runs here: the host-emulated kernel tests and the CPU tests belong to scripts/test.sh on the CPU, and
# here they would spend device time (the host tests alone take about 1.5 minutes) repeating what it checks.
if ! cmake --build "$build" -j "$(nproc)" --target kvgen kvgen-synth kvgen_cuda_tests >>"$work/build.log" 2>&1; then
    grep -m 30 -E -A3 "error|Error" "$work/build.log" | tee -a "$out/log.txt"
    exit 1
fi
kvgen="$root/$build/kvgen" synth="$root/$build/kvgen-synth"
log "built"
# The peak the bandwidths are counted against: KVGEN_PEAK_GBS, else the card's (its memory clock and bus width, as
# kvgen --list-devices prints them), else an H200's 4800 GB/s.
if [[ -z ${KVGEN_PEAK_GBS:-} ]]; then
    card_gbs=$({ "$kvgen" --list-devices 2>/dev/null || true; } |
        sed -n 's|^ *cuda0: .*, memory \([0-9][0-9]*\) GB/s)$|\1|p')
    if [[ -n $card_gbs ]]; then
        peak=$card_gbs
        log "peak bandwidth: $peak GB/s (cuda0's memory clock and bus width)"
    else
        log "peak bandwidth: $peak GB/s (cuda0 did not say; set KVGEN_PEAK_GBS for another card)"
    fi
fi

# The report, rewritten after every stage from what is there (scripts/lib/gpu_report.py): a run stopped early
# still leaves its figures. write_report STATE: "complete", or the stage just finished.
cuda_rc=-1 kv_status="not run" kv_parting="" kv_name="" ncu_status="not reached" skipped=()
write_report() {
    local state=$1 skipped_list
    skipped_list=$(printf '%s\n' "${skipped[@]+"${skipped[@]}"}")
    python3 scripts/lib/gpu_report.py "$out" "$work" "$gpu" "$peak" "$cuda_rc" "$kv_status" "$((SECONDS - t0))" \
        "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "$skipped_list" "$kv_name" "$mode" "$types" \
        "$ncu_status" "$kv_parting" "$state"
}

set +e
# note: a device fault is sticky for the process, so every test case after a faulting one fails too: read the first
# (the binary writes its name, or the name of the case it died in, to first-failure: tests/first_failure.h)
KVGEN_TEST_FIRST_FAILURE="$work/first-failure" timeout -k 5 240 "$build/tests/kvgen_cuda_tests" --durations yes \
    >"$out/cuda-tests.txt" 2>&1
cuda_rc=$?
set -e
log "[cuda] tests: exit $cuda_rc ($(tail -n 2 "$out/cuda-tests.txt" | tr '\n' ' '))"
# That first failing case once more under compute-sanitizer's memcheck, which names the kernel, the bad access and
# its source line (the tests are built with -lineinfo): its output ends cuda-tests.txt.
first=$(head -n 1 "$work/first-failure" 2>/dev/null || true)
if ((cuda_rc != 0 && cuda_rc != 77)) && [[ -n $first ]]; then
    csan=$(cuda_tool compute-sanitizer)
    if [[ -n $csan ]]; then
        # at most 150 s, and at most a third of what is left, so that the speed runs keep most of it
        csan_s=$(($(left) / 3))
        ((csan_s > 150)) && csan_s=150
        ((csan_s < 30)) && csan_s=30
        log "first failing [cuda] case: $first; once more under compute-sanitizer --tool memcheck (${csan_s} s at most)"
        spec=$(catch_spec "$first")
        {
            printf '\n=== compute-sanitizer --tool memcheck, the first failing case alone: %s\n' "$first"
            timeout -k 5 "$csan_s" "$csan" --tool memcheck --print-limit 20 "$build/tests/kvgen_cuda_tests" "$spec" \
                2>&1 | tail -n 250
        } >>"$out/cuda-tests.txt" || true
    else
        log "first failing [cuda] case: $first (no compute-sanitizer to rerun it under)"
    fi
fi
write_report "the [cuda] tests" >/dev/null

vocab="$shared/testdata/vocab/ggml-vocab-llama-spm.gguf"

# --- 2. correctness: CPU vs CUDA generations (not with --quick) --------------------------------------------------
mkdir -p "$work/cmp"
cmp_models=()
((quick)) || for f in "$shared"/testdata/ref/*.gguf "$shared"/testdata/tiny/*.gguf; do cmp_models+=("$f"); done
((quick)) || for t in F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K Q4_K_M; do
    "$synth" "$cmp_shape" --type "$t" --vocab "$vocab" -o "$work/cmp/$cmp_shape-$t.gguf" >/dev/null 2>&1 ||
        { log "kvgen-synth $cmp_shape $t failed"; continue; }
    cmp_models+=("$work/cmp/$cmp_shape-$t.gguf")
done
for m in "${cmp_models[@]+"${cmp_models[@]}"}"; do
    name=$(basename "$m" .gguf)
    for d in cpu cuda; do
        bounded "$kvgen" -m "$m" -p "Once upon a time, there was a little" -n 32 --temp 0 --ignore-eos \
            --device "$([[ $d == cuda ]] && echo "$dev" || echo cpu)" \
            --json "$work/cmp/$name.$d.json" --dump-logits "$work/cmp/$name.$d.f32" >/dev/null \
            2>"$work/cmp/$name.$d.err" || log "$name on $d failed: $(tail -n 1 "$work/cmp/$name.$d.err")"
    done
done
((quick)) || { log "correctness runs done (${#cmp_models[@]} models)"; write_report "the correctness runs" >/dev/null; }

# --- 3. speed, and per kernel --------------------------------------------------------------------------------------
# The KV comparison's model, and the full run's one per-kernel profile: the first shape in Q4_K_M (or the first type).
kv_type=${speed_types[0]}
[[ ,$types, == *,Q4_K_M,* ]] && kv_type=Q4_K_M
kv_name="${shapes[0]}-$kv_type"
ncu=$(cuda_tool ncu)
ncu_csv="" ncu_status="profiled with $ncu"
[[ -n $ncu ]] || ncu_status="ncu not available (neither /usr/local/cuda/bin/ncu nor on PATH): no per-kernel table"
if ((dry)); then
    [[ -n $ncu ]] && ncu_status="not run: a dry run's CPU device launches no kernels"
    ncu=""
    ncu_csv=${KVGEN_GPU_CHECK_NCU_CSV:-}
    [[ -n $ncu_csv ]] && ncu_status="dry run: $ncu_csv summarised in place of a profile"
fi
ncu_prompt="Hello world"  # 3 tokens with BOS in the LLaMA vocabulary
ncu_gen=3                 # the prefill, then 2 decode steps: the first one captures the graph, the last is summarised

# ncu_pass MODEL NAME [KVGEN FLAGS...]: profile MODEL into $work/ncu/NAME.csv; ncu_sum's exit status.
ncu_pass() {
    local f=$1 name=$2 rc metrics
    shift 2
    if [[ -n $ncu ]]; then
        # note: --log-file keeps ncu's CSV apart from kvgen's generated text on stdout.
        for metrics in "$ncu_metrics,$ncu_launch_metrics" "$ncu_metrics"; do
            bounded "$ncu" --clock-control none --metrics "$metrics" --csv --log-file "$work/ncu/$name.csv" \
                "$kvgen" -m "$f" -p "$ncu_prompt" -n "$ncu_gen" --temp 0 --ignore-eos --device "$dev" --no-perf "$@" \
                >/dev/null 2>"$work/ncu/$name.err" && break
            [[ $metrics == "$ncu_metrics" ]] && return 1
            log "$name: ncu with the launch metrics failed ($(cat "$work/ncu/$name.csv" "$work/ncu/$name.err" \
                2>/dev/null | grep -m 1 -i 'error' | cut -c1-200 || true)); again with time and bytes alone"
            (($(left) >= 60)) || return 1
        done
    else
        case $ncu_csv in
            *.gz) gzip -dc "$ncu_csv" >"$work/ncu/$name.csv" ;;
            *) cp "$ncu_csv" "$work/ncu/$name.csv" ;;
        esac
    fi
    rc=0
    python3 scripts/lib/ncu_sum.py "$work/ncu/$name.csv" --gen "$ncu_gen" --json "$work/ncu/$name.json" \
        >"$work/ncu/$name.md" 2>>"$work/ncu/$name.err" || rc=$?
    return "$rc"
}

# What ncu measures per kernel: GPU time and DRAM bytes read, and the launch facts that scripts/lib/ncu_sum.py shows
# beside them where present (its LAUNCH: registers, block and grid size, waves per SM, achieved occupancy).
ncu_metrics=gpu__time_duration.sum,dram__bytes_read.sum
ncu_launch_metrics=launch__registers_per_thread,launch__block_size,launch__grid_size,launch__waves_per_multiprocessor
ncu_launch_metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active

# profile_kernels MODEL NAME [KVGEN FLAGS...]: the per-kernel table of MODEL, in $work/ncu/NAME.md whatever happens.
profile_kernels() {
    local f=$1 name=$2 rc=0 start=$SECONDS
    shift 2
    if (($(left) < 60)); then skipped+=("per-kernel $name"); return; fi
    ncu_pass "$f" "$name" "$@" || rc=$?
    if ((rc == 3 && $(left) >= 60)); then
        # ncu_sum found no decode step: the graph's kernels were not profiled one by one. Launch them one by one.
        log "$name: no decode step in the profile; profiling again with --no-cuda-graphs"
        rc=0
        ncu_pass "$f" "$name" "$@" --no-cuda-graphs || rc=$?
        local why="Decode without the CUDA graph (kvgen --no-cuda-graphs): ncu did not profile the graph's kernels."
        ((rc == 0)) && sed -i "1s/^/$why /" "$work/ncu/$name.md"
    fi
    if ((rc == 0)); then
        gzip -c "$work/ncu/$name.csv" >"$out/ncu-$name.csv.gz"
        # note: the raw rows stay behind when large (what comes back from a lent machine is 16 MiB a file at most).
        if (($(stat -c %s "$out/ncu-$name.csv.gz") > 4 * 1024 * 1024)); then
            rm -f "$out/ncu-$name.csv.gz"
        else
            sed -i "1s/\$/ Raw rows: ncu-$name.csv.gz./" "$work/ncu/$name.md"
        fi
    else
        # ncu's own errors go to its --log-file, kvgen's and ncu_sum's to the .err file
        {
            echo "ncu failed (exit $rc):"; echo; echo '```'
            { grep -v '^"' "$work/ncu/$name.csv" 2>/dev/null || true; } | tail -n 5
            tail -n 5 "$work/ncu/$name.err"
            echo '```'
        } >"$work/ncu/$name.md"
        cat "$work/ncu/$name.err" >>"$out/log.txt"
        # the raw rows come back all the same (when small), so that the summary can be mended without a device
        if [[ -s $work/ncu/$name.csv ]]; then
            gzip -c "$work/ncu/$name.csv" >"$out/ncu-$name.csv.gz"
            (($(stat -c %s "$out/ncu-$name.csv.gz") <= 4 * 1024 * 1024)) || rm -f "$out/ncu-$name.csv.gz"
        fi
    fi
    log "$name profiled per kernel ($((SECONDS - start)) s, $( ((rc == 0)) && echo ok || echo "failed, exit $rc"))"
}

# The first ncu_prefill_kernels kernels (about two layers of a 7B shape) of a prefill of about 500 tokens: where a
# long prompt's time goes (the quantized weights' decoding, cuBLAS's GEMMs, attention), which the 3-token profile
# cannot show. Time and bytes alone (the launch metrics' extra passes would double its time).
ncu_prefill_kernels=200
profile_prefill() {
    local f=$1 name=$2-prefill rc=0 start=$SECONDS
    [[ -n $ncu ]] || return 0  # a dry run's stand-in CSV is a short run's
    if (($(left) < 90)); then skipped+=("per-kernel $name"); return; fi
    # 28 times 18 tokens and BOS: 505 tokens in the LLaMA vocabulary, one batch of the default 512
    [[ -f $work/pp-prompt.txt ]] || for _ in $(seq 28); do
        printf '%s ' "The key-value cache keeps the keys and values of every position, so each new token"
    done >"$work/pp-prompt.txt"
    bounded "$ncu" --clock-control none --launch-count "$ncu_prefill_kernels" --metrics "$ncu_metrics" --csv \
        --log-file "$work/ncu/$name.csv" "$kvgen" -m "$f" -f "$work/pp-prompt.txt" -n 1 -c 1024 --temp 0 \
        --device "$dev" --no-perf >/dev/null 2>"$work/ncu/$name.err" || rc=$?
    if ((rc == 0)); then
        python3 scripts/lib/ncu_sum.py "$work/ncu/$name.csv" --prefill-only --json "$work/ncu/$name.json" \
            >"$work/ncu/$name.md" 2>>"$work/ncu/$name.err" || rc=$?
    fi
    if ((rc != 0)); then
        { echo "ncu failed (exit $rc):"; echo; echo '```'; tail -n 5 "$work/ncu/$name.err"; echo '```'; } \
            >"$work/ncu/$name.md"
        cat "$work/ncu/$name.err" >>"$out/log.txt"
    fi
    log "$name profiled per kernel ($((SECONDS - start)) s, $( ((rc == 0)) && echo ok || echo "failed, exit $rc"))"
}

# profile_sections MODEL NAME KERNELS SKIP COUNT WHAT [KVGEN ARGS...]: COUNT launches of kernels whose names match
# KERNELS (an extended regular expression; the SKIP such launches before them left alone) in a kvgen run of MODEL
# with ARGS, under Nsight Compute's sections with
# their tables (--print-details all): throughput against the SM's and memory's peaks, the pipes (the tensor cores'
# among them), shared memory and its bank conflicts, occupancy, the schedulers, where warps stall. What a kernel is
# short of, which the speed table and the per-kernel tables (time and bytes) cannot say. In $work/ncu/NAME.md
# (gpu_report.py shows it), WHAT its first line.
profile_sections() {
    local f=$1 name=$2 kernel=$3 skip=$4 count=$5 what=$6 rc=0 start=$SECONDS attempt details=(--print-details all)
    shift 6
    [[ -n $ncu ]] || return 0
    if (($(left) < reserve + 60)); then skipped+=("$name under ncu"); return; fi
    for attempt in 1 2; do
        rc=0
        bounded "$ncu" --clock-control none --kernel-name "regex:$kernel" --launch-skip "$skip" \
            --launch-count "$count" "${details[@]}" --section SpeedOfLight --section ComputeWorkloadAnalysis \
            --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section Occupancy \
            --section LaunchStats --section SchedulerStats \
            --section WarpStateStats --log-file "$work/ncu/$name.txt" "$kvgen" -m "$f" --device "$dev" --temp 0 \
            --no-perf "$@" >/dev/null 2>"$work/ncu/$name.err" || rc=$?
        # an ncu older than --print-details: once more with the sections' headers alone
        if ((rc != 0 && attempt == 1 && $(left) >= reserve + 30)) &&
            { cat "$work/ncu/$name.txt" "$work/ncu/$name.err" 2>/dev/null || true; } | grep -q -- "print-details"; then
            details=()
        else
            break
        fi
    done
    if ((rc == 0)) && grep -qE "$kernel" "$work/ncu/$name.txt"; then
        {
            echo "$what: ncu's sections."
            echo; echo '```'
            { grep -v '^==PROF==' "$work/ncu/$name.txt" || true; } | sed -e 's/[[:space:]]*$//' | cat -s
            echo '```'
        } >"$work/ncu/$name.md"
    else
        {
            echo "ncu failed (exit $rc; or profiled no launch of $kernel):"; echo; echo '```'
            tail -n 5 "$work/ncu/$name.txt" "$work/ncu/$name.err" 2>/dev/null || true
            echo '```'
        } >"$work/ncu/$name.md"
        cat "$work/ncu/$name.err" >>"$out/log.txt" 2>/dev/null || true
    fi
    log "$name profiled ($((SECONDS - start)) s, $( ((rc == 0)) && echo ok || echo "failed, exit $rc"))"
}

# profile_launches MODEL NAME TYPE: under profile_sections, decode attention and the SwiGLU product of layer 0 in the
# second generated token of a 3-token prompt (NAME-decode: the largest of a decode step's products, a third of its
# time, and the largest kernel beside the products; for the types whose one-token products are integer ones), and the
# flash attention of layer 0 in the batch of 512 tokens at depth
# attn_depth of a longer prompt (NAME-flash: where pp512 at depth 4096 loses its time); the launches before them
# skipped, one a layer a step or batch. Without the CUDA graph, so that every launch counts whatever ncu makes of
# graphs.
profile_launches() {
    local f=$1 name=$2 t=$3 layers reps batches prompt_glu
    layers=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["n_layers"])' \
        "$work/speed/$name.inspect.json") || return 0
    # the prompt's SwiGLU launches: the integer kernel's one a layer (3 tokens); Q5_K's short prompt takes the split
    # activations instead (cuBLAS), as every type but these does, and only these decode through the integer kernel.
    # A decode step: each layer's attention, then its SwiGLU product (a prompt's attention is flash attention).
    case $t in
        Q4_0 | Q8_0 | Q4_K_M) prompt_glu=$layers ;;
        Q5_K) prompt_glu=0 ;;
        *) prompt_glu=-1 ;;
    esac
    if ((prompt_glu >= 0)); then
        profile_sections "$f" "$name-decode" "attention_decode_kernel|matvec_glu_int_kernel" \
            $((prompt_glu + 2 * layers)) 2 \
            "The second generated token's decode attention and SwiGLU product of layer 0 ($layers layers)" \
            -p "$ncu_prompt" -n "$ncu_gen" --ignore-eos --no-cuda-graphs
    fi
    # at least 16 tokens a sentence (18 in the LLaMA vocabulary): more than attn_depth + 512 tokens
    reps=$(((attn_depth + 512) / 16 + 4))
    for _ in $(seq "$reps"); do
        printf '%s ' "The key-value cache keeps the keys and values of every position, so each new token"
    done >"$work/depth-prompt.txt"
    batches=$((attn_depth / 512))  # the whole batches before the one at depth attn_depth
    profile_sections "$f" "$name-flash" flash_prefill_kernel $((batches * layers)) 1 \
        "pp512 at depth $attn_depth: the flash attention launch of layer 0 ($layers layers)" \
        -f "$work/depth-prompt.txt" -n 1 -b 512 -c $((reps * 20 + 64)) --no-cuda-graphs
}

# variant SUFFIX [--vs SUFFIX0] FLAG... -- ARG...: the file being benchmarked ($f, named $name) benched again with
# FLAGs (and the bench's ARGs: prompts, tokens, depths) as $name-SUFFIX: its inspect facts copied, its flags kept
# beside them for the report's comparison with the default run (gpu_report.py: "Variants against the defaults"), or
# with --vs with the variant $name-SUFFIX0 (the one its flags change one thing of); skipped (the report names it)
# where fewer than reserve + 20 seconds of the budget are left; the report rewritten after it.
variant() {
    local suffix=$1 base=$name flags=()
    shift
    [[ $1 == --vs ]] && { base=$name-$2; shift 2; }
    while [[ $1 != -- ]]; do flags+=("$1"); shift; done
    shift
    if (($(left) < reserve + 20)); then skipped+=("$name-$suffix"); return 0; fi
    cp "$work/speed/$name.inspect.json" "$work/speed/$name-$suffix.inspect.json"
    # the run it is compared with, the flags, the variant's name
    printf '%s\n%s\n%s\n' "$base" "${flags[*]}" "$suffix" >"$work/speed/$name-$suffix.flags"
    bounded "$kvgen" -m "$f" --bench --device "$dev" "${flags[@]}" "$@" -r 2 -o json \
        >"$work/speed/$name-$suffix.bench.json" 2>>"$out/log.txt" || log "$name: bench with ${flags[*]} failed"
    write_report "$name-$suffix" >/dev/null
}

mkdir -p "$work/speed" "$work/ncu"
ring0_profiled=0 prefill_profiled=0 reserve=0
for shape in "${shapes[@]}"; do
    # seconds a shape's runs take at most (2026-11-30: a 7B type about 40 s, a 13B 60-100 s with its larger files;
    # since then up to three more short benches a type)
    need=85
    [[ $shape == *13b ]] && need=140
    for ti in "${!speed_types[@]}"; do
        t=${speed_types[ti]}
        name="$shape-$t"
        if (($(left) < need)); then skipped+=("$name"); continue; fi
        f="$work/speed/$name.gguf"
        "$synth" "$shape" --type "$t" --vocab "$vocab" --threads "$(nproc)" -o "$f" >/dev/null 2>&1 ||
            { log "$name: kvgen-synth failed"; continue; }
        "$kvgen" -m "$f" --inspect --json "$work/speed/$name.inspect.json" >/dev/null ||
            { log "$name: kvgen --inspect failed"; rm -f "$f"; continue; }
        # a chat turn (the products of up to 16 tokens, split attention at depth), a prompt of 64 (the tensor cores'
        # integer products with --cuda-matvec-mma on, the GEMM without) and the GEMM
        prompts=16,64,512
        ((quick)) && prompts=4,16,64,512
        bounded "$kvgen" -m "$f" --bench --device "$dev" -p "$prompts" -n 128 -d "$depths" -r 2 -o json \
            >"$work/speed/$name.bench.json" 2>>"$out/log.txt" || log "$name: bench failed"
        log "$name benchmarked"
        write_report "$name's main runs" >/dev/null
        # The variants, those that decide a default still unmeasured on a GPU first, then the per-kernel table, then
        # the rest: where the budget runs short, variant skips a run (and the report names it) rather than leave the
        # next types without their main runs (reserve: 70 s each) or this one without its profile (60 s).
        reserve=$(((${#speed_types[@]} - ti - 1) * 70))
        profiling=0
        if [[ -n $ncu || -n $ncu_csv ]] && { ((quick)) || [[ $name == "$kv_name" ]]; }; then profiling=1; fi
        ((profiling)) && reserve=$((reserve + 60))
        quantized=1
        [[ $t == F16 || $t == BF16 || $t == F32 ]] && quantized=0
        if [[ $t == Q4_0 || $t == Q8_0 || $t == Q4_K_M || $t == Q5_K || $t == F16 || $t == BF16 ]]; then
            # the products' weights through registers, a block a row group (the default: rings of 3 stages in blocks
            # that stay; F16 and BF16: one token's alone)
            # and the rings with all the shared memory an SM allows (the default: what their blocks need, the rest
            # L1 for the activations every row group reads)
            if ((quantized)); then
                variant ring0 --cuda-matvec-stages 0 -- -p 16 -n 128 -d 0
                variant carvemax --cuda-ring-carveout max -- -p 16 -n 128 -d 0
            else
                variant ring0 --cuda-matvec-stages 0 -- -p 0 -n 128 -d 0
                variant carvemax --cuda-ring-carveout max -- -p 0 -n 128 -d 0
            fi
        fi
        if [[ $t == Q4_0 || $t == Q8_0 || $t == Q4_K_M ]]; then  # a short prompt's products on the tensor cores
            variant intmma --cuda-matvec-mma on -- -p 4,16,64 -n 0 -d 0
        fi
        if ((quantized)); then
            # the prefill GEMM's chunks decoded and multiplied in turn on one stream (the default: the next chunk, or
            # the next product's first, decoded on a second stream while one is multiplied)
            variant nooverlap --cuda-gemm-overlap off -- -p 512 -n 0 -d 0
        fi
        if ((ti == 0)); then
            # flash attention's tiles loaded through registers, not copied in two stages by cp.async
            variant flashsync --cuda-flash-pipeline off -- -p 512 -n 0 -d "0,$attn_depth"
        fi
        if ((quantized)); then
            # each RMSNorm in a launch of its own, not folded into the residual product before it
            variant normkernel --cuda-norm kernel -- -p 0 -n 128 -d 0
            # RoPE and the K/V store in a launch of their own, not the Q|K|V products' epilogue
            variant storekernel --cuda-kv-store kernel -- -p 16 -n 128 -d 0
        elif [[ $t == F16 ]]; then
            # a short prompt's RoPE and K/V store in a launch of their own, not the split products' sums
            variant storekernel --cuda-kv-store kernel -- -p 16 -n 0 -d 0
        fi
        # the output projection's and gate's and up's first weights read from memory, not fetched into L2 while decode
        # attention runs
        variant noprefetch --cuda-prefetch off -- -p 0 -n 128 -d 0
        if ((profiling)); then
            reserve=$((reserve - 60))
            profile_kernels "$f" "$name"
            # one more profile a type at most (OUTDIR keeps 8 files): Q4_0's steps of one block, else the first of
            # Q8_0 and Q4_K_M without rings
            if ((quick)) && [[ $t == Q4_0 ]]; then
                profile_kernels "$f" "$name-unit32" --cuda-matvec-unit 32
            elif ((quick && !ring0_profiled)) && [[ $t == Q8_0 || $t == Q4_K_M ]]; then
                profile_kernels "$f" "$name-ring0" --cuda-matvec-stages 0
                ring0_profiled=1
            fi
            if ((!prefill_profiled)) && ((quantized)); then  # the first quantized type profiled
                profile_prefill "$f" "$name"
                profile_launches "$f" "$name" "$t"
                prefill_profiled=1
            fi
        fi
        if [[ $t == Q4_0 ]]; then  # a lane's step one Q4_0 block of a row (the default: two)
            variant unit32 --cuda-matvec-unit 32 -- -p 16 -n 128 -d 0
        fi
        if [[ $t == Q4_0 || $t == Q8_0 || $t == Q4_K_M ]]; then
            # the register path with 4 rows a block of the one-token products (8 there by default), against ring0
            variant rows4 --vs ring0 --cuda-matvec-stages 0 --cuda-matvec-rows 4 -- -p 0 -n 128 -d 0
        fi
        if ((quantized)); then
            # cuBLAS on fixed chunks of decoded rows (0: the whole matrix) instead of auto
            for mib in 16 0; do variant "chunk$mib" --cuda-gemm-chunk "$mib" -- -p 512 -n 0 -d 0; done
        fi
        if ((ti == 0)); then
            # a short prompt's flash attention with one warp over each whole tile, not the four warps a quarter each
            variant flashrows --cuda-flash-warps rows -- -p 16 -n 0 -d "0,$attn_depth"
            if ((quick)); then  # and the tensor cores at that depth (the full run has it in its depths)
                if (($(left) >= reserve + 20)); then
                    bounded "$kvgen" -m "$f" --bench --device "$dev" -p 16,512 -n 0 -d "$attn_depth" -r 2 -o json \
                        >"$work/speed/$name.deep.json" 2>>"$out/log.txt" || log "$name: deep bench failed"
                else
                    skipped+=("$name pp16/pp512 at depth $attn_depth")
                fi
            fi
        fi
        if [[ $t == Q5_K ]]; then  # a short prompt's products in integers (the default: split activations)
            variant lanes --cuda-short-prompt lanes -- -p 16 -n 0 -d 0
        fi
        if [[ $t == F16 || $t == BF16 ]]; then
            # one token's F16 (BF16) products by a warp over 2 rows (the default: blocks over 4), and a short prompt's
            # by the f32 lanes (the default: cuBLAS on split activations)
            variant warpf16 --cuda-f16-matvec warp --cuda-short-prompt lanes -- -p 16 -n 128 -d 0
        fi
        if [[ $t == Q4_0 || $t == Q8_0 || $t == Q4_K_M ]] && ((ti == 0)); then  # rings of 2 and 4 stages
            for st in 2 4; do variant "ring$st" --cuda-matvec-stages "$st" -- -p 0 -n 128 -d 0; done
        fi
        if ((ti == 0)); then
            # a quantized KV cache: decode and prefill at depth; a q8_0 K beside an f16 V (-ctk q8_0 alone), decode
            for kvt in q8_0 q4_0 q8_0/f16; do
                kvp=512
                [[ $kvt == */* ]] && kvp=0
                variant "kv${kvt//\//-}" --kv-type "$kvt" -- -p "$kvp" -n 128 -d "0,$attn_depth"
            done
        fi
        # the decode products launched without programmatic dependent launch
        variant nopdl --cuda-pdl off -- -p 0 -n 128 -d 0
        if ((quantized)); then
            # the prefill products in one kernel, each weight tile decoded in shared memory
            variant mmagemm --cuda-gemm mma -- -p 512 -n 0 -d 0
        fi
        if ((ti == 0)); then
            # prefill attention on the CUDA cores, to compare with the tensor cores
            variant warpattn --cuda-attention warp -- -p 16,512 -n 0 -d "0,$attn_depth"
        fi
        if ((quick)); then  # the products of up to 16 tokens on f32 activations, to compare with the integer ones
            variant f32matvec --cuda-matvec f32 -- -p 4,16 -n 128 -d 0
        fi
        if [[ $name == "$kv_name" ]] && ((!quick)); then mv "$f" "$work/kv-model.gguf"; else rm -f "$f"; fi
        write_report "$name's speed runs" >/dev/null
    done
done

# --- 4. the KV cache comparison -----------------------------------------------------------------------------------
# note: bench-kv.sh writes 4-6 files; its results.md alone comes back (a lent machine returns at most 8 files)
((quick)) && kv_status="not run (--quick)"
if [[ -f $work/kv-model.gguf ]] && (($(left) > 30)); then
    if bounded env KVGEN_BIN="$kvgen" scripts/bench-kv.sh "$work/kv-model.gguf" --device "$dev" \
        --lengths "$kv_lengths" --runs 1 --nocache-runs 1 --out "$work/kv" >>"$out/log.txt" 2>&1; then
        kv_status="ok"
        cp "$work/kv/results.md" "$out/kv-results.md"
    else
        kv_status="failed (log.txt)"
    fi
    # bench-kv.sh's sentence on where the cached and recomputed tokens part, for the report's summary
    kv_parting=$(grep -m 1 '^Cached vs recomputed:' "$work/kv/results.md" 2>/dev/null || true)
    log "KV cache comparison: $kv_status${kv_parting:+; $kv_parting}"
elif [[ -f $work/kv-model.gguf ]]; then
    kv_status="skipped: time budget"
fi

# --- report -------------------------------------------------------------------------------------------------------
write_report complete
log "report: $out/report.md"
# A dry run has no GPU: its [cuda] tests skip (exit 77), which is no failure there.
((cuda_rc == 0 || (dry && cuda_rc == 77)))
