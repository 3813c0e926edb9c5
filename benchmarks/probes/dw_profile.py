"""Probe: one depthwise fprop layer, convgen's kernel and cuDNN's, launched a few times each the
last call of each inside an NVTX range ("convgen", "cudnn") that Nsight Compute can select:

    ncu --nvtx --nvtx-include "cudnn/" --section SpeedOfLight --section WarpStateStats \\
        python3 benchmarks/probes/dw_profile.py 64 56 96 7

Arguments: batch, image size (square), channels, filter size (square, 'same' padding), and
optionally the stride."""
import sys

import cupy as cp
import torch

import convgen

n, hw, c, r = (int(a) for a in sys.argv[1:5])
stride = int(sys.argv[5]) if len(sys.argv) > 5 else 1
x = cp.random.standard_normal((n, hw, hw, c), dtype=cp.float32).astype(cp.float16)
w = cp.random.standard_normal((c, r, r, 1), dtype=cp.float32).astype(cp.float16)
for i in range(4):
    if i == 3:
        torch.cuda.nvtx.range_push("convgen")
    y = convgen.conv2d(x, w, stride=stride, padding=r // 2, groups=c)
torch.cuda.nvtx.range_pop()
tx = torch.as_tensor(x, device="cuda").permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels_last
tw = torch.as_tensor(w, device="cuda").permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
torch.backends.cudnn.benchmark = True
for i in range(4):
    if i == 3:
        torch.cuda.nvtx.range_push("cudnn")
    ty = torch.nn.functional.conv2d(tx, tw, stride=stride, padding=r // 2, groups=c)
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
err = (ty.permute(0, 2, 3, 1).float() - torch.as_tensor(y, device="cuda").float()).norm() / ty.float().norm()
print(f"N={n} {hw}x{hw} C={c} {r}x{r} stride {stride}: relative difference {float(err):.2e}")
