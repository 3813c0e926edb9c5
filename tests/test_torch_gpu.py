"""convgen.torch on a real GPU: conv2d and the nn.Conv2d drop-in against F.conv2d in float64.

Every reference is computed on the values the kernels saw: x, w and dy rounded to
float16, a float16 bias as it is and any other to float32 (see convgen/torch_launch.py).  Errors are norm-relative
with the tolerance of tests/gpu_helpers.py for the pass's reduction length, and
every kernel output starts as NaN (convgen.runtime.POISON_OUTPUTS) so an
unwritten element fails instead of passing on leftover memory.

Beyond values: which passes run (only the gradients autograd asks for), the
zero-copy path, and that launches go on PyTorch's current stream and allocations
through PyTorch's allocator.  CUDA graphs, torch.compile and the depthwise drop-in are
tests/test_torch_graphs_gpu.py's, on the helpers here.
Skipped without torch or without a CUDA GPU.
"""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, strategies as st

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import convgen  # noqa: E402
import convgen.runtime  # noqa: E402
import convgen.torch as cgt  # noqa: E402
import convgen.torch_launch as ctl  # noqa: E402
from torch_fake import reference_grads as reference  # noqa: E402  (F.conv2d in float64 on the kernels' view)
from convgen.suites import SUITES  # noqa: E402

from gpu_helpers import tolerance  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.usefixtures("poison_outputs"),
    # F.conv2d's own note that an even-kernel 'same' reference pads a copy of its input.
    pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel"),
]
if not torch.cuda.is_available():
    pytest.skip("GPU test: torch.cuda.is_available() is False (no GPU, or a CPU-only torch build)",
                allow_module_level=True)

CL = torch.channels_last
DEV = torch.device("cuda", torch.cuda.current_device())


# --------------------------------------------------------------------------- helpers


def gen(*parts) -> torch.Generator:
    """A CPU generator per case: fresh data for each case, the same from run to run."""
    return torch.Generator().manual_seed(zlib.crc32(repr(parts).encode()))


def tensor(shape, dtype, g, channels_last=True, requires_grad=False, device=DEV):
    t = torch.randn(tuple(shape), generator=g, dtype=torch.float32).to(device=device, dtype=dtype)
    if channels_last and t.dim() == 4:
        t = t.contiguous(memory_format=CL)
    return t.requires_grad_(requires_grad)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert tuple(out.shape) == tuple(ref.shape), (tuple(out.shape), tuple(ref.shape))
    out = out.detach().double()
    bad = int((~torch.isfinite(out)).sum())
    assert bad == 0, f"{bad} of {out.numel()} elements are not finite (unwritten by a kernel?)"
    ref = ref.detach().double()
    return float((out - ref).norm() / max(float(ref.norm()), 1e-30))


def tol(reduction: int, dtype: torch.dtype) -> float:
    return tolerance(reduction, {torch.float16: "float16", torch.bfloat16: "bfloat16"}.get(dtype, "float32"))


def check_conv(x, w, b, stride, padding, dilation, what: str, seed=0):
    """Forward and backward through convgen.torch.conv2d, each result against the reference."""
    y = cgt.conv2d(x, w, b, stride, padding, dilation)
    assert y.dtype == x.dtype, f"{what}: y is {y.dtype}, x is {x.dtype}"
    assert y.is_contiguous(memory_format=CL), f"{what}: y must be channels_last, strides {y.stride()}"
    gy = tensor(y.shape, y.dtype, gen("gy", what, seed), channels_last=False, device=y.device)
    trains = [t for t in (x, w, b) if t is not None and t.requires_grad]
    if trains:
        y.backward(gy)
    yr, dxr, dwr, dbr = reference(x, w, b, gy, stride, padding, dilation)
    n, k, p, q = yr.shape
    c, r, s = w.shape[1:]
    errors = []
    for name, out, ref, reduction, dtype in (
        ("y", y, yr, c * r * s, x.dtype),
        ("dx", x.grad, dxr, k * r * s, x.dtype),
        ("dw", w.grad, dwr, n * p * q, w.dtype),
        ("db", None if b is None else b.grad, dbr, n * p * q, None if b is None else b.dtype),
    ):
        if name != "y":
            owner = {"dx": x, "dw": w, "db": b}[name]
            if owner is None or not owner.requires_grad:
                assert out is None, f"{what}: {name} computed though not requested"
                continue
            assert out is not None, f"{what}: {name} missing"
            assert out.dtype == owner.dtype and out.shape == owner.shape, (
                f"{what}: {name} is {out.dtype} {tuple(out.shape)}, its input {owner.dtype} {tuple(owner.shape)}"
            )
        err, t = rel_err(out, ref), tol(reduction, dtype)
        if err > t:
            errors.append(f"{name}: relative error {err:.3g} > {t:.3g}")
    assert not errors, f"{what}: " + "; ".join(errors)
    return y


# --------------------------------------------------------------------------- values


SUITE_LAYERS = [(suite, layer) for suite, layers in SUITES.items() for layer in layers]


@pytest.mark.parametrize("suite,layer", SUITE_LAYERS, ids=lambda v: getattr(v, "name", v))
def test_suite_layers(suite, layer):
    """Every built-in layer, forward and all three gradients, fp16 channels_last activations
    and an nn.Conv2d-layout (contiguous K, C, R, S) weight."""
    p = layer.problem
    n = 4 if suite.startswith("cifar") else 2
    g = gen("suite", suite, layer.name)
    x = tensor((n, p.c, p.h, p.w), torch.float16, g, requires_grad=True)
    w = tensor((p.k, p.c, p.r, p.s), torch.float16, g, channels_last=False, requires_grad=True)
    b = tensor((p.k,), torch.float16, g, requires_grad=True)
    check_conv(x, w, b, p.stride, p.padding, p.dilation, f"{suite}/{layer.name} N={n}")


@st.composite
def cases(draw):
    r, s = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    dil = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    mode = draw(st.sampled_from(["explicit", "explicit", "same", "valid"]))
    if mode == "explicit":
        stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        pad = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
        padding = pad
    else:
        stride = (1, 1)
        pad = (dil[0] * (r - 1) // 2, dil[1] * (s - 1) // 2) if mode == "same" else (0, 0)
        padding = mode
    h = draw(st.integers(max(1, dil[0] * (r - 1) + 1 - 2 * pad[0]), 24))
    w = draw(st.integers(max(1, dil[1] * (s - 1) + 1 - 2 * pad[1]), 24))
    return dict(
        n=draw(st.integers(1, 4)), c=draw(st.integers(1, 48)), k=draw(st.integers(1, 48)), h=h, w=w, r=r, s=s,
        stride=stride, padding=padding, dilation=dil,
        dtype=draw(st.sampled_from([torch.float16, torch.float32])),
        channels_last=draw(st.booleans()), bias=draw(st.booleans()),
        grads=draw(st.tuples(st.booleans(), st.booleans(), st.booleans())),
    )


@given(case=cases())
def test_drawn_shapes(case):
    """Drawn geometry (stride, padding incl. 'same'/'valid', dilation), dtype, layout, bias, and
    which of x, w, bias require grad: every requested gradient right, every other one absent."""
    g = gen("drawn", sorted((k, str(v)) for k, v in case.items()))
    dt, cl = case["dtype"], case["channels_last"]
    need_x, need_w, need_b = case["grads"]
    x = tensor((case["n"], case["c"], case["h"], case["w"]), dt, g, cl, need_x)
    w = tensor((case["k"], case["c"], case["r"], case["s"]), dt, g, False, need_w)
    b = tensor((case["k"],), dt, g, requires_grad=need_b) if case["bias"] else None
    check_conv(x, w, b, case["stride"], case["padding"], case["dilation"], what=repr(case))


# --------------------------------------------------------------------------- what runs, where


class Spy:
    """Wraps convgen.prepare (which convgen.torch looks up on the package when it builds an
    op) so that every launch of every op it builds records its operands' pointers and
    dtypes, its output, its options and the stream it ran on; the ops still run."""

    NAMES = {"fprop": "conv2d", "dgrad": "conv2d_dgrad", "wgrad": "conv2d_wgrad"}

    def __init__(self, monkeypatch):
        self.calls: list[dict] = []
        real = convgen.prepare
        monkeypatch.setattr(ctl, "_prepared", {})  # ops cached by earlier tests would not be seen
        monkeypatch.setattr(ctl, "fast_calls", {})
        dtypes: dict[int, str] = {}  # the tensors convgen.torch handed over, by pointer
        real_ptr, real_cl_ptr = ctl._ptr, ctl._cl_ptr

        def ptr(t, real=real_ptr):
            p = real(t)
            dtypes[p] = str(t.dtype).replace("torch.", "")
            return p

        monkeypatch.setattr(ctl, "_ptr", ptr)
        monkeypatch.setattr(ctl, "_cl_ptr", lambda t: ptr(t, real_cl_ptr))

        def prepare(pass_, *args, **kwargs):
            op = real(pass_, *args, **kwargs)
            spy = self

            class Recorded:
                workspace_elems = op.workspace_elems

                def launch(self, a, b, out, *, bias=0, workspace=0, stream=0):
                    op.launch(a, b, out, bias=bias, workspace=workspace, stream=stream)
                    operands = [p for p in (a, b, bias) if p]
                    spy.calls.append(dict(
                        name=spy.NAMES[pass_], stream=stream, ptrs=operands, dtypes=[dtypes[p] for p in operands],
                        result_ptr=out[0], kwargs=dict(bias=bool(kwargs.get("bias")), out_dtype=kwargs.get("out_dtype")),
                    ))

            return Recorded()

        monkeypatch.setattr(convgen, "prepare", prepare)

    def count(self, name: str) -> int:
        return sum(c["name"] == name for c in self.calls)


@pytest.mark.parametrize("need", [(False, True, True), (True, False, False), (False, False, True),
                                  (True, True, False), (True, False, True)],
                         ids=lambda t: "".join(n if v else "-" for n, v in zip("xwb", t)))
def test_only_requested_gradients_are_computed(monkeypatch, need):
    spy = Spy(monkeypatch)
    need_x, need_w, need_b = need
    g = gen("need", need)
    x = tensor((2, 16, 10, 10), torch.float16, g, requires_grad=need_x)
    w = tensor((24, 16, 3, 3), torch.float16, g, False, need_w)
    b = tensor((24,), torch.float16, g, requires_grad=need_b)
    check_conv(x, w, b, 1, 1, 1, f"requires_grad x/w/b = {need}")
    assert spy.count("conv2d") == 1
    assert spy.count("conv2d_dgrad") == int(need_x), "dgrad must run exactly when x needs a gradient"
    assert spy.count("conv2d_wgrad") == int(need_w), "wgrad must run exactly when w needs a gradient"
    for c in spy.calls:
        if c["name"] == "conv2d_wgrad":
            assert c["kwargs"]["bias"] == need_b, "wgrad must compute db exactly when bias needs a gradient"


@pytest.mark.parametrize("b_dtype", [torch.float32, torch.float16], ids=str)
def test_channels_last_half_is_zero_copy(monkeypatch, b_dtype):
    import cupy

    spy = Spy(monkeypatch)
    g = gen("zero-copy")
    x = tensor((4, 32, 16, 16), torch.float16, g, requires_grad=True)
    w = tensor((64, 32, 3, 3), torch.float16, g, requires_grad=True)  # channels_last: already KRSC
    b = tensor((64,), b_dtype, g, requires_grad=True)
    pool = cupy.get_default_memory_pool()
    pool_before = pool.total_bytes()
    torch_before = torch.cuda.memory_allocated()
    y = cgt.conv2d(x, w, b, padding=1)
    fwd = spy.calls[0]
    assert fwd["ptrs"][0] == x.data_ptr(), "x (channels_last fp16) must reach convgen.conv2d without a copy"
    assert fwd["ptrs"][1] == w.data_ptr(), "w (channels_last fp16) must reach convgen.conv2d without a copy"
    assert fwd["ptrs"][2] == b.data_ptr(), f"a {b_dtype} bias must reach convgen.conv2d without a copy"
    assert fwd["result_ptr"] == y.data_ptr(), "y must be convgen's output, not a copy of it"
    assert torch.cuda.memory_allocated() - torch_before >= y.numel() * 2, "y must be PyTorch-allocated memory"
    y.backward(torch.randn_like(y))
    dgrad = next(c for c in spy.calls if c["name"] == "conv2d_dgrad")
    wgrad = next(c for c in spy.calls if c["name"] == "conv2d_wgrad")
    assert dgrad["ptrs"][1] == w.data_ptr() and wgrad["ptrs"][0] == x.data_ptr(), "saved operands were copied"
    assert pool.total_bytes() == pool_before, "convgen.torch must allocate through PyTorch, not CuPy's pool"


def test_nchw_float32_is_converted_and_correct(monkeypatch):
    spy = Spy(monkeypatch)
    g = gen("fp32")
    x = tensor((3, 12, 15, 13), torch.float32, g, channels_last=False, requires_grad=True)
    w = tensor((20, 12, 3, 3), torch.float32, g, channels_last=False, requires_grad=True)
    b = tensor((20,), torch.float32, g, requires_grad=True)
    assert x.is_contiguous() and not x.is_contiguous(memory_format=CL)
    y = check_conv(x, w, b, 2, 1, 1, "NCHW float32")
    assert y.dtype == torch.float32 and x.grad.dtype == w.grad.dtype == b.grad.dtype == torch.float32
    fwd = spy.calls[0]
    assert fwd["dtypes"][:2] == ["float16", "float16"], f"operands must be converted to fp16, got {fwd['dtypes']}"
    assert fwd["ptrs"][0] != x.data_ptr()
    assert fwd["kwargs"]["out_dtype"] == "float32"


@pytest.mark.parametrize("default_stream", [False, True], ids=["side-stream", "default-stream"])
def test_launches_go_on_torchs_current_stream(monkeypatch, default_stream):
    import cupy

    spy = Spy(monkeypatch)
    g = gen("stream")
    x = tensor((2, 8, 12, 12), torch.float16, g, requires_grad=True)
    w = tensor((16, 8, 3, 3), torch.float16, g, False, True)
    b = tensor((16,), torch.float16, g, requires_grad=True)
    outside = cupy.cuda.get_current_stream().ptr
    s = torch.cuda.default_stream() if default_stream else torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = cgt.conv2d(x, w, b, padding=1)
        gy = torch.randn(y.shape, device=DEV, dtype=y.dtype)
        y.backward(gy)
    torch.cuda.current_stream().wait_stream(s)
    assert cupy.cuda.get_current_stream().ptr == outside, "CuPy's current stream must be restored"
    assert {c["name"] for c in spy.calls} == {"conv2d", "conv2d_dgrad", "conv2d_wgrad"}
    for c in spy.calls:
        assert c["stream"] == s.cuda_stream, f"{c['name']} ran on stream {c['stream']:#x}, not {s.cuda_stream:#x}"
    yr, dxr, dwr, dbr = reference(x, w, b, gy, 1, 1, 1)
    assert rel_err(y, yr) <= tol(8 * 9, torch.float16)
    assert rel_err(x.grad, dxr) <= tol(16 * 9, torch.float16)
    assert rel_err(w.grad, dwr) <= tol(2 * 144, torch.float16)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device():
    dev = torch.device("cuda", 1)
    g = gen("device1")
    x = tensor((2, 8, 9, 9), torch.float16, g, requires_grad=True, device=dev)
    w = tensor((8, 8, 3, 3), torch.float16, g, False, True, device=dev)
    assert torch.cuda.current_device() != 1
    y = check_conv(x, w, None, 1, 1, 1, "on cuda:1")
    assert y.device == dev


def test_empty_batch():
    g = gen("empty")
    x = tensor((0, 8, 9, 9), torch.float16, g, requires_grad=True)
    w = tensor((4, 8, 3, 3), torch.float16, g, False, True)
    b = tensor((4,), torch.float16, g, requires_grad=True)
    y = cgt.conv2d(x, w, b, padding=1)
    assert y.shape == (0, 4, 9, 9)
    y.sum().backward()
    assert x.grad.shape == x.shape and not w.grad.any() and not b.grad.any()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16], ids=str)
def test_autocast_casts_like_nn_conv2d(dt, compiled):
    """Under autocast of either 16-bit type, eagerly and under torch.compile(fullgraph=True),
    the output has the autocast type (nn.Conv2d's), the parameters' gradients their own
    float32, and the values are the convolution of the operands rounded to that type."""
    torch._dynamo.reset()
    g = gen("autocast", dt, compiled)
    x = tensor((2, 16, 12, 12), torch.float32, g, requires_grad=True)
    ours = cgt.Conv2d(16, 32, 3, padding=1, device=DEV)
    ref = nn.Conv2d(16, 32, 3, padding=1, device=DEV)
    ref.load_state_dict(ours.state_dict())
    run = torch.compile(ours, fullgraph=True) if compiled else ours
    with torch.autocast("cuda", dtype=dt):
        y = run(x)
        y_ref = ref(x)
    assert y.dtype == y_ref.dtype == dt
    gy = torch.randn(y.shape, device=DEV, dtype=dt)
    y.backward(gy)
    assert ours.weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    # autocast rounds x, the weight and the bias to dt
    _, dxr, dwr, dbr = reference(x.to(dt), ours.weight.to(dt), ours.bias.to(dt), gy, 1, 1, 1)
    yr = F.conv2d(x.to(dt).double(), ours.weight.to(dt).double(), ours.bias.to(dt).double(), padding=1)
    assert rel_err(y, yr) <= tol(16 * 9, dt)
    assert rel_err(ours.weight.grad, dwr) <= tol(2 * 144, dt)
    assert rel_err(x.grad, dxr) <= tol(32 * 9, dt)


# --------------------------------------------------------------------------- the nn.Conv2d drop-in


@pytest.mark.parametrize("args, kwargs", [
    ((3, 32, 3), dict(padding=1)),
    ((16, 24, (3, 5)), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), bias=False)),
    ((16, 16, 3), dict(padding="same")),
    ((16, 8, 4), dict(padding="same")),  # even kernel: asymmetric, the extra row/column padded first
    ((16, 8, 3), dict(padding="valid", stride=1)),
    ((32, 64, 1), dict(stride=2)),
], ids=lambda v: str(v))
def test_drop_in_for_nn_conv2d(args, kwargs):
    torch.manual_seed(0)
    ref = nn.Conv2d(*args, **kwargs, device=DEV, dtype=torch.float16)
    torch.manual_seed(0)
    ours = cgt.Conv2d(*args, **kwargs, device=DEV, dtype=torch.float16)
    assert isinstance(ours, nn.Conv2d)
    assert list(ours.state_dict()) == list(ref.state_dict()), "state_dict keys differ from nn.Conv2d's"
    for key, value in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), f"{key}: the same seed must give the same init"
    torch.manual_seed(1)
    ours.load_state_dict(nn.Conv2d(*args, **kwargs, device=DEV, dtype=torch.float16).state_dict())
    ref.load_state_dict(ours.state_dict())

    x = tensor((4, args[0], 17, 16), torch.float16, gen("drop-in", args, kwargs), requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y, y_ref = ours(x), ref(x_ref)
    assert y.shape == y_ref.shape and y.dtype == y_ref.dtype
    gy = torch.randn(y.shape, device=DEV, dtype=y.dtype)
    y.backward(gy)
    y_ref.backward(gy)
    # Both against float64; then against each other (cuDNN rounds too, so allow both errors).
    c, r, s = ours.weight.shape[1:]
    n, k, p, q = y.shape
    want, dxr, dwr, dbr = reference(x, ours.weight, ours.bias, gy, ours.stride, ours.padding, ours.dilation)
    for name, a, a_ref, r64, red in (("y", y, y_ref, want, c * r * s), ("dx", x.grad, x_ref.grad, dxr, k * r * s),
                                      ("dw", ours.weight.grad, ref.weight.grad, dwr, n * p * q)):
        t = tol(red, torch.float16)
        assert rel_err(a, r64) <= t, f"{name} vs float64: {rel_err(a, r64):.3g} > {t:.3g}"
        assert rel_err(a, a_ref) <= 2 * t, f"{name} vs nn.Conv2d: {rel_err(a, a_ref):.3g} > {2 * t:.3g}"
    if ours.bias is not None:
        assert rel_err(ours.bias.grad, dbr) <= tol(n * p * q, torch.float16)
    # Unbatched input, as nn.Conv2d takes it.
    assert ours(x[0].detach()).shape == ref(x_ref[0].detach()).shape


@pytest.mark.parametrize("args, kwargs", [
    ((16, 32, 3), dict(padding=1)),
    ((24, 40, (3, 5)), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), bias=False)),
    ((64, 64, 1), dict()),
    ((32, 32, 3), dict(padding=1, groups=32)),  # depthwise
], ids=lambda v: str(v))
def test_bfloat16_model(args, kwargs):
    """A bfloat16 model: channels_last bfloat16 activations and weights reach bfloat16 kernels
    (the fast path from the second call on), and forward and every gradient match float64 on
    the bfloat16 values within bfloat16's tolerance, and nn.Conv2d (cuDNN, bfloat16) within
    twice that, call after call."""
    torch.manual_seed(0)
    ours = cgt.Conv2d(*args, **kwargs, device=DEV, dtype=torch.bfloat16).to(memory_format=CL)
    ref = nn.Conv2d(*args, **kwargs, device=DEV, dtype=torch.bfloat16).to(memory_format=CL)
    ref.load_state_dict(ours.state_dict())
    for call in range(2):
        g = gen("bf16", args, kwargs, call)
        x = tensor((4, args[0], 15, 14), torch.bfloat16, g, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        for m in (ours, ref):
            m.zero_grad(set_to_none=True)
        y, y_ref = ours(x), ref(x_ref)
        assert y.dtype == torch.bfloat16 and y.is_contiguous(memory_format=CL)
        gy = tensor(y.shape, torch.bfloat16, g)
        y.backward(gy)
        y_ref.backward(gy)
        want, dxr, dwr, dbr = reference(x, ours.weight, ours.bias, gy, ours.stride, ours.padding, ours.dilation,
                                        ours.groups)
        c, r, s = ours.weight.shape[1:]
        n, k, p, q = y.shape
        checks = [("y", y, y_ref, want, c * r * s), ("dx", x.grad, x_ref.grad, dxr, k * r * s // ours.groups),
                  ("dw", ours.weight.grad, ref.weight.grad, dwr, n * p * q)]
        if ours.bias is not None:
            checks.append(("db", ours.bias.grad, ref.bias.grad, dbr, n * p * q))
        for name, a, a_ref, r64, red in checks:
            assert a.dtype == torch.bfloat16, f"call {call}, {name}: {a.dtype}"
            t = tol(red, torch.bfloat16)
            assert rel_err(a, r64) <= t, f"call {call}, {name} vs float64: {rel_err(a, r64):.3g} > {t:.3g}"
            assert rel_err(a, a_ref) <= 2 * t, f"call {call}, {name} vs nn.Conv2d: {rel_err(a, a_ref):.3g}"


def test_drop_in_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError, match=r"groups=3 must divide the 8 channels of in_channels"):
        cgt.Conv2d(8, 9, 3, groups=3, device=DEV)
    with pytest.raises(ValueError, match=r"groups=3 must divide the 8 channels of x.shape\[1\]"):
        cgt.conv2d(tensor((1, 8, 6, 6), torch.float16, gen("groups=3")),
                   tensor((9, 3, 3, 3), torch.float16, gen("groups=3 w")), groups=3)
    with pytest.raises(ValueError, match="padding_mode"):
        cgt.Conv2d(8, 8, 3, padding=1, padding_mode="reflect", device=DEV)


def test_inplace_relu_after_the_conv():
    torch.manual_seed(0)
    ours = nn.Sequential(cgt.Conv2d(8, 16, 3, padding=1), nn.ReLU(inplace=True)).to(DEV, torch.float16)
    ref = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(inplace=True)).to(DEV, torch.float16)
    ref.load_state_dict(ours.state_dict())
    x = tensor((2, 8, 10, 10), torch.float16, gen("relu"))
    ours(x).float().square().sum().backward()
    ref(x).float().square().sum().backward()
    assert rel_err(ours[0].weight.grad, ref[0].weight.grad) <= 2 * tol(200, torch.float16)
