"""convgen.torch without a GPU: everything but the kernels, on the NumPy bridge (tests/torch_fake.py).

What is left is convgen.torch's own logic: layouts, dtype policy, 'same' padding, unbatched
inputs, which gradients are computed, the nn.Conv2d drop-in, the operators and the fast
path; each is checked against F.conv2d in float64.  Groups and depthwise layers are in
test_torch_groups_cpu.py; bfloat16 models, autocast and the training-step example in
test_torch_dtypes_cpu.py.  Skipped when torch is not installed.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import convgen.torch as cgt  # noqa: E402
import convgen.torch_launch as ctl  # noqa: E402
from torch_fake import CL, make, reference_grads, rel_err, tol  # noqa: E402

# F.conv2d's own note that an even-kernel 'same' reference pads a copy of its input.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")


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


def test_backprop_through_the_gradient_operators_raises_and_never_skips(fake):
    """dgrad and wgrad have no derivative of their own: a graph through them (a double
    backward) must raise, not run on with their inputs' gradients missing."""
    w = make((6, 4, 3, 3), torch.float16, False, 2)
    gy = make((2, 6, 4, 4), torch.float16, True, 4, requires_grad=True)
    x = make((2, 4, 7, 7), torch.float16, True, 1)
    geo = ([2, 2], [1, 1], [1, 1], 1)
    dx = torch.ops.convgen.conv2d_dgrad(gy, w, [2, 4, 7, 7], torch.float16, *geo)
    with pytest.raises(RuntimeError, match="no derivative of their own"):
        dx.float().sum().backward()
    dw, _ = torch.ops.convgen.conv2d_wgrad(gy, x, [6, 4, 3, 3], torch.float16, None, *geo)
    with pytest.raises(RuntimeError, match="no derivative of their own"):
        dw.float().sum().backward()


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


