#!/usr/bin/env python3
"""A training step of a small VGG-style CIFAR-10 network on convgen's kernels vs cuDNN.

The network: three 3x3 convolutions with 'same' padding, 3->32, 32->64, 64->128,
each followed by ReLU and a 2x2 max-pool, then global average pooling and a
linear layer 128->10; cross-entropy loss; SGD with momentum.  It is built twice
from the same initial weights (one state_dict loaded into the other): once with
``convgen.torch.Conv2d`` and once with ``torch.nn.Conv2d`` (cuDNN, with
``cudnn.benchmark`` on), so the only difference is who runs the convolutions.

Precision, and why: both models are converted to float16 with channels_last
memory (``model.to(dtype=float16, memory_format=channels_last)``), and the
input is channels_last float16.  That is the layout and dtype convgen reads
natively (zero-copy activations and weights), and, unlike autocast, it gives
both sides exactly the same operand dtypes at every layer, so any difference
is the convolutions' own rounding.  The loss is taken in float32 and scaled by
a static factor before backward so small float16 gradients do not flush to
zero; the SGD learning rate is divided by the same factor, which makes the
update exactly the unscaled one (momentum is linear; there is no weight decay).

It prints ms/step for both (CUDA events, after warm-up), in three modes (``--modes``):
``eager``; ``reduce-overhead``, the model under ``torch.compile(mode="reduce-overhead")``
(CUDA graphs) with the loss and the SGD step eager; and ``compiled-step``, where the
forward with its loss is one ``torch.compile(mode="reduce-overhead")`` graph (its backward
AOTAutograd's, also CUDA graphs) and the SGD step is compiled too (``torch.compile``'s
compiled optimizer), so that little of the step waits on the host.  It checks the first
step's loss against cuDNN's, and every parameter gradient of both fp16 nets
against the same net run in fp32 (norm-relative): convgen must be about as
close to fp32 as cuDNN-fp16 is (tolerances printed).  It exits 1 if not, 2 if
it cannot run (no GPU, no PyTorch or no CuPy), 0 otherwise.

    python3 examples/train_step.py [--batch 256] [--steps 50] [--warmup 10]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

# Run from a checkout without installing: put the repository root on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=50, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per model before timing")
    p.add_argument("--seed", type=int, default=0, help="weights and synthetic data")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--loss-scale", type=float, default=1024.0)
    p.add_argument("--no-precompile", action="store_true",
                   help="let convgen compile its kernels one by one as the first step meets them, instead of "
                        "convgen.torch.precompile compiling them all in parallel first")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="eager steps; steps of torch.compile(model, mode='reduce-overhead') (CUDA graphs), loss and SGD "
                        "eager; and compiled steps (forward and loss as one reduce-overhead graph, SGD compiled), "
                        "on both sides")
    # Both fp16 nets are judged against the same net in fp32 (cuDNN, TF32 off): fp16 rounding
    # at every layer, amplified through three convs, max-pool choices and the backward pass,
    # puts each fp16 gradient some 1e-3..1e-1 away from fp32 (the first layer's most).
    # convgen passes a gradient when its error is at most twice cuDNN-fp16's plus --grad-tol;
    # a wrong kernel is O(1) off.
    p.add_argument("--grad-tol", type=float, default=2e-3, help="norm-relative slack over 2x cuDNN-fp16's error")
    p.add_argument("--loss-tol", type=float, default=1e-3, help="relative")
    return p.parse_args(argv)


MODES = ("eager", "reduce-overhead", "compiled-step")


def make_step(mode: str, model, opt, x, labels, loss_scale: float, compile_fn=None):
    """One training step of `model` as a callable: zero the gradients, forward, float32
    cross-entropy scaled by `loss_scale`, backward, SGD.  It returns the (unscaled, detached)
    loss and never waits for the GPU.

    `mode` says what torch.compile covers, the same on both sides: nothing ("eager"); the
    model ("reduce-overhead": the loss and the optimizer run eagerly around its graphs); or
    the forward with its loss and, apart, the optimizer's step ("compiled-step").  A step
    whose optimizer and loss run eagerly is bound by their host time on a small network, on
    both sides alike, so "compiled-step" is the mode in which the convolutions' own speed
    shows.  `compile_fn(fn, fullgraph=..., optimizer=...)` compiles; the default is
    torch.compile(fn, mode="reduce-overhead", fullgraph=fullgraph) for the model and the
    forward (fullgraph: a graph break at a convolution is a failure, not a slow step), and
    torch.compile's default mode for the optimizer (PyTorch's compiled optimizer: its
    foreach updates fused into a few kernels)."""
    import torch
    import torch.nn.functional as F

    def default_compile(fn, *, fullgraph: bool, optimizer: bool):
        if optimizer:
            return torch.compile(fn, fullgraph=fullgraph)
        return torch.compile(fn, mode="reduce-overhead", fullgraph=fullgraph)

    compile_fn = compile_fn or default_compile

    def loss_of(net):
        return F.cross_entropy(net(x).float(), labels)

    if mode == "eager" or mode == "reduce-overhead":
        net = model if mode == "eager" else compile_fn(model, fullgraph=True, optimizer=False)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = loss_of(net)
            (loss * loss_scale).backward()
            opt.step()
            return loss.detach()
        return step
    if mode != "compiled-step":
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")

    def forward_loss():
        loss = loss_of(model)
        return loss * loss_scale, loss.detach()

    fwd = compile_fn(forward_loss, fullgraph=True, optimizer=False)
    sgd = compile_fn(opt.step, fullgraph=False, optimizer=True)

    def step():
        opt.zero_grad(set_to_none=True)
        scaled, loss = fwd()
        scaled.backward()
        sgd()
        return loss.clone()  # a CUDA graph's output is overwritten by its next replay
    return step


def fail(message: str) -> int:
    print(f"train_step: {message}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import torch
        import torch.nn.functional as F
        from torch import nn
    except ImportError:
        return fail("needs PyTorch (pip install torch); nothing was run")
    if not torch.cuda.is_available():
        return fail("needs a CUDA GPU, and torch.cuda.is_available() is False (no GPU, no driver, or a "
                    "CPU-only PyTorch build): convgen's kernels run on NVIDIA GPUs. Nothing was run.")
    try:
        import cupy  # noqa: F401  (convgen launches through CuPy)
    except ImportError:
        return fail("needs CuPy to launch convgen's kernels: pip install 'convgen[cuda13]' (or [cuda12])")
    import convgen.torch as cgt

    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    cl = torch.channels_last

    def make_net(conv: type) -> nn.Module:
        return nn.Sequential(
            conv(3, 32, 3, padding="same"), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            conv(32, 64, 3, padding="same"), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            conv(64, 128, 3, padding="same"), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
        )

    torch.manual_seed(args.seed)
    cudnn_net = make_net(nn.Conv2d)
    convgen_net = make_net(cgt.Conv2d)
    convgen_net.load_state_dict(cudnn_net.state_dict())  # identical initial weights
    models = {"convgen": convgen_net, "cuDNN": cudnn_net}
    opts = {}
    for name, m in models.items():
        m.to(device=dev, dtype=torch.float16, memory_format=cl)
        opts[name] = torch.optim.SGD(m.parameters(), lr=args.lr / args.loss_scale, momentum=0.9)
    # The yardstick: the same net and the same (fp16-valued) weights in fp32 on cuDNN, TF32 off.
    fp32_net = make_net(nn.Conv2d)
    fp32_net.load_state_dict(cudnn_net.state_dict())
    fp32_net.to(device=dev, dtype=torch.float32, memory_format=cl)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False

    g = torch.Generator().manual_seed(args.seed)  # synthetic CIFAR-10-shaped data, fixed
    x = torch.randn(args.batch, 3, 32, 32, generator=g).to(dev, torch.float16).contiguous(memory_format=cl)
    labels = torch.randint(0, 10, (args.batch,), generator=g).to(dev)

    def forward_backward(model: nn.Module, opt: torch.optim.Optimizer) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).float(), labels)
        (loss * args.loss_scale).backward()
        return loss.detach()

    print(f"VGG-style CIFAR-10 net, batch {args.batch}, float16 channels_last, "
          f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}")

    # -- agreement: the first step, from identical weights, on identical data -------------
    if not args.no_precompile:
        t0 = time.perf_counter()
        n_ops = cgt.precompile(convgen_net, x)
        print(f"convgen.torch.precompile: {n_ops} ops (every conv pass of a step) in {time.perf_counter() - t0:.2f} s, "
              "compiled in parallel where the caches lacked them")
    losses, first = {}, {}
    for name in models:  # convgen compiles (or loads from its disk cache) every kernel here
        t0 = time.perf_counter()
        losses[name] = forward_backward(models[name], opts[name])
        torch.cuda.synchronize()
        first[name] = time.perf_counter() - t0
    fp32_net.zero_grad(set_to_none=True)
    F.cross_entropy(fp32_net(x.float()), labels).mul(args.loss_scale).backward()
    torch.cuda.synchronize()
    print(f"first forward+backward: convgen {first['convgen']:.2f} s "
          f"({'compiles or loads its kernels one by one' if args.no_precompile else 'kernels precompiled'}), "
          f"cuDNN {first['cuDNN']:.2f} s")
    ok = True
    lc, lr = float(losses["convgen"]), float(losses["cuDNN"])
    loss_err = abs(lc - lr) / max(abs(lr), 1e-30)
    ok &= loss_err <= args.loss_tol
    print(f"\nloss: convgen {lc:.6f}, cuDNN {lr:.6f}, relative difference {loss_err:.2e} "
          f"(tolerance {args.loss_tol:.0e}) {'ok' if loss_err <= args.loss_tol else 'MISMATCH'}")
    print("gradients, norm-relative error against the fp32 net (pass: convgen <= 2 x cuDNN-fp16 "
          f"+ {args.grad_tol:.0e}):")
    print(f"  {'parameter':<12} {'shape':<18} {'convgen':>9} {'cuDNN fp16':>10} {'between':>9}")
    ref_params = dict(cudnn_net.named_parameters())
    fp32_params = dict(fp32_net.named_parameters())

    def rel(a, b) -> float:
        a, b = a.double(), b.double()
        return float((a - b).norm() / max(float(b.norm()), 1e-30)) if bool(torch.isfinite(a).all()) else float("inf")

    for pname, p in convgen_net.named_parameters():
        q, t = ref_params[pname], fp32_params[pname]
        if p.grad is None or q.grad is None:
            print(f"  {pname:<12} {'missing gradient':>40}  MISMATCH")
            ok = False
            continue
        e_cg, e_cd, between = rel(p.grad, t.grad), rel(q.grad, t.grad), rel(p.grad, q.grad)
        good = e_cg <= 2 * e_cd + args.grad_tol
        ok &= good
        print(f"  {pname:<12} {str(tuple(p.shape)):<18} {e_cg:9.2e} {e_cd:10.2e} {between:9.2e}  "
              f"{'ok' if good else 'MISMATCH'}")
    for name in models:
        opts[name].step()  # finish the checked step

    # -- speed ---------------------------------------------------------------------------
    def timed(step) -> tuple[float, float]:
        """(ms/step wall clock from CUDA events over back-to-back steps, GPU-busy ms/step: the
        profiler's summed kernel time over a few more steps)."""
        for _ in range(args.warmup):
            step()
        # Both sides' windows start with Python's garbage collected: the first full collection
        # after torch's imports scans every object they made (161 ms on a 2-core CPU box), and
        # it landed in whichever window came first (H100, 2026-12-05: convgen's eager step at
        # 6.1-7.3 ms over 50 steps, 2.5 ms over 400, or after 200 warm-up steps).
        gc.collect()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.steps):
            step()
        end.record()
        end.synchronize()
        wall = start.elapsed_time(end) / args.steps
        busy_steps = 5
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(busy_steps):
                step()
            torch.cuda.synchronize()
        busy_us = sum(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
                      for e in prof.key_averages())
        return wall, busy_us / 1e3 / busy_steps

    results = {}
    for mode in args.modes:
        for name, model in models.items():
            torch._dynamo.reset()
            step = make_step(mode, model, opts[name], x, labels, args.loss_scale)
            if mode != "eager":
                t0 = time.perf_counter()
                step()  # traced and compiled here
                torch.cuda.synchronize()
                print(f"{mode}: torch.compile of the {name} net, first step {time.perf_counter() - t0:.1f} s")
            results[(mode, name)] = timed(step)
    print(f"\nms/step over {args.steps} steps after {args.warmup} warm-up steps (forward, loss, backward, SGD "
          "step), and GPU-busy ms/step (summed kernel time, profiler, 5 steps):")
    for mode in args.modes:
        for name in models:
            wall, busy = results[(mode, name)]
            print(f"  {mode:<16} {name:<8} {wall:8.3f} ms/step   GPU busy {busy:7.3f} ms/step")
        ratio = results[(mode, "convgen")][0] / results[(mode, "cuDNN")][0]
        print(f"  {mode:<16} convgen / cuDNN = {ratio:.2f}x")

    if not ok:
        print("\ntrain_step: convgen is further from fp32 than cuDNN-fp16 beyond the tolerances above",
              file=sys.stderr)
        return 1
    print("\nconvgen agrees with cuDNN on the loss, and every gradient is as close to fp32 as cuDNN-fp16's.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
