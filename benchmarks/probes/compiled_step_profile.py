"""Where does examples/train_step.py's compiled step spend its host time, per phase and side?

On the H100 (2026-12-05, 7428884) the compiled step (the forward with its loss under
torch.compile(mode="reduce-overhead", fullgraph=True), the optimizer's step compiled too) took
1.902 ms with convgen against 1.712 with cuDNN, though convgen's kernels were busier for less
(0.228 against 0.301 ms of GPU time a step): both sides host-bound, convgen's 0.19 ms more.
The CPU box found no difference in Dynamo's guards (388 against 314) or in the traced graphs'
operators.  This times each phase of the step on the host (zero_grad, the compiled forward,
backward, the compiled optimizer step), over many steps after warm-up, for the same net built
on convgen.torch.Conv2d and on nn.Conv2d, then prints a cProfile of one side's steps.

Run on the GPU machine: `python3 benchmarks/probes/compiled_step_profile.py [--steps 200]`
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import convgen.torch as cgt


def make_net(conv: type) -> nn.Module:
    return nn.Sequential(conv(3, 32, 3, padding="same"), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                         conv(32, 64, 3, padding="same"), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                         conv(64, 128, 3, padding="same"), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    cl = torch.channels_last
    x = torch.randn(args.batch, 3, 32, 32, device="cuda").half().contiguous(memory_format=cl)
    labels = torch.randint(0, 10, (args.batch,), device="cuda")
    for name, conv in (("convgen", cgt.Conv2d), ("cuDNN", nn.Conv2d)):
        torch._dynamo.reset()
        net = make_net(conv).to(device="cuda", dtype=torch.float16, memory_format=cl)
        opt = torch.optim.SGD(net.parameters(), lr=1e-4, momentum=0.9)

        def forward_loss():
            loss = F.cross_entropy(net(x).float(), labels)
            return loss * 1024.0, loss.detach()

        fwd = torch.compile(forward_loss, mode="reduce-overhead", fullgraph=True)
        sgd = torch.compile(opt.step)
        phases = {"zero_grad": 0.0, "forward (compiled)": 0.0, "backward": 0.0, "optimizer (compiled)": 0.0}

        def step(timed: bool) -> None:
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            t1 = time.perf_counter()
            scaled, _ = fwd()
            t2 = time.perf_counter()
            scaled.backward()
            t3 = time.perf_counter()
            sgd()
            t4 = time.perf_counter()
            if timed:
                for key, dt in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                    phases[key] += dt

        for _ in range(30):
            step(False)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            step(True)
        issued = time.perf_counter() - start
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        print(f"{name}: {1e3 * wall / args.steps:.3f} ms/step wall, {1e3 * issued / args.steps:.3f} issuing; per phase: "
              + ", ".join(f"{k} {1e3 * v / args.steps:.3f}" for k, v in phases.items()))
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(50):
            step(False)
        prof.disable()
        torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
        print(out.getvalue())


if __name__ == "__main__":
    main()
