"""convgen.torch's grouped and depthwise layers without a GPU, on the NumPy bridge
(tests/torch_fake.py): values and gradients against F.conv2d in float64, the fast path, the
module, the operators and precompile.  Skipped when torch is not installed.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import convgen.torch as cgt  # noqa: E402
import convgen.torch_launch as ctl  # noqa: E402
from torch_fake import CL, make, reference_grads, rel_err, tol  # noqa: E402

# F.conv2d's own note that an even-kernel 'same' reference pads a copy of its input.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")


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


