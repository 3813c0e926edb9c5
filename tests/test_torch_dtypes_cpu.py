"""convgen.torch's 16-bit types and its training step without a GPU, on the NumPy bridge
(tests/torch_fake.py): bfloat16 models, autocast's cast, and examples/train_step.py's three
modes.  Skipped when torch is not installed.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import convgen.torch as cgt  # noqa: E402
from torch_fake import CL, make, reference_grads, rel_err, tol  # noqa: E402

# F.conv2d's own note that an even-kernel 'same' reference pads a copy of its input.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")


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

