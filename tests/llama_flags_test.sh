#!/usr/bin/env bash
# A session of the llama.cpp flags a user coming from llama-completion and llama-bench types, each checked for the
# behaviour README.md documents, or for its one-line answer naming kvgen's nearest option. Also the prompt from
# standard input, escapes, -sys, reverse prompts and the terminal newline.
# usage: llama_flags_test.sh KVGEN SHARED_DIR SOURCE_DIR
set -euo pipefail
kvgen=$1 shared=$2 src=$3
# shellcheck source=cli_lib.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"

ref="$shared/testdata/ref/open-gqa-Q8_0.gguf"
spm="$shared/testdata/vocab/ggml-vocab-llama-spm.gguf"
default="$src/models/SmolLM2-135M-Instruct.Q4_1.gguf"
gen=(-m "$ref" -p "Hello" -n 4 --temp 0 --no-perf)

# expect_same NAME CMD_A -- CMD_B: both succeed with identical stdout.
expect_same() {
    local name=$1 a=() rc=0
    shift
    while [[ $1 != -- ]]; do a+=("$1"); shift; done
    shift
    "${a[@]}" >"$tmp/a" 2>"$tmp/a.err" </dev/null || rc=$?
    "$@" >"$tmp/b" 2>"$tmp/b.err" </dev/null || rc=$?
    if [[ $rc -ne 0 ]]; then fail "$name: exit status $rc: $(head -c 300 "$tmp/a.err" "$tmp/b.err")"; return; fi
    if cmp -s "$tmp/a" "$tmp/b"; then pass; else fail "$name: '$(head -c 200 "$tmp/a")' != '$(head -c 200 "$tmp/b")'"; fi
}

# -ngl: 0 is the CPU, N > 0 the GPU (one line without one), auto as --device auto.
expect_same "-ngl 0 runs on the CPU" "$kvgen" "${gen[@]}" -ngl 0 -- "$kvgen" "${gen[@]}" --device cpu
"$kvgen" "${gen[@]}" -ngl 0 --json "$tmp/ngl.json" >/dev/null 2>&1
if python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["device"] == "cpu"' "$tmp/ngl.json"; then pass; else fail "-ngl 0: device is not cpu"; fi
expect_same "--n-gpu-layers 0" "$kvgen" "${gen[@]}" --n-gpu-layers 0 -- "$kvgen" "${gen[@]}" --device cpu
expect_error "-ngl 0 with --device cuda" "disagree" "$kvgen" "${gen[@]}" -ngl 0 --device cuda
expect_error "-ngl past 64 bits is still a GPU count" "disagree" "$kvgen" "${gen[@]}" -ngl 9223372036854775808 \
    --device cpu
expect_same "-ngl 000 runs on the CPU" "$kvgen" "${gen[@]}" -ngl 000 -- "$kvgen" "${gen[@]}" --device cpu
expect_error "a CUDA index past any machine" "expected cpu, cuda, cudaN" "$kvgen" "${gen[@]}" --device cuda99999999999
expect_error "-ngl lots" "-ngl/--n-gpu-layers 'lots'" "$kvgen" "${gen[@]}" -ngl lots
if "$kvgen" --list-devices | grep -q '^  cuda0:'; then
    expect_ok "-ngl 99 runs on the GPU" "" "$kvgen" "${gen[@]}" -ngl 99
    expect_ok "-dev CUDA0" "" "$kvgen" "${gen[@]}" -dev CUDA0
else
    expect_error "-ngl 99 without a GPU" "-ngl 99: .*use --device cpu" "$kvgen" "${gen[@]}" -ngl 99
    expect_error "-dev CUDA0 without a GPU" "--device cuda" "$kvgen" "${gen[@]}" -dev CUDA0
fi
expect_same "-dev none is the CPU" "$kvgen" "${gen[@]}" -dev none -- "$kvgen" "${gen[@]}" --device cpu
expect_error "-dev with two devices" "one device" "$kvgen" "${gen[@]}" -dev CUDA0,CUDA1

# -fa: kvgen's attention is always fused, so on/auto (or a bare -fa) change nothing and off is refused.
expect_same "-fa on" "$kvgen" "${gen[@]}" -fa on -- "$kvgen" "${gen[@]}"
expect_same "-fa auto" "$kvgen" "${gen[@]}" -fa auto -- "$kvgen" "${gen[@]}"
expect_same "bare -fa" "$kvgen" -fa "${gen[@]}" -- "$kvgen" "${gen[@]}"
expect_error "-fa off" "-fa off: kvgen has no unfused attention" "$kvgen" "${gen[@]}" -fa off

# -ctk / -ctv: the K and V cache types.
expect_same "-ctk f32 -ctv f32" "$kvgen" "${gen[@]}" -ctk f32 -ctv f32 -- "$kvgen" "${gen[@]}" --kv-type f32
expect_same "-ctk q8_0 -ctv q8_0" "$kvgen" "${gen[@]}" -ctk q8_0 -ctv q8_0 -- "$kvgen" "${gen[@]}" --kv-type q8_0
expect_error "-ctk q5_1" "-ctk q5_1: this KV cache type is not supported" "$kvgen" "${gen[@]}" -ctk q5_1
expect_same "-ctk q8_0 -ctv q4_0" "$kvgen" "${gen[@]}" -ctk q8_0 -ctv q4_0 -- "$kvgen" "${gen[@]}" --kv-type q8_0/q4_0
expect_error "-ctk against --kv-type" "-ctk f32 and --kv-type f16 disagree on the K type" "$kvgen" "${gen[@]}" \
    --kv-type f16 -ctk f32

# -tb: one thread count for prefill and decode.
expect_same "-tb equal to -t" "$kvgen" "${gen[@]}" -t 2 -tb 2 -- "$kvgen" "${gen[@]}" -t 2
expect_error "-tb other than -t" "use -t 1" "$kvgen" "${gen[@]}" -t 2 -tb 1

# -e / --no-escape: escapes processed by default, as llama.cpp.
expect_ok "escapes by default" "^1 263 13 29890$" "$kvgen" -m "$spm" --tokenize -p 'a\nb'
expect_ok "-e" "^1 263 13 29890$" "$kvgen" -m "$spm" --tokenize -e -p 'a\nb'
expect_ok "--no-escape" "^1 263 29905 9877$" "$kvgen" -m "$spm" --tokenize --no-escape -p 'a\nb'
expect_ok "\\xHH" "^1 319$" "$kvgen" -m "$spm" --tokenize -p '\x41'

# The prompt from standard input: -f -, and a pipe when neither -p nor -f is given (one trailing newline dropped).
if [[ $(echo "Hello world" | "$kvgen" -m "$spm" --tokenize -f -) == "1 15043 3186" ]]; then pass; else fail "-f -"; fi
if [[ $(echo "Hello world" | "$kvgen" -m "$spm" --tokenize) == "1 15043 3186" ]]; then pass; else fail "piped stdin"; fi
if [[ $(printf 'Hello' | "$kvgen" "${gen[@]:0:2}" -n 4 --temp 0 --no-perf 2>/dev/null) == $("$kvgen" "${gen[@]}" 2>/dev/null) ]]; then
    pass
else
    fail "generation from piped stdin differs from -p"
fi
expect_error "-p and -f" "not both" "$kvgen" -m "$ref" -p hi -f -

# -r: llama-completion's reverse prompt; with --bench, llama-bench's repetition count.
if [[ -f $default ]]; then
    out=$("$kvgen" --chat -p "What is the capital of France?" --temp 0 -n 40 -r "Paris" --no-perf --json "$tmp/r.json" 2>/dev/null)
    if [[ $out == *Paris && $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stop"])' "$tmp/r.json") == reverse_prompt ]]; then
        pass
    else
        fail "-r Paris: output '$out' does not stop at the reverse prompt"
    fi
    # A reverse prompt that is one control token stops on that token.
    out=$("$kvgen" --chat -p "Hi" --temp 0 -n 60 --ignore-eos -r "<|im_end|>" --special --no-perf 2>/dev/null)
    if [[ $out == *"<|im_end|>" && $out != *"<|im_end|>"*"<|im_end|>" ]]; then pass; else fail "-r <|im_end|>: '$out'"; fi
else
    fail "default model missing: run models/fetch-default.sh"
fi
expect_ok "--bench -r 1" "pp8" "$kvgen" -m "$ref" --bench -p 8 -n 4 -r 1
expect_error "--bench -r TEXT" "with --bench, -r is the number of repetitions" "$kvgen" -m "$ref" --bench -r "User:"
expect_error "--repetitions without --bench" "only applies to --bench" "$kvgen" "${gen[@]}" --repetitions 3
expect_error "-d without --bench" "--n-depth only applies to --bench" "$kvgen" "${gen[@]}" -d 512
expect_error "-o without --bench" "--output-format only applies to --bench" "$kvgen" "${gen[@]}" -o json

# -sys / -sysf: the chat format's system turn (implies --chat); -st and -cnv -st: one chat turn; -no-cnv: accepted.
if [[ -f $default ]]; then
    expect_ok "-sys replaces the default system turn" "^1 9690 198 6077 5453 30 2 198 1 4093 198 6004 2" \
        "$kvgen" --tokenize -sys "Be brief." -p hi
    printf 'Be brief.\n' >"$tmp/sys.txt"
    expect_ok "-sysf" "^1 9690 198 6077 5453 30 2 198" "$kvgen" --tokenize -sysf "$tmp/sys.txt" -p hi
    expect_ok "--chat --tokenize formats the prompt" "^1 9690 198 2683" "$kvgen" --tokenize --chat -p hi
    expect_same "-st is --chat" "$kvgen" -p hi -n 8 --temp 0 --no-perf -st -- "$kvgen" -p hi -n 8 --temp 0 --no-perf --chat
    expect_same "-cnv -st is --chat" "$kvgen" -p hi -n 8 --temp 0 --no-perf -cnv -st -- \
        "$kvgen" -p hi -n 8 --temp 0 --no-perf --chat
    "$kvgen" --chat -p hi -n 1 -v --no-perf >/dev/null 2>"$tmp/v.err"
    if grep -q "^<|im_start|>user$" "$tmp/v.err"; then pass; else fail "-v with --chat does not show the prompt"; fi
fi
expect_same "-no-cnv" "$kvgen" "${gen[@]}" -no-cnv -- "$kvgen" "${gen[@]}"
for f in -if -mli --in-prefix; do
    expect_error "$f" "$f: kvgen's interactive mode is the conversation: -cnv" "$kvgen" "${gen[@]}" "$f"
done
expect_error "-sys with -sysf" "not both" "$kvgen" "${gen[@]}" -sys a -sysf "$tmp/sys.txt"

# --display-prompt / --no-display-prompt (kvgen's default: the text alone) and -sp.
expect_same "--no-display-prompt" "$kvgen" "${gen[@]}" --no-display-prompt -- "$kvgen" "${gen[@]}"
"$kvgen" "${gen[@]}" >"$tmp/plain" 2>/dev/null
"$kvgen" "${gen[@]}" --display-prompt >"$tmp/shown" 2>/dev/null
if [[ $(cat "$tmp/shown") == "Hello$(cat "$tmp/plain")" ]]; then pass; else fail "--display-prompt: '$(cat "$tmp/shown")'"; fi
expect_ok "-sp parses control tokens" "^1 6004$" "$kvgen" --tokenize -sp -p "<|im_start|>hi"

# Flags llama.cpp has and kvgen answers with its nearest option; an unknown one-dash flag is named whole.
expect_error "-ub" "-ub: kvgen has one batch size .*-b/--batch-size" "$kvgen" "${gen[@]}" -ub 512
expect_error "-hf" "-hf: kvgen does not download models" "$kvgen" -hf org/model
expect_error "-mg" "--device cudaN" "$kvgen" "${gen[@]}" -mg 1
expect_error "--jinja" "--jinja: --chat formats" "$kvgen" "${gen[@]}" --jinja
expect_error "-co" "unknown option '-co'" "$kvgen" "${gen[@]}" -co
expect_error "-ngl read whole, not as -n gl" "-ngl" "$kvgen" "${gen[@]}" -ngl gl

# Output ends with a newline on a terminal (and is left exact in a pipe).
if command -v script >/dev/null; then
    script -qec "$(printf '%q ' "$kvgen" "${gen[@]}")" /dev/null >"$tmp/tty" 2>&1 || true
    if [[ $(tail -c 2 "$tmp/tty" | od -An -c | tr -d ' ') == '\r\n' ]]; then pass; else fail "no newline at the end on a terminal"; fi
fi
if [[ $(tail -c 1 "$tmp/plain" | od -An -c | tr -d ' ') != '\n' ]]; then pass; else fail "a newline was added in a pipe"; fi

finish
