"""The NumPy bridge the CPU tests of convgen.torch run on (tests/test_torch_*cpu.py).

The CuPy bridge of convgen.torch (three functions) is swapped for a NumPy one and
convgen's three run-time functions for the float64 NumPy reference, wrapped in
checks of the run-time contract (NHWC / KRSC, dense 16-bit operands of the op's type, a
float32 or 16-bit bias, explicit symmetric padding).  tests/conftest.py's ``fake`` fixture
installs it; the test modules import the helpers from here.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

import convgen
import convgen.torch_launch as ctl
from convgen import reference

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
                # convgen.torch hands 16-byte-aligned memory only (a real launch refuses what
                # its kernel's vector accesses cannot read, and convgen.torch copies such views)
                assert not any(p % 16 for p in (a, b, bias, *out)), "a pointer off a 16-byte boundary"
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


def install(monkeypatch) -> FakeKernels:
    """convgen.torch on the NumPy bridge for one test (tests/conftest.py's ``fake`` fixture)."""
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
    monkeypatch.setattr(ctl, "operator_calls", {})
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
    """(y, dx, dw, db) of F.conv2d in float64 on the values the kernels see: x, w and dy
    rounded to the call's 16-bit type (bfloat16 where x or w is), the bias to float32.  Any
    device: the GPU tests use it too."""
    elem = torch.bfloat16 if torch.bfloat16 in (x.dtype, w.dtype) else torch.float16
    xr = x.detach().to(elem).double().requires_grad_()
    wr = w.detach().to(elem).double().requires_grad_()
    br = None if b is None else b.detach().float().double().requires_grad_()
    yr = F.conv2d(xr, wr, br, stride, padding, dilation, groups)
    yr.backward(gy.detach().to(elem).double())
    return yr.detach(), xr.grad, wr.grad, None if br is None else br.grad

