"""convgen.torch's registered operators without a GPU, on the NumPy bridge (tests/torch_fake.py):
their fast path (a FastConv per call signature, as eager calls have) and their Autograd-key
kernels (straight to the implementation only when nothing sits between autograd and the
backend).  opcheck and torch.compile tracing are in test_torch_cpu.py.  Skipped when torch is
not installed.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import convgen.torch as cgt  # noqa: E402
import convgen.torch_launch as ctl  # noqa: E402
from torch_fake import make, reference_grads, rel_err, tol  # noqa: E402

OPS = torch.ops.convgen
GEO = ([2, 1], [1, 1], [1, 2], 1)  # stride, padding, dilation (lists: as traced graphs pass them), groups
X_SHAPE, W_SHAPE, Y_SHAPE = (2, 8, 9, 11), (16, 8, 3, 3), (2, 16, 5, 9)


def _operands(dtype, seed=1):
    x = make(X_SHAPE, dtype, True, seed, requires_grad=False)
    w = make(W_SHAPE, dtype, True, seed + 1, requires_grad=False)
    gy = make(Y_SHAPE, dtype, True, seed + 2, requires_grad=False)
    return x, w, gy


def _three(x, w, b, gy, b_dtype):
    """The three operators' outputs on these operands: y, dx, dw, db."""
    y = OPS.conv2d(x, w, b, *GEO)
    dx = OPS.conv2d_dgrad(gy, w, list(X_SHAPE), x.dtype, *GEO)
    dw, db = OPS.conv2d_wgrad(gy, x, list(W_SHAPE), w.dtype, b_dtype, *GEO)
    return y, dx, dw, db


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_operators_on_channels_last_half_operands_take_a_fastconv(fake, monkeypatch, dtype, with_bias):
    """From their first call on, the operators on channels_last 16-bit operands run through a
    FastConv: a repeat call converts nothing and builds no op, launches once per pass, and
    gives what the implementations give, bit for bit, which is the reference."""
    x, w, gy = _operands(dtype)
    b = make((W_SHAPE[0],), dtype, False, 5, requires_grad=False) if with_bias else None
    b_dtype = dtype if with_bias else None
    first = _three(x, w, b, gy, b_dtype)
    assert sum(f is not None for f in ctl.operator_calls.values()) == 3, "one FastConv per operator's signature"
    built, launched = len(fake.prepared), {name: len(v) for name, v in fake.calls.items()}
    with monkeypatch.context() as m:
        m.setattr(ctl, "_dense_half", lambda *a: pytest.fail("a repeat call converted an operand"))
        for impl in ("_fprop_impl", "_dgrad_impl", "_wgrad_impl"):
            m.setattr(cgt, impl, lambda *a, impl=impl: pytest.fail(f"a repeat call took {impl}"))
        repeat = _three(x, w, b, gy, b_dtype)
    assert len(fake.prepared) == built, "a repeat call built an op"
    assert {name: len(v) - launched[name] for name, v in fake.calls.items()} == {"conv2d": 1, "dgrad": 1, "wgrad": 1}
    general = (ctl._fprop_impl(x, w, b, *GEO), ctl._dgrad_impl(gy, w, X_SHAPE, dtype, *GEO),
               *ctl._wgrad_impl(gy, x, W_SHAPE, dtype, b_dtype, *GEO))
    ref = reference_grads(x, w, b, gy, *GEO[:3])
    for i, (a, e, f) in enumerate(zip(first, repeat, general)):
        assert a.shape == f.shape and a.dtype == f.dtype and a.stride() == f.stride(), (i, a.shape, f.shape)
        assert torch.equal(a, e) and torch.equal(a, f), f"output {i} differs between the paths"
        if i < 3 or with_bias:
            assert rel_err(a, ref[i]) <= tol(dtype), f"output {i} against the reference"
    assert first[3].shape == ((W_SHAPE[0],) if with_bias else (0,))


@pytest.mark.parametrize("groups, k", [(4, 8), (8, 16)], ids=["groups4", "depthwise-x2"])
def test_grouped_operators_take_a_fastconv_and_give_the_reference(fake, groups, k):
    """A grouped (and a depthwise, channel multiplier 2) layer's operators on channels_last
    float16: FastConvs that keep the groups, and the grouped reference."""
    c, (n, h, wd) = 8, (2, 9, 7)
    x = make((n, c, h, wd), torch.float16, True, 21, requires_grad=False)
    w = make((k, c // groups, 3, 3), torch.float16, True, 22, requires_grad=False)
    geo = ([1, 1], [1, 1], [1, 1], groups)
    gy = make((n, k, h, wd), torch.float16, True, 23, requires_grad=False)
    ref = reference_grads(x, w, None, gy, 1, 1, 1, groups)
    for _ in range(2):  # the first call builds the FastConvs, the second takes them
        y = OPS.conv2d(x, w, None, *geo)
        dx = OPS.conv2d_dgrad(gy, w, [n, c, h, wd], torch.float16, *geo)
        dw, _ = OPS.conv2d_wgrad(gy, x, [k, c // groups, 3, 3], torch.float16, None, *geo)
        for name, got, want in (("y", y, ref[0]), ("dx", dx, ref[1]), ("dw", dw, ref[2])):
            assert got.shape == want.shape and rel_err(got, want) <= tol(torch.float16), name
    assert sum(f is not None for f in ctl.operator_calls.values()) == 3
    assert set(fake.groups) == {groups}


def test_operators_hand_off_what_the_fast_path_cannot_read_as_it_is(fake):
    """float32 x, a float32 gradient asked for, float32 or NCHW operands, a float32 bias's db, a
    misaligned view: each operator call takes the implementations (such a signature keeps no
    FastConv, or its FastConv hands off) and gives the reference, in the dtype asked for."""
    x, w, gy = _operands(torch.float16, seed=7)
    b32 = make((W_SHAPE[0],), torch.float32, False, 9, requires_grad=False)
    ref = reference_grads(x, w, b32, gy, *GEO[:3])
    y = OPS.conv2d(x.float(), w, None, *GEO)
    assert y.dtype == torch.float32 and rel_err(y, reference_grads(x, w, None, gy, *GEO[:3])[0]) <= tol(torch.float16)
    assert list(ctl.operator_calls.values()) == [None], "a float32 x keeps no FastConv"
    dx = OPS.conv2d_dgrad(gy.contiguous(), w, list(X_SHAPE), torch.float16, *GEO)  # NCHW memory
    assert rel_err(dx, ref[1]) <= tol(torch.float16)
    dw, db = OPS.conv2d_wgrad(gy, x, list(W_SHAPE), torch.float16, torch.float32, *GEO)  # db float32
    assert db.dtype == torch.float32 and rel_err(dw, ref[2]) <= tol(torch.float16) and rel_err(db, ref[3]) <= 1e-3
    # the gradient of a float32 x or w, from float16 operands: float32 out, as the fake says
    dx = OPS.conv2d_dgrad(gy, w, list(X_SHAPE), torch.float32, *GEO)
    assert dx.dtype == torch.float32 and rel_err(dx, ref[1]) <= tol(torch.float16)
    dw, _ = OPS.conv2d_wgrad(gy, x, list(W_SHAPE), torch.float32, None, *GEO)
    assert dw.dtype == torch.float32 and rel_err(dw, ref[2]) <= tol(torch.float16)
    dx = OPS.conv2d_dgrad(gy, w.float(), list(X_SHAPE), torch.float16, *GEO)  # a float32 w: converted
    assert dx.dtype == torch.float16 and rel_err(dx, ref[1]) <= tol(torch.float16)
    dx = OPS.conv2d_dgrad(gy, w.contiguous(), list(X_SHAPE), torch.float16, *GEO)  # w in NCHW memory
    assert rel_err(dx, ref[1]) <= tol(torch.float16)
    dw, _ = OPS.conv2d_wgrad(gy, x.contiguous(), list(W_SHAPE), torch.float16, None, *GEO)  # x in NCHW memory
    assert rel_err(dw, ref[2]) <= tol(torch.float16)
    n, c, h, wd = X_SHAPE
    off = torch.empty(n * h * wd * c + 1, dtype=torch.float16)[1:].view(n, h, wd, c).permute(0, 3, 1, 2)
    off.copy_(make(X_SHAPE, torch.float16, True, 11, requires_grad=False))  # channels_last, 2 bytes off 16
    assert off.stride() == ctl._cl_strides(X_SHAPE) and off.data_ptr() % 16
    OPS.conv2d(off.clone(memory_format=torch.channels_last), w, None, *GEO)  # the signature's FastConv
    y = OPS.conv2d(off, w, None, *GEO)
    assert rel_err(y, reference_grads(off, w, None, gy, *GEO[:3])[0]) <= tol(torch.float16)


class _Seen(TorchDispatchMode):
    """A dispatch mode that notes the operators it sees, then runs them."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_autograd_kernels_go_straight_to_the_implementation_only_with_nothing_between(fake, monkeypatch):
    """With no gradient to record and plain tensors, the operators' Autograd-key kernels call
    the implementation with no redispatch; under a dispatch mode (as torch.compile's tracing
    and profilers use) they redispatch, so the mode sees each operator."""
    x, w, gy = _operands(torch.float16, seed=13)
    with monkeypatch.context() as m:
        m.setattr(cgt, "_below_autograd", lambda *a: pytest.fail("a plain call redispatched"))
        plain = _three(x, w, None, gy, None)
    with _Seen() as mode:
        moded = _three(x, w, None, gy, None)
    assert [s for s in mode.seen if s.startswith("convgen.")] == [
        "convgen.conv2d.default", "convgen.conv2d_dgrad.default", "convgen.conv2d_wgrad.default"]
    for a, b in zip(plain, moded):
        assert torch.equal(a, b)


def test_the_forward_operator_records_its_gradient_through_the_gradient_operators(fake):
    """Called where a gradient is recorded, convgen::conv2d's backward runs dgrad and wgrad
    (db with them), each once, and the gradients are the reference's."""
    x, w, gy = _operands(torch.float16, seed=17)
    b = make((W_SHAPE[0],), torch.float16, False, 19, requires_grad=False)
    xx, ww, bb = (t.detach().requires_grad_() for t in (x, w, b))
    launched = {name: len(v) for name, v in fake.calls.items()}
    y = OPS.conv2d(xx, ww, bb, *GEO)
    assert y.grad_fn is not None
    y.backward(gy)
    assert {name: len(v) - launched[name] for name, v in fake.calls.items()} == {"conv2d": 1, "dgrad": 1, "wgrad": 1}
    ref = reference_grads(x, w, b, gy, *GEO[:3])
    for name, got, want in (("y", y, ref[0]), ("dx", xx.grad, ref[1]), ("dw", ww.grad, ref[2]), ("db", bb.grad, ref[3])):
        assert rel_err(got, want) <= tol(torch.float16), name
