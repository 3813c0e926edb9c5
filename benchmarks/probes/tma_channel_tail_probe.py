"""Probe: fprop of 3x3 layers whose C is not a whole number of 64-channel boxes, on the TMA
loop (w mapped as (C, R*S, K), each tap's last step part zeros) against the im2col plan the
planner gave them before, and against cuDNN.  Not the bench: CUDA events over back-to-back
reps with the L2 flushed (convgen.tools.timing), no bias on either side.

    python3 benchmarks/probes/tma_channel_tail_probe.py
"""

from __future__ import annotations

import cupy as cp
import numpy as np

import convgen
import convgen.planner
from convgen.compile import detect_target
from convgen.ir import ConvProblem, Pass
from convgen.tools import timing

LAYERS = [
    ("c96-56px", ConvProblem(56, 56, 96, 96, 3, 3, 1, 1, 1, n=32)),
    ("c160-28px", ConvProblem(28, 28, 160, 128, 3, 3, 1, 1, 1, n=64)),
    ("c96to192-128px", ConvProblem(128, 128, 96, 192, 3, 3, 1, 1, 1, n=16)),
]

dev = timing.CudaDevice(cp, cp.cuda.get_current_stream())
target = detect_target()
rng = np.random.default_rng(0)
try:
    import torch
except ImportError:
    torch = None
print(f"{'layer':16s} {'plan':28s} {'us':>8s} {'TFLOP/s':>8s}")
for name, prob in LAYERS:
    x = cp.asarray(rng.standard_normal(prob.x_shape, dtype=np.float32).astype(np.float16))
    w = cp.asarray(rng.standard_normal(prob.w_shape, dtype=np.float32).astype(np.float16))
    tma = convgen.plan(prob, Pass.FPROP, target)
    real = convgen.planner.tma_eligible
    convgen.planner.tma_eligible = lambda *a, **k: "probe: the plan before"  # noqa: E731
    try:
        before = convgen.plan(prob, Pass.FPROP, target)
    finally:
        convgen.planner.tma_eligible = real
    ys = {}
    for label, p in (("default", tma), ("before", before)):
        ys[label] = convgen.conv2d(x, w, padding=1, plan=p)
        us = timing.median_gpu_us(dev, lambda p=p: convgen.conv2d(x, w, padding=1, plan=p), 20)
        print(f"{name:16s} {label + ' ' + p.brief():28s} {us:8.1f} {2 * prob.gemm(Pass.FPROP).m * prob.k * 9 * prob.c / us / 1e6:8.1f}")
    a, b = (cp.asnumpy(ys[k]).astype(np.float64) for k in ("default", "before"))
    print(f"{name:16s} default against before: norm-relative difference {np.linalg.norm(a - b) / np.linalg.norm(b):.2e}")
    if torch is not None:
        xt = torch.as_tensor(cp.asnumpy(x), device="cuda").permute(0, 3, 1, 2)
        wt = torch.as_tensor(cp.asnumpy(w), device="cuda").permute(0, 3, 1, 2)
        xt = xt.contiguous(memory_format=torch.channels_last)
        wt = wt.contiguous(memory_format=torch.channels_last)
        torch.backends.cudnn.benchmark = True
        for _ in range(3):
            torch.nn.functional.conv2d(xt, wt, padding=1)
        torch.cuda.synchronize()
        us = timing.median_gpu_us(dev, lambda: torch.nn.functional.conv2d(xt, wt, padding=1), 20)
        print(f"{name:16s} {'cuDNN':28s} {us:8.1f}")
