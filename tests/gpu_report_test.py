#!/usr/bin/env python3
"""scripts/lib/gpu_report.py's comparison of gpu-check.sh's variants with the default runs: a small WORK folder as the
script leaves it (a default run, two variants of it with their .flags files, one named with a dash as the K/V type
pairs are, and a variant compared with another variant, variant --vs; one kernel launch's ncu sections and one such
profile that failed), the report made from it, its JSON and Markdown read back."""
import json
import os
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench(path, tests):
    with open(path, "w") as f:
        json.dump([{"test": t, "n_depth": int(t.split(" @ d")[1]) if " @ d" in t else 0,
                    "n_gen": 128 if t.startswith("tg") else 0, "avg_ts": ts, "stddev_ts": sd}
                   for t, ts, sd in tests], f)


with tempfile.TemporaryDirectory() as d:
    out, work = os.path.join(d, "out"), os.path.join(d, "work")
    os.makedirs(out)
    os.makedirs(os.path.join(work, "speed"))
    open(os.path.join(out, "log.txt"), "w").close()
    speed = os.path.join(work, "speed")
    base = "llama2-7b-Q4_0"
    for name in (base, base + "-nopdl", base + "-kvq8_0-f16", base + "-ring0", base + "-rows4"):
        with open(os.path.join(speed, name + ".inspect.json"), "w") as f:
            json.dump({"weight_bytes_per_token": 3.72e9}, f)
    bench(os.path.join(speed, base + ".bench.json"),
          [("pp512", 20000.0, 20.0), ("tg128", 500.0, 0.5), ("tg128 @ d4096", 400.0, 0.4)])
    # faster in decode; a test the default did not run (pp16) is left out
    bench(os.path.join(speed, base + "-nopdl.bench.json"), [("tg128", 480.0, 0.5), ("pp16", 1800.0, 1.0)])
    with open(os.path.join(speed, base + "-nopdl.flags"), "w") as f:
        f.write(f"{base}\n--cuda-pdl off\n")
    # within the runs' spread: 400.5 against 400 with spreads of 0.4 and 0.3
    bench(os.path.join(speed, base + "-kvq8_0-f16.bench.json"), [("tg128 @ d4096", 400.5, 0.3)])
    with open(os.path.join(speed, base + "-kvq8_0-f16.flags"), "w") as f:
        f.write(f"{base}\n--kv-type q8_0/f16\n")
    # a variant (its name on the .flags file's third line) and one compared with it rather than the default
    bench(os.path.join(speed, base + "-ring0.bench.json"), [("tg128", 450.0, 0.5)])
    with open(os.path.join(speed, base + "-ring0.flags"), "w") as f:
        f.write(f"{base}\n--cuda-matvec-stages 0\nring0\n")
    bench(os.path.join(speed, base + "-rows4.bench.json"), [("tg128", 441.0, 0.5)])
    with open(os.path.join(speed, base + "-rows4.flags"), "w") as f:
        f.write(f"{base}-ring0\n--cuda-matvec-stages 0 --cuda-matvec-rows 4\nrows4\n")
    # one flash attention launch's ncu sections (gpu-check.sh's profile_sections), as text
    os.makedirs(os.path.join(work, "ncu"))
    with open(os.path.join(work, "ncu", base + "-flash.md"), "w") as f:
        f.write("pp512 at depth 4096: the flash attention launch of layer 0 (32 layers), ncu's sections.\n\n"
                "```\n    Compute (SM) Throughput  %  41.2\n```\n")
    with open(os.path.join(work, "ncu", base + "-decode.md"), "w") as f:  # and one that failed
        f.write("ncu failed (exit 1):\n\n```\n==ERROR== no kernels were profiled\n```\n")
    r = subprocess.run([sys.executable, os.path.join(root, "scripts", "lib", "gpu_report.py"), out, work,
                        "Test GPU", "4800", "0", "not run", "12", "abc1234", "", base, "quick", "Q4_0", "not run", "",
                        "complete"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(out, "report.json")) as f:
        rep = json.load(f)
    got = {(v["variant"], v["test"]): v for v in rep["variants"]}
    assert set(got) == {("nopdl", "tg128"), ("kvq8_0-f16", "tg128 @ d4096"), ("ring0", "tg128"),
                        ("rows4 (vs ring0)", "tg128")}, got
    v = got[("rows4 (vs ring0)", "tg128")]
    assert v["model"] == base and v["default_tok_s"] == 450.0 and abs(v["ratio"] - 0.98) < 1e-9, v
    v = got[("nopdl", "tg128")]
    assert v["model"] == base and v["flags"] == "--cuda-pdl off", v
    assert abs(v["ratio"] - 0.96) < 1e-9 and not v["within_noise"], v
    v = got[("kvq8_0-f16", "tg128 @ d4096")]
    assert abs(v["ratio"] - 400.5 / 400.0) < 1e-9 and v["within_noise"], v
    md = open(os.path.join(out, "report.md")).read()
    assert "## Variants against the defaults" in md, md
    assert f"| {base} | nopdl | `--cuda-pdl off` | tg128 | 500.0 | 480.0 | 0.960 |" in md, md
    assert (f"| {base} | rows4 (vs ring0) | `--cuda-matvec-stages 0 --cuda-matvec-rows 4` | tg128 | 450.0 | 441.0 | "
            "0.980 |") in md, md
    assert f"| {base} | kvq8_0-f16 | `--kv-type q8_0/f16` | tg128 @ d4096 | 400.0 | 400.5 | 1.001 (noise) |" in md, md
    assert (f"## Per kernel (ncu): {base}-flash, one flash attention launch of a long prompt over a deep cache\n\n"
            "pp512 at depth 4096") in md, md
    assert "Compute (SM) Throughput  %  41.2" in rep["per_kernel"][base + "-flash"]["sections"], rep["per_kernel"]
    assert f"## Per kernel (ncu): {base}-decode, a decode step's attention and SwiGLU product\n\nncu failed" in md, md
    assert "no kernels were profiled" in rep["per_kernel"][base + "-decode"]["error"], rep["per_kernel"]
print("gpu_report: variants compared, a kernel launch's ncu sections shown, a failed one named")
