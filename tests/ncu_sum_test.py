#!/usr/bin/env python3
"""scripts/lib/ncu_sum.py on the kernel names that Nsight Compute versions print, and on a small CSV of two forwards
in the form ncu 2025 writes (names as 'void unnamed>::kernel<12>(...)', values with thousands separators)."""
import json
import os
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(root, "scripts", "lib"))
import ncu_sum  # noqa: E402

NAMES = {
    "void kvgen::<unnamed>::matvec_kernel<12>(const unsigned char *, long)": "matvec_kernel<Q4_K>",
    "void kvgen::(anonymous namespace)::get_rows_kernel<14>(const int *)": "get_rows_kernel<Q6_K>",
    "void unnamed>::matvec_int_kernel<12, 4>(const unsigned char *, long, ActBlock *)": "matvec_int_kernel<Q4_K, 4>",
    "unnamed>::rmsnorm_kernel(const float *, const float *, float *, ActBlock *, int, float)": "rmsnorm_kernel",
    "_ZN5kvgen4cuda38_GLOBAL__N__e810e4a5_6_ops_cu_588279d415get_rows_kernelILNS_8GgmlTypeE12EEEvPKhlllPKiiPf":
        "get_rows_kernel<Q4_K>",
    "_ZN5kvgen4cuda38_GLOBAL__N__e810e4a5_6_ops_cu_588279d414rmsnorm_kernelEPKfS3_PfPNS0_8ActBlockEif":
        "rmsnorm_kernel",
}
for raw, want in NAMES.items():
    got = ncu_sum.short_name(raw)
    assert got == want, f"short_name({raw!r}) = {got!r}, want {want!r}"

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def rows(kid, name, ns, nbytes):
    pre = f'"{kid}","7","kvgen","127.0.0.1","{name}","1","13","(128, 1, 1)","(3, 1, 1)","0","9.0","metrics",'
    return (pre + f'"dram__bytes_read.sum","byte","{nbytes:,}"\n' + pre + f'"gpu__time_duration.sum","ns","{ns:,}"\n')


# a prefill and one decode step: each starts with the embedding lookup
forward = [("void unnamed>::get_rows_kernel<12>(const unsigned char *)", 4000, 16384),
           ("unnamed>::rmsnorm_kernel(const float *)", 6000, 32768),
           ("void unnamed>::matvec_int_kernel<12, 1>(const unsigned char *)", 1000000, 1500000000)]
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "p.csv")
    with open(path, "w") as f:
        f.write("==PROF== Connected to process 7\n" + HEADER)
        kid = 0
        for _ in range(2):
            for name, ns, nbytes in forward:
                f.write(rows(kid, name, ns, nbytes))
                kid += 1
    out = subprocess.run([sys.executable, os.path.join(root, "scripts", "lib", "ncu_sum.py"), path, "--gen", "2",
                          "--json", os.path.join(d, "p.json")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "`matvec_int_kernel<Q4_K, 1>` | 1 | 1000.0 |" in out.stdout, out.stdout
    with open(os.path.join(d, "p.json")) as f:
        res = json.load(f)
    assert res["forwards"] == [3, 3], res

# The launch metrics, where the CSV has them: per kernel, a range over its launches (grid) or one value (registers),
# and the achieved occupancy weighted by each launch's time; kernels without them leave their cells empty.
def launch_rows(kid, name, facts):
    pre = f'"{kid}","7","kvgen","127.0.0.1","{name}","1","13","(128, 1, 1)","(3, 1, 1)","0","9.0","metrics",'
    return "".join(pre + f'"{m}","{u}","{v:,}"\n' for m, u, v in facts)


matvec = "void unnamed>::matvec_int_kernel<12, 1>(const unsigned char *)"
decode = [("void unnamed>::get_rows_kernel<12>(const unsigned char *)", 4000, 16384, []),
          (matvec, 3000, 45000000, [("launch__registers_per_thread", "register/thread", 83),
                                    ("launch__block_size", "", 128), ("launch__grid_size", "", 3072),
                                    ("launch__waves_per_multiprocessor", "", 4.65),
                                    ("sm__warps_active.avg.pct_of_peak_sustained_active", "%", 30.0)]),
          (matvec, 1000, 15000000, [("launch__registers_per_thread", "register/thread", 83),
                                    ("launch__block_size", "", 128), ("launch__grid_size", "", 1024),
                                    ("launch__waves_per_multiprocessor", "", 1.55),
                                    ("sm__warps_active.avg.pct_of_peak_sustained_active", "%", 10.0)])]
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "l.csv")
    with open(path, "w") as f:
        f.write(HEADER)
        kid = 0
        for _ in range(2):
            for name, ns, nbytes, facts in decode:
                f.write(rows(kid, name, ns, nbytes) + launch_rows(kid, name, facts))
                kid += 1
    out = subprocess.run([sys.executable, os.path.join(root, "scripts", "lib", "ncu_sum.py"), path, "--gen", "2"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "| GB/s | regs | block | grid | waves/SM | occupancy % |" in out.stdout, out.stdout
    # occupancy (30 * 3000 + 10 * 1000) / 4000 = 25
    assert "`matvec_int_kernel<Q4_K, 1>` | 2 | 4.0 | 50.0% | 0.060 | 15000 | 83 | 128 | 1024-3072 | 1.55-4.65 | 25 |" \
        in out.stdout, out.stdout
    assert "`get_rows_kernel<Q4_K>` | 1 | 4.0 | 50.0% | 0.000 | 4 |  |  |  |  |  |" in out.stdout, out.stdout
    assert "unknown" not in out.stderr and "warning" not in out.stderr, out.stderr

# --prefill-only: a long prompt's first kernels (ncu --launch-count), every one the prefill's, even a forward's start
# without a decode step after it
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "pp.csv")
    with open(path, "w") as f:
        f.write(HEADER)
        for kid, (name, ns, nbytes) in enumerate(forward):
            f.write(rows(kid, name, ns, nbytes))
    out = subprocess.run([sys.executable, os.path.join(root, "scripts", "lib", "ncu_sum.py"), path, "--prefill-only",
                          "--json", os.path.join(d, "pp.json")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("The first 3 kernels of a prefill"), out.stdout
    assert "`matvec_int_kernel<Q4_K, 1>` | 1 | 1000.0 |" in out.stdout, out.stdout
    with open(os.path.join(d, "pp.json")) as f:
        res = json.load(f)
    assert res["kernels"] == 3 and "decode" not in res, res
print("ncu_sum: names, a two-forward profile, its launch metrics and a prefill alone summarised")
