"""Host cost per call of each way to launch a convgen kernel, beside the bare-launch floors.

Run on the GPU machine: `python3 benchmarks/probes/host_cost.py [--calls 300] [--json PATH]`.
Host cost is wall-clock time per call while a spin kernel holds the GPU, so no GPU work
is in it (the same method as `convgen bench`).  Rows: an empty kernel through CuPy's
RawKernel and through cuda-bindings' cuLaunchKernel (the floors), then per layer and pass:
the plain function's repeat call, a prepared op (convgen.prepare) with and without a
caller-supplied output, and PyTorch's cuDNN call for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import cupy as cp  # noqa: E402

import convgen  # noqa: E402
from convgen.suites import SUITES  # noqa: E402

SPIN = cp.RawKernel(r'''
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}''', "spin")
EMPTY = cp.RawKernel(r'''
extern "C" __global__ void empty(const void* a, const void* b, void* c, void* d, int n) { }''', "empty")


def host_us(fn, calls: int, repeats: int = 5) -> float:
    """Median over `repeats` of (wall time of `calls` calls) / calls, GPU held busy."""
    fn()
    cp.cuda.get_current_stream().synchronize()
    rate = cp.cuda.runtime.getDeviceProperties(0)["clockRate"] * 1e3  # Hz
    out = []
    for _ in range(repeats):
        SPIN((1,), (1,), (np.int64(rate * (calls * 60e-6 + 2e-3)),))  # covers the calls at 60 us each
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
        cp.cuda.get_current_stream().synchronize()
    return statistics.median(out)


def floors(calls: int) -> dict[str, float]:
    a = cp.empty(16, cp.float16)
    res = {"cupy RawKernel, empty kernel, 5 args": host_us(
        lambda: EMPTY((1,), (32,), (a, a, a, a, np.int32(1))), calls)}
    try:
        from cuda.bindings import driver
    except ImportError:
        return res
    EMPTY.compile()
    fn = EMPTY.kernel.ptr
    slots = np.zeros(5, np.uint64)
    params = np.array([slots.ctypes.data + 8 * i for i in range(5)], np.uint64)
    pp = int(params.ctypes.data)
    ptr = a.data.ptr

    def drv():
        slots[:] = (ptr, ptr, ptr, ptr, 1)
        driver.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, cp.cuda.get_current_stream().ptr, pp, 0)
    res["cuda-bindings cuLaunchKernel, empty kernel, 5 args"] = host_us(drv, calls)
    # what a prepared call does besides the launch, piece by piece
    x = cp.empty((8, 8, 8, 16), cp.float16)
    res["component: cupy.cuda.runtime.getDevice()"] = host_us(cp.cuda.runtime.getDevice, calls)
    res["component: cupy.cuda.get_current_stream().ptr"] = host_us(lambda: cp.cuda.get_current_stream().ptr, calls)
    res["component: shape/dtype/strides/ptr/device checks of one array"] = host_us(
        lambda: (x.shape == (8, 8, 8, 16) and x.dtype is x.dtype and x.strides == (2048, 256, 32, 2)
                 and not x.data.ptr % 16 and x.data.device_id == 0), calls)
    res["component: cupy.empty of a 64 KiB output"] = host_us(lambda: cp.empty((8, 8, 8, 64), cp.float16), calls)
    return res


_PROBE_LIB = None  # a torch.library.Library for the dispatcher's floor, made with the first torch row


def layer_rows(suite: str, name: str, calls: int) -> list[dict]:
    layer = next(l for l in SUITES[suite] if l.name == name)
    p = layer.problem
    geo = dict(stride=p.stride, padding=p.padding, dilation=p.dilation)
    rng = np.random.default_rng(0)
    x = cp.asarray(rng.standard_normal(p.x_shape).astype(np.float16))
    w = cp.asarray(rng.standard_normal(p.w_shape).astype(np.float16))
    dy = cp.asarray(rng.standard_normal(p.y_shape).astype(np.float16))
    rows = []

    def add(pass_, what, fn):
        try:
            us = host_us(fn, calls)
        except Exception as exc:  # one broken path must not hide the others' figures
            print(f"{suite}/{name} {pass_} {what}: {type(exc).__name__}: {exc}")
            return
        rows.append({"suite": suite, "layer": name, "pass": pass_, "what": what, "host_us": us})
        print(f"{suite}/{name:8} {pass_:5} {us:6.2f} us  {what}", flush=True)

    y = cp.empty(p.y_shape, cp.float16)
    dx = cp.empty(p.x_shape, cp.float16)
    dw = cp.empty(p.w_shape, cp.float16)
    add("fprop", "convgen.conv2d (repeat call)", lambda: convgen.conv2d(x, w, **geo))
    add("dgrad", "convgen.conv2d_dgrad (repeat call)", lambda: convgen.conv2d_dgrad(dy, w, p.x_shape, **geo))
    add("wgrad", "convgen.conv2d_wgrad(bias=False) (repeat call)",
        lambda: convgen.conv2d_wgrad(x, dy, p.w_shape, bias=False, **geo))
    for launch in ("CuPy Function",):
        f = convgen.prepare("fprop", p.x_shape, p.w_shape, **geo)
        d = convgen.prepare("dgrad", p.x_shape, p.w_shape, **geo)
        g = convgen.prepare("wgrad", p.x_shape, p.w_shape, **geo)
        add("fprop", f"prepare op, out= given ({launch})", lambda: f(x, w, out=y))
        add("fprop", f"prepare op, allocates y ({launch})", lambda: f(x, w))
        add("dgrad", f"prepare op, out= given ({launch})", lambda: d(dy, w, out=dx))
        add("wgrad", f"prepare op, out= given ({launch}; split-K {g._kernel.source.spec.plan.split_k})",
            lambda: g(x, dy, out=(dw,)))
        sp = cp.cuda.get_current_stream().ptr
        ws = cp.empty(max(g.workspace_elems, 1), cp.float32)
        add("fprop", "prepared op's launch(), pointers", lambda: f.launch(x.data.ptr, w.data.ptr, (y.data.ptr,), stream=sp))
        add("dgrad", "prepared op's launch(), pointers", lambda: d.launch(dy.data.ptr, w.data.ptr, (dx.data.ptr,),
                                                                          stream=sp))
        add("wgrad", "prepared op's launch(), pointers", lambda: g.launch(
            x.data.ptr, dy.data.ptr, (dw.data.ptr,), workspace=ws.data.ptr if g.workspace_elems else 0, stream=sp))
    try:
        import torch
        import torch.nn.functional as F

        tx = torch.from_dlpack(x).permute(0, 3, 1, 2)
        tw = torch.from_dlpack(w).permute(0, 3, 1, 2)
        tdy = torch.from_dlpack(dy).permute(0, 3, 1, 2)
        torch.backends.cudnn.benchmark = True
        add("fprop", "torch conv2d (cuDNN)", lambda: F.conv2d(tx, tw, None, p.stride, p.padding, p.dilation))
        add("dgrad", "torch convolution_backward dx (cuDNN)", lambda: torch.ops.aten.convolution_backward(
            tdy, tx, tw, None, p.stride, p.padding, p.dilation, False, (0, 0), 1, (True, False, False)))
        add("wgrad", "torch convolution_backward dW (cuDNN)", lambda: torch.ops.aten.convolution_backward(
            tdy, tx, tw, None, p.stride, p.padding, p.dilation, False, (0, 0), 1, (False, True, False)))
        # convgen.torch's operators against PyTorch's own conv dispatch, channels_last fp16
        import importlib

        cgt = importlib.import_module("convgen.torch")  # registers the convgen:: operators (an `import
        # convgen.torch` here would make `convgen` a local name of this whole function)
        global _PROBE_LIB
        if _PROBE_LIB is None:
            _PROBE_LIB = torch.library.Library("host_cost_probe", "DEF")
            _PROBE_LIB.define("noop(Tensor x, Tensor w, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
                              "int groups) -> Tensor")
            _PROBE_LIB.impl("noop", lambda x, *rest: x, "CompositeExplicitAutograd")

        cx = torch.randn(p.n, p.c, p.h, p.w, device="cuda", dtype=torch.float16).contiguous(
            memory_format=torch.channels_last)
        cw = torch.randn(p.k, p.c, p.r, p.s, device="cuda", dtype=torch.float16).contiguous(
            memory_format=torch.channels_last)
        cgy = torch.randn_like(F.conv2d(cx, cw, None, p.stride, p.padding, p.dilation))
        geo_l = ([*p.stride], [*p.padding], [*p.dilation], 1)  # groups: 1
        add("fprop", "convgen.torch operator convgen::conv2d", lambda: torch.ops.convgen.conv2d(cx, cw, None, *geo_l))
        add("fprop", "torch F.conv2d, channels_last (cuDNN)", lambda: F.conv2d(cx, cw, None, p.stride, p.padding,
                                                                              p.dilation))
        add("dgrad", "convgen.torch operator convgen::conv2d_dgrad", lambda: torch.ops.convgen.conv2d_dgrad(
            cgy, cw, [p.n, p.c, p.h, p.w], torch.float16, *geo_l))
        add("wgrad", "convgen.torch operator convgen::conv2d_wgrad", lambda: torch.ops.convgen.conv2d_wgrad(
            cgy, cx, [p.k, p.c, p.r, p.s], torch.float16, None, *geo_l))
        # where an operator call's host time goes: its kernel without the dispatcher, and the
        # dispatcher alone (a no-op operator of the same schema on the same tensors)
        add("fprop", "convgen.torch operator's kernel, called directly", lambda: cgt._fprop_kernel(
            cx, cw, None, *geo_l))
        add("dgrad", "convgen.torch operator's kernel, called directly", lambda: cgt._dgrad_kernel(
            cgy, cw, [p.n, p.c, p.h, p.w], torch.float16, *geo_l))
        add("wgrad", "convgen.torch operator's kernel, called directly", lambda: cgt._wgrad_kernel(
            cgy, cx, [p.k, p.c, p.r, p.s], torch.float16, None, *geo_l))
        add("fprop", "a no-op Library operator of conv2d's schema (the dispatcher's floor)",
            lambda: torch.ops.host_cost_probe.noop(cx, cw, None, *geo_l))
        # the eager path convgen.torch.Conv2d takes: the autograd Function's forward (no grad
        # recorded), and the two backward passes' implementations it calls
        def eager_fprop():
            with torch.no_grad():
                return cgt.conv2d(cx, cw, None, p.stride, p.padding, p.dilation)

        add("fprop", "convgen.torch eager conv2d (no grad)", eager_fprop)
        cb = torch.randn(p.k, device="cuda", dtype=torch.float16)

        def eager_fprop_bias():
            with torch.no_grad():
                return cgt.conv2d(cx, cw, cb, p.stride, p.padding, p.dilation)

        add("fprop", "convgen.torch eager conv2d, fp16 bias (no grad)", eager_fprop_bias)
        add("fprop", "torch F.conv2d, fp16 bias, channels_last (cuDNN)", lambda: F.conv2d(
            cx, cw, cb, p.stride, p.padding, p.dilation))
        # a training layer's whole eager call: forward and backward (dx, dW, db) through autograd
        tx, twt, tb = (cx.detach().requires_grad_(), cw.detach().requires_grad_(), cb.detach().requires_grad_())

        def train_call(conv):
            def run():
                tx.grad = twt.grad = tb.grad = None  # no accumulation kernels on either side
                conv(tx, twt, tb, p.stride, p.padding, p.dilation).backward(cgy)
            return run

        add("fwd+bwd", "convgen.torch forward+backward, dx dW db (autograd)", train_call(cgt.conv2d))
        add("fwd+bwd", "torch F.conv2d forward+backward, dx dW db (cuDNN)", train_call(F.conv2d))

        def noop_function(gw, gb):  # the least a layer written as a Python Function costs
            class _Noop(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x, w, b):
                    return torch.empty_like(x)

                @staticmethod
                def backward(ctx, g):
                    return g, gw, gb
            return _Noop

        tn = cx.detach().requires_grad_()
        noop1 = noop_function(None, None)

        def noop_call():
            tn.grad = None
            noop1.apply(tn, cw, None).backward(cx)

        add("fwd+bwd", "a no-op torch.autograd.Function forward+backward (a Python layer's floor)", noop_call)
        noop3 = noop_function(torch.empty_like(twt), torch.empty_like(tb))  # the three gradients a conv layer's returns

        def noop3_call():
            tx.grad = twt.grad = tb.grad = None
            noop3.apply(tx, twt, tb).backward(cx)

        add("fwd+bwd", "a no-op Function forward+backward returning dx, dW and db (the same autograd work)",
            noop3_call)
        # the same training call with every prepared op's launch() a no-op: what is left is
        # convgen.torch's Python and PyTorch's allocations, so the difference to the real row
        # is what the three launches cost inside a training step (the backward's two run on
        # the autograd engine's device thread)
        ops = list(cgt._tl._prepared.values())
        for op in ops:
            op.launch = lambda *a, **k: None
        try:
            add("fwd+bwd", "convgen.torch forward+backward, launches stubbed out", train_call(cgt.conv2d))
        finally:
            for op in ops:
                del op.launch
        add("dgrad", "convgen.torch eager dgrad (backward's call)", lambda: cgt._dgrad_impl(
            cgy, cw, [p.n, p.c, p.h, p.w], torch.float16, *geo_l))
        add("wgrad", "convgen.torch eager wgrad (backward's call)", lambda: cgt._wgrad_impl(
            cgy, cx, [p.k, p.c, p.r, p.s], torch.float16, None, *geo_l))
    except ImportError:
        pass
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--json")
    args = ap.parse_args()
    result = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "floors": floors(args.calls),
              "rows": []}
    for k, v in result["floors"].items():
        print(f"floor  {v:6.2f} us  {k}", flush=True)
    for suite, name in (("cifar-vgg", "conv2"), ("cifar-resnet", "res3"), ("resnet50", "l4-1x1")):
        result["rows"] += layer_rows(suite, name, args.calls)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
