"""An RGB stem's channels padded to 4 (convgen/channel_pad.py), without a GPU: when the rule
pads, that the padded kernel is the vector one it pads for, and that the copy kernels are
emitted deterministically and compile cleanly with NVRTC. The GPU tier is
tests/test_channel_pad_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest

from convgen.channel_pad import MIN_X_BYTES, kernel_problem, pad_source, padded_channels
from convgen.ir import ConvProblem, Pass, Target
from convgen.mainloop import StagedHalo
from convgen.planner import make_spec
from convgen.suites import SUITES

STEM = ConvProblem(224, 224, 3, 64, 7, 7, 2, 3, 1, n=64)
H200 = Target("sm_90", sm_count=132)


@pytest.mark.parametrize("c", range(1, 17))
@pytest.mark.parametrize("pass_", list(Pass), ids=lambda p: p.value)
def test_fprop_and_wgrad_of_3_channels_pad_to_4(c, pass_):
    got = padded_channels(dataclasses.replace(STEM, c=c), pass_, "float16", H200)
    assert got == (4 if c == 3 and pass_ is not Pass.DGRAD else None)


def test_small_inputs_run_as_they_are():
    """CIFAR's stems (1.5 MB of x) ran slower padded: the copy's launch and pass cost more."""
    edge = MIN_X_BYTES // (224 * 224 * 3 * 2)
    assert padded_channels(dataclasses.replace(STEM, n=edge + 1), Pass.FPROP, "float16", H200) == 4
    assert padded_channels(dataclasses.replace(STEM, n=edge), Pass.FPROP, "float16", H200) is None
    assert padded_channels(ConvProblem(32, 32, 3, 16, 3, 3, 1, 1, 1, n=256), Pass.FPROP, "float16", H200) is None


@pytest.mark.parametrize("why, kwargs", [
    ("a hand plan", dict(plan=make_spec(STEM, Pass.FPROP, target=H200).plan)),
    ("the scalar path", dict(scalar=True)),
    ("float32 inputs (cast in the gather)", dict(in_dtype="float32")),
    ("sm_75 (no cp.async)", dict(target=Target("sm_75"))),
    ("a HIP target", dict(target=Target("gfx942"))),
])
def test_no_padding_where_the_caller_or_the_target_names_the_kernel(why, kwargs):
    args = dict(in_dtype="float16", target=H200) | kwargs
    assert padded_channels(STEM, Pass.FPROP, args.pop("in_dtype"), args.pop("target"), **args) is None, why


def test_bf16_pads_too():
    assert padded_channels(STEM, Pass.WGRAD, "bfloat16", Target("sm_80")) == 4


STEMS = [(s, l) for s, layers in SUITES.items() for l in layers
         if l.problem.c == 3 and l.problem.n * l.problem.h * l.problem.w * 6 >= MIN_X_BYTES]


@pytest.mark.parametrize("suite, layer", STEMS, ids=[f"{s}/{l.name}" for s, l in STEMS])
@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.WGRAD], ids=lambda p: p.value)
def test_every_imagenet_stem_runs_a_vector_kernel_once_padded(suite, layer, pass_):
    """The point of the copy: the padded kernel gathers x in 8-byte runs (the unpadded one
    reads it one fp16 at a time), and its other operand as it did.  A stride-1 stem's fprop
    is the exception: it runs the staged halo, unpadded (the next test)."""
    before = make_spec(layer.problem, pass_, target=H200).plan
    if pass_ is Pass.FPROP and isinstance(before.loop, StagedHalo):
        pytest.skip("a stride-1 stem's fprop stages its whole halo unpadded")
    x_vec = (lambda p: p.vec_a) if pass_ is Pass.FPROP else (lambda p: p.vec_b)  # wgrad: x is B
    assert x_vec(before) == 1
    kp = kernel_problem(layer.problem, pass_, "float16", H200)
    assert kp.c == 4 and dataclasses.replace(kp, c=layer.problem.c) == layer.problem
    plan = make_spec(kp, pass_, target=H200).plan
    assert x_vec(plan) == 4 and max(plan.vec_a, plan.vec_b) >= 4, plan.brief()


HALO_STEMS = {("vgg16", "conv1_1"), ("unet", "enc1a"), ("darknet53-down", "stem")}


@pytest.mark.parametrize("suite, layer", STEMS, ids=[f"{s}/{l.name}" for s, l in STEMS])
def test_stride_1_stems_run_fprop_on_the_staged_halo_unpadded(suite, layer):
    """The three stems the channel-pad probe timed on the staged halo ran 1.19-1.35x faster
    unpadded (H200 at b41f285): their fprop keeps 3 channels and the staged halo; the 7x7
    stride-2 stems (ResNet's), which the halo path cannot run, are padded; wgrad pads all."""
    kp = kernel_problem(layer.problem, Pass.FPROP, "float16", H200)
    if (suite, layer.name) in HALO_STEMS:
        assert kp == layer.problem
        assert isinstance(make_spec(kp, Pass.FPROP, target=H200).plan.loop, StagedHalo)
    else:
        assert layer.problem.stride != (1, 1) and kp.c == 4
    assert kernel_problem(layer.problem, Pass.WGRAD, "float16", H200).c == 4


def test_the_suites_have_imagenet_stems():
    assert {s for s, _ in STEMS} >= {"resnet50", "resnet18", "vgg16", "unet", "darknet53-down"}


@pytest.mark.parametrize("c", [3, 5, 7])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_copy_kernels_are_deterministic_and_compile_without_warnings(c, itemsize):
    pytest.importorskip("cupy", reason="NVRTC comes with CuPy")
    from convgen.compile import compile_binary

    src, pad, unpad = pad_source(c, 4 if c < 4 else 8, itemsize)
    pad_source.cache_clear()
    assert pad_source(c, 4 if c < 4 else 8, itemsize) == (src, pad, unpad)
    assert f'extern "C" __global__ void {pad}(' in src and f'extern "C" __global__ void {unpad}(' in src
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        binary = compile_binary(src, arch="sm_90", name=f"{pad}.cu")
    assert binary[:4] == b"\x7fELF"
