#!/usr/bin/env python3
"""Writes dequant_golden.bin (a GGUF file; .bin keeps it apart from models): random blocks of every weight type kvgen supports, each beside the float32 values
that an independent implementation (the `gguf` Python package, llama.cpp's own) decodes them to.

Tensor `<TYPE>.q` holds 1024 weights as raw blocks ([1024] for 32-blocks and 256-blocks alike, 4 rows of 256),
`<TYPE>.f32` the expected floats. Regenerate with: pip install gguf==0.19.0 numpy; python3 make_dequant_golden.py
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

rng = np.random.default_rng(20261130)
out = sys.argv[1] if len(sys.argv) > 1 else "dequant_golden.bin"
w = GGUFWriter(out, arch="kvgen-test")

# Byte offsets (in a block) of each half-precision scale field, set to sane random values so nothing is NaN/inf.
half_fields = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
n = 1024
for qt, fields in half_fields.items():
    block, size = GGML_QUANT_SIZES[qt]
    nb = n // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for off in fields:
        vals = (rng.uniform(0.001, 0.05, size=nb) * rng.choice([-1, 1], size=nb)).astype(np.float16)
        raw[:, off:off + 2] = vals.view(np.uint8).reshape(nb, 2)
    raw = raw.reshape(4, -1)  # 4 rows of 256 weights
    expect = dequantize(raw, qt).astype(np.float32).reshape(4, 256)
    w.add_tensor(f"{qt.name}.q", raw, raw_shape=raw.shape, raw_dtype=qt)
    w.add_tensor(f"{qt.name}.f32", expect)

for qt, dt in ((T.F16, np.float16), (T.BF16, None)):
    vals = rng.normal(0, 1, size=(4, 256)).astype(np.float32)
    if dt is np.float16:
        raw = vals.astype(np.float16).view(np.uint8).reshape(4, 512)
    else:  # bfloat16: the top half of each float32, rounded to nearest even
        u = vals.view(np.uint32)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        raw = u.view(np.uint8).reshape(4, 512)
    expect = dequantize(raw, qt).astype(np.float32).reshape(4, 256)
    w.add_tensor(f"{qt.name}.q", raw, raw_shape=raw.shape, raw_dtype=qt)
    w.add_tensor(f"{qt.name}.f32", expect)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print("wrote", out)
