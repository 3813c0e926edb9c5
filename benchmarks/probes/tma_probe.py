"""Probe: the TMA main loop (TmaWgmma) on every layer of one pass it can run, beside
convgen's current plan (tuned or default) and cuDNN, in one process on the same bytes.

For each layer of the chosen suites that the loop can run (planner.tma_eligible), it times
cuDNN (PyTorch, channels_last fp16, cudnn.benchmark; fprop without bias, dgrad dx alone,
wgrad dW alone),
convgen's current plan, and each TMA candidate (convgen.candidates), with `convgen bench`'s method: CUDA
events around each call, a spin kernel ahead so no host gap is timed, the L2 flushed
before every rep, reps interleaved.  Every output is checked against cuDNN's first.  The
candidates' kernels are compiled in parallel first (one NVRTC process per kernel).

    python3 benchmarks/probes/tma_probe.py --pass dgrad --suites resnet50 large --reps 10 --out tma.json

This is a probe for choosing the planner's rule, not the same-work bench: it reports GPU
time only.  The bench (`convgen bench`) gives the three figures per row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import cupy as cp
import torch
import torch.nn.functional as F

import convgen
from convgen.autotune import _compile_all
from convgen.candidates import candidates
from convgen.compile import detect_target
from convgen.emit import emit
from convgen.ir import Pass
from convgen.planner import make_spec, tma_eligible
from convgen.runtime import _gpu_name
from convgen.suites import SUITES
from convgen.tools.timing import CudaDevice, time_interleaved
from convgen.tuning_db import tuned_plan


def _rel(a, b) -> float:
    a, b = a.astype(cp.float64), b.astype(cp.float64)
    return float(cp.linalg.norm(a - b) / max(float(cp.linalg.norm(b)), 1e-30))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suites", nargs="*", default=list(SUITES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--pass", dest="pass_", choices=("fprop", "dgrad", "wgrad"), default="fprop")
    ap.add_argument("--strided", action="store_true", help="only the layers whose stride is not 1")
    args = ap.parse_args()
    ps = Pass.parse(args.pass_)
    target = detect_target()
    gpu = _gpu_name(cp.cuda.Device().id)
    torch.backends.cudnn.benchmark = True
    layers = []
    for suite in args.suites:
        for layer in SUITES[suite]:
            p = layer.problem
            if args.strided and p.stride == (1, 1):
                continue
            if tma_eligible(p.geometry, ps, target) is None:
                layers.append((suite, layer, [c for c in candidates(p, ps, target) if c.tma]))
    print(f"{len(layers)} layers; GPU {gpu}", flush=True)

    t0 = time.perf_counter()
    sources = []
    for _, layer, plans in layers:
        cur = tuned_plan(gpu, layer.problem.geometry, ps, "float16", target.arch)
        for plan in [cur] + plans:
            src = emit(make_spec(layer.problem, ps, target=target, plan_=plan))
            sources.append((src.source, src.compile_arch))
    for i in range(0, len(sources), args.jobs):
        for why in _compile_all(sources[i:i + args.jobs], time.perf_counter() + 600):
            if why:
                print("compile:", why, flush=True)
    print(f"compiled {len(sources)} kernels in {time.perf_counter() - t0:.0f} s", flush=True)

    rows = []
    stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream) if torch.cuda.current_stream().cuda_stream \
        else cp.cuda.Stream.null
    with stream, torch.no_grad():
        dev = CudaDevice(cp, stream)
        for suite, layer, plans in layers:
            p = layer.problem
            g = torch.Generator(device="cuda")
            g.manual_seed(1)
            x = torch.randn(p.x_shape, generator=g, device="cuda").half()
            w = (torch.randn(p.w_shape, generator=g, device="cuda") / (p.r * p.s * p.c) ** 0.5).half()
            dy = torch.randn(p.y_shape, generator=g, device="cuda").half()
            xt, wt, dyt = x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), dy.permute(0, 3, 1, 2)
            geo = dict(stride=p.stride, padding=p.padding, dilation=p.dilation)
            cw = cp.from_dlpack(w)
            if ps is Pass.FPROP:
                ca, out_shape = cp.from_dlpack(x), p.y_shape
                ops = [("cudnn", lambda: F.conv2d(xt, wt, None, **geo))]
                ref = cp.from_dlpack(ops[0][1]().permute(0, 2, 3, 1).contiguous())
            else:  # dx alone, or dW alone, as the same-work bench computes them
                aten = torch.ops.aten
                dx_only = ps is Pass.DGRAD
                ops = [("cudnn", lambda: aten.convolution_backward(dyt, xt, wt, None, list(p.stride), list(p.padding),
                                                                   list(p.dilation), False, [0, 0], 1,
                                                                   [dx_only, not dx_only, False]))]
                ref = cp.from_dlpack(ops[0][1]()[0 if dx_only else 1].permute(0, 2, 3, 1).contiguous())
                if dx_only:
                    ca, cw, out_shape = cp.from_dlpack(dy), cp.from_dlpack(w), p.x_shape
                else:  # convgen's wgrad takes (x, dy)
                    ca, cw, out_shape = cp.from_dlpack(x), cp.from_dlpack(dy), p.w_shape
            errs = {}
            for name, plan in [("current", None)] + [(c.brief(), c) for c in plans]:
                try:
                    op = convgen.prepare(ps.value, p.x_shape, p.w_shape, plan=plan, **geo)
                    y = cp.full(out_shape, cp.nan, dtype=cp.float16)
                    op(ca, cw, out=y)
                    errs[name] = _rel(y, ref)
                except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
                    print(f"{suite}/{layer.name} {name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                    continue
                ops.append((name, lambda op=op, y=y: op(ca, cw, out=y)))
            for _, fn in ops:
                fn()
            times = {k: statistics.median(v) for k, v in time_interleaved(dev, ops, args.reps).items()}
            gm = p.gemm(ps)
            tflop = 2 * gm.m * gm.n * gm.k / 1e12
            tma = {k: v for k, v in times.items() if k not in ("cudnn", "current")}
            best = min(tma, key=tma.get) if tma else None
            row = dict(pass_=ps.value, suite=suite, layer=layer.name, shape=p.describe(), gflop=tflop * 1e3, us=times, err=errs,
                       best_tma=best)
            rows.append(row)
            cur = times.get("current")
            print(f"{suite}/{layer.name:14s} {tflop * 1e3:7.1f} GFLOP  cuDNN {tflop / times['cudnn'] * 1e6:5.0f}  "
                  f"current {tflop / cur * 1e6 if cur else 0:5.0f}  best TMA {best} "
                  f"{tflop / tma[best] * 1e6 if best else 0:5.0f} TFLOP/s  "
                  f"(x cuDNN {times['cudnn'] / tma[best] if best else 0:.2f}, x current "
                  f"{cur / tma[best] if best and cur else 0:.2f})  max err {max(errs.values()) if errs else 0:.1e}",
                  flush=True)
            for k in tma:
                print(f"      {k:40s} {tflop / tma[k] * 1e6:5.0f} TFLOP/s  err {errs[k]:.1e}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(gpu=gpu, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
