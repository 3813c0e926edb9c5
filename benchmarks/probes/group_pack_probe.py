"""Probe: how many groups should a slab pack, per layer and pass (convgen/group_pack.py)?

ResNeXt's grouped 3x3 layers have 4 to 32 channels a group. Packing PACK neighbouring groups
into one slab of PACK times the channels (block-diagonal weights) gives each block a full N
tile and whole 16-byte gathers, for PACK times the MMA work. This times, per layer and pass, on
one stream with the bench's method (L2 flushed, host hidden, median of reps):

* ``as is``: convgen on the layer as it is (the planner's plan for it, as a hand plan, so the
  library packs nothing);
* ``slab N``: convgen on the layer packed into slabs of N channels, the planner's plan for
  that problem as a hand plan, on weights expanded beforehand (fprop, dgrad) or writing the
  slab dW (wgrad): the kernel alone, without the copies;
* ``library``: ``convgen.conv2d`` & co. as they run by default, copies included;
* cuDNN (PyTorch, channels_last) on the layer as it is.

It checks the library's result against ``as is`` (norm-relative; the same sums, zeros added).

    CONVGEN_TUNED=0 python3 benchmarks/probes/group_pack_probe.py [reps]
"""

from __future__ import annotations

import dataclasses
import sys

import cupy as cp

import convgen
from convgen.compile import compile_async
from convgen.group_pack import expand_weights
from convgen.ir import Epilogue, Pass
from convgen.suites import SUITES
from convgen.tools.timing import CudaDevice
from probe_timing import cudnn_op, medians

SLABS = (16, 32, 64, 128)


def options(g):
    """(label, problem) per slab width that divides into whole groups, the layer as is first."""
    widest = max(g.c // g.groups, g.k // g.groups)
    out = [("as is", g)]
    for width in SLABS:
        pack = width // widest
        if pack > 1 and width % widest == 0 and g.groups % pack == 0:
            out.append((f"slab {width}", dataclasses.replace(g, groups=g.groups // pack)))
    return out


def main() -> int:
    import torch

    torch.backends.cudnn.benchmark = True
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    layers = SUITES["resnext50-grouped"]
    # every kernel compiled in parallel first
    srcs = []
    for layer in layers:
        for _, prob in options(layer.problem):
            for pass_ in Pass:
                epi = Epilogue(bias=False)
                src = convgen.emit(convgen.make_spec(prob, pass_, epilogue=epi, plan_=convgen.plan(prob, pass_)))
                srcs.append((src.source, src.compile_arch))
    for f in compile_async(srcs):
        f.result()
    stream = cp.cuda.Stream(non_blocking=True)
    cols = ["as is"] + [f"slab {w}" for w in SLABS] + ["library", "cuDNN"]
    print(f"{'layer':18s} {'pass':5s} " + " ".join(f"{c:>9s}" for c in cols) + "  library vs as is")
    # torch's kernels on the same stream as convgen's and the timing events (at 5bf5603 they ran
    # on torch's own stream and the cuDNN column timed nothing: 1.6 us)
    with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
        dev = CudaDevice(cp, stream)
        for layer in layers:
            g = layer.problem
            kw = dict(stride=tuple(g.stride), padding=tuple(g.padding), dilation=tuple(g.dilation))
            rng = cp.random.default_rng()
            x = rng.standard_normal(g.x_shape, dtype=cp.float32).astype(cp.float16)
            w = (rng.standard_normal(g.w_shape, dtype=cp.float32) * 0.1).astype(cp.float16)
            dy = rng.standard_normal(g.y_shape, dtype=cp.float32).astype(cp.float16)
            tx = torch.as_tensor(x, device="cuda").permute(0, 3, 1, 2)
            tw = torch.as_tensor(w, device="cuda").permute(0, 3, 1, 2)
            tdy = torch.as_tensor(dy, device="cuda").permute(0, 3, 1, 2)
            for pass_ in ("fprop", "dgrad", "wgrad"):
                ops = []
                for label, prob in options(g):
                    plan = convgen.plan(prob, pass_)
                    pk = dict(kw, groups=prob.groups, plan=plan)
                    ws = cp.asarray(expand_weights(cp.asnumpy(w), g.groups, prob.groups))
                    if pass_ == "fprop":
                        ops.append((label, lambda ws=ws, pk=pk: convgen.conv2d(x, ws, **pk)))
                    elif pass_ == "dgrad":
                        ops.append((label, lambda ws=ws, pk=pk: convgen.conv2d_dgrad(dy, ws, g.x_shape, **pk)))
                    else:
                        ops.append((label, lambda ws=ws, pk=pk: convgen.conv2d_wgrad(x, dy, ws.shape, bias=False, **pk)))
                lk = dict(kw, groups=g.groups)
                if pass_ == "fprop":
                    lib = lambda: convgen.conv2d(x, w, **lk)  # noqa: E731
                elif pass_ == "dgrad":
                    lib = lambda: convgen.conv2d_dgrad(dy, w, g.x_shape, **lk)  # noqa: E731
                else:
                    lib = lambda: convgen.conv2d_wgrad(x, dy, g.w_shape, bias=False, **lk)[0]  # noqa: E731
                ops += [("library", lib), ("cuDNN", cudnn_op(torch, pass_, tx, tw, tdy, g))]
                ref = ops[0][1]()
                ref = (ref[0] if isinstance(ref, tuple) else ref).astype(cp.float32)
                got = lib().astype(cp.float32)
                err = float(cp.linalg.norm(got - ref) / cp.linalg.norm(ref))
                med = medians(dev, ops, reps)
                print(f"{layer.name:18s} {pass_:5s} " + " ".join(f"{med.get(c, float('nan')):9.1f}" for c in cols)
                      + f"  {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
