"""Probe: run the depthwise fprop candidates of the forty-fifth session (the held-filter loop and
the stencil on mma.sync) once each, with the default beside them, for compute-sanitizer.

    compute-sanitizer --tool memcheck --report-api-errors no python3 benchmarks/probes/sanitize_dw.py
    compute-sanitizer --tool racecheck python3 benchmarks/probes/sanitize_dw.py

Small layers with edge tiles, a chunk past C and several tiles a block, each plan checked
against the float64 reference too, so a run the sanitizer passes also computed the right numbers."""

from __future__ import annotations

import numpy as np

import cupy as cp

import convgen
from convgen import reference
from convgen.candidates import candidates
from convgen.ir import ConvProblem, Pass, Target

LAYERS = [ConvProblem(13, 11, 96, 96, 7, 7, 1, 3, groups=96, n=3), ConvProblem(12, 9, 40, 40, 5, 5, 1, 2, groups=40, n=2),
          ConvProblem(9, 10, 16, 32, 3, 3, 2, 1, groups=16, n=2)]

rng = np.random.default_rng(7)
for prob in LAYERS:
    plans = candidates(prob, Pass.FPROP, Target("sm_90"))
    picked = [plans[0]] + [p for p in plans if p.loop.out_rows > 1][:2] + [p for p in plans if p.loop.mma][:2]
    x = rng.integers(-2, 3, size=prob.x_shape).astype(np.float16)
    w = rng.integers(-2, 3, size=prob.w_shape).astype(np.float16)
    ref = reference.fprop(x.astype(np.float64), w.astype(np.float64), None, stride=prob.stride, padding=prob.padding,
                          dilation=prob.dilation, groups=prob.groups)
    for plan in picked:
        y = convgen.conv2d(cp.asarray(x), cp.asarray(w), stride=prob.stride, padding=prob.padding,
                           dilation=prob.dilation, groups=prob.groups, out_dtype="float32", plan=plan)
        bad = int((cp.asnumpy(y).astype(np.float64) != ref).sum())
        print(f"fprop {prob.describe()} {plan.loop.tag} {plan.brief()}: {bad} of {ref.size} outputs differ from the "
              "exact reference")
