"""convgen.torch without a GPU: everything but the kernels.

The CuPy bridge of convgen.torch (three functions) is swapped for a NumPy one and
convgen's three run-time functions for the float64 NumPy reference, wrapped in
checks of the run-time contract (NHWC / KRSC, dense float16 operands, a float32
bias, explicit symmetric padding).  What is left is convgen.torch's own logic:
layouts, dtype policy, 'same' padding, unbatched inputs, which gradients are
computed, and the nn.Conv2d drop-in; each is checked against F.conv2d in float64.
Skipped when torch is not installed.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import convgen  # noqa: E402
import convgen.torch as cgt  # noqa: E402
import convgen.torch_launch as ctl  # noqa: E402
from convgen import reference  # noqa: E402

CL = torch.channels_last


def _np_dtype(name: str) -> np.dtype:
    """A dtype name as NumPy's: bfloat16 is ml_dtypes' (NumPy has none of its own)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _f64(a: np.ndarray) -> np.ndarray:
    """An operand as the reference takes it (it refuses ml_dtypes' bfloat16, no NumPy float)."""
    return a.astype(np.float64)


def _array(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's memory as a NumPy array (a bfloat16 one through ml_dtypes: NumPy cannot
    take PyTorch's bfloat16 directly), sharing its memory, so the fake kernels write through."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_np_dtype("bfloat16"))
    return t.numpy()
# F.conv2d's own note that an even-kernel 'same' reference pads a copy of its input.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")


# --------------------------------------------------------------------------- the NumPy bridge


class FakeKernels:
    """convgen.prepare on NumPy arrays: ops that check what they are given (the run-time
    contract: dense float16 NHWC/KRSC operands, a float32 bias, dense outputs of the op's
    shape and dtype, explicit (h, w) geometry) and write the float64 reference into the
    caller's outputs, as the kernels do."""

    def __init__(self) -> None:
        self.calls: dict[str, list[dict]] = {"conv2d": [], "dgrad": [], "wgrad": []}
        self.arrays: dict[int, np.ndarray] = {}  # what convgen.torch handed over, by pointer
        self.prepared: list[tuple] = []  # every op built: (pass, x_shape, w_shape, bias)
        self.groups: list[int] = []  # the groups of every op built, in the same order
        self.batches: list[int] = []  # the sizes of convgen.prepare_many's calls
        self.in_dtypes: list[str] = []  # the 16-bit type of every op built, in the same order

    @staticmethod
    def _operand(name: str, a, shape=None, dtype: str = "float16") -> None:
        assert isinstance(a, np.ndarray), f"{name}: expected an array, got {type(a).__name__}"
        assert a.ndim == 4, f"{name}: expected 4-D, got {a.shape}"
        assert a.dtype == _np_dtype(dtype), f"{name}: convgen.torch must pass {dtype} operands here, got {a.dtype}"
        assert a.flags.c_contiguous, f"{name}: convgen.torch must pass dense NHWC/KRSC operands (strides {a.strides})"
        if shape is not None:
            assert a.shape == tuple(shape), f"{name}: shape {a.shape}, expected {tuple(shape)}"

    @staticmethod
    def _output(name: str, a, shape, dtype) -> None:
        assert isinstance(a, np.ndarray) and a.flags.c_contiguous, f"{name}: outputs must be dense arrays"
        assert a.shape == tuple(shape) and a.dtype == _np_dtype(dtype), (name, a.shape, a.dtype, shape, dtype)

    @staticmethod
    def _geometry(stride, padding, dilation) -> None:
        for name, v in (("stride", stride), ("padding", padding), ("dilation", dilation)):
            assert isinstance(v, tuple) and len(v) == 2 and all(isinstance(i, int) for i in v), (
                f"{name} reaches the kernels as {v!r}; expected an explicit (h, w) pair of ints"
            )

    def prepare(self, pass_, x_shape, w_shape, *, stride, padding, dilation, bias=False, bias_dtype="float32",
                out_dtype="float16", device=None, groups=1, in_dtype="float16", **kw):
        self._geometry(stride, padding, dilation)
        assert not kw, kw
        n, h, wd, c = x_shape
        k, r, s, cw = w_shape
        # convgen.prepare's contract: KRSC weights of C/groups channels, groups dividing C and K
        assert type(groups) is int and cw * groups == c and k % groups == 0, (groups, x_shape, w_shape)
        assert in_dtype in ("float16", "bfloat16"), in_dtype  # convgen.torch hands the kernels 16-bit operands
        assert out_dtype in (in_dtype, "float32") and bias_dtype in (in_dtype, "float32"), (in_dtype, out_dtype, bias_dtype)
        self.prepared.append((pass_, tuple(x_shape), tuple(w_shape), bias))
        self.in_dtypes.append(in_dtype)
        self.groups.append(groups)
        fake = self
        geo = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
        p = (h + 2 * padding[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
        q = (wd + 2 * padding[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1

        class Op:
            workspace_elems = 0

            def launch(self, a, b, out, *, bias=0, workspace=0, stream=0):
                # convgen.torch hands pointers of tensors it made (convgen.torch_launch's _ptr and _cl_ptr, which the
                # fixture wraps to remember them): run the checks on those tensors' arrays
                assert stream == 0 and workspace == 0, (stream, workspace)
                arr = fake.arrays
                outs = tuple(arr[o] for o in out)
                self(arr[a], arr[b], arr[bias] if bias else None, out=outs if pass_ == "wgrad" else outs[0])

            def __call__(self, a, b, bias_arr=None, *, out, workspace=None):
                if pass_ == "fprop":
                    fake._operand("x", a, x_shape, in_dtype)
                    fake._operand("w", b, w_shape, in_dtype)
                    if bias:
                        assert bias_arr.dtype == _np_dtype(bias_dtype) and bias_arr.shape == (k,), (
                            bias_arr.dtype, bias_dtype, bias_arr.shape)
                    else:
                        assert bias_arr is None
                    fake._output("y", out, (n, p, q, k), out_dtype)
                    fake.calls["conv2d"].append(dict(x_ptr=a.ctypes.data, w_ptr=b.ctypes.data, out_dtype=out_dtype,
                                                     bias_dtype=bias_dtype if bias else None, in_dtype=in_dtype))
                    out[...] = reference.fprop(_f64(a), _f64(b), None if bias_arr is None else _f64(bias_arr), **geo)
                elif pass_ == "dgrad":
                    fake._operand("dy", a, (n, p, q, k), in_dtype)
                    fake._operand("w", b, w_shape, in_dtype)
                    fake._output("dx", out, x_shape, out_dtype)
                    fake.calls["dgrad"].append(dict(out_dtype=out_dtype))
                    out[...] = reference.dgrad(_f64(a), _f64(b), x_shape, **geo)
                else:
                    fake._operand("x", a, x_shape, in_dtype)
                    fake._operand("dy", b, (n, p, q, k), in_dtype)
                    assert len(out) == (2 if bias else 1)
                    fake._output("dw", out[0], w_shape, out_dtype)
                    fake.calls["wgrad"].append(dict(bias=bias, out_dtype=out_dtype))
                    dw, db = reference.wgrad(_f64(a), _f64(b), w_shape, **geo)
                    out[0][...] = dw
                    if bias:
                        fake._output("db", out[1], (k,), out_dtype)
                        out[1][...] = db

        return Op()


@pytest.fixture
def fake(monkeypatch):
    k = FakeKernels()

    real_ptr = ctl._ptr

    def ptr(t):
        p = real_ptr(t)  # the real guard: dense tensors of the kernels' dtypes only
        k.arrays[p] = _array(t.detach())
        return p

    def cl_ptr(t):  # a channels_last (N, C, H, W) tensor: the kernels see its NHWC array
        assert t.dim() == 4 and t.permute(0, 2, 3, 1).is_contiguous(), f"not channels_last: {t.stride()}"
        p = t.data_ptr()
        k.arrays[p] = _array(t.detach().permute(0, 2, 3, 1))
        return p

    monkeypatch.setattr(ctl, "_ptr", ptr)
    monkeypatch.setattr(ctl, "_cl_ptr", cl_ptr)
    monkeypatch.setattr(ctl, "_raw_stream", lambda index: 0)
    monkeypatch.setattr(ctl, "_current_device", lambda: 0)
    monkeypatch.setattr(ctl, "_prepared", {})
    monkeypatch.setattr(ctl, "fast_calls", {})
    monkeypatch.setattr(convgen, "prepare", k.prepare)

    def prepare_many(layers, workers=None):
        k.batches.append(len(layers))
        return [k.prepare(**layer) for layer in layers]

    monkeypatch.setattr(convgen, "prepare_many", prepare_many)
    return k


# --------------------------------------------------------------------------- helpers


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    out, ref = out.detach().double(), ref.detach().double()
    assert torch.isfinite(out).all()
    return float((out - ref).norm() / max(float(ref.norm()), 1e-30))


def tol(dtype: torch.dtype) -> float:
    # The fake kernels are exact in float64; only the output rounding is left (bfloat16's
    # 8-bit mantissa: 8x float16's).
    return {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}.get(dtype, 1e-6)


def make(shape, dtype, channels_last, seed, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if channels_last and t.dim() == 4:
        t = t.contiguous(memory_format=CL)
    return t.requires_grad_(requires_grad)


def reference_grads(x, w, b, gy, stride, padding, dilation, groups=1):
    """F.conv2d in float64 on the values the kernels see: x, w and dy rounded to the call's
    16-bit type (bfloat16 where x or w is), the bias to float32 (or its own 16-bit type)."""
    elem = torch.bfloat16 if torch.bfloat16 in (x.dtype, w.dtype) else torch.float16
    xr = x.detach().to(elem).double().requires_grad_()
    wr = w.detach().to(elem).double().requires_grad_()
    br = None if b is None else b.detach().float().double().requires_grad_()
    yr = F.conv2d(xr, wr, br, stride, padding, dilation, groups)
    yr.backward(gy.detach().to(elem).double())
    return yr, xr.grad, wr.grad, None if br is None else br.grad


# --------------------------------------------------------------------------- values and layouts

GEOMETRIES = [
    # (N, C, H, W), (K, R, S), stride, padding, dilation
    ((2, 3, 9, 11), (8, 3, 3), 1, 1, 1),
    ((2, 8, 10, 7), (5, 3, 2), (2, 1), (1, 0), (1, 2)),
    ((1, 4, 8, 8), (6, 1, 1), 2, 0, 1),
    ((3, 5, 12, 9), (4, 5, 4), 1, "same", 1),  # even S: asymmetric 'same', extra column padded first
    ((2, 6, 10, 10), (4, 4, 3), 1, "same", (1, 2)),
    ((2, 6, 10, 10), (4, 3, 3), 1, "valid", 1),
    ((4, 16, 7, 7), (16, 3, 3), 3, 3, 2),
    ((2, 8, 10, 7), (5, 3, 2), [2, 1], [1, 0], [1, 2]),  # lists: not hashable, so never remembered
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("channels_last", [True, False], ids=["cl", "nchw"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("geo", GEOMETRIES, ids=lambda g: f"{g[0]}-{g[1]}-s{g[2]}-p{g[3]}-d{g[4]}")
def test_values_layouts_and_dtypes(fake, geo, dtype, channels_last, bias):
    (n, c, h, wd), (k, r, s), stride, padding, dilation = geo
    x = make((n, c, h, wd), dtype, channels_last, 1)
    w = make((k, c, r, s), dtype, False, 2)
    b = make((k,), dtype, False, 3) if bias else None
    y = cgt._conv2d(x, w, b, stride, padding, dilation)
    gy = make(tuple(y.shape), dtype, False, 4, requires_grad=False)
    y.backward(gy)
    yr, dxr, dwr, dbr = reference_grads(x, w, b, gy, stride, padding, dilation)

    assert y.dtype == dtype, "the output dtype must follow x"
    assert y.shape == yr.shape
    assert y.is_contiguous(memory_format=CL), "y must come back in channels_last memory"
    assert y._base is None, "y must not be a view (in-place ops on it would raise)"
    assert rel_err(y, yr) <= tol(dtype)
    for name, t, ref in (("x", x, dxr), ("w", w, dwr), ("bias", b, dbr)):
        if t is None:
            continue
        assert t.grad is not None, f"no gradient for {name}"
        assert t.grad.dtype == t.dtype and t.grad.shape == t.shape, (name, t.grad.dtype, t.grad.shape)
        assert rel_err(t.grad, ref) <= tol(t.dtype), f"d{name}: {rel_err(t.grad, ref):.3g}"
    assert len(fake.calls["conv2d"]) == 1 and len(fake.calls["dgrad"]) == 1 and len(fake.calls["wgrad"]) == 1
    elem = "bfloat16" if dtype == torch.bfloat16 else "float16"  # float32 and float64 are rounded to float16
    want = elem if dtype in (torch.float16, torch.bfloat16) else "float32"
    assert fake.in_dtypes == [elem] * 3, "every pass's kernels multiply the call's 16-bit type"
    assert fake.calls["conv2d"][0]["out_dtype"] == want
    assert fake.calls["dgrad"][0]["out_dtype"] == want
    assert fake.calls["wgrad"][0] == dict(bias=bias, out_dtype=want)


def test_zero_copy_for_channels_last_half(fake):
    x = make((2, 8, 6, 6), torch.float16, True, 1, requires_grad=False)
    w = make((4, 8, 3, 3), torch.float16, False, 2, requires_grad=False).contiguous(memory_format=CL)
    cgt._conv2d(x, w, None, 1, 1, 1)
    call = fake.calls["conv2d"][0]
    assert call["x_ptr"] == x.data_ptr(), "a channels_last float16 x must reach the kernel without a copy"
    assert call["w_ptr"] == w.data_ptr(), "a channels_last float16 weight is already KRSC: no copy"


def test_views_off_a_16_byte_boundary_are_copied_not_misread(fake):
    """The kernels' vector loads need 16-byte aligned operands: a batch slice that starts
    54 bytes into its storage is copied into fresh memory first, and the result is right."""
    full = make((3, 3, 3, 3), torch.float16, True, 1, requires_grad=False)
    x = full[1:]
    assert x.is_contiguous(memory_format=CL) and x.data_ptr() % 16
    w = make((8, 3, 3, 3), torch.float16, False, 2, requires_grad=False)
    y = cgt._conv2d(x, w, None, 1, 1, 1)
    assert fake.calls["conv2d"][0]["x_ptr"] % 16 == 0
    assert rel_err(y, F.conv2d(x.double(), w.double(), None, 1, 1)) <= 1e-3


def test_nchw_and_float32_are_converted_not_misread(fake):
    x = make((2, 8, 6, 6), torch.float32, False, 1, requires_grad=False)
    w = make((4, 8, 3, 3), torch.float32, False, 2, requires_grad=False)
    y = cgt._conv2d(x, w, None, 1, 1, 1)
    assert fake.calls["conv2d"][0]["x_ptr"] != x.data_ptr()
    assert y.dtype == torch.float32
    assert rel_err(y, F.conv2d(x.half().double(), w.half().double(), None, 1, 1)) <= 1e-6


@pytest.mark.parametrize("need", list(itertools.product([False, True], repeat=3))[1:],
                         ids=lambda t: "".join(n if v else "-" for n, v in zip("xwb", t)))
def test_only_requested_gradients(fake, need):
    need_x, need_w, need_b = need
    x = make((2, 4, 7, 7), torch.float16, True, 1, need_x)
    w = make((6, 4, 3, 3), torch.float16, False, 2, need_w)
    b = make((6,), torch.float16, False, 3, need_b)
    y = cgt._conv2d(x, w, b, 1, 1, 1)
    gy = make(tuple(y.shape), torch.float16, True, 4, requires_grad=False)
    y.backward(gy)
    assert len(fake.calls["dgrad"]) == int(need_x), "dgrad must run exactly when x needs a gradient"
    assert len(fake.calls["wgrad"]) == int(need_w), "wgrad must run exactly when w needs a gradient"
    if need_w:
        assert fake.calls["wgrad"][0]["bias"] == need_b
    _, dxr, dwr, dbr = reference_grads(x, w, b, gy, 1, 1, 1)
    for name, t, ref, wanted in (("x", x, dxr, need_x), ("w", w, dwr, need_w), ("b", b, dbr, need_b)):
        if wanted:
            assert rel_err(t.grad, ref) <= tol(t.dtype), name
        else:
            assert t.grad is None, name


def test_inplace_op_on_output_and_unbatched_input(fake):
    x = make((3, 9, 9), torch.float16, False, 1)
    w = make((4, 3, 3, 3), torch.float16, False, 2)
    y = cgt._conv2d(x, w, None, 1, 1, 1)
    assert y.shape == (4, 9, 9)
    x2 = make((1, 3, 9, 9), torch.float16, True, 5)
    y2 = cgt._conv2d(x2, w, None, 1, 1, 1)
    torch.relu_(y2)  # nn.ReLU(inplace=True) after the conv: must not raise
    y2.sum().backward()
    y.float().sum().backward()
    assert x.grad.shape == x.shape


def test_empty_batch(fake):
    x = make((0, 4, 7, 7), torch.float16, True, 1)
    w = make((6, 4, 3, 3), torch.float16, False, 2)
    b = make((6,), torch.float32, False, 3)
    y = cgt._conv2d(x, w, b, 2, 1, 1)
    assert y.shape == (0, 6, 4, 4) and y.dtype == torch.float16
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.count_nonzero(w.grad) == 0 and torch.count_nonzero(b.grad) == 0
    assert b.grad.dtype == torch.float32
    assert not any(fake.calls.values()), "an empty batch launches nothing"


def test_mixed_dtypes_return_each_gradient_in_its_own_dtype(fake):
    x = make((2, 4, 6, 6), torch.float16, True, 1)
    w = make((3, 4, 3, 3), torch.float32, False, 2)
    b = make((3,), torch.float64, False, 3)
    y = cgt._conv2d(x, w, b, 1, 1, 1)
    assert y.dtype == torch.float16
    y.float().sum().backward()
    assert (x.grad.dtype, w.grad.dtype, b.grad.dtype) == (torch.float16, torch.float32, torch.float64)
    assert fake.calls["wgrad"][0]["out_dtype"] == "float32"


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("d", [1, 2, 3])
def test_same_padding_matches_pytorch(fake, k, d):
    x = make((1, 2, 11, 10), torch.float64, False, k * 10 + d)
    w = make((3, 2, k, k + 1), torch.float64, False, 7)
    y = cgt._conv2d(x, w, None, 1, "same", d)
    ref = F.conv2d(x.half().double(), w.half().double(), None, 1, "same", d)
    assert y.shape == ref.shape == (1, 3, 11, 10)
    assert rel_err(y, ref) <= 1e-6


# --------------------------------------------------------------------------- errors


def test_cpu_tensors_are_refused_with_a_clear_error():
    x = torch.randn(1, 3, 8, 8)
    w = torch.randn(4, 3, 3, 3)
    with pytest.raises(RuntimeError, match="CUDA"):
        cgt.conv2d(x, w)
    with pytest.raises(RuntimeError, match="GPU"):
        cgt.Conv2d(3, 4, 3)(x)


@pytest.mark.parametrize("kwargs, match", [
    (dict(groups=3), r"groups=3 must divide the 4 channels of in_channels"),
    (dict(padding_mode="reflect"), "padding_mode='zeros'"),
    (dict(padding="same", stride=2), "strided"),
    (dict(padding="full"), "Invalid padding string"),
])
def test_unsupported_module_options_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cgt.Conv2d(4, 8, 3, **kwargs)


def test_bad_operands_raise(fake):
    x = make((1, 4, 6, 6), torch.float16, True, 1)
    w = make((3, 4, 3, 3), torch.float16, False, 2)
    with pytest.raises(TypeError, match="^x is torch.bfloat16 and w is torch.float16: the kernels multiply one 16-bit"):
        cgt._conv2d(x.bfloat16(), w, None, 1, 0, 1)
    with pytest.raises(TypeError, match="^w must be float16, bfloat16, float32 or float64, got torch.int32"):
        cgt._conv2d(x, w.to(torch.int32), None, 1, 0, 1)
    with pytest.raises(ValueError, match="input channels"):
        cgt._conv2d(x, make((3, 2, 3, 3), torch.float16, False, 2), None, 1, 0, 1)
    with pytest.raises(ValueError, match="bias must have shape"):
        cgt._conv2d(x, w, make((4,), torch.float16, False, 3), 1, 0, 1)
    with pytest.raises(ValueError, match="4-D"):
        cgt._conv2d(x[0, 0], w, None, 1, 0, 1)
    with pytest.raises(ValueError, match="output height"):
        cgt._conv2d(x, make((3, 4, 9, 3), torch.float16, False, 2), None, 1, 0, 1)
    with pytest.raises(TypeError, match="^w must be a torch.Tensor, got NoneType"):
        cgt._conv2d(x, None, None, 1, 0, 1)
    with pytest.raises(TypeError, match="^x must be a torch.Tensor, got ndarray"):
        cgt._conv2d(x.detach().numpy(), w, None, 1, 0, 1)
    with pytest.raises(ValueError, match="^stride must be an integer, got 1.5"):
        cgt._conv2d(x, w, None, 1.5, 0, 1)


# --------------------------------------------------------------------------- the nn.Conv2d drop-in


@pytest.mark.parametrize("args, kwargs", [
    ((3, 16, 3), dict(padding=1)),
    ((8, 12, (3, 5)), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), bias=False)),
    ((4, 4, 4), dict(padding="same")),
    ((4, 4, 3), dict(padding="valid")),
])
def test_module_is_a_drop_in(fake, args, kwargs):
    torch.manual_seed(0)
    ref = nn.Conv2d(*args, **kwargs)
    torch.manual_seed(0)
    ours = cgt.Conv2d(*args, **kwargs)
    assert isinstance(ours, nn.Conv2d)
    assert list(ours.state_dict()) == list(ref.state_dict())
    for key, value in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), f"{key}: same seed must give the same init"
    torch.manual_seed(1)
    other = nn.Conv2d(*args, **kwargs)
    ours.load_state_dict(other.state_dict())
    ref.load_state_dict(ours.state_dict())  # and back
    x = torch.randn(2, args[0], 12, 11)
    # The module refuses CPU input; drive the same arguments through the CPU-testable core.
    y = cgt._conv2d(x, ours.weight, ours.bias, ours.stride, ours.padding, ours.dilation)
    want = F.conv2d(x.half().double(), other.weight.half().double(),
                    None if other.bias is None else other.bias.double(),
                    other.stride, other.padding, other.dilation)
    assert y.shape == want.shape
    assert rel_err(y, want) <= 1e-6


def test_import_convgen_does_not_import_torch():
    code = "import sys, convgen, convgen.cli, convgen.planner, convgen.emit; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, "import convgen must not load torch"


# --------------------------------------------------------------------------- operators and torch.compile


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_operators_pass_torch_library_opcheck(fake, dtype):
    """Schema, fake implementations (shapes, dtypes, strides) and autograd registration, as
    torch.library.opcheck checks them, on each of the three operators."""
    x = make((2, 4, 7, 7), dtype, True, 1)
    w = make((6, 4, 3, 3), dtype, False, 2)
    b = make((6,), torch.float32, False, 3)
    gy = make((2, 6, 4, 4), dtype, True, 4, requires_grad=False)
    geo = ([2, 2], [1, 1], [1, 1], 1)  # stride, padding, dilation, groups
    torch.library.opcheck(torch.ops.convgen.conv2d.default, (x, w, b, *geo))
    torch.library.opcheck(torch.ops.convgen.conv2d_dgrad.default, (gy, w.detach(), [2, 4, 7, 7], dtype, *geo))
    torch.library.opcheck(torch.ops.convgen.conv2d_wgrad.default,
                          (gy, x.detach(), [6, 4, 3, 3], dtype, torch.float32, *geo))
    assert set(fake.in_dtypes) == {str(dtype).replace("torch.", "")}


def test_torch_compile_fullgraph_traces_forward_and_backward(fake):
    """One graph, no break: fullgraph=True raises on any graph break, and the compiled
    forward and backward must call convgen's operators and match the reference."""
    torch._dynamo.reset()
    layer = cgt.Conv2d(4, 6, 3, padding=1).double()
    x = make((2, 4, 7, 7), torch.float64, False, 1)

    def step(x):
        return cgt._conv2d(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation).relu().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(x)
    loss.backward()
    loss = loss.detach()
    xr = x.detach().half().double().requires_grad_()
    wr = layer.weight.detach().half().double().requires_grad_()
    br = layer.bias.detach().float().double().requires_grad_()
    ref = F.conv2d(xr, wr, br, 1, 1).relu().sum()
    ref.backward()
    ref = ref.detach()
    assert abs(loss.item() - ref.item()) <= 1e-6 * abs(ref.item())
    assert rel_err(x.grad, xr.grad) <= 1e-6 and rel_err(layer.weight.grad, wr.grad) <= 1e-6
    assert len(fake.calls["conv2d"]) == 1 and len(fake.calls["dgrad"]) == 1 and len(fake.calls["wgrad"]) == 1


def test_precompile_prepares_every_op_a_step_launches_and_runs_nothing(fake, monkeypatch):
    """One forward, no kernel: the first layer's input needs no gradient (no dgrad), the
    bias-free layer's wgrad has no db; the step after it builds no op of its own and is
    right; batch norm's statistics and the train/eval mode are as they were."""
    # The module refuses CPU input: its forward runs the CPU-testable core here.
    monkeypatch.setattr(cgt.Conv2d, "_conv_forward",
                        lambda self, i, w, b: cgt._conv2d(i, w, b, self.stride, self.padding, self.dilation))
    torch.manual_seed(0)
    model = nn.Sequential(
        cgt.Conv2d(3, 8, 3, padding="same"), nn.BatchNorm2d(8), nn.ReLU(),
        cgt.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.ReLU(), cgt.Conv2d(16, 4, 1),
    ).to(memory_format=CL)
    x = make((2, 3, 10, 10), torch.float32, True, 1, requires_grad=False)
    stats = model[1].running_mean.clone(), model[1].running_var.clone()
    assert cgt.precompile(model, x) == 8
    assert fake.batches == [8] and not any(fake.calls.values()), "precompile must launch nothing"
    assert model.training and torch.equal(model[1].running_mean, stats[0]) and torch.equal(model[1].running_var, stats[1])
    assert sorted(p for p, *_ in fake.prepared) == ["dgrad", "dgrad", "fprop", "fprop", "fprop", "wgrad", "wgrad", "wgrad"]
    assert [b for p, _, _, b in fake.prepared if p == "wgrad"] == [True, False, True]
    assert cgt.precompile(model, x) == 8 and fake.batches == [8, 0], "a second precompile finds every op ready"
    built = len(fake.prepared)
    y = model(x)
    y.backward(torch.ones_like(y))
    assert len(fake.prepared) == built, "the step after precompile must find every op it launches"
    assert len(fake.calls["conv2d"]) == 3 and len(fake.calls["dgrad"]) == 2 and len(fake.calls["wgrad"]) == 3
    ref = nn.Sequential(nn.Conv2d(3, 8, 3, padding="same"), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.ReLU(), nn.Conv2d(16, 4, 1))
    ref.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
    model[1].running_mean.copy_(stats[0])  # both nets' batch norms start where precompile left them
    assert rel_err(y, ref.double()(x.half().double())) <= 5e-3


def test_calls_with_nothing_to_differentiate_skip_the_autograd_function(fake, monkeypatch):
    """Under no_grad, or with no operand that requires grad, the forward runs the kernel
    directly (the Function's apply is host time for nothing) and gives the same y; anything
    that records a graph still goes through the Function."""
    x = make((2, 4, 7, 7), torch.float16, True, 1, requires_grad=False)
    w = make((6, 4, 3, 3), torch.float16, False, 2, requires_grad=False)
    b = make((6,), torch.float16, False, 3, requires_grad=False)
    want = cgt._conv2d(x, w, b, 1, 1, 1)
    applied = []
    real_apply = cgt._EagerConv2d.apply
    monkeypatch.setattr(cgt._EagerConv2d, "apply", lambda *a: applied.append(1) or real_apply(*a))
    assert torch.equal(cgt._conv2d(x, w, b, 1, 1, 1), want) and not applied
    with torch.no_grad():
        assert torch.equal(cgt._conv2d(x, w.requires_grad_(), b, 1, 1, 1), want) and not applied
    y = cgt._conv2d(x, w, b, 1, 1, 1)
    assert applied and y.grad_fn is not None and torch.equal(y.detach(), want)


# --------------------------------------------------------------------------- the fast path

FAST = [  # (N, C, H, W), (K, R, S), stride, padding, dilation
    ((2, 8, 9, 11), (16, 3, 3), 1, 1, 1),
    ((2, 8, 10, 7), (8, 3, 2), (2, 1), (1, 0), (1, 2)),
    ((1, 16, 8, 8), (8, 1, 1), 2, 0, 1),
]


def _listed(v):
    return [v, v] if isinstance(v, int) else list(v)


@pytest.mark.parametrize("dtype, b_dtype", [(torch.float16, None), (torch.float16, torch.float16),
                                            (torch.float16, torch.float32), (torch.bfloat16, None),
                                            (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)], ids=str)
@pytest.mark.parametrize("geo", FAST, ids=lambda g: f"{g[0]}-{g[1]}-s{g[2]}-p{g[3]}-d{g[4]}")
def test_repeat_calls_of_a_channels_last_half_signature_take_the_fast_path(fake, monkeypatch, geo, dtype, b_dtype):
    """From its first call on, a signature whose operands the kernels read as they are
    (channels_last float16, or bfloat16) runs through its FastConv: a repeat call checks nothing,
    converts nothing and builds no op, and forward and backward give what the general path
    (list arguments never make a signature) gives, bit for bit, which is the reference.
    A float32 bias's backward is the exception: db float32 beside a 16-bit dw is not one
    kernel's output, so it takes the general path (and still launches once per pass)."""
    (n, c, h, wd), (k, r, s), stride, padding, dilation = geo
    x = make((n, c, h, wd), dtype, True, 1)
    w = make((k, c, r, s), dtype, True, 2)
    b = None if b_dtype is None else make((k,), b_dtype, False, 3)
    p = (h + 2 * _listed(padding)[0] - _listed(dilation)[0] * (r - 1) - 1) // _listed(stride)[0] + 1
    q = (wd + 2 * _listed(padding)[1] - _listed(dilation)[1] * (s - 1) - 1) // _listed(stride)[1] + 1
    gy = make((n, k, p, q), dtype, True, 4, requires_grad=False)

    def run(*geometry):
        xx, ww = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        bb = None if b is None else b.detach().clone().requires_grad_()
        y = cgt._conv2d(xx, ww, bb, *geometry)
        y.backward(gy)
        return [y.detach(), xx.grad, ww.grad] + ([] if bb is None else [bb.grad])

    first = run(stride, padding, dilation)
    assert len(ctl.fast_calls) == 1, "a channels_last 16-bit call must leave its FastConv"
    built, launched = len(fake.prepared), {name: len(v) for name, v in fake.calls.items()}
    with monkeypatch.context() as m:
        m.setattr(cgt, "_check_operands", lambda *a: pytest.fail("a repeat call ran the checks"))
        if b_dtype != torch.float32:  # (an fp32 db beside an fp16 dw: the backward takes the general path)
            m.setattr(ctl, "_dense_half", lambda *a: pytest.fail("a repeat call converted an operand"))
        repeat = run(stride, padding, dilation)
    assert len(fake.prepared) == built, "a repeat call built an op"
    assert {name: len(v) - launched[name] for name, v in fake.calls.items()} == {
        "conv2d": 1, "dgrad": 1, "wgrad": 1}, "one launch per pass (db comes with wgrad)"
    want_b = None if b_dtype is None else str(b_dtype).replace("torch.", "")
    assert fake.calls["conv2d"][-1]["bias_dtype"] == want_b, "the bias reaches the kernel in its own dtype, uncast"
    general = run(_listed(stride), _listed(padding), _listed(dilation))
    ref = reference_grads(x, w, b, gy, stride, padding, dilation)
    for i, (a, e, f) in enumerate(zip(first, repeat, general)):
        assert a.dtype == f.dtype and a.stride() == f.stride(), (i, a.dtype, f.dtype, a.stride(), f.stride())
        assert torch.equal(a, e) and torch.equal(a, f), f"output {i} differs between the paths"
        assert rel_err(a, ref[i]) <= tol(dtype), f"output {i} against the reference"
    assert set(fake.in_dtypes) == {str(dtype).replace("torch.", "")}


def test_the_fast_path_hands_off_what_it_cannot_read_as_it_is(fake):
    """A FastConv's call with a misaligned view of x, and its backward with a gradient in
    NCHW memory (what ``(y * g).sum()`` gives for a contiguous g), take the general path's
    conversions and still give the reference; neither leaves the signature's fast path."""
    (n, c, h, wd), (k, r, s) = (2, 5, 9, 11), (8, 3, 3)
    base = make((n + 1, c, h, wd), torch.float16, True, 1, requires_grad=False)
    x = base[1:]  # the same strides as a dense tensor, but 990 bytes in: off a 16-byte boundary
    assert x.stride() == ctl._cl_strides(x.shape) and x.data_ptr() % 16
    w = make((k, c, r, s), torch.float16, True, 2)
    b = make((k,), torch.float16, False, 3)
    dense = x.clone(memory_format=CL)
    cgt._conv2d(dense, w, b, 1, 1, 1)  # leaves the signature's FastConv (x's signature is the same)
    assert len(ctl.fast_calls) == 1
    gy = make((n, k, h, wd), torch.float16, False, 4, requires_grad=False)  # NCHW memory
    xx = x.detach().requires_grad_()
    y = cgt._conv2d(xx, w, b, 1, 1, 1)
    y.backward(gy)
    ref = reference_grads(x, w, b, gy, 1, 1, 1)
    for name, got, want in (("y", y, ref[0]), ("dx", xx.grad, ref[1]), ("dw", w.grad, ref[2]), ("db", b.grad, ref[3])):
        assert rel_err(got, want) <= tol(torch.float16), name
    assert len(ctl.fast_calls) == 1


def test_a_signatures_fast_path_is_never_taken_by_another_layout_or_dtype(fake):
    """The FastConv kept for a channels_last float16 call is keyed by strides and dtypes too:
    the same shapes in NCHW memory, in float32, or with a float32 bias beside a float16 one,
    each take their own way and give the reference, never the kept FastConv's reading."""
    x = make((2, 8, 9, 11), torch.float16, True, 1, requires_grad=False)
    w = make((16, 8, 3, 3), torch.float16, True, 2, requires_grad=False)
    b = make((16,), torch.float16, False, 3, requires_grad=False)
    cgt._conv2d(x, w, b, 1, 1, 1)
    assert len(ctl.fast_calls) == 1
    for name, xx, ww, bb in (("nchw x", x.contiguous(), w, b), ("fp32 x", x.float(), w, b),
                             ("nchw w", x, w.contiguous(), b), ("fp32 bias", x, w, b.float())):
        y = cgt._conv2d(xx, ww, bb, 1, 1, 1)
        ref = reference_grads(xx, ww, bb, torch.zeros_like(y, dtype=torch.float64), 1, 1, 1)[0]
        assert rel_err(y, ref) <= tol(y.dtype), name
    kept = {id(f) for f in ctl.fast_calls.values()}
    assert len(kept) == len(ctl.fast_calls), "each signature has a FastConv of its own"


# --------------------------------------------------------------------------- depthwise (groups = C)

DEPTHWISE = [  # (N, C, H, W), (K, R, S), stride, padding, dilation: K a multiple of C, groups = C
    ((2, 8, 9, 11), (8, 3, 3), 1, 1, 1),
    ((2, 4, 10, 7), (8, 3, 2), (2, 1), (1, 0), (1, 2)),  # channel multiplier 2
    ((1, 6, 8, 8), (6, 5, 5), 1, "same", 1),
    ((2, 5, 12, 9), (15, 4, 3), 2, 1, 1),  # multiplier 3, even R
    ((3, 1, 6, 6), (2, 3, 3), 1, 1, 1),  # C = 1: groups = 1 is depthwise too
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("channels_last", [True, False], ids=["cl", "nchw"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("geo", DEPTHWISE, ids=lambda g: f"{g[0]}-{g[1]}-s{g[2]}-p{g[3]}-d{g[4]}")
def test_depthwise_values_and_gradients(fake, geo, dtype, channels_last, bias):
    """groups = C reaches convgen.prepare (KRSC weights of one channel, groups=C) for all
    three passes, and y, dx, dw (shape (K, 1, R, S)) and db match F.conv2d with the same groups."""
    (n, c, h, wd), (k, r, s), stride, padding, dilation = geo
    x = make((n, c, h, wd), dtype, channels_last, 1)
    w = make((k, 1, r, s), dtype, False, 2)
    b = make((k,), dtype, False, 3) if bias else None
    y = cgt._conv2d(x, w, b, stride, padding, dilation, c)
    gy = make(tuple(y.shape), dtype, False, 4, requires_grad=False)
    y.backward(gy)
    yr, dxr, dwr, dbr = reference_grads(x, w, b, gy, stride, padding, dilation, c)
    assert y.dtype == dtype and y.shape == yr.shape and y.is_contiguous(memory_format=CL)
    assert rel_err(y, yr) <= tol(dtype)
    for name, t, ref in (("x", x, dxr), ("w", w, dwr), ("bias", b, dbr)):
        if t is None:
            continue
        assert t.grad is not None and t.grad.dtype == t.dtype and t.grad.shape == t.shape, name
        assert rel_err(t.grad, ref) <= tol(t.dtype), f"d{name}: {rel_err(t.grad, ref):.3g}"
    assert sorted(p for p, *_ in fake.prepared) == ["dgrad", "fprop", "wgrad"]
    assert all(ws == (k, r, s, 1) for _, _, ws, _ in fake.prepared), fake.prepared
    assert fake.groups == [c, c, c], "groups must reach convgen.prepare for every pass"


@pytest.mark.parametrize("geo", [((2, 8, 9, 11), (12, 3, 3), 1, 1, 1, 4), ((2, 12, 10, 7), (6, 3, 2), (2, 1), (1, 0), (1, 2), 3)],
                         ids=["g4", "g3-strided"])
def test_grouped_values_and_gradients(fake, geo):
    """Groups with several channels each reach convgen.prepare with (K, R, S, C/G) weights, and
    y, dx, dw (K, C/G, R, S) and db match F.conv2d with the same groups."""
    (n, c, h, wd), (k, r, s), stride, padding, dilation, g = geo
    x = make((n, c, h, wd), torch.float16, True, 1)
    w = make((k, c // g, r, s), torch.float16, False, 2)
    b = make((k,), torch.float16, False, 3)
    y = cgt._conv2d(x, w, b, stride, padding, dilation, g)
    gy = make(tuple(y.shape), torch.float16, False, 4, requires_grad=False)
    y.backward(gy)
    yr, dxr, dwr, dbr = reference_grads(x, w, b, gy, stride, padding, dilation, g)
    assert rel_err(y, yr) <= tol(torch.float16)
    for name, t, ref in (("x", x, dxr), ("w", w, dwr), ("bias", b, dbr)):
        assert t.grad.shape == t.shape and rel_err(t.grad, ref) <= tol(torch.float16), name
    assert all(ws == (k, r, s, c // g) for _, _, ws, _ in fake.prepared), fake.prepared
    assert fake.groups == [g, g, g]


def test_depthwise_fast_path_and_its_signature(fake, monkeypatch):
    """A channels_last float16 depthwise call leaves a FastConv whose repeat calls build and
    convert nothing and give the reference; the same shapes under another groups never take
    it (they are refused, as on their first call)."""
    x = make((2, 8, 9, 9), torch.float16, True, 1)
    w = make((16, 1, 3, 3), torch.float16, True, 2)
    b = make((16,), torch.float16, False, 3)
    gy = make((2, 16, 9, 9), torch.float16, True, 4, requires_grad=False)

    def run():
        xx, ww, bb = (t.detach().clone().requires_grad_() for t in (x, w, b))
        y = cgt._conv2d(xx, ww, bb, 1, 1, 1, 8)
        y.backward(gy)
        return [y.detach(), xx.grad, ww.grad, bb.grad]

    first = run()
    assert len(ctl.fast_calls) == 1
    built = len(fake.prepared)
    with monkeypatch.context() as m:
        m.setattr(cgt, "_check_operands", lambda *a: pytest.fail("a repeat call ran the checks"))
        m.setattr(ctl, "_dense_half", lambda *a: pytest.fail("a repeat call converted an operand"))
        repeat = run()
    assert len(fake.prepared) == built and fake.groups == [8] * built
    ref = reference_grads(x, w, b, gy, 1, 1, 1, 8)
    for i, (a, e) in enumerate(zip(first, repeat)):
        assert torch.equal(a, e), f"output {i} differs between the first call and the fast path"
        assert rel_err(a, ref[i]) <= tol(torch.float16), f"output {i} against the reference"
    with pytest.raises(ValueError, match="input channels"):
        cgt._conv2d(x, w, b, 1, 1, 1)  # groups=1 with a (K, 1, R, S) weight: not the depthwise FastConv


def test_depthwise_module_builds_nn_conv2ds_weight_and_runs(fake):
    torch.manual_seed(0)
    ref = nn.Conv2d(8, 16, 3, padding=1, groups=8)
    torch.manual_seed(0)
    ours = cgt.Conv2d(8, 16, 3, padding=1, groups=8)
    assert ours.groups == 8 and tuple(ours.weight.shape) == (16, 1, 3, 3)
    assert list(ours.state_dict()) == list(ref.state_dict())
    for key, value in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), f"{key}: same seed must give the same init"
    x = torch.randn(2, 8, 10, 9)
    # The module refuses CPU input; drive its own arguments through the CPU-testable core.
    y = cgt._conv2d(x, ours.weight, ours.bias, ours.stride, ours.padding, ours.dilation, ours.groups)
    want = F.conv2d(x.half().double(), ours.weight.half().double(), ours.bias.double(), 1, 1, 1, 8)
    assert rel_err(y, want) <= 1e-6
    assert cgt.Conv2d(4, 4, 3, groups=4, bias=False).weight.shape == (4, 1, 3, 3)


def test_module_forward_passes_its_groups_to_conv2d(monkeypatch):
    """Conv2d.forward hands its groups to conv2d, depthwise or dense (a stand-in input passes the
    CUDA check, which CPU tensors cannot; conv2d is a spy)."""
    seen = []
    monkeypatch.setattr(cgt, "conv2d", lambda *a: seen.append(a) or "y")

    class CudaInput:
        device = torch.device("cuda", 0)

    for layer, groups in ((cgt.Conv2d(6, 12, 3, padding=1, groups=6), 6), (cgt.Conv2d(6, 12, 3), 1)):
        seen.clear()
        assert layer(CudaInput()) == "y"
        (args,) = seen
        assert args[1] is layer.weight and args[-1] == groups, args


@pytest.mark.parametrize("args, kwargs, match", [
    ((6, 8, 3), dict(groups=4), "groups=4 must divide the 6 channels of in_channels"),
    ((8, 12, 3), dict(groups=8), "groups=8 must divide the 12 channels of out_channels"),
    ((8, 12, 3), dict(groups=0), "groups must be a positive integer"),
])
def test_groupings_that_do_not_divide_the_channels_are_refused(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cgt.Conv2d(*args, **kwargs)


def test_bad_groups_are_refused_by_the_functional_and_after_init(fake):
    x = make((1, 8, 6, 6), torch.float16, True, 1)
    with pytest.raises(ValueError, match=r"groups=3 must divide the 8 channels of x.shape\[1\]"):
        cgt._conv2d(x, make((9, 3, 3, 3), torch.float16, False, 2), None, 1, 1, 1, 3)
    with pytest.raises(ValueError, match=r"groups=8 must divide the 12 channels of w.shape\[0\]"):
        cgt._conv2d(x, make((12, 1, 3, 3), torch.float16, False, 2), None, 1, 1, 1, 8)
    with pytest.raises(ValueError, match=r"with groups=8, w.shape\[1\] must be"):
        cgt._conv2d(x, make((8, 2, 3, 3), torch.float16, False, 2), None, 1, 1, 1, 8)
    with pytest.raises(ValueError, match="groups must be a positive integer"):
        cgt._conv2d(x, make((8, 1, 3, 3), torch.float16, False, 2), None, 1, 1, 1, 0)
    layer = cgt.Conv2d(8, 8, 3, groups=8)
    layer.groups = 3  # attributes can be changed after __init__: the forward checks again
    with pytest.raises(ValueError, match="groups=3"):
        layer(torch.randn(1, 8, 6, 6))
    assert not any(fake.calls.values()) and not fake.prepared


def test_depthwise_operators_pass_opcheck_and_their_fakes_give_the_shapes(fake):
    """The operators' schemas take groups; their fake implementations give depthwise shapes
    (dw as torch's (K, C/groups, R, S)) under FakeTensorMode and on meta tensors, matching
    what the implementations return (opcheck)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = make((2, 4, 7, 7), torch.float16, True, 1)
    w = make((8, 1, 3, 3), torch.float16, False, 2)
    b = make((8,), torch.float32, False, 3)
    gy = make((2, 8, 4, 4), torch.float16, True, 4, requires_grad=False)
    geo = ([2, 2], [1, 1], [1, 1], 4)
    for op in (torch.ops.convgen.conv2d, torch.ops.convgen.conv2d_dgrad, torch.ops.convgen.conv2d_wgrad):
        assert "int groups" in str(op.default._schema), op.default._schema
    torch.library.opcheck(torch.ops.convgen.conv2d.default, (x, w, b, *geo))
    torch.library.opcheck(torch.ops.convgen.conv2d_dgrad.default,
                          (gy, w.detach(), [2, 4, 7, 7], torch.float16, *geo))
    torch.library.opcheck(torch.ops.convgen.conv2d_wgrad.default,
                          (gy, x.detach(), [8, 1, 3, 3], torch.float16, torch.float32, *geo))
    mode = FakeTensorMode()
    fx, fw, fgy = (mode.from_tensor(t.detach()) for t in (x, w, gy))
    with mode:
        y = torch.ops.convgen.conv2d(fx, fw, None, *geo)
        dx = torch.ops.convgen.conv2d_dgrad(fgy, fw, [2, 4, 7, 7], torch.float16, *geo)
        dw, db = torch.ops.convgen.conv2d_wgrad(fgy, fx, [8, 1, 3, 3], torch.float16, torch.float32, *geo)
    assert tuple(y.shape) == (2, 8, 4, 4) and tuple(dx.shape) == (2, 4, 7, 7)
    assert tuple(dw.shape) == (8, 1, 3, 3) and tuple(db.shape) == (8,) and db.dtype == torch.float32
    mx = torch.empty((3, 6, 9, 9), dtype=torch.float16, device="meta")
    mw = torch.empty((12, 1, 3, 3), dtype=torch.float16, device="meta")
    my = torch.ops.convgen.conv2d(mx, mw, None, [1, 1], [1, 1], [1, 1], 6)
    assert tuple(my.shape) == (3, 12, 9, 9) and my.is_contiguous(memory_format=CL)


def test_depthwise_torch_compile_fullgraph(fake):
    """A depthwise layer under torch.compile(fullgraph=True): one graph through the operators
    with groups, forward and backward right."""
    torch._dynamo.reset()
    layer = cgt.Conv2d(4, 8, 3, padding=1, groups=4).double()
    x = make((2, 4, 7, 7), torch.float64, False, 1)

    def step(x):
        return cgt._conv2d(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation,
                           layer.groups).relu().sum()

    loss = torch.compile(step, fullgraph=True, backend="aot_eager")(x)
    loss.backward()
    xr = x.detach().half().double().requires_grad_()
    wr = layer.weight.detach().half().double().requires_grad_()
    br = layer.bias.detach().float().double().requires_grad_()
    ref = F.conv2d(xr, wr, br, 1, 1, 1, 4).relu().sum()
    ref.backward()
    assert abs(loss.item() - ref.item()) <= 1e-6 * abs(ref.item())
    assert rel_err(x.grad, xr.grad) <= 1e-6 and rel_err(layer.weight.grad, wr.grad) <= 1e-6
    assert rel_err(layer.bias.grad, br.grad) <= 1e-6
    assert len(fake.calls["conv2d"]) == 1 and len(fake.calls["dgrad"]) == 1 and len(fake.calls["wgrad"]) == 1
    assert fake.groups == [4, 4, 4]


def test_precompile_prepares_a_depthwise_layers_ops_with_its_groups(fake, monkeypatch):
    monkeypatch.setattr(cgt.Conv2d, "_conv_forward", lambda self, i, w, b: cgt._conv2d(
        i, w, b, self.stride, self.padding, self.dilation, self.groups))
    model = nn.Sequential(cgt.Conv2d(3, 8, 1), nn.ReLU(), cgt.Conv2d(8, 8, 3, padding=1, groups=8))
    x = make((2, 3, 8, 8), torch.float32, True, 1, requires_grad=False)
    assert cgt.precompile(model, x) == 5  # the first layer's input needs no dx
    assert sorted(zip(fake.groups, (p for p, *_ in fake.prepared))) == [
        (1, "fprop"), (1, "wgrad"), (8, "dgrad"), (8, "fprop"), (8, "wgrad")]
    built = len(fake.prepared)
    y = model(x)
    y.sum().backward()
    assert len(fake.prepared) == built, "the step after precompile must find every op it launches"


# --------------------------------------------------------------------------- examples/train_step.py's steps


def _train_step_example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "train_step.py"
    spec = importlib.util.spec_from_file_location("train_step_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")  # torch's own, under torch.compile
def test_train_step_example_modes_take_the_same_steps(fake, monkeypatch):
    """examples/train_step.py times three modes; each must be the same training step.  From
    the same weights on the same data, three SGD steps eagerly, with the model compiled, and
    with the forward+loss and the optimizer compiled (torch.compile's aot_eager backend on
    the CPU; fullgraph on the model and the forward, so a graph break at a convgen layer
    fails here) must give the same losses and parameters, and every step must run convgen's
    three passes."""
    monkeypatch.setattr(cgt.Conv2d, "_conv_forward", lambda self, i, w, b: cgt._conv2d(
        i, w, b, self.stride, self.padding, self.dilation, self.groups))
    example = _train_step_example()
    assert example.MODES == ("eager", "reduce-overhead", "compiled-step")

    def net():
        return nn.Sequential(cgt.Conv2d(3, 4, 3, padding="same"), nn.ReLU(), nn.MaxPool2d(2),
                             cgt.Conv2d(4, 6, 3, padding="same"), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 10)).double()

    torch.manual_seed(0)
    start = net().state_dict()
    x = make((4, 3, 8, 8), torch.float64, True, 1, requires_grad=False)
    labels = torch.randint(0, 10, (4,), generator=torch.Generator().manual_seed(2))

    def compile_fn(fn, *, fullgraph, optimizer):
        return torch.compile(fn, backend="aot_eager", fullgraph=fullgraph)

    results = {}
    for mode in example.MODES:
        torch._dynamo.reset()
        model = net()
        model.load_state_dict(start)
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        step = example.make_step(mode, model, opt, x, labels, 8.0, compile_fn)
        before = {k: len(v) for k, v in fake.calls.items()}
        losses = [float(step()) for _ in range(3)]
        ran = {k: len(v) - before[k] for k, v in fake.calls.items()}
        # two layers a step: two forwards and wgrads, one dgrad (the input needs no gradient)
        assert ran == {"conv2d": 6, "dgrad": 3, "wgrad": 6}, (mode, ran)
        results[mode] = losses, [p.detach().clone() for p in model.parameters()]
    want_losses, want_params = results["eager"]
    moved = [rel_err(p, start[k]) for p, k in zip(want_params, start)]
    assert min(moved) > 1e-3, f"three SGD steps must move every parameter: {moved}"
    for mode in example.MODES[1:]:
        losses, params = results[mode]
        assert losses == pytest.approx(want_losses, rel=1e-12), mode
        for (k, p), q in zip(zip(start, params), want_params):
            assert rel_err(p, q) <= 1e-12, (mode, k)
    with pytest.raises(ValueError, match="mode must be one of"):
        example.make_step("max-autotune", net(), opt, x, labels, 8.0, compile_fn)


def test_bfloat16_model_tensors_reach_the_kernels_as_they_are(fake):
    """A channels_last bfloat16 x and weight go to bfloat16 kernels with no copy; a float32
    weight beside a bfloat16 x is rounded to bfloat16 (x decides the output: bfloat16), and
    its gradient comes back float32."""
    x = make((2, 8, 6, 6), torch.bfloat16, True, 1, requires_grad=False)
    w = make((4, 8, 3, 3), torch.bfloat16, False, 2, requires_grad=False).contiguous(memory_format=CL)
    y = cgt._conv2d(x, w, None, 1, 1, 1)
    call = fake.calls["conv2d"][0]
    assert (call["x_ptr"], call["w_ptr"], call["in_dtype"]) == (x.data_ptr(), w.data_ptr(), "bfloat16")
    assert y.dtype == torch.bfloat16 and call["out_dtype"] == "bfloat16"
    xr = make((2, 8, 6, 6), torch.bfloat16, True, 3)
    w32 = make((4, 8, 3, 3), torch.float32, False, 4)
    y = cgt._conv2d(xr, w32, None, 1, 1, 1)
    assert y.dtype == torch.bfloat16 and fake.calls["conv2d"][-1]["in_dtype"] == "bfloat16"
    ref = F.conv2d(xr.detach().double(), w32.detach().bfloat16().double(), None, 1, 1)
    assert rel_err(y, ref) <= tol(torch.bfloat16)
    y.float().sum().backward()
    assert (xr.grad.dtype, w32.grad.dtype) == (torch.bfloat16, torch.float32)
    assert fake.calls["wgrad"][-1]["out_dtype"] == "float32"


def test_bfloat16_precompile_prepares_the_ops_a_step_launches(fake, monkeypatch):
    """precompile() of a bfloat16 model keys its ops with their 16-bit type, so the step after
    it builds none."""
    monkeypatch.setattr(cgt.Conv2d, "_conv_forward", lambda self, i, w, b: cgt._conv2d(
        i, w, b, self.stride, self.padding, self.dilation, self.groups))
    model = nn.Sequential(cgt.Conv2d(4, 8, 3, padding=1), nn.ReLU(), cgt.Conv2d(8, 8, 1)).to(torch.bfloat16)
    x = make((2, 4, 8, 8), torch.bfloat16, True, 1, requires_grad=False)
    assert cgt.precompile(model, x) == 5
    assert set(fake.in_dtypes) == {"bfloat16"}
    built = len(fake.prepared)
    model(x).float().sum().backward()
    assert len(fake.prepared) == built, "the step after precompile must find every op it launches"


# --------------------------------------------------------------------------- autocast


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16], ids=str)
def test_autocast_runs_the_kernels_in_the_autocast_type(fake, monkeypatch, dt):
    """Under CUDA autocast (simulated: the CPU build has none) the operands go to the kernels
    in the autocast type, float16 or bfloat16, as nn.Conv2d's would: the output has it, the
    gradients come back in each parameter's own dtype, and the convolution itself runs with
    autocast off.  A float64 operand is left as it is, as autocast leaves it."""
    state = {"on": True, "inside": []}
    monkeypatch.setattr(cgt, "_autocasting", lambda: state["on"])
    monkeypatch.setattr(cgt, "_autocast_dtype", lambda: dt)

    import contextlib

    @contextlib.contextmanager
    def off():
        state["on"] = False
        try:
            yield
        finally:
            state["on"] = True

    real_as_is = cgt._conv2d_as_is

    def as_is(*args):
        state["inside"].append(state["on"])
        return real_as_is(*args)

    monkeypatch.setattr(cgt, "_autocast_off", off)
    monkeypatch.setattr(cgt, "_conv2d_as_is", as_is)
    x = make((2, 8, 6, 6), torch.float32, True, 1)
    w = make((4, 8, 3, 3), torch.float32, False, 2)
    b = make((4,), torch.float32, False, 3)
    y = cgt._conv2d(x, w, b, 1, 1, 1)
    assert y.dtype == dt and state["inside"] == [False], "the convolution must run in dt with autocast off"
    gy = make(tuple(y.shape), dt, True, 4, requires_grad=False)
    y.backward(gy)
    assert (x.grad.dtype, w.grad.dtype, b.grad.dtype) == (torch.float32,) * 3
    name = str(dt).replace("torch.", "")
    assert fake.in_dtypes == [name] * 3 and fake.calls["conv2d"][0]["bias_dtype"] == name
    yr, dxr, dwr, dbr = reference_grads(x.detach().to(dt), w.detach().to(dt), b.detach().to(dt), gy, 1, 1, 1)
    assert rel_err(y, yr) <= tol(dt) and rel_err(x.grad, dxr) <= tol(dt) and rel_err(w.grad, dwr) <= tol(dt)
    x64 = make((2, 8, 6, 6), torch.float64, True, 5, requires_grad=False)
    assert cgt._conv2d(x64, w.detach(), None, 1, 1, 1).dtype == torch.float64  # float64 is not autocast
    assert fake.in_dtypes[-1] == name  # w was, so the kernels multiply dt
