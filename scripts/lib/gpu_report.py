"""gpu-check.sh's report: OUT/report.md and OUT/report.json from what the stages left in OUT and WORK.

usage: gpu_report.py OUT WORK GPU PEAK_GBS CUDA_RC KV_STATUS SECONDS COMMIT SKIPPED KV_NAME MODE TYPES NCU_STATUS
                     KV_PARTING STATE

STATE is "complete" at the end of a run, or the stage last finished: gpu-check.sh writes the report after every
stage, so that a run stopped early (a device machine's time limit) still leaves what it measured. Prints report.md
when STATE is complete.
"""
import array, datetime, glob, json, math, os, re, sys

(out, work, gpu, peak, cuda_rc, kv_status, secs, commit, skipped, kv_name, mode, types, ncu_status,
 kv_parting, state) = sys.argv[1:16]
peak = float(peak)
rep = {"date": datetime.date.today().isoformat(), "gpu": gpu.strip(), "commit": commit, "seconds": int(secs),
       "state": state,
       "mode": mode, "types": types.split(","), "cuda_tests_exit": int(cuda_rc),
       "peak_gbs": peak, "correctness": [], "speed": [], "per_kernel": {}, "ncu": ncu_status, "kv_cache": kv_status,
       "kv_parting": kv_parting, "skipped": [s for s in skipped.split("\n") if s]}

# correctness: the CUDA run against the CPU run, logits compared while the two greedy paths agree
cmp_runs = sorted(glob.glob(f"{work}/cmp/*.cpu.json"))


def f32(path):  # the standard library only: a machine may lack numpy
    a = array.array("f")
    with open(path, "rb") as fh:
        a.frombytes(fh.read())
    return a


for cj in cmp_runs:
    name = os.path.basename(cj)[:-len(".cpu.json")]
    gj = f"{work}/cmp/{name}.cuda.json"
    row = {"model": name}
    try:
        c, g = json.load(open(cj)), json.load(open(gj))
        lc, lg = f32(f"{work}/cmp/{name}.cpu.f32"), f32(f"{work}/cmp/{name}.cuda.f32")
        n_vocab = len(lc) // len(c["tokens"])
        same = 0
        while same < min(len(c["tokens"]), len(g["tokens"])) and c["tokens"][same] == g["tokens"][same]:
            same += 1
        rows = min(same + 1, len(c["tokens"]), len(g["tokens"]))  # logits of step i depend on tokens < i
        m = rows * n_vocab
        a, diff = lc[:m], [x - y for x, y in zip(lc[:m], lg[:m])]
        rel = max(abs(d) for d in diff) / max(1e-9, max(abs(x) for x in a))
        mean = sum(a) / m
        std = math.sqrt(sum((x - mean) ** 2 for x in a) / m)
        nrmse = math.sqrt(sum(d * d for d in diff) / m) / max(1e-9, std)
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
    # a run with --kv-type K or K/V (SHAPE-T-kvK, -kvK-V): its cache's bytes, half of each type's for a pair
    kvm = re.search(r"-kv(f16|f32|q8_0|q4_0)(?:-(f16|f32|q8_0|q4_0))?$", name)
    if kvm:
        per = [(info.get("kv_cache_types", {}).get(t) or {}).get("bytes_per_token") for t in kvm.groups() if t]
        if all(b is not None for b in per):
            kv_tok = sum(per) / len(per)
    row = {"model": name, "weight_bytes_per_token": wbytes, "tests": []}
    for part in ("bench", "deep"):
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

# variants (gpu-check.sh's `variant`): a run of the same file with other flags, SHAPE-T-SUFFIX, whose .flags file names
# the default run and the flags; each of its tests beside the default run's same test (prompt or generation, depth)
rep["variants"] = []
speed_by_model = {r["model"]: r for r in rep["speed"]}
for r in rep["speed"]:
    fp = f"{work}/speed/{r['model']}.flags"
    if not os.path.exists(fp):
        continue
    lines = open(fp).read().split("\n")
    base, flags = lines[0], lines[1] if len(lines) > 1 else ""
    if base not in speed_by_model:
        continue
    # the variant's name (a third line; older files: the model's name past the default run's), and what it is compared
    # with where that is another variant of the same file (gpu-check.sh's variant --vs)
    name = lines[2] if len(lines) > 2 and lines[2] else r["model"][len(base) + 1:]
    vs = next((m for m in speed_by_model if base.startswith(m + "-") and os.path.exists(f"{work}/speed/{base}.flags")),
              None)
    if vs is not None:
        name = f"{name} (vs {base[len(vs) + 1:]})"
    default = {e["test"]: e for e in speed_by_model[base]["tests"]}
    for e in r["tests"]:
        d = default.get(e["test"])
        if d is None or d["tok_s"] <= 0:
            continue
        # a difference within twice the two runs' spread together is not told apart from noise
        noise = 2 * math.sqrt(e["stddev"] ** 2 + d["stddev"] ** 2)
        rep["variants"].append({"variant": name, "model": vs or base, "flags": flags,
                                "test": e["test"], "default_tok_s": d["tok_s"], "tok_s": e["tok_s"],
                                "ratio": e["tok_s"] / d["tok_s"],
                                "within_noise": abs(e["tok_s"] - d["tok_s"]) <= noise})

# 77: the test binary found no GPU (a dry run's case; on the GPU machine, a failure all the same)
cuda_word = {0: "passed", 77: "skipped: no GPU found (exit 77)"}.get(int(cuda_rc), f"FAILED (exit {cuda_rc})")
# the first case that failed (or was running when the binary died), which gpu-check.sh reruns under compute-sanitizer
first_failure = ""
if int(cuda_rc) not in (0, 77) and os.path.exists(f"{work}/first-failure"):
    with open(f"{work}/first-failure") as f:
        first_failure = f.readline().strip()
rep["cuda_first_failure"] = first_failure
if first_failure:
    cuda_word += (f"; first failing case \"{first_failure}\", rerun alone under compute-sanitizer at the end of "
                  "cuda-tests.txt where the tool is installed")

# per kernel: ncu_sum.py's tables (or why there are none)
per_kernel_md = {}
for md in sorted(glob.glob(f"{work}/ncu/*.md")):
    name = os.path.basename(md)[:-len(".md")]
    per_kernel_md[name] = open(md).read().strip()
    js = f"{work}/ncu/{name}.json"
    if os.path.exists(js):
        rep["per_kernel"][name] = json.load(open(js))
    elif name.endswith(("-flash", "-decode")) and not per_kernel_md[name].startswith("ncu failed"):
        rep["per_kernel"][name] = {"sections": per_kernel_md[name]}  # one launch's ncu sections, as text
    else:
        rep["per_kernel"][name] = {"error": per_kernel_md[name]}

# a decode graph that did not capture runs launch by launch (slower, and the speed rows would not say why)
graph_fails = sum("graph capture failed" in line for line in open(f"{out}/log.txt", errors="replace"))
rep["graph_capture_failures"] = graph_fails



def write(name, text):  # whole or not at all: a run may be stopped at any moment
    with open(f"{out}/{name}.tmp", "w") as fh:
        fh.write(text)
    os.replace(f"{out}/{name}.tmp", f"{out}/{name}")


write("report.json", json.dumps(rep, indent=2) + "\n")

L = [f"# kvgen GPU check ({mode}), {rep['date']}", "",
     f"GPU: {rep['gpu']}; commit {commit}; {secs} s; weight types {types}; peak bandwidth taken as {peak:.0f} GB/s.",
     ""]
if state != "complete":
    L += [f"**Partial report**: written after {state}; the run did not finish (log.txt says where it stopped).", ""]
L += [
     f"- `[cuda]` tests: {cuda_word} "
     "(cuda-tests.txt); the host-emulated kernel tests run on the CPU (scripts/test.sh), not here",
     f"- per-kernel profile: {ncu_status}",
     ]
if mode == "full":
    L.append(f"- KV cache comparison ({kv_name} shape): {kv_status}" + (" (kv-results.md)" if kv_status == "ok" else "")
             + (f". {kv_parting}" if kv_parting else ""))
if rep["skipped"]:
    L.append(f"- skipped for time: {', '.join(rep['skipped'])}")
if graph_fails:
    L.append(f"- CUDA graph capture FAILED in {graph_fails} run(s): those decoded launch by launch (log.txt)")
if mode == "full":
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
if rep["variants"]:
    L += ["", "## Variants against the defaults", "",
          "Each variant is the same file benchmarked with other flags; ratio = the variant's t/s over the default's in "
          "the same test (above 1: the variant is faster). \"noise\": the two differ by no more than twice their "
          "runs' spread together.", "",
          "| model | variant | flags | test | default t/s | variant t/s | ratio |",
          "| --- | --- | --- | --- | ---: | ---: | ---: |"]
    for v in rep["variants"]:
        L.append(f"| {v['model']} | {v['variant']} | `{v['flags']}` | {v['test']} | {v['default_tok_s']:.1f} | "
                 f"{v['tok_s']:.1f} | {v['ratio']:.3f}{' (noise)' if v['within_noise'] else ''} |")
for name, md in per_kernel_md.items():
    what = ("the first kernels of a prefill of about 500 tokens" if name.endswith("-prefill")
            else "one flash attention launch of a long prompt over a deep cache" if name.endswith("-flash")
            else "a decode step's attention and SwiGLU product" if name.endswith("-decode")
            else "a 3-token prompt and 3 generated tokens")
    L += ["", f"## Per kernel (ncu): {name}, {what}", "", md]
if kv_status == "ok" and os.path.exists(f"{out}/kv-results.md"):
    L += ["", f"## KV cache on the GPU ({kv_name} shape)", "", open(f"{out}/kv-results.md").read()]
write("report.md", "\n".join(L) + "\n")
if state == "complete":
    print("\n".join(L))
