"""Narrow inputs padded to 8 channels (convgen/channel_pad.py), without a GPU: when the rule
pads, that the padded kernel is the vector one it pads for, and that the copy kernels are
emitted deterministically and compile cleanly with NVRTC. The GPU tier is
tests/test_channel_pad_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest

from convgen.channel_pad import kernel_problem, pad_source, padded_channels
from convgen.ir import ConvProblem, Pass, Target
from convgen.planner import make_spec
from convgen.suites import SUITES

STEM = ConvProblem(224, 224, 3, 64, 7, 7, 2, 3, 1, n=64)
H200 = Target("sm_90", sm_count=132)


@pytest.mark.parametrize("c", range(1, 17))
@pytest.mark.parametrize("pass_", list(Pass), ids=lambda p: p.value)
def test_fprop_and_wgrad_of_3_to_7_channels_pad_to_8(c, pass_):
    got = padded_channels(dataclasses.replace(STEM, c=c), pass_, "float16", H200)
    assert got == (8 if 3 <= c <= 7 and pass_ is not Pass.DGRAD else None)


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
    assert padded_channels(STEM, Pass.WGRAD, "bfloat16", Target("sm_80")) == 8


STEMS = [(s, l) for s, layers in SUITES.items() for l in layers if 3 <= l.problem.c < 8]


@pytest.mark.parametrize("suite, layer", STEMS, ids=[f"{s}/{l.name}" for s, l in STEMS])
@pytest.mark.parametrize("pass_", [Pass.FPROP, Pass.WGRAD], ids=lambda p: p.value)
def test_every_suite_stem_runs_a_16_byte_kernel_once_padded(suite, layer, pass_):
    """The point of the copy: the padded kernel gathers both operands in 16-byte runs (the
    unpadded one reads x one fp16 at a time)."""
    before = make_spec(layer.problem, pass_, target=H200).plan
    assert min(before.vec_a, before.vec_b) < 8
    kp = kernel_problem(layer.problem, pass_, "float16", H200)
    assert kp.c == 8 and dataclasses.replace(kp, c=layer.problem.c) == layer.problem
    plan = make_spec(kp, pass_, target=H200).plan
    assert (plan.vec_a, plan.vec_b) == (8, 8), plan.brief()


@pytest.mark.parametrize("c", [3, 5, 7])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_copy_kernels_are_deterministic_and_compile_without_warnings(c, itemsize):
    pytest.importorskip("cupy", reason="NVRTC comes with CuPy")
    from convgen.compile import compile_binary

    src, pad, unpad = pad_source(c, 8, itemsize)
    pad_source.cache_clear()
    assert pad_source(c, 8, itemsize) == (src, pad, unpad)
    assert f'extern "C" __global__ void {pad}(' in src and f'extern "C" __global__ void {unpad}(' in src
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        binary = compile_binary(src, arch="sm_90", name=f"{pad}.cu")
    assert binary[:4] == b"\x7fELF"
