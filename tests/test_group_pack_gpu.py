"""Narrow groups packed into slabs (convgen/group_pack.py) on the GPU, against the float64
reference: every pass through the plain functions (exact integer tier, bit for bit), prepared
ops given a NaN-filled workspace of the caller's (the slab weights and wgrad's split-K slices of
each filter's own channels lie in it, so an element a copy or the kernel leaves unwritten
turns the sums it meets into NaN), the pointer path
on a raw stream, fp32 and bf16 inputs, and the fused epilogue. Each op is checked to pack, so
a rule that stopped packing would not pass these tests on the plain grouped loop."""

from __future__ import annotations

import numpy as np
import pytest

import convgen
from convgen import reference
from convgen.group_pack import GroupPack, packed_groups
from convgen.ir import ConvProblem, Pass, Target

from gpu_helpers import check, check_fp16, draw_layer, geo, kernel_view, poisoned, run_pass, seeded

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poison_outputs")]

PASSES = [Pass.FPROP, Pass.DGRAD, Pass.WGRAD]


def grouped(h, w, c, k, g, r, s, stride=1, pad=0, dil=1, n=2):
    return ConvProblem(h, w, c, k, r, s, stride, pad, dil, groups=g, n=n)


# ResNeXt's 4, 8 and 16 channels a group (slabs of 32 channels; on the H200 the 128-channel
# layer as one dense layer on the TMA loop), strides 1 and 2 (dgrad's residue classes), K/G
# unlike C/G (the slab's wider side decides), 3 channels a group (the scalar gathers), a 1x1
# and a 5x3 filter.
SHAPES = [
    grouped(13, 11, 128, 128, 32, 3, 3, 1, 1),   # 4 a group: 4 slabs of 8, or one dense layer
    grouped(14, 14, 256, 256, 32, 3, 3, 2, 1),   # 8 a group, stride 2: 8 slabs of 4
    grouped(9, 9, 512, 512, 32, 3, 3, 1, 1),     # 16 a group: 16 slabs of 2
    grouped(7, 7, 512, 512, 32, 3, 3, 2, 1),     # 16 a group, stride 2 on a 7x7 image
    grouped(10, 12, 64, 128, 8, 3, 3, 1, 1),     # 8 in, 16 out a group: 4 slabs of 2
    grouped(11, 9, 32, 64, 4, 5, 3, (2, 1), (1, 2), (1, 2)),  # 8 in, 16 out: 2 slabs of 2
    grouped(8, 10, 24, 48, 8, 1, 1),             # 1x1, 3 in, 6 out a group
]


def _ids(p):
    return p.describe().replace(" ", "_")


def _assert_packs(problem: ConvProblem, pass_: Pass, **kw) -> convgen.PreparedConv:
    """The op runs the slabs' kernel: fprop and dgrad after the weights' copy, wgrad's kernel
    storing each filter's own channels itself (KernelSpec.pack), with no copy after it."""
    op = convgen.prepare(pass_, problem.x_shape, problem.w_shape, groups=problem.groups, **geo(problem), **kw)
    spec = op._kernel.source.spec
    slabs = spec.geometry.groups
    assert slabs == packed_groups(problem, pass_, "float16", Target()) and slabs < problem.groups
    if pass_ is Pass.WGRAD:
        assert op._copies is None and spec.pack == problem.groups // slabs, "wgrad does not store its groups' own dW"
    else:
        assert isinstance(op._copies, GroupPack) and spec.pack == 1, "the op does not pack its groups' weights"
    return op


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
@pytest.mark.parametrize("problem", SHAPES, ids=_ids)
def test_packed_exact_tier(problem, pass_):
    """Integer data: the slabs' zeros add nothing, every sum is exact in fp32, so fp32 outputs
    match the reference bit for bit (fprop with bias and ReLU, wgrad with db)."""
    _assert_packs(problem, pass_, out_dtype="float32",
                  bias=pass_ is not Pass.DGRAD, **({"activation": "relu"} if pass_ is Pass.FPROP else {}))
    epi = dict(bias=True, relu=True) if pass_ is Pass.FPROP else dict(bias=True) if pass_ is Pass.WGRAD else {}
    res = run_pass(problem, pass_, seeded("packed-exact", problem, pass_), out_dtype="float32", exact=True, **epi)
    check(res, "float32", exact=True, what=f"{pass_.value} {problem.describe()}")


@pytest.mark.parametrize("problem", SHAPES[:2] + SHAPES[4:5], ids=_ids)
def test_prepared_ops_with_a_poisoned_workspace_and_the_pointer_path(problem):
    import cupy as cp

    x, w, dy, bias = draw_layer("packed", problem)
    xd, wd, dyd, bd = (cp.asarray(a) for a in (x, w, dy, bias))
    g = dict(geo(problem), groups=problem.groups)
    ref_y = reference.fprop(kernel_view(x), kernel_view(w), bias.astype(np.float64), **g)
    ref_dx = reference.dgrad(kernel_view(dy), kernel_view(w), problem.x_shape, **g)
    ref_dw, ref_db = reference.wgrad(kernel_view(x), kernel_view(dy), problem.w_shape, **g)
    red_f = problem.r * problem.s * problem.c // problem.groups
    red_d = problem.r * problem.s * problem.k // problem.groups
    red_w = problem.n * problem.p * problem.q
    fop = _assert_packs(problem, Pass.FPROP, bias=True)
    dop = _assert_packs(problem, Pass.DGRAD)
    wop = _assert_packs(problem, Pass.WGRAD, bias=True)
    for trial in range(2):  # the second call reuses the op's launch and its scratch
        ws = cp.full(fop.workspace_elems, np.nan, dtype=cp.float32)
        check_fp16(fop(xd, wd, bd, workspace=ws), ref_y, red_f, f"prepared fprop, call {trial}")
        ws = cp.full(dop.workspace_elems, np.nan, dtype=cp.float32)
        check_fp16(dop(dyd, wd, workspace=ws), ref_dx, red_d, f"prepared dgrad, call {trial}")
        ws = cp.full(wop.workspace_elems, np.nan, dtype=cp.float32)
        dw, db = wop(xd, dyd, workspace=ws)
        check_fp16(dw, ref_dw, red_w, f"prepared wgrad dw, call {trial}")
        check_fp16(db, ref_db, red_w, f"prepared wgrad db, call {trial}")

    # the pointer path (convgen.torch's): caller's outputs and workspaces, a raw stream
    y, dx = poisoned(problem.y_shape, cp.float16), poisoned(problem.x_shape, cp.float16)
    dw, db = poisoned(problem.w_shape, cp.float16), poisoned(problem.k, cp.float16)
    fws, dws, wws = (poisoned(op.workspace_elems, cp.float32) for op in (fop, dop, wop))
    stream = cp.cuda.Stream(non_blocking=True)
    fop.launch(xd.data.ptr, wd.data.ptr, (y.data.ptr,), bias=bd.data.ptr, workspace=fws.data.ptr, stream=stream.ptr)
    dop.launch(dyd.data.ptr, wd.data.ptr, (dx.data.ptr,), workspace=dws.data.ptr, stream=stream.ptr)
    wop.launch(xd.data.ptr, dyd.data.ptr, (dw.data.ptr, db.data.ptr), workspace=wws.data.ptr, stream=stream.ptr)
    stream.synchronize()
    check_fp16(y, ref_y, red_f, "launch() fprop")
    check_fp16(dx, ref_dx, red_d, "launch() dgrad")
    check_fp16(dw, ref_dw, red_w, "launch() wgrad dw")
    check_fp16(db, ref_db, red_w, "launch() wgrad db")


@pytest.mark.parametrize("pass_", PASSES, ids=lambda p: p.value)
def test_packed_float32_and_bf16_inputs(pass_):
    """The copies move 4-byte elements for fp32 inputs (and fp32 dW), 2-byte ones for bf16."""
    p = SHAPES[0]
    res = run_pass(p, pass_, seeded("packed-f32", pass_), in_dtype="float32", out_dtype="float32", exact=True)
    check(res, "float32", exact=True, what=f"{pass_.value} fp32 in")
    res = run_pass(p, pass_, seeded("packed-bf16", pass_), in_dtype="bfloat16", out_dtype="bfloat16",
                   bias=pass_ is Pass.WGRAD)
    check(res, "bfloat16", what=f"{pass_.value} bf16")


def test_packed_residual_gelu():
    p = SHAPES[1]
    res = run_pass(p, Pass.FPROP, seeded("packed-res"), out_dtype="float32", bias=True, gelu=True,
                   residual=True, alpha=0.5, beta=2.0)
    check(res, "float32", what="fprop residual gelu")


PARTS = 4  # each packed shape's candidates in this many tests (every PARTS-th one), so -n spreads them


@pytest.mark.parametrize("part", range(PARTS))
@pytest.mark.parametrize("problem", [SHAPES[0], SHAPES[4]], ids=_ids)
def test_packed_wgrad_candidates_store_each_filters_own_dw(problem, part, monkeypatch):
    """Every plan a tuning database may hold for a packed wgrad's slabs runs with the kernel
    storing each filter's own channels (KernelSpec.pack): split-K reduced by a second kernel
    or in the kernel's own grid, TMA, im2col, sliced K, stream-K and no split (SHAPES[4]'s 8
    groups pack into one dense layer, which offers them all).  Exact on integer data, db too;
    the outputs are poisoned, so a column no store reaches fails."""
    from convgen import runtime, tuning_db
    from convgen.candidates import candidates
    from convgen.group_pack import kernel_problem

    target = runtime._target(0)
    kp = kernel_problem(problem, Pass.WGRAD, "float16", target)
    pack = problem.groups // kp.groups
    assert pack > 1, "the shape does not pack"
    for i, plan in enumerate(candidates(kp, Pass.WGRAD, target)):
        if i % PARTS != part:
            continue
        # the layer itself has no tuned plan; its slabs' problem has this one
        monkeypatch.setattr(tuning_db, "tuned_plan", lambda gpu, prob, pass_, dt, tgt, plan=plan:
                            plan if prob.groups == kp.groups and pass_ is Pass.WGRAD else None)
        convgen.clear_cache()
        op = convgen.prepare(Pass.WGRAD, problem.x_shape, problem.w_shape, groups=problem.groups,
                             bias=True, out_dtype="float32", **geo(problem))
        spec = op._kernel.source.spec
        assert spec.pack == pack and op._copies is None and spec.plan.brief() == plan.brief(), plan.brief()
        res = run_pass(problem, Pass.WGRAD, seeded("packed-cand", problem, i), out_dtype="float32", exact=True,
                       bias=True)
        check(res, "float32", exact=True, what=f"wgrad {problem.describe()} as {plan.brief()} {plan.split_reduce}")
    convgen.clear_cache()


def _packs_timed(problem: ConvProblem, monkeypatch) -> tuple:
    """(target, the slabs' problem, the list each kernel tuning reads the resources of adds its
    KernelSpec.pack to) for a grouped layer whose wgrad packs on this GPU."""
    from convgen import runtime
    from convgen.group_pack import kernel_problem

    target = runtime._target(0)
    slabs = kernel_problem(problem, Pass.WGRAD, "float16", target)
    assert slabs.groups < problem.groups, "the shape does not pack"
    built = []
    real = runtime.kernels_for

    def kernels_for(p):
        ks = real(p)
        built.extend(k.source.spec.pack for k in ks)
        return ks

    monkeypatch.setattr(runtime, "kernels_for", kernels_for)
    return target, slabs, built


def test_tune_times_a_packed_wgrad_as_the_op_runs_it(monkeypatch):
    """`convgen tune` on a packed wgrad (tune_layer's ``layer``): every candidate runs through
    the layer's own call as the slabs' pinned plan, so the kernels it times store each filter's
    own channels (KernelSpec.pack > 1); every candidate agrees with the default plan, and the
    winner read back from the rows is a plan of the slabs."""
    import cupy as cp

    from convgen import tuning_db
    from convgen.tools import timing, tune

    problem = SHAPES[4]
    target, slabs, built = _packs_timed(problem, monkeypatch)
    dev = timing.CudaDevice(cp, cp.cuda.get_current_stream())
    rows = tune.tune_layer(slabs, Pass.WGRAD, dev, target, reps=3, bias=False, layer=problem)
    convgen.clear_cache()
    assert rows and all(r["ok"] or r.get("skipped") for r in rows), [r for r in rows if not r["ok"]]
    assert built and set(built) == {problem.groups // slabs.groups}, set(built)
    assert not tuning_db._pinned


def test_first_use_tunes_a_packed_wgrad_as_the_op_runs_it(monkeypatch, tmp_path):
    """Tuning on first use of a packed wgrad (autotune.tune's ``layer``): the kernels it times
    store each filter's own channels (KernelSpec.pack > 1), the winner is recorded under the
    slabs' shape, and the call that tuned, and a repeat, give dW bit for bit (exact tier)."""
    from convgen import autotune, tuning_db

    problem = SHAPES[4]
    target, slabs, built = _packs_timed(problem, monkeypatch)
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path))  # an empty user database: the shape is new
    monkeypatch.delenv("CONVGEN_TUNED", raising=False)
    monkeypatch.setattr(tuning_db, "SHIPPED_DIR", tmp_path / "none-shipped")
    tuning_db._loaded.clear()
    convgen.clear_cache()
    autotune.set_autotune(True)
    try:
        for i in range(2):  # the call that tunes, then a repeat on the tuned kernel
            res = run_pass(problem, Pass.WGRAD, seeded("first-use", i), out_dtype="float32", exact=True)
            check(res, "float32", exact=True, what=f"packed wgrad {problem.describe()} tuned on first use, call {i}")
    finally:
        autotune.set_autotune(None)
        tuning_db._loaded.clear()
        convgen.clear_cache()
    assert built and set(built) == {problem.groups // slabs.groups}, set(built)
    db = tuning_db.read_db(tmp_path / "tuning.json")
    keys = {k for gpu in db["gpus"].values() for k in gpu}
    assert keys == {tuning_db.tune_key(slabs.geometry, Pass.WGRAD, "float16", target.arch)}
    assert not tuning_db._pinned
