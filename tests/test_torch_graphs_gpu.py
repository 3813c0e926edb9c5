"""convgen.torch's layers in whole models on a real GPU: a forward+backward captured in a CUDA
graph and replayed, precompile, torch.compile(fullgraph=True) with and without CUDA graphs, the
registered operators called as compiled graphs call them, and the depthwise drop-in (groups = C),
eager and compiled.  A replayed graph or compiled model skips the Python that an eager call
runs, so each must give what the eager model gives, bit for bit, and compile with no graph
break.  The data, references and tolerances are tests/test_torch_gpu.py's; skipped without
torch or without a CUDA GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import convgen.torch as cgt  # noqa: E402
import convgen.torch_launch as ctl  # noqa: E402
from torch_fake import reference_grads as reference  # noqa: E402  (F.conv2d in float64 on the kernels' view)

# The GPU tests' marks, data and checks; importing them skips this module too where that one
# skips (no CUDA GPU).
from test_torch_gpu import CL, DEV, gen, pytestmark, rel_err, tensor, tol  # noqa: E402, F401


# --------------------------------------------------------------------------- CUDA graphs


def test_cuda_graph_capture_and_replay():
    """A forward+backward of two convgen layers captured with torch.cuda.graph, replayed on
    new data copied into the static input: bit-identical to eager runs of the same model."""
    torch.manual_seed(0)
    model = nn.Sequential(
        cgt.Conv2d(8, 16, 3, padding=1), nn.ReLU(), cgt.Conv2d(16, 8, 3, stride=2, padding=1),
    ).to(DEV, torch.float16).to(memory_format=CL)
    params = list(model.parameters())
    g = gen("graph")
    static_x = tensor((4, 8, 16, 16), torch.float16, g, requires_grad=True)
    static_gy = tensor((4, 8, 8, 8), torch.float16, g)

    # Warm-up on a side stream (PyTorch's recipe): compiles every kernel before the capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            for t in params + [static_x]:
                t.grad = None
            model(static_x).backward(static_gy)
    torch.cuda.current_stream().wait_stream(side)
    for t in params + [static_x]:
        t.grad = None  # so backward allocates the grads from the graph's private pool

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = model(static_x)
        static_y.backward(static_gy)

    previous = None
    for trial in range(3):
        gt = gen("graph-data", trial)
        new_x = tensor(static_x.shape, torch.float16, gt)
        new_gy = tensor(static_gy.shape, torch.float16, gt)
        with torch.no_grad():
            static_x.copy_(new_x)
            static_gy.copy_(new_gy)
        graph.replay()
        torch.cuda.synchronize()
        x_eager = new_x.clone().requires_grad_()
        y_eager = model(x_eager)
        eager = torch.autograd.grad(y_eager, [x_eager] + params, new_gy)  # leaves .grad alone
        captured = [static_x.grad] + [p.grad for p in params]
        assert torch.isfinite(static_y).all(), f"replay {trial}: non-finite outputs"
        assert torch.equal(static_y, y_eager), (
            f"replay {trial}: y differs from eager, max |diff| {float((static_y - y_eager).abs().max()):.3g}"
        )
        for i, (a, e) in enumerate(zip(captured, eager)):
            assert torch.equal(a, e), f"replay {trial}: gradient {i} differs from eager, max |diff| {float((a - e).abs().max()):.3g}"
        if previous is not None:
            assert not torch.equal(static_y, previous), "the replay did not recompute y (stale output)"
        previous = static_y.clone()


def test_precompile_then_step_is_the_plain_step(monkeypatch):
    """precompile builds every op the step launches (the step builds none), and the step
    then gives bit for bit what the same model gives without it."""
    monkeypatch.setattr(ctl, "_prepared", {})
    monkeypatch.setattr(ctl, "fast_calls", {})
    model = _small_model()
    g = gen("precompile")
    x = tensor((4, 8, 16, 16), torch.float16, g)
    gy = tensor((4, 8, 8, 8), torch.float16, g)
    assert cgt.precompile(model, x.detach().requires_grad_()) == 9  # _step's input needs dx: 3 ops per layer
    built = dict(ctl._prepared)
    got = [t.clone() for t in _step(model, x, gy)]
    assert ctl._prepared == built, "the step built an op precompile had not"
    monkeypatch.setattr(ctl, "_prepared", {})
    monkeypatch.setattr(ctl, "fast_calls", {})
    want = _step(model, x, gy)
    for i, (a, e) in enumerate(zip(got, want)):
        assert torch.isfinite(a).all() and torch.equal(a, e), f"output {i}"


# --------------------------------------------------------------------------- torch.compile


def _small_model():
    torch.manual_seed(0)
    return nn.Sequential(
        cgt.Conv2d(8, 16, 3, padding=1), nn.ReLU(), cgt.Conv2d(16, 16, 3, stride=2, padding=1, bias=False),
        nn.ReLU(), cgt.Conv2d(16, 8, 1),
    ).to(DEV, torch.float16).to(memory_format=CL)


def _step(model, x, gy):
    for p in model.parameters():
        p.grad = None
    x = x.detach().requires_grad_()
    y = model(x)
    y.backward(gy)
    return [y.detach(), x.grad] + [p.grad for p in model.parameters()]


def _compiled_is_eager(model, mode, name: str, trials: int) -> None:
    """torch.compile(model, fullgraph=True, mode=mode) steps (forward and backward) on fresh data
    give the eager model's outputs and gradients bit for bit, trial after trial, in at least one
    graph, and under reduce-overhead with no CUDA graph skipped."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, mode=mode)
    for trial in range(trials):
        g = gen(name, mode, trial)
        x = tensor((4, 8, 16, 16), torch.float16, g)
        gy = tensor((4, 8, 8, 8), torch.float16, g)
        got = [t.clone() for t in _step(compiled, x, gy)]
        want = _step(model, x, gy)
        for i, (a, e) in enumerate(zip(got, want)):
            assert a.shape == e.shape and torch.isfinite(a).all(), f"trial {trial}, output {i}"
            assert torch.equal(a, e), f"trial {trial}, output {i}: max |diff| {float((a - e).abs().max()):.3g}"
    assert counters["stats"]["unique_graphs"] >= 1
    if mode == "reduce-overhead":
        assert not counters["inductor"]["cudagraph_skips"], f"CUDA graphs were skipped: {dict(counters['inductor'])}"


@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["default", "reduce-overhead"])
def test_torch_compile_fullgraph(mode):
    """torch.compile(fullgraph=True) raises on any graph break; the compiled model (with
    CUDA graphs under reduce-overhead) must give what the eager model gives, bit for bit
    (the same kernels on the same data), replay after replay on new data."""
    _compiled_is_eager(_small_model(), mode, "compile", trials=4)


def test_operators_on_cuda_tensors_go_straight_to_their_kernels(monkeypatch):
    """The registered operators called as torch.compile's graphs call them (CUDA tensors, no
    gradient recorded): their Autograd-key kernels take the implementation with no redispatch
    (the backend key after autograd is CUDA), a FastConv serves the repeat calls, and the
    outputs are the reference's; with a gradient recorded, the backward is right too."""
    g = gen("operators")
    x, w = tensor((4, 16, 12, 10), torch.float16, g), tensor((24, 16, 3, 3), torch.float16, g)
    gy = tensor((4, 24, 6, 5), torch.float16, g)
    geo = ([2, 2], [1, 1], [1, 1], 1)
    ref = reference(x, w, None, gy, 2, 1, 1)
    ops = torch.ops.convgen
    monkeypatch.setattr(ctl, "operator_calls", {})
    with monkeypatch.context() as m:
        m.setattr(cgt, "_below_autograd", lambda *a: pytest.fail("a plain CUDA call redispatched"))
        for _ in range(2):
            y = ops.conv2d(x, w, None, *geo)
            dx = ops.conv2d_dgrad(gy, w, [4, 16, 12, 10], torch.float16, *geo)
            dw, db = ops.conv2d_wgrad(gy, x, [24, 16, 3, 3], torch.float16, None, *geo)
            for name, got, want, red in (("y", y, ref[0], 16 * 9), ("dx", dx, ref[1], 24 * 9),
                                         ("dw", dw, ref[2], 4 * 30)):
                assert rel_err(got, want) <= tol(red, torch.float16), name
            assert db.shape == (0,)
    assert sum(f is not None for f in ctl.operator_calls.values()) == 3, "each operator keeps a FastConv"
    xx, ww = x.detach().requires_grad_(), w.detach().requires_grad_()
    ops.conv2d(xx, ww, None, *geo).backward(gy)
    assert rel_err(xx.grad, ref[1]) <= tol(24 * 9, torch.float16)
    assert rel_err(ww.grad, ref[2]) <= tol(4 * 30, torch.float16)


# --------------------------------------------------------------------------- depthwise (groups = C)


DEPTHWISE = [  # Conv2d's arguments: in_channels, out_channels (a multiple), kernel_size, and its options
    ((16, 16, 3), dict(padding=1)),
    ((24, 48, 3), dict(stride=2, padding=1)),  # channel multiplier 2
    ((32, 32, 5), dict(padding="same", bias=False)),
    ((8, 24, (3, 5)), dict(stride=(1, 2), padding=(1, 2), dilation=(2, 1))),  # multiplier 3
    ((64, 64, 7), dict(padding=3)),
    ((3, 6, 4), dict(padding="same")),  # even kernel: asymmetric 'same', C not a multiple of 8
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
@pytest.mark.parametrize("args, kwargs", DEPTHWISE, ids=lambda v: str(v))
def test_depthwise_drop_in_forward_and_backward(args, kwargs, dtype):
    """convgen.torch.Conv2d(groups=in_channels) against nn.Conv2d of the same groups and
    weights on the same data (y, dx, dw, db), and both against F.conv2d in float64 on the
    values the kernels saw.  Float16 takes the fast path (channels_last operands), the
    others the converting implementations."""
    c = args[0]
    torch.manual_seed(0)
    ours = cgt.Conv2d(*args, **kwargs, groups=c, device=DEV, dtype=dtype)
    ref = nn.Conv2d(*args, **kwargs, groups=c, device=DEV, dtype=dtype)
    assert tuple(ours.weight.shape) == (args[1], 1, *ours.kernel_size)
    ref.load_state_dict(ours.state_dict())
    if dtype == torch.float16:
        ours.to(memory_format=CL)
    g = gen("depthwise", args, kwargs, str(dtype))
    x = tensor((3, c, 17, 14), dtype, g, channels_last=dtype == torch.float16, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    for trial in range(2):  # the second call of a signature: its FastConv when float16
        for t in (x, x_ref, ours.weight, ours.bias, ref.weight, ref.bias):
            if t is not None:
                t.grad = None
        y, y_ref = ours(x), ref(x_ref)
        assert y.shape == y_ref.shape and y.dtype == y_ref.dtype == dtype
        gy = tensor(y.shape, dtype, gen("depthwise gy", args, kwargs, str(dtype), trial), channels_last=False)
        y.backward(gy)
        y_ref.backward(gy)
        n, k, p, q = y.shape
        r, s = ours.kernel_size
        want, dxr, dwr, dbr = reference(x, ours.weight, ours.bias, gy, ours.stride, ours.padding, ours.dilation, c)
        results = [("y", y, y_ref, want, r * s), ("dx", x.grad, x_ref.grad, dxr, (k // c) * r * s),
                   ("dw", ours.weight.grad, ref.weight.grad, dwr, n * p * q)]
        if ours.bias is not None:
            results.append(("db", ours.bias.grad, ref.bias.grad, dbr, n * p * q))
        for name, a, a_ref, r64, red in results:
            assert a.dtype == dtype and a.shape == a_ref.shape, (name, a.dtype, tuple(a.shape))
            t = tol(red, dtype)
            assert rel_err(a, r64) <= t, f"trial {trial}, {name} vs float64: {rel_err(a, r64):.3g} > {t:.3g}"
            # nn.Conv2d computes on the unrounded operands: allow fp16 rounding on both sides.
            t16 = 2 * tol(red, torch.float16)
            err = rel_err(a, a_ref)
            assert err <= t16, f"trial {trial}, {name} vs nn.Conv2d: {err:.3g} > {t16:.3g}"


def _small_depthwise_model():
    torch.manual_seed(0)
    return nn.Sequential(
        cgt.Conv2d(8, 16, 1), nn.ReLU(), cgt.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(),
        cgt.Conv2d(16, 32, 3, stride=2, padding=1, groups=16, bias=False), nn.ReLU(), cgt.Conv2d(32, 8, 1),
    ).to(DEV, torch.float16).to(memory_format=CL)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["default", "reduce-overhead"])
def test_depthwise_torch_compile_fullgraph(mode):
    """A model with depthwise layers under torch.compile(fullgraph=True): no graph break, and
    bit for bit what the eager model gives, which is F.conv2d's (checked in float64 once)."""
    model = _small_depthwise_model()
    _compiled_is_eager(model, mode, "compile-depthwise", trials=3)
    # The eager model against nn.Conv2d layers with the same weights, in float64.
    ref = nn.Sequential(
        nn.Conv2d(8, 16, 1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=16, bias=False), nn.ReLU(), nn.Conv2d(32, 8, 1),
    ).to(DEV, torch.float64)
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    x = tensor((4, 8, 16, 16), torch.float16, gen("compile-depthwise-ref"))
    with torch.no_grad():
        assert rel_err(model(x), ref(x.double())) <= 4 * tol(16 * 9, torch.float16)
