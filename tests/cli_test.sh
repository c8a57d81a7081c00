#!/usr/bin/env bash
# End-to-end checks of kvgen and kvgen-synth: --inspect on every shared model and on synthetic files of every
# type, and bad input answered by one "kvgen: error:" line with exit status 1.
# usage: cli_test.sh KVGEN KVGEN_SYNTH SHARED_DIR SOURCE_DIR
set -euo pipefail
kvgen=$1 synth=$2 shared=$3 src=$4
# shellcheck source=cli_lib.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"

# --inspect on every shared file.
for f in "$shared"/testdata/*/*.gguf; do
    expect_ok "inspect $(basename "$f")" "architecture:" "$kvgen" -m "$f" --inspect
done
expect_ok "inspect tiny: KV cost" "KV cache (f16): 32 B per token, 128 KiB for 4096 tokens" \
    "$kvgen" -m "$shared/testdata/tiny/llama-2-tiny-random.gguf" --inspect
expect_ok "inspect ref: GQA" "grouped-query 4:1" "$kvgen" -m "$shared/testdata/ref/open-gqa-Q4_K_M.gguf" --inspect
expect_ok "inspect vocab-only" "vocabulary-only file" "$kvgen" -m "$shared/testdata/vocab/ggml-vocab-gpt-2.gguf" --inspect

# The default model (scripts/test.sh fetches it first).
default="$src/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ -f $default ]]; then
    expect_ok "inspect default model" "KV cache (f16): 22.5 KiB per token, 180 MiB for 8192 tokens" \
        "$kvgen" -m "$default" --inspect
    expect_ok "inspect default model: tied" "tied to token_embd" "$kvgen" -m "$default" --inspect
    expect_ok "inspect default model: the chosen KV types first" \
        "KV cache (q8_0/q4_0): 9.14 KiB per token, 73.1 MiB for 8192 tokens" "$kvgen" -m "$default" --inspect \
        --kv-type q8_0/q4_0
    expect_ok "inspect default model: the chosen KV types in JSON" '"type": "q4_0",' "$kvgen" -m "$default" --inspect \
        -ctk q4_0 -ctv q4_0 --json -
    expect_ok "inspect default model: JSON" '"n_kv_heads": 3' "$kvgen" -m "$default" --inspect --json -
    # -v --json holds every metadata string whole (the chat template is 368 bytes) and numbers as numbers.
    if "$kvgen" -m "$default" --inspect -v --json - | python3 -c 'import json,sys; m=json.load(sys.stdin)["metadata"]; t=m["tokenizer.chat_template"]; assert len(t) == 368 and t.endswith("{% endif %}") and m["llama.block_count"] == 30, t'; then
        pass
    else
        fail "inspect -v --json: the chat template is not whole"
    fi
    "$kvgen" -m "$default" --inspect --json "$tmp/inspect.json" >/dev/null
    if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["n_layers"]==30 and d["kv_cache"]["bytes_per_token"]==23040' "$tmp/inspect.json"; then
        pass
    else
        fail "inspect --json FILE: not the expected JSON"
    fi
else
    fail "default model missing: run models/fetch-default.sh"
fi

# --tokenize, on vocabulary-only files and models.
spm="$shared/testdata/vocab/ggml-vocab-llama-spm.gguf"
expect_ok "tokenize SPM with BOS" "^1 15043 3186$" "$kvgen" -m "$spm" --tokenize -p "Hello world"
expect_ok "tokenize --no-bos" "^15043 3186$" "$kvgen" -m "$spm" --tokenize -p "Hello world" --no-bos
expect_ok "tokenize -v pieces" "15043 -> ' Hello'" "$kvgen" -m "$spm" --tokenize -p "Hello world" -v
expect_ok "tokenize -v: a backslash piece is escaped, not taken for an escape" "59 -> '\\\\\\\\'" "$kvgen" \
    -m "$shared/testdata/vocab/ggml-vocab-gpt-2.gguf" --tokenize --no-escape -p 'a\nb' -v
expect_ok "tokenize GPT-2" "^15496 995$" "$kvgen" -m "$shared/testdata/vocab/ggml-vocab-gpt-2.gguf" --tokenize -p "Hello world"
printf 'Hello world' >"$tmp/prompt.txt"
expect_ok "tokenize -f FILE" "^1 15043 3186$" "$kvgen" -m "$spm" --tokenize -f "$tmp/prompt.txt"
if [[ -f $default ]]; then
    expect_ok "tokenize default model" "^19556 905$" "$kvgen" -m "$default" --tokenize -p "Hello world"
    expect_ok "tokenize --special" "^1 6004$" "$kvgen" -m "$default" --tokenize -p "<|im_start|>hi" --special
fi
# A reader that stops early (| head) ends --tokenize quietly, with status 0 rather than a SIGPIPE death.
python3 -c 'print("word " * 200000)' >"$tmp/big.txt"
sigpipe_ok=1
for _ in 1 2 3 4 5; do
    set +o pipefail
    "$kvgen" -m "$spm" --tokenize -v -f "$tmp/big.txt" 2>"$tmp/tok.err" | head -2 >/dev/null
    rc=${PIPESTATUS[0]}
    set -o pipefail
    [[ $rc -eq 0 && ! -s $tmp/tok.err ]] || sigpipe_ok=0
done
if ((sigpipe_ok)); then pass; else fail "--tokenize | head: status $rc: $(cat "$tmp/tok.err")"; fi
expect_error "tokenize: missing prompt file" "cannot open" "$kvgen" -m "$spm" --tokenize -f "$tmp/none.txt"
expect_error "tokenize: no tokenizer" "no tokenizer" "$kvgen" -m "$src/tests/data/dequant_golden.bin" --tokenize -p hi

# Generation.
ref="$shared/testdata/ref/open-gqa-Q8_0.gguf"
expect_ok "generate: JSON keys" "" "$kvgen" -m "$ref" -p "Hello" -n 8 --temp 0 -t 2 --device cpu --json "$tmp/gen.json" \
    --dump-logits "$tmp/logits.f32"
if python3 - "$tmp/gen.json" "$tmp/logits.f32" <<'PY'; then pass; else fail "generate: --json/--dump-logits content"; fi
import json, os, sys
d = json.load(open(sys.argv[1]))
keys = ["model", "device", "threads", "kv_cache", "n_ctx", "prompt_tokens", "tokens", "text", "load_ms", "prefill_ms",
        "decode_ms", "prefill_tok_s", "decode_tok_s", "token_ms", "kv_cache_bytes", "peak_rss_bytes"]
missing = [k for k in keys if k not in d]
assert not missing, missing
assert d["kv_cache"] is True and d["device"] == "cpu" and d["threads"] == 2
assert len(d["tokens"]) == 8 and len(d["token_ms"]) == 8 and d["prompt_tokens"][0] == 1
assert os.path.getsize(sys.argv[2]) == 8 * 4096 * 4
PY
"$kvgen" -m "$ref" -p "Hello" -n 8 --temp 0 --no-kv-cache --json "$tmp/gen-nokv.json" >/dev/null 2>&1
if python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); assert a["tokens"]==b["tokens"] and b["kv_cache"] is False' "$tmp/gen.json" "$tmp/gen-nokv.json"; then
    pass
else
    fail "generate: --no-kv-cache tokens differ from the cached run"
fi
if [[ -f $default ]]; then
    expect_ok "default model: greedy chat answers Paris" "Paris" \
        "$kvgen" --chat -p "What is the capital of France?" --temp 0 -n 24
fi
expect_error "generate: no prompt" "no prompt" "$kvgen" -m "$ref"
expect_error "generate: prompt longer than context" "raise --ctx-size" "$kvgen" -m "$ref" -p "one two three four five six" -c 4
expect_error "generate: -n -5" "n-predict" "$kvgen" -m "$ref" -p hi -n -5
expect_error "generate: -c 0" "ctx-size" "$kvgen" -m "$ref" -p hi -c 0
expect_error "generate: --temp -1" "temp" "$kvgen" -m "$ref" -p hi --temp -1
expect_error "generate: --top-p 2" "top-p" "$kvgen" -m "$ref" -p hi --top-p 2
expect_error "generate: -t 0" "threads" "$kvgen" -m "$ref" -p hi -t 0
for opt in --temp --top-p --min-p --repeat-penalty; do
    expect_error "generate: $opt nan" "$opt: value nan not a number" "$kvgen" -m "$ref" -p hi "$opt" nan
    expect_error "generate: $opt inf" "$opt: value inf not a number" "$kvgen" -m "$ref" -p hi "$opt" inf
done
"$kvgen" -m "$ref" -p "Hello" -n 0 --json "$tmp/n0.json" >"$tmp/n0.out" 2>"$tmp/n0.err"
if [[ ! -s $tmp/n0.out ]] && grep -q "prompt eval time = .* /     3 tokens" "$tmp/n0.err" &&
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["tokens"] == [] and d["prefill_ms"] > 0' "$tmp/n0.json"; then
    pass
else
    fail "-n 0: $(cat "$tmp/n0.out" "$tmp/n0.err")"
fi
expect_error "generate: --kv-type q4" "kv-type" "$kvgen" -m "$ref" -p hi --kv-type q4
expect_error "generate: a context with no room to generate" "leaves no room to generate" "$kvgen" -m "$ref" -p Hi -c 2
expect_error "generate: --math approx" "--math: approx not in" "$kvgen" -m "$ref" -p hi --math approx
expect_error "generate: --cuda-gemm bogus" "--cuda-gemm: bogus not in" "$kvgen" -m "$ref" -p hi --cuda-gemm bogus
expect_error "generate: --cuda-gemm-chunk big" "--cuda-gemm-chunk: must be auto or a number" "$kvgen" -m "$ref" -p hi \
    --cuda-gemm-chunk big
expect_error "generate: --cuda-gemm-chunk 5000" "--cuda-gemm-chunk: must be auto or a number" "$kvgen" -m "$ref" -p hi \
    --cuda-gemm-chunk 5000
expect_ok "generate: --cuda-gemm-chunk auto on the CPU" "." "$kvgen" -m "$ref" -p "The KV cache" -n 2 --temp 0 -t 1 \
    --cuda-gemm-chunk auto
expect_error "generate: --cuda-norm bogus" "--cuda-norm: bogus not in" "$kvgen" -m "$ref" -p hi --cuda-norm bogus
expect_error "generate: --cuda-ring-carveout half" "--cuda-ring-carveout: half not in" "$kvgen" -m "$ref" -p hi \
    --cuda-ring-carveout half
expect_ok "generate: --cuda-ring-carveout max on the CPU" "." "$kvgen" -m "$ref" -p "The KV cache" -n 2 --temp 0 -t 1 \
    --cuda-ring-carveout max
expect_error "generate: --cuda-matvec-mma yes" "--cuda-matvec-mma: yes not in" "$kvgen" -m "$ref" -p hi \
    --cuda-matvec-mma yes
expect_error "generate: --cuda-flash-warps cols" "--cuda-flash-warps: cols not in" "$kvgen" -m "$ref" -p hi \
    --cuda-flash-warps cols
expect_error "generate: --cuda-short-prompt f32" "--cuda-short-prompt: f32 not in" "$kvgen" -m "$ref" -p hi \
    --cuda-short-prompt f32
expect_ok "generate: --cuda-matvec-mma on on the CPU" "." "$kvgen" -m "$ref" -p "The KV cache" -n 2 --temp 0 -t 1 \
    --cuda-matvec-mma on
expect_error "generate: --math fast on the GPU" "exact mode only" "$kvgen" -m "$ref" -p hi --math fast --device cuda
expect_ok "generate: --math f32" "." "$kvgen" -m "$ref" -p "The KV cache" -n 4 --temp 0 -t 1 --math f32
# --math fast: the same text interface, its mode named in --bench's backend column
expect_ok "generate: --math fast" "." "$kvgen" -m "$ref" -p "The KV cache" -n 4 --temp 0 -t 1 --math fast
expect_ok "bench: --math fast" "CPU --math fast" "$kvgen" -m "$ref" --bench -p 8 -n 2 -r 1 -t 1 --math fast

# A token's numbers do not depend on the instruction set: the AVX-512, AVX2 and portable kernels give the same logits.
for m in open-gqa-Q8_0 open-mha-F16; do
    for isa in native avx2 generic; do
        KVGEN_ISA=$([[ $isa == native ]] || echo "$isa") "$kvgen" -m "$shared/testdata/ref/$m.gguf" -t 1 --temp 0 -n 6 \
            -p "The KV cache keeps the keys and values of every earlier token" --dump-logits "$tmp/isa-$isa.f32" \
            >/dev/null 2>&1
    done
    if cmp -s "$tmp/isa-native.f32" "$tmp/isa-avx2.f32" && cmp -s "$tmp/isa-native.f32" "$tmp/isa-generic.f32"; then
        pass
    else
        fail "$m: the logits differ between the AVX-512, AVX2 and portable kernels"
    fi
done

# --prompt-cache: the second run reuses the first's prompt and prints the same text; a damaged file is a warning
# and a cold run; the file is never left half-written.
pc_args=(-m "$ref" -p "The KV cache keeps the keys and values of every earlier token" -n 8 --temp 0 -t 1)
"$kvgen" "${pc_args[@]}" --prompt-cache "$tmp/p.cache" >"$tmp/pc1.out" 2>"$tmp/pc1.err"
"$kvgen" "${pc_args[@]}" --prompt-cache "$tmp/p.cache" --json "$tmp/pc2.json" >"$tmp/pc2.out" 2>"$tmp/pc2.err"
if cmp -s "$tmp/pc1.out" "$tmp/pc2.out" && grep -q "prompt cache = .* 0 tokens reused of 0 in the file" "$tmp/pc1.err" &&
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["prompt_cache"]; n=len(json.load(open(sys.argv[1]))["prompt_tokens"])
assert d["reused_tokens"] == n - 1 and d["file_tokens"] == n and d["problem"] == "", d' "$tmp/pc2.json"; then
    pass
else
    fail "--prompt-cache reuse: $(cat "$tmp/pc1.err" "$tmp/pc2.err")"
fi
head -c 1000 "$tmp/p.cache" >"$tmp/p.trunc"
"$kvgen" "${pc_args[@]}" --prompt-cache "$tmp/p.trunc" --prompt-cache-ro >"$tmp/pc3.out" 2>"$tmp/pc3.err" || true
if cmp -s "$tmp/pc1.out" "$tmp/pc3.out" && grep -q "warning: --prompt-cache .*truncated or damaged.*not used" "$tmp/pc3.err" &&
    [[ $(stat -c %s "$tmp/p.trunc") -eq 1000 ]] && ! ls "$tmp"/p.trunc.tmp* >/dev/null 2>&1; then
    pass
else
    fail "--prompt-cache truncated file: $(cat "$tmp/pc3.err")"
fi
# A file saved by a run whose context shifted holds the rows as the prompt computed them (the prompt's; with
# --prompt-cache-all every position's before the first shift), so a later hit gives the cold run's tokens and logits.
pc_long="The KV cache keeps the keys and values of every earlier token so that a new token attends to them without \
computing them again"
pc_hit() {  # pc_hit NAME FILE PROMPT: a hit on FILE gives the cold run's text and logits
    "$kvgen" -m "$ref" -p "$3" -n 8 --temp 0 -t 1 --prompt-cache "$2" --prompt-cache-ro --dump-logits "$tmp/hit.f32" \
        >"$tmp/hit.out" 2>"$tmp/hit.err"
    "$kvgen" -m "$ref" -p "$3" -n 8 --temp 0 -t 1 --dump-logits "$tmp/cold.f32" >"$tmp/cold.out" 2>/dev/null
    if cmp -s "$tmp/hit.f32" "$tmp/cold.f32" && cmp -s "$tmp/hit.out" "$tmp/cold.out" &&
        grep -q "prompt cache = .* [1-9][0-9]* tokens reused" "$tmp/hit.err"; then
        pass
    else
        fail "$1: $(cat "$tmp/hit.err")"
    fi
}
"$kvgen" -m "$ref" -p "$pc_long" -c 48 -n 40 --temp 0 --ignore-eos -t 1 --prompt-cache "$tmp/shift.cache" \
    >/dev/null 2>"$tmp/shift.err"
grep -q "context shifts = " "$tmp/shift.err" || fail "--prompt-cache and a context shift: no shift"
pc_hit "--prompt-cache saved by a run that shifted" "$tmp/shift.cache" "$pc_long"
"$kvgen" -m "$ref" -p "$pc_long" -c 48 -n 40 --temp 0 --ignore-eos -t 1 --prompt-cache "$tmp/shift-all.cache" \
    --prompt-cache-all --json "$tmp/shift-all.json" >/dev/null 2>&1
pc_text=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["text"][:40])' "$tmp/shift-all.json")
pc_hit "--prompt-cache-all saved by a run that shifted" "$tmp/shift-all.cache" "$pc_long$pc_text"
# rows another --math computed are not reused; a file that is not a prompt cache (a model) is never overwritten
"$kvgen" "${pc_args[@]}" --prompt-cache "$tmp/p.cache" --math fast >/dev/null 2>"$tmp/pcm.err"
if grep -q "warning: --prompt-cache .*computed with --math exact (this run: fast); not used" "$tmp/pcm.err"; then
    pass
else
    fail "--prompt-cache with another --math: $(cat "$tmp/pcm.err")"
fi
cp "$ref" "$tmp/model-copy.gguf"
expect_error "--prompt-cache naming a model" "model-copy.gguf: not a kvgen prompt-cache file; it is not overwritten" \
    "$kvgen" "${pc_args[@]}" --prompt-cache "$tmp/model-copy.gguf"
if cmp -s "$ref" "$tmp/model-copy.gguf"; then pass; else fail "--prompt-cache overwrote a model"; fi
mkfifo "$tmp/fifo"
expect_error "--prompt-cache naming a FIFO" "not a regular file" timeout 20 "$kvgen" "${pc_args[@]}" \
    --prompt-cache "$tmp/fifo"
expect_error "--prompt-cache with --no-kv-cache" "which --no-kv-cache turns off" "$kvgen" "${pc_args[@]}" \
    --prompt-cache "$tmp/p.cache" --no-kv-cache
expect_error "--prompt-cache-all without --prompt-cache" "only applies to --prompt-cache" "$kvgen" "${pc_args[@]}" \
    --prompt-cache-all
expect_error "--prompt-cache in --bench" "only applies to generation" "$kvgen" -m "$ref" --bench -p 8 -n 0 \
    --prompt-cache "$tmp/p.cache"

# Context shift: -c 48 and 120 tokens to generate: the run shifts and finishes; --no-context-shift stops at the context.
"$kvgen" -m "$ref" -p "Once upon a time" -c 48 -n 120 --temp 0 --ignore-eos --json "$tmp/cs.json" >/dev/null \
    2>"$tmp/cs.err"
if grep -q "context shifts = " "$tmp/cs.err" && python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
assert len(d["tokens"]) == 120 and d["context_shifts"] >= 2 and d["stop"] == "n_predict", d["stop"]' "$tmp/cs.json"; then
    pass
else
    fail "context shift: $(cat "$tmp/cs.err")"
fi
"$kvgen" -m "$ref" -p "Once upon a time" -c 48 -n 120 --temp 0 --ignore-eos --no-context-shift --json "$tmp/ncs.json" \
    >/dev/null 2>"$tmp/ncs.err"
if grep -q "the context of 48 tokens is full" "$tmp/ncs.err" &&
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["stop"] == "context" and d["context_shifts"] == 0' \
        "$tmp/ncs.json"; then
    pass
else
    fail "--no-context-shift: $(cat "$tmp/ncs.err")"
fi
expect_error "--keep -2" "keep" "$kvgen" -m "$ref" -p hi --keep -2
# a shift that would keep everything says which setting to change; -ro on a missing file says there is none
"$kvgen" -m "$ref" -p "Once upon a time there" -c 8 -n 20 --keep -1 --temp 0 --no-perf >/dev/null 2>"$tmp/keep.err"
if grep -q "a context shift that keeps 7 frees none (raise --ctx-size or lower --keep)" "$tmp/keep.err"; then
    pass
else
    fail "--keep -1 in a full context: $(cat "$tmp/keep.err")"
fi
"$kvgen" -m "$ref" -p hi -n 2 --no-perf --prompt-cache "$tmp/none.cache" --prompt-cache-ro >/dev/null 2>"$tmp/ro.err"
if grep -q "none.cache: no such file, and --prompt-cache-ro writes none" "$tmp/ro.err"; then
    pass
else
    fail "--prompt-cache-ro on a missing file: $(cat "$tmp/ro.err")"
fi

# Conversation mode through a real terminal (a pty): three turns typed at the "> " prompt, then /exit. Turns 2 and 3
# take the conversation so far from the cache, the previous answer included, and prefill only that answer's last
# token and end-of-turn text (at most 3 tokens on the default model) and their own message.
if python3 - "$kvgen" "$default" >"$tmp/cnv.log" 2>&1 <<'PY'; then
import os, pty, re, select, sys, time
kvgen, model = sys.argv[1:3]
pid, fd = pty.fork()
if pid == 0:
    os.execv(kvgen, [kvgen, "-m", model, "-cnv", "--temp", "0", "-n", "24", "-t", "2", "-c", "512"])
out = b""
def read_until(pattern, timeout=120):
    global out
    end = time.time() + timeout
    while not re.search(pattern, out):
        if time.time() > end:
            sys.exit("timed out waiting for %r; got %r" % (pattern, out[-400:]))
        if select.select([fd], [], [], 1)[0]:
            try:
                out += os.read(fd, 4096)
            except OSError:
                break
for i, msg in enumerate(["What is the capital of France?", "And of Italy?", "Which of the two is larger?"]):
    read_until(rb"\n> $" if i == 0 else rb"turn %d: [^\r\n]*[\r\n]+> $" % i)
    os.write(fd, msg.encode() + b"\n")
read_until(rb"turn 3: [^\r\n]*[\r\n]+> $")
os.write(fd, b"/exit\n")
_, status = os.waitpid(pid, 0)
text = out.decode(errors="replace")
print(text)
turns = re.findall(r"turn (\d): (\d+) tokens from the cache, (\d+) prefilled \((\d+) of the previous answer, (\d+) new", text)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
assert [t[0] for t in turns] == ["1", "2", "3"], turns
cached = [int(t[1]) for t in turns]
answer = [int(t[3]) for t in turns]
new = [int(t[4]) for t in turns]
assert cached[0] == 0 and 0 < cached[1] < cached[2], cached
assert all(0 < a <= 3 for a in answer[1:]), answer
assert all(0 < n < 30 for n in new[1:]), new
PY
    pass
else
    fail "conversation in a terminal: $(tail -c 1500 "$tmp/cnv.log")"
fi
# Conversation from a pipe: a blank line is no message, CRLF line ends and spaces around /exit are taken as typed;
# a message that cannot fit the context is one error line and exit status 1; flags it cannot honour are refused.
if printf '  \r\nHi\r\n /exit \nnot reached\n' |
    "$kvgen" -m "$default" -cnv -n 4 --temp 0 -t 1 --json "$tmp/cnv.json" >/dev/null 2>"$tmp/cnv.err" &&
    python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["turns"]; assert [x["message"] for x in t] == ["Hi"], t' \
        "$tmp/cnv.json"; then
    pass
else
    fail "conversation from a pipe: $(cat "$tmp/cnv.err")"
fi
rc=0
printf 'This message is far too long to fit into a context of only sixteen tokens, whatever the model\n' |
    "$kvgen" -m "$default" -cnv -c 16 -n 4 -t 1 --json "$tmp/cnv-err.json" >/dev/null 2>"$tmp/cnv.err" || rc=$?
if [[ $rc -eq 1 ]] && grep -q "^kvgen: error: the conversation with this message has [0-9]* tokens but the context holds 16" \
    "$tmp/cnv.err" && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["turns"] == [] and \
"context holds 16" in d["error"], d' "$tmp/cnv-err.json"; then
    pass
else
    fail "conversation: a message longer than the context: exit status $rc: $(cat "$tmp/cnv.err")"
fi
expect_error "conversation with --ignore-eos" "takes no --dump-logits, --ignore-eos" "$kvgen" -m "$default" -cnv \
    --ignore-eos
expect_error "conversation with -p and -sys" "from -p or from -sys/-sysf, not both" "$kvgen" -m "$default" -cnv -p a \
    -sys b
expect_error "generate: vocabulary-only file" "vocabulary-only" "$kvgen" -m "$spm" -p hi
printf 'Once upon a time, there was a little girl.\n' >"$tmp/short.txt"
for _ in $(seq 40); do echo "The quick brown fox jumps over the lazy dog, and the cat watches it from the wall."; done \
    >"$tmp/long.txt"
expect_error "perplexity: a text shorter than two chunks" "needs at least" "$kvgen" -m "$ref" --perplexity \
    -f "$tmp/short.txt" -c 64
expect_error "perplexity: no -f" "needs the text as -f" "$kvgen" -m "$ref" --perplexity -p hello
expect_error "perplexity: a KL base file that is not one" "not a kvgen KL base file" "$kvgen" -m "$ref" --perplexity \
    -f "$tmp/long.txt" -c 64 --kl-divergence "$tmp/short.txt"
expect_error "--kl-divergence without --perplexity" "only applies to --perplexity" "$kvgen" -m "$ref" -p hi \
    --kl-divergence "$tmp/short.txt"
# --perplexity on two chunks: the running value per chunk and llama-perplexity's final line on stdout
if "$kvgen" -m "$ref" --perplexity -f "$tmp/long.txt" -c 64 -t 1 >"$tmp/ppl.out" 2>"$tmp/ppl.err" &&
    grep -q '^\[1\][0-9.]*,\[2\][0-9.]*,' "$tmp/ppl.out" && grep -q '^Final estimate: PPL = [0-9.]* +/- [0-9.]*$' "$tmp/ppl.out"; then
    pass "perplexity: running values and the final estimate"
else
    fail "perplexity: $(cat "$tmp/ppl.out" "$tmp/ppl.err")"
fi
expect_ok "bench: the KV types in the markdown table when not f16" "| CPU | 1 | q8_0 | q4_0 | pp8 |" "$kvgen" -m "$ref" \
    --bench -p 8 -n 0 -r 1 -t 1 --kv-type q8_0/q4_0
expect_ok "--version: the version, build number and commit" "^kvgen [0-9.]* (build [0-9]*, commit [0-9a-z-]*)$" \
    "$kvgen" --version
# csv, json, jsonl and sql: llama-bench's field names, the same fields in each, values that agree with each other.
for format in csv json jsonl sql; do
    "$kvgen" -m "$ref" --bench -p 8 -n 2 -r 2 -t 1 --math fast -o "$format" >"$tmp/bench.$format" 2>"$tmp/err" ||
        fail "bench -o $format: $(cat "$tmp/err")"
done
commit=$(git -C "$src" rev-parse --short=7 HEAD 2>/dev/null || echo unknown)
if python3 - "$tmp/bench" "$commit" <<'PY'; then
import csv, json, sqlite3, sys
base, commit = sys.argv[1], sys.argv[2]
rows = json.load(open(base + ".json"))
lines = [json.loads(line) for line in open(base + ".jsonl")]
assert [r["test"] for r in rows] == [r["test"] for r in lines] == ["pp8", "tg2"], rows
llama_bench = ["build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename", "model_type",
               "model_size", "model_n_params", "n_batch", "n_threads", "type_k", "type_v", "n_gpu_layers", "use_mmap",
               "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
               "samples_ns", "samples_ts"]
for r in rows:
    assert list(r)[:len(llama_bench)] == llama_bench, list(r)
    assert r["build_commit"].split("-")[0] == commit or commit == "unknown", (r["build_commit"], commit)
    assert r["backends"] == "CPU" and r["math"] == "fast" and r["n_threads"] == 1 and r["type_k"] == "f16"
    assert r["n_gpu_layers"] == 0
    n = r["n_prompt"] + r["n_gen"]
    assert len(r["samples_ns"]) == len(r["samples_ts"]) == 2
    for ns, ts in zip(r["samples_ns"], r["samples_ts"]):
        assert abs(ns * ts / 1e9 - n) < 1e-3 * n, (ns, ts, n)
    assert abs(r["avg_ns"] - sum(r["samples_ns"]) / 2) <= 1
with open(base + ".csv", newline="") as f:
    table = list(csv.DictReader(f))
scalars = [k for k in rows[0] if not isinstance(rows[0][k], list)]
assert list(table[0]) == scalars, list(table[0])
assert open(base + ".csv").read().splitlines()[1].startswith('"'), "csv values are quoted"
assert [(t["test"], t["math"], t["kv_cache"], t["n_prompt"]) for t in table] == [("pp8", "fast", "1", "8"),
                                                                                 ("tg2", "fast", "1", "0")], table
db = sqlite3.connect(":memory:")
db.executescript(open(base + ".sql").read())
got = db.execute("SELECT test, n_gen, avg_ns > 0, avg_ts > 0, model_filename FROM kvgen_bench ORDER BY n_gen")
assert got.fetchall() == [(r["test"], r["n_gen"], 1, 1, r["model_filename"]) for r in rows]
PY
    pass
else
    fail "bench: csv, json, jsonl and sql outputs"
fi
expect_ok "bench: size and params as llama-bench prints them" "| 5.19 MiB | 5.11 M | CPU |" "$kvgen" -m "$ref" --bench \
    -p 8 -n 0 -r 1 -t 1
expect_error "bench: nothing to measure" "nothing to measure" "$kvgen" -m "$ref" --bench -p 0 -n 0
expect_error "bench: a depth past any context" "needs 2147483648 positions, more than a context holds" "$kvgen" \
    -m "$ref" --bench -p 1 -n 0 -d 2147483647
mkfifo "$tmp/model-fifo"
expect_error "a FIFO as the model" "model-fifo: not a regular file" timeout 20 "$kvgen" -m "$tmp/model-fifo" -p hi
expect_error "an empty model path" "--model: the file name is empty" "$kvgen" -m "" -p hi
expect_error "an empty --json path" "--json: the file name is empty" "$kvgen" -m "$ref" -p hi --json ""
expect_error "--dump-logits to stdout" "--dump-logits -: its data is binary" "$kvgen" -m "$ref" -p hi --dump-logits -
# stdout that fails (a full disk) is an error, not a quiet exit 0; a reader that goes away (| head) is quiet
rc=0
"$kvgen" -m "$ref" -p hi -n 4 --no-perf >/dev/full 2>"$tmp/full.err" || rc=$?
if [[ $rc -eq 1 ]] && grep -q "^kvgen: error: standard output: write failed: No space left on device" "$tmp/full.err"; then
    pass
else
    fail "stdout on a full disk: exit status $rc: $(cat "$tmp/full.err")"
fi
# SIGTERM in the middle of a run that writes --dump-logits leaves neither the file nor its temporary
mkdir "$tmp/term"
"$kvgen" -m "$ref" -p hi -n 1000000 --ignore-eos -t 1 --dump-logits "$tmp/term/l.f32" >/dev/null 2>&1 &
term_pid=$!
for _ in $(seq 100); do
    compgen -G "$tmp/term/l.f32.tmp.*" >/dev/null && break
    sleep 0.1
done
written=$(ls "$tmp/term")
kill -TERM "$term_pid"
rc=0
wait "$term_pid" || rc=$?
if [[ -n $written && $rc -eq 143 && -z $(ls -A "$tmp/term") ]]; then
    pass
else
    fail "SIGTERM while writing: exit status $rc; before: '$written'; after: '$(ls "$tmp/term")'"
fi
# a hangup that the run started ignoring (nohup) stays ignored
(
    trap '' HUP
    exec "$kvgen" -m "$ref" -p hi -n 1000000 --ignore-eos -t 1 --no-perf >/dev/null 2>&1
) &
hup_pid=$!
sleep 1
kill -HUP "$hup_pid" 2>/dev/null || true
sleep 0.5
if kill -0 "$hup_pid" 2>/dev/null; then pass; else fail "an ignored SIGHUP ended the run"; fi
kill -TERM "$hup_pid" 2>/dev/null || true
wait "$hup_pid" 2>/dev/null || true
expect_error "generate: unwritable --json" "cannot write" "$kvgen" -m "$ref" -p hi --json /nonexistent-dir/x.json
expect_error "generate: --chat without a template" "chat_template" "$kvgen" -m "$ref" -p hi --chat

# Synthetic files of every type, written by kvgen-synth and read back by kvgen.
vocab="$shared/testdata/ref/open-gqa-Q8_0.gguf"
for type in F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K Q4_K_M; do
    out="$tmp/synth-$type.gguf"
    if "$synth" tiny --type "$type" --vocab "$vocab" -o "$out" --threads 2 2>"$tmp/err"; then
        expect_ok "synth $type: inspect" "synthetic tiny $type" "$kvgen" -m "$out" --inspect
        expect_ok "synth $type: generate" "" "$kvgen" -m "$out" -p "Hello" -n 4 --temp 0 --no-perf
    else
        fail "kvgen-synth $type: $(cat "$tmp/err")"
    fi
done
# several models (-m again) and thread counts (-t a list), as llama-bench: every model with every count, in turn
if "$kvgen" --bench -m "$ref" -m "$tmp/synth-Q4_0.gguf" -t 1,2 -p 4 -n 0 -r 1 -o jsonl 2>"$tmp/err" |
    python3 -c '
import json, sys
rows = [json.loads(line) for line in sys.stdin]
got = [(r["model_filename"].rsplit("/", 1)[-1], r["n_threads"], r["test"]) for r in rows]
assert got == [(m, t, "pp4") for m in ("open-gqa-Q8_0.gguf", "synth-Q4_0.gguf") for t in (1, 2)], got'; then
    pass
else
    fail "bench: two models and two thread counts ($(cat "$tmp/err"))"
fi
# -m a,b is two models, as in llama-bench (a file whose name holds a comma stays one); devices in one run: --device
# or -ngl as a list, every device with every thread count on the CPU
cp "$ref" "$tmp/with,comma.gguf"
if "$kvgen" --bench -m "$ref,$tmp/synth-Q4_0.gguf" -m "$tmp/with,comma.gguf" --device cpu,cpu -t 1,2 -p 4 -n 0 -r 1 \
    -o jsonl 2>"$tmp/err" | python3 -c '
import json, sys
rows = [json.loads(line) for line in sys.stdin]
got = [(r["model_filename"].rsplit("/", 1)[-1], r["backends"], r["n_gpu_layers"], r["n_threads"]) for r in rows]
models = ("open-gqa-Q8_0.gguf", "synth-Q4_0.gguf", "with,comma.gguf")
assert got == [(m, "CPU", 0, t) for m in models for d in range(2) for t in (1, 2)], got'; then
    pass
else
    fail "bench: -m a,b and a --device list ($(cat "$tmp/err"))"
fi
expect_ok "bench: an -ngl list" "| CPU | 1 | pp4 |" "$kvgen" --bench -m "$ref" -ngl 0,0 -p 4 -n 0 -r 1 -t 1
expect_error "an -ngl list without --bench" "-ngl '0,99': kvgen runs a model on one device (a list of them is for" \
    "$kvgen" -m "$ref" -p hi -ngl 0,99
expect_error "bench: --device and an -ngl list" "give the devices one way" "$kvgen" --bench -m "$ref" -ngl 0,99 \
    --device cpu
expect_error "bench: a --device list ending in a comma" "expected a comma-separated list of devices" "$kvgen" --bench \
    -m "$ref" --device cpu,
expect_error "bench: --math fast with a GPU in the list" "exact mode only" "$kvgen" --bench -m "$ref" --math fast \
    -ngl 0,99
expect_error "bench: -m a, (an empty name)" "expected a comma-separated list of model files" "$kvgen" --bench \
    -m "$ref,"
# -n takes a list with --bench, and -pg P,N times a prompt and its generation together (llama-bench's ppP+tgN)
if "$kvgen" --bench -m "$ref" -p 0 -n 2,3 -pg 4,2 -d 0,8 -r 1 -t 1 -o jsonl 2>"$tmp/err" | python3 -c '
import json, sys
rows = [json.loads(line) for line in sys.stdin]
got = [(r["test"], r["n_prompt"], r["n_gen"], r["n_depth"]) for r in rows]
assert got == [("tg2", 0, 2, 0), ("tg3", 0, 3, 0), ("pp4+tg2", 4, 2, 0), ("tg2 @ d8", 0, 2, 8), ("tg3 @ d8", 0, 3, 8),
               ("pp4+tg2 @ d8", 4, 2, 8)], got
r = rows[2]
assert all(abs(ns * ts / 1e9 - 6) < 1e-3 for ns, ts in zip(r["samples_ns"], r["samples_ts"])), r'; then
    pass
else
    fail "bench: -n list and -pg ($(cat "$tmp/err"))"
fi
# a list option given again adds to its list, as in llama-bench (-p 4 -p 6,8 is -p 4,6,8); elsewhere it is an error
if "$kvgen" --bench -m "$ref" -p 4 -p 6 -n 0 -n 2 -d 0 -d 8 -t 1 -t 2 -r 1 -o jsonl 2>"$tmp/err" | python3 -c '
import json, sys
got = [(r["n_threads"], r["test"]) for r in map(json.loads, sys.stdin)]
want = [(t, x + d) for t in (1, 2) for d in ("", " @ d8") for x in ("pp4", "pp6", "tg2")]
assert got == want, got'; then
    pass
else
    fail "bench: repeated -p, -n, -d and -t ($(cat "$tmp/err"))"
fi
expect_error "generation: -p twice" "-p/--prompt given 2 times (only --bench" "$kvgen" -m "$ref" -p hi -p ho
expect_error "generation: -t twice" "-t/--threads given 2 times" "$kvgen" -m "$ref" -p hi -t 1 -t 2
# KV cache types in one --bench: a --kv-type list, or -ctk and -ctv lists (every pair, as llama-bench)
if "$kvgen" --bench -m "$ref" -ctk f16,q8_0 -ctv q4_0,f16 -p 0 -n 2 -r 1 -t 1 -o jsonl 2>"$tmp/err" | python3 -c '
import json, sys
got = [(r["type_k"], r["type_v"]) for r in map(json.loads, sys.stdin)]
assert got == [("f16", "q4_0"), ("f16", "f16"), ("q8_0", "q4_0"), ("q8_0", "f16")], got'; then
    pass
else
    fail "bench: -ctk and -ctv lists ($(cat "$tmp/err"))"
fi
expect_ok "bench: a --kv-type list" "| q8_0 | q4_0 | tg2 |" "$kvgen" --bench -m "$ref" --kv-type f16,q8_0/q4_0 -p 0 \
    -n 2 -r 1 -t 1
expect_error "a --kv-type list without --bench" "is for --bench" "$kvgen" -m "$ref" -p hi --kv-type f16,q8_0
expect_error "bench: --kv-type list and -ctk" "give the types one way" "$kvgen" --bench -m "$ref" --kv-type f16,q8_0 \
    -ctk q8_0
expect_ok "bench: a -b list, n_batch in the table" "| 1 | 4 | pp8 |" "$kvgen" --bench -m "$ref" -b 4,8 -p 8 -n 0 -r 1 \
    -t 1
expect_error "-b list without --bench" "a list of them is for --bench" "$kvgen" -m "$ref" -p hi -b 4,8
expect_error "-b 0" "expected a number of tokens from 1 to 65536$" "$kvgen" -m "$ref" -p hi -b 0
# options that --bench or --perplexity would only ignore are refused
expect_error "bench: -c" "--ctx-size only applies to generation and --perplexity" "$kvgen" -m "$ref" --bench -c 3 -p 4
expect_error "bench: --temp" "--temp only applies to generation" "$kvgen" -m "$ref" --bench --temp 0
expect_error "perplexity: -n" "--n-predict only applies to generation and --bench" "$kvgen" -m "$ref" --perplexity \
    -f "$tmp/long.txt" -n 3
expect_error "bench: -p ''" "expected a comma-separated list of prompt sizes" "$kvgen" -m "$ref" --bench -p ''
expect_error "-ctk ''" "--cache-type-k: an empty value" "$kvgen" -m "$ref" -p hi -ctk ''
expect_error "-pg without --bench" "only applies to --bench" "$kvgen" -m "$ref" -p hi -pg 4,2
expect_error "bench: -pg with one number" "expected P,N" "$kvgen" -m "$ref" --bench -pg 4
expect_error "-n list without --bench" "a list of them is for --bench" "$kvgen" -m "$ref" -p hi -n 1,2
expect_error "-m twice without --bench" "only --bench measures several models" "$kvgen" -m "$ref" -m "$ref" -p hi
expect_error "-t list without --bench" "a list of them is for --bench" "$kvgen" -m "$ref" -p hi -t 1,2
expect_error "bench: a thread count past 1024" "or a comma-separated list of them" "$kvgen" -m "$ref" --bench -t 1,2000
expect_error "bench: a second model that is not there" "cannot open" "$kvgen" --bench -m "$ref" -m "$tmp/none.gguf"
# a later model that cannot run with the settings fails before the first row (head_dim 48 and a q8_0 cache)
"$synth" tiny --type Q8_0 --vocab "$vocab" --n-embd 192 --n-heads 4 --n-kv-heads 4 -o "$tmp/hd48.gguf" >/dev/null 2>&1
expect_error "bench: a later model that cannot run" "hd48.gguf: --kv-type q8_0: .*head_dim is 48" "$kvgen" --bench \
    -m "$ref" -m "$tmp/hd48.gguf" \
    --kv-type q8_0 -p 4 -n 0 -r 1 -o csv
expect_error "bench: a later KV type that cannot run" "head_dim is 48" "$kvgen" --bench -m "$tmp/hd48.gguf" \
    --kv-type f16,q8_0 -p 4 -n 0 -r 1 -o csv
expect_error "two modes" "--bench and --inspect are different modes" "$kvgen" -m "$ref" --bench --inspect
expect_error "--json with --bench" "--bench prints json with -o json" "$kvgen" -m "$ref" --bench --json "$tmp/b.json"
expect_error "-t with no value" "expected a number of threads" "$kvgen" -m "$ref" -p hi -t ''
expect_error "bench: a list ending in a comma" "expected a comma-separated list" "$kvgen" -m "$ref" --bench -p 4,
expect_error "bench: -tb with a -t list" "each count of -t is both" "$kvgen" -m "$ref" --bench -t 1,2 -tb 2
# --bench's model column: what general.file_type says the file mostly is (as llama-bench names it), else the type
# of most of its bytes (kvgen-synth records no file type for a k-quant alone).
expect_ok "bench: the model column from general.file_type" "| llama [0-9.]*[KM] Q4_K - Medium | " "$kvgen" \
    -m "$tmp/synth-Q4_K_M.gguf" --bench -p 4 -n 0 -r 1 -t 1
expect_ok "bench: the model column without general.file_type" "| llama [0-9.]*[KM] Q5_K | " "$kvgen" \
    -m "$tmp/synth-Q5_K.gguf" --bench -p 4 -n 0 -r 1 -t 1
# --prompt-cache-all with Q5_0 weights: where a generated token's K/V differ in their last bits from a prompt token's
# (CPUs without AVX2, whose prompts take f32 tiles) only the prompt's rows are saved; with AVX2 or AVX-512 VNNI a
# prompt's products are a generated token's bits and the answer's rows are saved too. Either way a hit on prompt +
# answer is exactly the cold run.
q5="$tmp/synth-Q5_0.gguf"
q5_saved="only the prompt's are saved"
if [[ -f $q5 ]]; then
    q5_bench=$("$kvgen" -m "$q5" --bench -p 1 -n 0 -r 1 -t 1 2>&1 || true)
    if [[ $q5_bench == *"avx2 kernels"* || $q5_bench == *"avx512-vnni kernels"* ]]; then q5_saved=""; fi
    q5_args=(-m "$q5" -n 6 --temp 0 -t 1 --ignore-eos)
    "$kvgen" "${q5_args[@]}" -p "The KV cache keeps the keys" --prompt-cache "$tmp/q5.cache" --prompt-cache-all \
        --json "$tmp/q5.json" >/dev/null 2>"$tmp/q5.err"
    q5_text=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["text"])' "$tmp/q5.json")
    "$kvgen" "${q5_args[@]}" -p "The KV cache keeps the keys$q5_text" --prompt-cache "$tmp/q5.cache" \
        --prompt-cache-ro --dump-logits "$tmp/q5hit.f32" >"$tmp/q5hit.out" 2>/dev/null
    "$kvgen" "${q5_args[@]}" -p "The KV cache keeps the keys$q5_text" --dump-logits "$tmp/q5cold.f32" \
        >"$tmp/q5cold.out" 2>/dev/null
    if { if [[ -n $q5_saved ]]; then grep -q "$q5_saved" "$tmp/q5.err"; else ! grep -q "only the prompt" "$tmp/q5.err"; fi; } &&
        cmp -s "$tmp/q5hit.f32" "$tmp/q5cold.f32" && cmp -s "$tmp/q5hit.out" "$tmp/q5cold.out"; then
        pass
    else
        fail "--prompt-cache-all on Q5_0: $(cat "$tmp/q5.err")"
    fi
fi
expect_ok "synth Q4_K_M mixes types" "Q6_K" "$kvgen" -m "$tmp/synth-Q4_K_M.gguf" --inspect
if ls "$tmp"/*.tmp.* >/dev/null 2>&1; then fail "kvgen-synth left a temporary file"; else pass; fi

# Bad input: one clear line and exit status 1.
tiny="$shared/testdata/tiny/llama-2-tiny-random.gguf"
expect_error "missing file" "No such file" "$kvgen" -m "$tmp/none.gguf" --inspect
expect_error "directory" "is a directory" "$kvgen" -m "$tmp" --inspect
: >"$tmp/empty.gguf"
expect_error "empty file" "empty file" "$kvgen" -m "$tmp/empty.gguf" --inspect
echo "hello, I am not a model" >"$tmp/text.gguf"
expect_error "not GGUF" "not a GGUF file" "$kvgen" -m "$tmp/text.gguf" --inspect
head -c 100000 "$tiny" >"$tmp/trunc.gguf"
expect_error "truncated" "offset" "$kvgen" -m "$tmp/trunc.gguf" --inspect
head -c $(($(stat -c %s "$tiny") - 1)) "$tiny" >"$tmp/trunc-data.gguf"
expect_error "truncated data" "runs past the end" "$kvgen" -m "$tmp/trunc-data.gguf" --inspect
expect_error "unsupported architecture" "unsupported architecture 'kvgen-test'" \
    "$kvgen" -m "$src/tests/data/dequant_golden.bin" --inspect
expect_error "unknown flag" "--no-such-flag" "$kvgen" --no-such-flag
expect_error "unwritable --json" "cannot write" "$kvgen" -m "$tiny" --inspect --json /nonexistent-dir/x.json
expect_error "synth: unknown shape" "unknown shape" "$synth" gpt-9 --vocab "$vocab" -o "$tmp/x.gguf"
expect_error "synth: no vocab" "--vocab" "$synth" tiny -o "$tmp/x.gguf"
expect_error "synth: bad type" "unknown type 'Q9_9'" "$synth" tiny --type Q9_9 --vocab "$vocab" -o "$tmp/x.gguf"

# Reliability: every bad input of the table answers with one line and status 1.
"$synth" tiny --vocab "$vocab" -o "$tmp/iq4.gguf" --tensor-type blk.0.attn_q.weight=IQ4_NL 2>/dev/null
expect_error "unsupported tensor type (inspect)" "has type IQ4_NL (supported: F32" "$kvgen" -m "$tmp/iq4.gguf" --inspect
expect_error "unsupported tensor type (generate)" "blk.0.attn_q.weight' has type IQ4_NL" "$kvgen" -m "$tmp/iq4.gguf" -p hi
if "$kvgen" --list-devices | grep -q '^  cuda0:'; then
    expect_error "--device cuda: KV cache larger than the GPU" "not enough GPU memory .* is free" \
        "$kvgen" -m "$ref" -p hi -c 16777216 --device cuda
    expect_error "--device cuda with --kv-type f32" "keeps K and V in f16, q8_0 or q4_0" "$kvgen" -m "$ref" -p hi \
        --device cuda --kv-type f32
else
    expect_error "--device cuda without a GPU" "--device cuda" "$kvgen" -m "$ref" -p hi --device cuda
    expect_error "bench: -ngl 0,99 without a GPU, before any row" "-ngl 99: " "$kvgen" --bench -m "$ref" -ngl 0,99 \
        -p 4 -n 0 -r 1
    # With no NVIDIA driver at all, say so rather than "driver version is insufficient".
    if [[ ! -e /proc/driver/nvidia/version ]] && ! "$kvgen" --list-devices | grep -q "this build has no CUDA"; then
        expect_error "--device cuda without a driver" "no NVIDIA driver or GPU found" "$kvgen" -m "$ref" -p hi --device cuda
        if "$kvgen" --list-devices | grep -q "^  cuda: no NVIDIA driver or GPU found$"; then pass; else fail "--list-devices without a driver"; fi
    fi
fi
if [[ -f $default ]]; then
    expect_error "KV cache too large to allocate" "cannot allocate the KV cache: [0-9]* bytes" \
        "$kvgen" -m "$default" -p hi -c 16777216 --device cpu
fi
expect_error "unknown --device" "device" "$kvgen" -m "$ref" -p hi --device tpu
expect_error "not a directory" "Not a directory" "$kvgen" -m "$tiny/model.gguf" --inspect
if [[ $(id -u) -ne 0 ]]; then
    cp "$tiny" "$tmp/locked.gguf"
    chmod 000 "$tmp/locked.gguf"
    expect_error "unreadable file" "Permission denied" "$kvgen" -m "$tmp/locked.gguf" --inspect
else
    echo "note: running as root, which can read any file: the unreadable-file case is checked as non-root only"
fi

# SIGINT stops at the next token, prints the timings, writes the report marked interrupted, exits 130. (A script's
# background job starts with SIGINT ignored, which kvgen keeps, as nohup's SIGHUP: the job gets SIGINT's default back.)
python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
    "$kvgen" -m "$ref" -p "Hello" -n 100000 --ignore-eos --temp 0 -c 4096 --json "$tmp/int.json" \
    >"$tmp/int.out" 2>"$tmp/int.err" &
pid=$!
for _ in $(seq 1 100); do [[ -s $tmp/int.out ]] && break; sleep 0.1; done
sleep 0.5
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
if [[ $rc -eq 130 && -s $tmp/int.out ]] && grep -q "eval time" "$tmp/int.err" &&
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["interrupted"] and d["stop"] == "interrupted" and len(d["tokens"]) > 0' "$tmp/int.json"; then
    pass
else
    fail "SIGINT: status $rc, stderr: $(tail -n 3 "$tmp/int.err")"
fi

# A reader that goes away (kvgen ... | head -c 10) ends the run quietly.
set +o pipefail
"$kvgen" -m "$ref" -p "Hello" -n 2000 --ignore-eos --temp 0 2>"$tmp/pipe.err" | head -c 10 >/dev/null
rc=${PIPESTATUS[0]}
set -o pipefail
if [[ $rc -eq 0 ]] && ! grep -q "error" "$tmp/pipe.err"; then pass; else fail "SIGPIPE: status $rc: $(cat "$tmp/pipe.err")"; fi

# A long run does not drift: resident memory after the first token equals that after the last.
"$kvgen" -m "$ref" -p "Hello" -n 1500 --ignore-eos --temp 0.8 -s 3 -c 1600 --json "$tmp/long.json" >/dev/null 2>&1
if python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["rss_samples"]; assert len(s) >= 3 and s[-1][1] - s[0][1] < (2 << 20), s' "$tmp/long.json"; then
    pass
else
    fail "resident memory grew during a 1500-token run"
fi

# Every script answers --help with its usage and nothing of its own code.
for script in "$src"/scripts/*.sh "$src"/models/*.sh; do
    if help=$(bash "$script" --help 2>&1) && [[ $help == *usage* ]] && ! grep -q '^set -' <<<"$help"; then
        pass
    else
        fail "$(basename "$script") --help: $(head -c 300 <<<"$help")"
    fi
done

# The docs speak to users: no links to files outside the repository.
if grep -rnE '\]\(\.\./|\.\./shared' "$src/README.md" "$src/docs" >"$tmp/links"; then
    fail "docs link outside the repository: $(head -n 3 "$tmp/links")"
else
    pass
fi

# The model file is only read.
before=$(sha256sum "$tiny" | cut -d' ' -f1)
"$kvgen" -m "$tiny" -p "Hello" -n 4 --temp 0 >/dev/null 2>&1
if [[ $(sha256sum "$tiny" | cut -d' ' -f1) == "$before" ]]; then pass; else fail "the model file changed"; fi

finish
