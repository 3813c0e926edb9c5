"""Probe: does padding a narrow input's channels to 4 or 8 pay, for stem layers?

Every real-network suite starts with a C=3 layer (RGB input; C=1 in the speech suite), and
those rows trail cuDNN most (0.36-0.66x in fprop and wgrad at cf1b940): with C=3 a pixel is
6 bytes, so the gathers read one fp16 at a time. Padding x's channels with zeros to CP = 4 or
8 (and w's the same) gives 8- or 16-byte runs and the vector gathers, for 33-167% more MMA
work on layers that are nowhere near the tensor-core rate. This times, per layer and pass, on
one stream with the bench's method (L2 flushed, host hidden, median of reps):

* ``as is``: convgen on the layer as it is (the planner's plan for it, given as a hand plan so
  the library's own padding stays out);
* ``pad CP``: one pad kernel (x to CP channels, one thread per pixel) plus convgen on the
  padded layer (fprop: w padded too, outside the timing, as a cached weight would be;
  wgrad: dW computed at CP channels, then its first C channels copied out);
* ``pad kern``: the probe's own one-thread-a-row copy to 4 channels, alone;
* ``library``: ``convgen.conv2d`` / ``conv2d_wgrad`` as they run by default (convgen/channel_pad.py);
* cuDNN (PyTorch, channels_last) on the layer as it is, for scale.

It also checks that the padded result equals the plain one (same reduction, zero terms added).

    CONVGEN_TUNED=0 python3 benchmarks/probes/channel_pad_probe.py
"""

from __future__ import annotations

import dataclasses
import sys

import cupy as cp
import numpy as np

import convgen
from convgen.suites import SUITES
from probe_timing import cudnn_op, medians, one_stream, torch_with_cudnn

LAYERS = [("resnet50", "conv1"), ("resnet18", "conv1"), ("vgg16", "conv1_1"), ("unet", "enc1a"),
          ("darknet53-down", "stem"), ("speech", "ds2-conv1"), ("speech", "spec-5x20"),
          ("cifar-resnet", "conv1"), ("cifar-vgg", "conv1")]

_PAD_SRC = r"""
extern "C" __global__ void pad_channels(const unsigned short* __restrict__ x, unsigned short* __restrict__ y,
                                        long long pixels, int c, int cp) {
    long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= pixels) return;
    unsigned short v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < c; ++i) v[i] = x[p * c + i];
    if (cp == 8) {
        uint4 o; o.x = v[0] | (v[1] << 16); o.y = v[2] | (v[3] << 16); o.z = v[4] | (v[5] << 16); o.w = v[6] | (v[7] << 16);
        reinterpret_cast<uint4*>(y)[p] = o;
    } else {
        uint2 o; o.x = v[0] | (v[1] << 16); o.y = v[2] | (v[3] << 16);
        reinterpret_cast<uint2*>(y)[p] = o;
    }
}
"""
_pad = cp.RawKernel(_PAD_SRC, "pad_channels")


def pad(x, cpad, out):
    pixels = x.size // x.shape[-1]
    _pad(((pixels + 255) // 256,), (256,), (x, out, np.int64(pixels), np.int32(x.shape[-1]), np.int32(cpad)))
    return out


def main() -> int:
    torch = torch_with_cudnn()
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    with one_stream(cp, torch) as dev:  # cuDNN on the timed stream too (probe_timing.py; not so before)
        print(f"{'layer':22s} {'pass':5s} {'as is':>8s} {'pad 4':>8s} {'pad 8':>8s} {'pad kern':>8s} {'library':>8s} "
              f"{'cuDNN':>8s}  check (norm-relative, against as is)")
        for suite, name in LAYERS:
            layer = next(l for l in SUITES[suite] if l.name == name)
            g = layer.problem
            n, h, w_, c, k, r, s = g.n, g.h, g.w, g.c, g.k, g.r, g.s
            kw = dict(stride=tuple(g.stride), padding=tuple(g.padding))
            rng = cp.random.default_rng(0)
            x = rng.standard_normal((n, h, w_, c), dtype=cp.float32).astype(cp.float16)
            wt = (rng.standard_normal((k, r, s, c), dtype=cp.float32) * 0.1).astype(cp.float16)
            y = convgen.conv2d(x, wt, **kw)
            dy = rng.standard_normal(y.shape, dtype=cp.float32).astype(cp.float16)
            for pass_ in ("fprop", "wgrad"):
                ops = []
                plan = convgen.plan(g, pass_)
                if pass_ == "fprop":
                    ops.append(("as is", lambda plan=plan: convgen.conv2d(x, wt, plan=plan, **kw)))
                    ops.append(("library", lambda: convgen.conv2d(x, wt, **kw)))
                    ref = convgen.conv2d(x, wt, plan=plan, **kw).astype(cp.float32)
                    lib = convgen.conv2d(x, wt, **kw).astype(cp.float32)
                else:
                    ops.append(("as is", lambda plan=plan: convgen.conv2d_wgrad(x, dy, wt.shape, bias=False, plan=plan, **kw)))
                    ops.append(("library", lambda: convgen.conv2d_wgrad(x, dy, wt.shape, bias=False, **kw)))
                    ref = convgen.conv2d_wgrad(x, dy, wt.shape, bias=False, plan=plan, **kw)
                    ref = (ref[0] if isinstance(ref, tuple) else ref).astype(cp.float32)
                    lib = convgen.conv2d_wgrad(x, dy, wt.shape, bias=False, **kw)[0].astype(cp.float32)
                checks = [f"lib:{float(cp.linalg.norm(lib - ref) / cp.linalg.norm(ref)):.1e}"]
                for cpad in (4, 8):
                    xp = cp.empty((n, h, w_, cpad), cp.float16)
                    wp = cp.zeros((k, r, s, cpad), cp.float16)
                    wp[..., :c] = wt
                    # the planner's plan for the padded layer, as a hand plan: the library pads no further
                    pplan = convgen.plan(dataclasses.replace(g, c=cpad), pass_)
                    if pass_ == "fprop":
                        def op(xp=xp, wp=wp, pplan=pplan):
                            return convgen.conv2d(pad(x, xp.shape[-1], xp), wp, plan=pplan, **kw)
                        got = op().astype(cp.float32)
                    else:
                        def op(xp=xp, wp=wp, pplan=pplan):
                            d = convgen.conv2d_wgrad(pad(x, xp.shape[-1], xp), dy, wp.shape, bias=False, plan=pplan, **kw)
                            d = d[0] if isinstance(d, tuple) else d
                            return cp.ascontiguousarray(d[..., :c])
                        got = op().astype(cp.float32)
                    err = float(cp.linalg.norm(got - ref) / cp.linalg.norm(ref))
                    checks.append(f"{cpad}:{err:.1e}")
                    ops.append((f"pad {cpad}", op))
                xp4 = cp.empty((n, h, w_, 4), cp.float16)
                ops.append(("pad kern", lambda: pad(x, 4, xp4)))
                if torch is not None:
                    tx = torch.as_tensor(x, device="cuda").permute(0, 3, 1, 2)
                    tw = torch.as_tensor(wt, device="cuda").permute(0, 3, 1, 2)
                    tdy = torch.as_tensor(dy, device="cuda").permute(0, 3, 1, 2)
                    ops.append(("cuDNN", cudnn_op(torch, pass_, tx, tw, tdy, g)))
                med = medians(dev, ops, reps)
                print(f"{suite + '/' + name:22s} {pass_:5s} " + " ".join(f"{med.get(k_, float('nan')):8.1f}"
                      for k_ in ("as is", "pad 4", "pad 8", "pad kern", "library", "cuDNN")) + "  " + " ".join(checks), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
