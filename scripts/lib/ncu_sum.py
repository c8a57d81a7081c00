#!/usr/bin/env python3
"""Per-kernel summary of an Nsight Compute CSV (`ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum`)
over a short kvgen run: one decode step and the prefill, each as a table of kernel, launches, GPU time, share of the
step, DRAM bytes read and the bandwidth they imply. Where the CSV also has the launch metrics of LAUNCH (registers
per thread, block and grid size, waves per SM, achieved occupancy), the tables show them too.

usage: ncu_sum.py CSV[.gz] [--gen N | --prefill-only] [--json FILE] [--top K]

Forwards are told apart by their first kernel: kvgen's forward starts with the embedding lookup (get_rows*), one
launch per forward. With --gen N (the tokens the run generated) the last N-1 forwards are decode steps and every
kernel before them is the prefill; the table shows the last decode step. Without --gen, every forward after the
first is a decode step. With --prefill-only (a profile of a long prompt's first kernels, ncu --launch-count), every
kernel is the prefill's and there is no decode table. Prints Markdown; --json FILE also writes the numbers. Exit status 3 when fewer forwards were
profiled than --gen implies (kernels that ncu did not see, e.g. inside a CUDA graph it was told to skip).
Standard library only: the GPU machine is not guaranteed numpy.
"""
import argparse
import collections
import csv
import gzip
import json
import re
import sys

# ncu writes values in the unit it names per row; --print-units base gives bytes and ns, but scaled units are
# accepted too so that a CSV made without it still sums right.
UNITS = {
    "byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
    "kibyte": 1024, "mibyte": 1024**2, "gibyte": 1024**3,
    "ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9,
}
TIME, READ = "gpu__time_duration.sum", "dram__bytes_read.sum"
# Launch facts, shown per kernel where present: column heading, and whether the column is a time-weighted mean (else
# the range of values over the kernel's launches).
LAUNCH = collections.OrderedDict([
    ("launch__registers_per_thread", ("regs", False)),
    ("launch__block_size", ("block", False)),
    ("launch__grid_size", ("grid", False)),
    ("launch__waves_per_multiprocessor", ("waves/SM", False)),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", ("occupancy %", True)),
])
# kvgen's kernels templated on the weight type (GgmlType, src/gguf/ggml_types.h) show its number: name it.
GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
              11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 30: "BF16"}
TYPED = re.compile(r"^(matvec\w*|dequantize\w*|get_rows\w*)<(?:\(kvgen::GgmlType\))?(\d+)\b")


def value(text, unit, unknown):
    text = text.strip().replace(",", "")
    if text in ("", "n/a", "N/A"):
        return 0.0
    u = unit.strip().lower()
    if u not in UNITS:
        unknown.add(unit)
    return float(text) * UNITS.get(u, 1)


def split_top(s, sep):
    """s split at sep where no <...> or (...) is open."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(s[start:])
    return parts


def unmangle(name):
    """A mangled kernel name ('_ZN5kvgen4cuda...15get_rows_kernelILNS_8GgmlTypeE12EEEvPKh...', as some ncu versions
    print it) -> 'get_rows_kernel<12>': the last identifier of its nested name, with its leading integer template
    arguments. Other names are returned as they are."""
    if not name.startswith("_ZN"):
        return name
    i, ident = 3, ""
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        ln = int(name[i:j])
        ident, i = name[j:j + ln], j + ln
    if not ident:
        return name
    args = re.findall(r"L[^E]*?E(\d+)E|Li(\d+)E", name[i:]) if name[i:i + 1] == "I" else []
    nums = [a or b for a, b in args]
    return f"{ident}<{', '.join(nums)}>" if nums else ident


def short_name(name):
    """'void kvgen::<unnamed>::matvec_kernel<12>(const unsigned char *, ...)' (or 'void
    unnamed>::matvec_kernel<12>(...)') -> 'matvec_kernel<Q4_K>'."""
    # the anonymous namespace as '(anonymous namespace)::', '<unnamed>::' or, from ncu 2025, 'unnamed>::' with its
    # '<' and the namespaces before it cut off: dropped, so that no '<' is left open
    n = re.sub(r"(?:\(anonymous namespace\)|<?unnamed>)::", "", unmangle(name.strip()))
    if n.startswith("void "):
        n = n[5:]
    # the argument list: the last top-level (...)
    depth = 0
    for i, c in enumerate(n):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            n = n[:i]
            break
    n = split_top(n, "::")[-1].strip()  # namespaces, <unnamed> among them
    m = re.match(r"^([^<]*)<(.*)>$", n)
    if m and len(m.group(2)) > 24:  # cuBLAS's long template lists: keep the start
        n = f"{m.group(1)}<{m.group(2)[:20].rstrip(', ')}, ...>"
    t = TYPED.match(n)
    if t and int(t.group(2)) in GGML_TYPES:
        n = n[:t.start(2)] + GGML_TYPES[int(t.group(2))] + n[t.end(2):]
        n = n.replace("(kvgen::GgmlType)", "")
    return n


def read_kernels(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own ==PROF== lines and program output aside
    kernels = collections.OrderedDict()
    unknown = set()
    for r in csv.DictReader(lines):
        if r.get("ID") in (None, "ID"):
            continue
        key = (r.get("Process ID", ""), int(r["ID"]))
        k = kernels.setdefault(key, {"name": short_name(r["Kernel Name"]), TIME: 0.0, READ: 0.0})
        metric = r.get("Metric Name")
        if metric in (TIME, READ):
            k[metric] = value(r["Metric Value"], r.get("Metric Unit", ""), unknown)
        elif metric in LAUNCH:
            try:  # counts, waves and percentages: no unit to scale
                k[metric] = float(r["Metric Value"].strip().replace(",", ""))
            except ValueError:
                pass
    if unknown:
        print(f"ncu_sum: warning: units {sorted(unknown)} taken as bytes and ns", file=sys.stderr)
    return [kernels[k] for k in sorted(kernels, key=lambda k: (k[0], k[1]))]


def launch_facts(launches):
    """The LAUNCH columns of one kernel's launches: {heading: text}, for the metrics they have."""
    facts = {}
    for metric, (head, weighted) in LAUNCH.items():
        have = [k for k in launches if metric in k]
        if not have:
            continue
        if weighted:
            t = sum(k[TIME] for k in have)
            v = sum(k[metric] * k[TIME] for k in have) / t if t else sum(k[metric] for k in have) / len(have)
            facts[head] = f"{v:.0f}"
        else:
            lo, hi = min(k[metric] for k in have), max(k[metric] for k in have)
            fmt = (lambda x: f"{x:.2f}") if head == "waves/SM" else (lambda x: f"{x:.0f}")
            facts[head] = fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}"
    return facts


def summarize(seg, top):
    agg = collections.OrderedDict()
    by_name = collections.defaultdict(list)
    for k in seg:
        a = agg.setdefault(k["name"], [0, 0.0, 0.0])
        a[0] += 1
        a[1] += k[TIME]
        a[2] += k[READ]
        by_name[k["name"]].append(k)
    rows = sorted(([n] + a for n, a in agg.items()), key=lambda r: -r[2])
    if len(rows) > top:
        rest = rows[top - 1:]
        rows = rows[:top - 1] + [[f"({len(rest)} other kernels)", sum(r[1] for r in rest), sum(r[2] for r in rest),
                                  sum(r[3] for r in rest)]]
    total_ns = sum(k[TIME] for k in seg)
    total_b = sum(k[READ] for k in seg)
    return {"kernels": len(seg), "time_us": total_ns / 1e3, "gb_read": total_b / 1e9,
            "gb_s": total_b / total_ns if total_ns else 0.0,
            "rows": [{"kernel": n, "launches": c, "time_us": t / 1e3, "share": t / total_ns if total_ns else 0.0,
                      "gb_read": b / 1e9, "gb_s": b / t if t else 0.0, "launch": launch_facts(by_name.get(n, []))}
                     for n, c, t, b in rows]}


def table(s):
    heads = [h for h, _ in LAUNCH.values() if any(h in r["launch"] for r in s["rows"])]
    out = ["| kernel | launches | time (us) | share of step | GB read | GB/s |" + "".join(f" {h} |" for h in heads),
           "| --- | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * len(heads)]
    for r in s["rows"]:
        out.append(f"| `{r['kernel']}` | {r['launches']} | {r['time_us']:.1f} | {100 * r['share']:.1f}% "
                   f"| {r['gb_read']:.3f} | {r['gb_s']:.0f} |" + "".join(f" {r['launch'].get(h, '')} |" for h in heads))
    out.append(f"| all | {s['kernels']} | {s['time_us']:.1f} | 100% | {s['gb_read']:.3f} | {s['gb_s']:.0f} |" +
               " |" * len(heads))
    return out


def emit(lines, res, json_path):
    """Prints the Markdown lines, and writes res as JSON to json_path when given."""
    print("\n".join(lines))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(res, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--gen", type=int, default=0, help="tokens the profiled run generated")
    ap.add_argument("--json", help="also write the numbers to this file")
    ap.add_argument("--top", type=int, default=20, help="kernels per table; the rest are summed in one row")
    ap.add_argument("--prefill-only", action="store_true", help="every kernel is the prefill's (no decode step)")
    a = ap.parse_args()
    ks = read_kernels(a.csv)
    starts = [i for i, k in enumerate(ks) if k["name"].startswith("get_rows")]
    if not ks or not starts:
        print(f"ncu_sum: no kvgen forward in {a.csv} ({len(ks)} kernels profiled)", file=sys.stderr)
        return 2
    if a.prefill_only:
        res = {"csv": a.csv, "kernels": len(ks), "prefill": summarize(ks, a.top)}
        p = res["prefill"]
        lines = [f"The first {len(ks)} kernels of a prefill, each launched one at a time by ncu (the sums leave out "
                 f"launch gaps): {p['time_us'] / 1e3:.3f} ms of GPU time, {p['gb_read']:.3f} GB read, "
                 f"{p['gb_s']:.0f} GB/s on average.", ""] + table(p)
        emit(lines, res, a.json)
        return 0
    if starts[0] != 0:  # kernels before the first forward (none today): counted with the prefill
        starts[0] = 0
    fwd = [ks[b:e] for b, e in zip(starts, starts[1:] + [len(ks)])]
    n_decode = a.gen - 1 if a.gen > 0 else len(fwd) - 1
    if n_decode < 1 or len(fwd) < n_decode + 1:
        print(f"ncu_sum: {len(fwd)} forwards profiled ({', '.join(str(len(f)) for f in fwd)} kernels), "
              f"expected a prefill and {max(n_decode, 1)} decode step(s): were some kernels not profiled "
              f"(a CUDA graph)?", file=sys.stderr)
        return 3
    prefill = [k for f in fwd[:len(fwd) - n_decode] for k in f]
    decode = fwd[-1]
    steps = [len(f) for f in fwd[len(fwd) - n_decode:]]
    res = {"csv": a.csv, "kernels": len(ks), "forwards": [len(f) for f in fwd], "decode_steps": steps,
           "decode": summarize(decode, a.top), "prefill": summarize(prefill, a.top)}
    d, p = res["decode"], res["prefill"]
    same = "" if len(set(steps)) == 1 else f" (the decode steps launched {', '.join(map(str, steps))} kernels)"
    lines = [f"{len(ks)} kernels profiled: a prefill of {p['kernels']} kernels and {len(steps)} decode step(s) of "
             f"{steps[-1]}{same}. GPU time is each kernel's own, launched one at a time by ncu, so the sums leave out "
             f"launch gaps.", "",
             f"One decode step (the last): {d['time_us'] / 1e3:.3f} ms of GPU time, {d['gb_read']:.3f} GB read, "
             f"{d['gb_s']:.0f} GB/s on average.", ""] + table(d) + [
             "", f"Prefill: {p['time_us'] / 1e3:.3f} ms of GPU time, {p['gb_read']:.3f} GB read, "
             f"{p['gb_s']:.0f} GB/s on average.", ""] + table(p)
    emit(lines, res, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
