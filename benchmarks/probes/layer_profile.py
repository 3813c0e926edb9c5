"""Probe: one layer and pass, convgen's kernels and cuDNN's, the last of four calls of each side
inside an NVTX range ("convgen", "cudnn") that Nsight Compute selects, the same work on both
sides (no bias; dgrad dx alone; wgrad dW alone):

    ncu --nvtx --nvtx-include "cudnn/" --section SpeedOfLight --section WarpStateStats \\
        python3 benchmarks/probes/layer_profile.py fprop 128 56 56 144 144 3 1 1 144

Arguments: pass, N, H, W, C, K, R (square filter), stride, padding, and optionally groups.
Run it once without ncu first: it compiles convgen's kernels and prints both sides' relative
difference from each other, so the profile does not time a compile.  PROFILE_PLAN=mma (or held,
or a number: that candidate of `convgen.candidates`) profiles that tuning candidate instead of
the planner's plan, e.g. the depthwise stencil on mma.sync."""
import os
import sys

import cupy as cp
import torch

import convgen
from convgen.candidates import candidates
from convgen.ir import ConvProblem, Pass, Target

pass_ = sys.argv[1]
n, h, w_, c, k, r, stride, pad = (int(a) for a in sys.argv[2:10])
groups = int(sys.argv[10]) if len(sys.argv) > 10 else 1
p, q = (h + 2 * pad - r) // stride + 1, (w_ + 2 * pad - r) // stride + 1
x = cp.random.standard_normal((n, h, w_, c), dtype=cp.float32).astype(cp.float16)
w = cp.random.standard_normal((k, r, r, c // groups), dtype=cp.float32).astype(cp.float16)
dy = cp.random.standard_normal((n, p, q, k), dtype=cp.float32).astype(cp.float16)
tx, tw, tdy = (torch.as_tensor(a, device="cuda").permute(0, 3, 1, 2) for a in (x, w, dy))  # channels_last views
torch.backends.cudnn.benchmark = True
mask = {"fprop": None, "dgrad": [True, False, False], "wgrad": [False, True, False]}[pass_]
plan = None
if os.environ.get("PROFILE_PLAN"):
    want = os.environ["PROFILE_PLAN"]
    sm = cp.cuda.Device().attributes["MultiProcessorCount"]
    offered = candidates(ConvProblem(h, w_, c, k, r, r, stride, pad, 1, groups, n=n), Pass(pass_), Target("sm_90", sm))
    pick = {"mma": lambda p: getattr(p.loop, "mma", False), "held": lambda p: getattr(p.loop, "out_rows", 1) > 1}
    plan = offered[int(want)] if want.isdigit() else next(p for p in offered if pick[want](p))
    print(f"profiling the candidate {plan.brief()}", flush=True)


def ours():
    if pass_ == "fprop":
        return convgen.conv2d(x, w, stride=stride, padding=pad, groups=groups, plan=plan)
    if pass_ == "dgrad":
        return convgen.conv2d_dgrad(dy, w, x.shape, stride=stride, padding=pad, groups=groups, plan=plan)
    return convgen.conv2d_wgrad(x, dy, w.shape, stride=stride, padding=pad, bias=False, groups=groups, plan=plan)[0]


def theirs():
    if mask is None:
        return torch.nn.functional.conv2d(tx, tw, stride=stride, padding=pad, groups=groups)
    out = torch.ops.aten.convolution_backward(tdy, tx, tw, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0],
                                              groups, mask)
    return out[0] if pass_ == "dgrad" else out[1]


for side, fn in (("convgen", ours), ("cudnn", theirs)):
    for i in range(4):
        if i == 3:
            torch.cuda.nvtx.range_push(side)
        out = fn()
        if i == 3:
            torch.cuda.nvtx.range_pop()
    if side == "convgen":
        mine = torch.as_tensor(out, device="cuda").float()
    else:
        ref = out.permute(0, 2, 3, 1).float()
torch.cuda.synchronize()
err = (ref - mine).norm() / ref.norm()
print(f"{pass_} N={n} {h}x{w_} {c}->{k} {r}x{r} stride {stride} pad {pad} groups {groups}: "
      f"relative difference {float(err):.2e}")
