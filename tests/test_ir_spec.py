"""Epilogues and KernelSpec keys.  A key names a kernel in the disk cache and in the emission
hashes, so it must be the same in every process, change with every field that changes the
kernel, and leave out what does not (the batch, a plan's reasons, an epilogue that is off);
an epilogue that a pass cannot apply is refused by name.  Last, regressions: values that once
slipped through.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from convgen.ir import ConvGeometry, ConvProblem, Epilogue, Pass, Target
from convgen.spec import KernelSpec, Plan
from convgen.mainloop import FlatHalo, HaloLdsm, HaloTile, Im2col, StagedHalo, Wgmma

from test_ir import ROOT  # the repository's root


# --------------------------------------------------------------------------- Epilogue and KernelSpec

PROB = ConvProblem(16, 16, 8, 16, 3, 3, 1, 1, 1, n=4)
PLAN = Plan(128, 32, 32, 4, 1, 3, 8, 8)


def spec(**changes) -> KernelSpec:
    kw = dict(geometry=PROB, pass_=Pass.FPROP, epilogue=Epilogue(bias=True), in_dtype="float16",
              target=Target("sm_90"), plan=PLAN)
    kw.update(changes)
    return KernelSpec(**kw)


def canonical_key(s: KernelSpec) -> str:
    blob = json.dumps(s.as_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def test_epilogue_rejects_bad_out_dtype():
    with pytest.raises(ValueError, match=r"out_dtype must be one of \('float16', 'bfloat16', 'float32'\), got 'int8'"):
        Epilogue(out_dtype="int8")


def test_bias_dtype_is_fprops_bias_and_keeps_its_kernels_apart():
    """A float16 bias is a different kernel (its own key, so its own cache entry); it is
    fprop's with a bias only, and a dtype convgen has no kernels for is refused by name."""
    with pytest.raises(ValueError, match=r"bias_dtype must be one of \('float16', 'bfloat16', 'float32'\), got 'int8'"):
        Epilogue(bias=True, bias_dtype="int8")
    for pass_, epi in ((Pass.WGRAD, Epilogue(bias=True, bias_dtype="float16")),
                       (Pass.FPROP, Epilogue(bias_dtype="float16"))):
        with pytest.raises(ValueError, match="bias_dtype is what fprop's bias is read as"):
            spec(pass_=pass_, epilogue=epi)
    b16, b32 = spec(epilogue=Epilogue(bias=True, bias_dtype="float16")), spec(epilogue=Epilogue(bias=True))
    assert b16.key != b32.key and b16.name != b32.name


@pytest.mark.parametrize("pass_", [Pass.DGRAD, Pass.WGRAD])
def test_relu_is_fprop_only(pass_):
    with pytest.raises(ValueError, match=rf"relu is an fprop epilogue; {pass_.value} cannot apply it"):
        spec(pass_=pass_, epilogue=Epilogue(relu=True))


def test_bias_on_dgrad_is_rejected_but_wgrad_bias_means_db():
    with pytest.raises(ValueError, match="bias does not apply to dgrad"):
        spec(pass_=Pass.DGRAD, epilogue=Epilogue(bias=True))
    assert spec(pass_=Pass.WGRAD, epilogue=Epilogue(bias=True)).epilogue.bias


def test_spec_rejects_bad_in_dtype_and_pass():
    with pytest.raises(ValueError, match=r"in_dtype must be one of .*got 'float64'"):
        spec(in_dtype="float64")
    with pytest.raises(ValueError, match="pass must be one of"):
        spec(pass_="backward")


def test_spec_key_is_stable():
    a, b = spec(), spec()
    assert a.key == b.key == canonical_key(a)
    assert re.fullmatch(r"[0-9a-f]{16}", a.key)
    assert spec(pass_="fprop").key == a.key  # a pass given by name is the same spec
    assert a.name == f"convgen_fprop_im2col_128x32x32_s3_sm90_16x16_c8_k16_3x3_s11_p11_d11_{a.key[:8]}"
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", a.name)  # a C identifier


@pytest.mark.parametrize("changes, middle", [
    (dict(plan=Plan(128, 32, 64, 4, 1, 4, 8, 8, loop=HaloTile(16, 2))), "fprop_halo16x2_128x32x64_s4_sm90"),
    (dict(plan=Plan(128, 32, 32, 4, 1, 3, 8, 8, loop=Wgmma()), pass_=Pass.DGRAD, epilogue=Epilogue()),
     "dgrad_wgmma_128x32x32_s3_sm90"),
    (dict(plan=Plan(64, 32, 16, 4, 1, 2, 8, 8, loop=HaloLdsm(8)), target=Target("gfx942")),
     "fprop_ldsm8_64x32x16_s2_gfx942"),
    (dict(plan=Plan(128, 32, 64, 2, 1, 2, 8, 8, loop=Im2col(2)), pass_=Pass.WGRAD), "wgrad_im2colk2_128x32x64_s2_sm90"),
])
def test_kernel_names_say_kind_tile_stages_and_arch(changes, middle):
    s = spec(**changes)
    assert s.name == f"convgen_{middle}_16x16_c8_k16_3x3_s11_p11_d11_{s.key[:8]}"
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s.name) and len(s.name) <= 96


def test_spec_key_is_the_same_in_another_process():
    code = (
        "from convgen.ir import *\n"
        "from convgen.spec import *\n"
        "p = ConvProblem(16, 16, 8, 16, 3, 3, 1, 1, 1, n=4)\n"
        "s = KernelSpec(p, Pass.FPROP, Epilogue(bias=True), 'float16', Target('sm_90'), Plan(128, 32, 32, 4, 1, 3, 8, 8))\n"
        "print(s.key, s.name)\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [spec().key, spec().name]


def test_spec_drops_the_batch():
    a = spec(geometry=PROB.with_batch(1))
    b = spec(geometry=PROB.with_batch(999))
    c = spec(geometry=PROB.geometry)
    assert type(a.geometry) is ConvGeometry
    assert a == b == c
    assert a.key == b.key == c.key and a.name == b.name == c.name
    assert "n" not in a.as_dict()["geometry"]


def _variants():
    g = PROB.geometry
    for name in ("h", "w", "c", "k"):
        yield f"geometry.{name}", dict(geometry=dataclasses.replace(g, **{name: getattr(g, name) * 2}))
    yield "geometry.r", dict(geometry=dataclasses.replace(g, r=1))
    yield "geometry.s", dict(geometry=dataclasses.replace(g, s=5))
    yield "geometry.stride", dict(geometry=dataclasses.replace(g, stride=(1, 2)))
    yield "geometry.padding", dict(geometry=dataclasses.replace(g, padding=(1, 0)))
    yield "geometry.dilation", dict(geometry=dataclasses.replace(g, dilation=(2, 1)))
    yield "pass", dict(pass_=Pass.WGRAD)
    yield "epilogue.bias", dict(epilogue=Epilogue(bias=False))
    yield "epilogue.relu", dict(epilogue=Epilogue(bias=True, relu=True))
    yield "epilogue.out_dtype", dict(epilogue=Epilogue(bias=True, out_dtype="float32"))
    yield "in_dtype", dict(in_dtype="float32")
    yield "target.arch", dict(target=Target("sm_80"))
    yield "target.sm_count", dict(target=Target("sm_90", 100))
    for name, value in dict(block_m=64, block_n=64, block_k=64, warps_m=2, warps_n=2, stages=2,
                            vec_a=4, vec_b=2, split_k=3).items():
        yield f"plan.{name}", dict(plan=dataclasses.replace(PLAN, **{name: value}))
    yield "plan.read_a", dict(plan=dataclasses.replace(PLAN, vec_a=1, read_a="float32"), in_dtype="float32")
    yield "plan.read_b", dict(plan=dataclasses.replace(PLAN, vec_b=1, read_b="float32"), in_dtype="float32")


VARIANTS = list(_variants())


@pytest.mark.parametrize("changes", [v[1] for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_spec_key_changes_with_every_field(changes):
    base, other = spec(), spec(**changes)
    if "plan" in changes and "in_dtype" in changes:  # read_* needs float32 inputs: compare like with like
        base = spec(in_dtype="float32", plan=dataclasses.replace(changes["plan"], read_a="float16", read_b="float16"))
    assert other != base
    assert other.key != base.key
    assert other.name != base.name


def test_all_variant_keys_are_distinct():
    keys = {spec(**changes).key for _, changes in VARIANTS} | {spec().key}
    assert len(keys) == len(VARIANTS) + 1


def test_spec_key_ignores_plan_reasons():
    a = spec(plan=dataclasses.replace(PLAN, reasons=("one reason",)))
    assert a.key == spec().key and a == spec()


# --------------------------------------------------------------------------- regressions


def test_numpy_ints_in_target_and_plan_give_a_key():
    s = spec(target=Target("sm_90", np.int64(100)), plan=dataclasses.replace(PLAN, block_m=np.int64(128)))
    assert s.key == spec(target=Target("sm_90", 100), plan=dataclasses.replace(PLAN, block_m=128)).key
    assert type(s.target.sm_count) is int and type(s.plan.block_m) is int


def test_epilogue_flags_must_be_bools():
    with pytest.raises(ValueError, match="bias"):
        Epilogue(bias="yes")
    with pytest.raises(ValueError, match="relu"):
        Epilogue(relu=1)


def test_plan_brief_names_the_halo_tile():
    """tune's and bench's tables print plans this way; a halo plan must not read as im2col."""
    from convgen.spec import Plan

    assert Plan(256, 32, 32, 4, 1, 2, 8, 8).brief() == "256x32x32 w4x1 s2 k1"
    assert Plan(256, 32, 32, 4, 1, 2, 8, 8, split_k=3, loop=HaloTile(16)).brief() == "256x32x32 w4x1 s2 k3 halo16"
    assert Plan(256, 32, 32, 4, 1, 2, 8, 8, loop=StagedHalo(32)).brief() == "256x32x32 w4x1 s2 k1 halo32"
    assert Plan(128, 32, 32, 4, 1, 2, 8, 8, loop=HaloLdsm(8, 2)).brief() == "128x32x32 w4x1 s2 k1 halo8x2"
    assert Plan(128, 32, 32, 4, 1, 2, 8, 8, loop=FlatHalo(2)).brief() == "128x32x32 w4x1 s2 k1 flatx2"


def test_residual_and_gelu_are_fprop_epilogues_that_keep_other_kernels_keys():
    """A residual (act(alpha * conv + bias + beta * residual)) and GELU: fprop only, GELU or
    ReLU and not both, and left out of the key when off, so every kernel without them keeps
    its key, name and cache entry (the emission hashes hold the source)."""
    assert "residual" not in Epilogue(bias=True).as_dict() and "gelu" not in Epilogue().as_dict()
    assert Epilogue(residual=True, gelu=True).as_dict()["residual"] is True
    with pytest.raises(ValueError, match="two activations"):
        Epilogue(relu=True, gelu=True)
    with pytest.raises(ValueError, match="epilogue residual must be True or False"):
        Epilogue(residual=1)
    for name in ("residual", "gelu"):
        for pass_ in (Pass.DGRAD, Pass.WGRAD):
            with pytest.raises(ValueError, match=f"{name} is an fprop epilogue; {pass_.value} cannot apply it"):
                Epilogue(**{name: True}).check_pass(pass_)
    keys = {Epilogue(**kw).as_dict().__repr__() for kw in ({}, {"residual": True}, {"gelu": True},
                                                            {"residual": True, "gelu": True})}
    assert len(keys) == 4
