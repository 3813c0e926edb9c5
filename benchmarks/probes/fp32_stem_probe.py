"""Probe: should a float32 RGB stem be cast to 16 bits (and padded to 4 channels) before its kernel?

With float16 inputs an ImageNet-sized stem's x is padded from 3 channels to 4 and the kernel
gathers 8-byte runs (convgen/channel_pad.py: 1.3-1.6x faster in fprop). With float32 inputs
the pad is skipped: the plan reads x one float32 at a time in its gather (the scalar path),
and `convgen sass` shows such a kernel near the register cap where the whole reduction is one
K-step (3x3x3: 255 registers on 128x64 tiles of 4 warps, sm_90; 7x7x3: 170). A NumPy/CuPy
framework that keeps float32 activations meets exactly this layer. Per stem and pass, timed
with the bench's method (L2 flushed, host hidden, interleaved, median of reps):

* ``fp32``: ``convgen.conv2d`` / ``conv2d_wgrad`` on the float32 arrays, as the library runs them;
* ``cast+16``: the same arrays cast to float16 first (the casts timed), then the library's
  float16 path (the pad where its rule takes the stem);
* ``cast``: the casts alone;
* ``fp32 8w`` (fprop): the float32 plan with twice the warps (8 instead of 4, the same tile),
  where its warps hold 8 fragments: such kernels with a one-step reduction sat at 248-255
  registers (`convgen sass`), 8 warps at about 145;
* cuDNN (PyTorch, channels_last, float16) on the layer, for scale.

Both convgen columns round the inputs to float16 (the float32 path in its gather), so they
must agree to fp32 accumulation order; the check prints their norm-relative difference. Both
write float32 outputs (dW too), as a float32 framework wants them.

    CONVGEN_TUNED=0 python3 benchmarks/probes/fp32_stem_probe.py [reps]
"""

from __future__ import annotations

import dataclasses
import sys

import cupy as cp

import convgen
from convgen.compile import detect_target
from convgen.suites import SUITES
from probe_timing import cudnn_op, medians, one_stream, torch_with_cudnn

LAYERS = [("resnet50", "conv1"), ("resnet18", "conv1"), ("vgg16", "conv1_1"), ("unet", "enc1a"),
          ("darknet53-down", "stem"), ("cifar-resnet", "conv1"), ("cifar-vgg", "conv1")]
COLUMNS = ("fp32", "fp32 8w", "cast+16", "cast", "cuDNN")


def _dw(res):
    return res[0] if isinstance(res, tuple) else res


def main() -> int:
    torch = torch_with_cudnn()
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    with one_stream(cp, torch) as dev:
        print(f"{'layer':22s} {'pass':5s} " + " ".join(f"{c:>8s}" for c in COLUMNS) + "  fp32 vs cast+16 (norm-relative)")
        for suite, name in LAYERS:
            g = next(l for l in SUITES[suite] if l.name == name).problem
            kw = dict(stride=tuple(g.stride), padding=tuple(g.padding), out_dtype=cp.float32)  # one output either way
            rng = cp.random.default_rng()
            x = rng.standard_normal((g.n, g.h, g.w, g.c), dtype=cp.float32)
            w = rng.standard_normal((g.k, g.r, g.s, g.c), dtype=cp.float32) * 0.1
            dy = rng.standard_normal(convgen.conv2d(x, w, **kw).shape, dtype=cp.float32)
            for pass_ in ("fprop", "wgrad"):
                if pass_ == "fprop":
                    ops = [("fp32", lambda: convgen.conv2d(x, w, **kw)),
                           ("cast+16", lambda: convgen.conv2d(x.astype(cp.float16), w.astype(cp.float16), **kw)),
                           ("cast", lambda: (x.astype(cp.float16), w.astype(cp.float16)))]
                    p = convgen.plan(g, "fprop", detect_target(), "float32")
                    if p.warps == 4 and p.block_m // p.warps_m * p.block_n // p.warps_n >= 8 * 256 and not p.tma:
                        p8 = dataclasses.replace(p, warps_m=p.warps_m * 2, reasons=())
                        ops.append(("fp32 8w", lambda p8=p8: convgen.conv2d(x, w, plan=p8, **kw)))
                else:
                    ops = [("fp32", lambda: convgen.conv2d_wgrad(x, dy, w.shape, bias=False, **kw)),
                           ("cast+16", lambda: convgen.conv2d_wgrad(x.astype(cp.float16), dy.astype(cp.float16),
                                                                    w.shape, bias=False, **kw)),
                           ("cast", lambda: (x.astype(cp.float16), dy.astype(cp.float16)))]
                a = _dw(ops[0][1]()).astype(cp.float32)
                b = _dw(ops[1][1]()).astype(cp.float32)
                diff = float(cp.linalg.norm(a - b) / cp.linalg.norm(a))
                if torch is not None:
                    tx = torch.as_tensor(x, device="cuda").half().permute(0, 3, 1, 2)
                    tw = torch.as_tensor(w, device="cuda").half().permute(0, 3, 1, 2)
                    tdy = torch.as_tensor(dy, device="cuda").half().permute(0, 3, 1, 2)
                    ops.append(("cuDNN", cudnn_op(torch, pass_, tx, tw, tdy, g)))
                med = medians(dev, ops, reps)
                print(f"{suite + '/' + name:22s} {pass_:5s} " + " ".join(f"{med.get(c, float('nan')):8.1f}" for c in COLUMNS)
                      + f"  {diff:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
