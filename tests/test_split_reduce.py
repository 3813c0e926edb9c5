"""plan.split_reduce: where split-K's slices are summed, without a GPU.

"kernel" (every plan so far) launches the reduction kernel after the main one; "grid" sums
the slices in the main kernel after a grid-wide barrier, in one cooperative launch.  Here:
which plans may say "grid" and the errors that name why not, the plan dict (old plans keep
their keys), what the emitter writes (one kernel, cooperative, the same workspace), the
tuning candidates, the runtime's residency check, and NVRTC compiling the kernels of the
three kinds that split wgrad.  tests/test_split_reduce_gpu.py runs them.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

import convgen.runtime as rt
from convgen.candidates import candidates
from convgen.autotune import CANDIDATES
from convgen.emit import emit
from convgen.ir import ConvProblem, Epilogue, Pass, Target
from convgen.planner import check_plan, make_spec, plan as plan_for
from convgen.spec import Plan
from convgen.mainloop import TmaWgmma

SM90 = Target("sm_90")
DENSE = ConvProblem(32, 32, 16, 16, 3, 3, 1, 1, 1, n=256)  # CIFAR res1: 132 slices on the im2col loop
TMA = ConvProblem(56, 56, 64, 64, 3, 3, 1, 1, 1, n=128)  # ResNet's l1 3x3: the TMA loop, 24 slices
DEPTHWISE = ConvProblem(56, 56, 144, 144, 3, 3, 1, 1, 1, groups=144, n=128)  # MobileNetV2's stencil
GROUPED = ConvProblem(28, 28, 128, 128, 3, 3, 1, 1, 1, groups=8, n=64)  # G GEMMs side by side (im2col)
GROUPED_TMA = ConvProblem(28, 28, 256, 256, 3, 3, 1, 1, 1, groups=4, n=64)  # 64-channel groups: the TMA loop
KINDS = [DENSE, TMA, DEPTHWISE, GROUPED, GROUPED_TMA]
KIND_IDS = ["im2col", "tma", "depthwise", "grouped", "grouped-tma"]


def grid(problem: ConvProblem, target: Target = SM90) -> Plan:
    p = plan_for(problem, Pass.WGRAD, target)
    assert p.split_k > 1, p.brief()
    return dataclasses.replace(p, split_reduce="grid")


# --------------------------------------------------------------------------- which plans


def test_split_reduce_values_are_checked_by_name():
    base = plan_for(DENSE, Pass.WGRAD, SM90)
    with pytest.raises(ValueError, match=r"plan.split_reduce must be one of \('kernel', 'grid'\), got 'tree'"):
        dataclasses.replace(base, split_reduce="tree")
    with pytest.raises(ValueError, match=r"split_reduce='grid' sums split-K slices .*: it needs split_k > 1 or that loop"):
        dataclasses.replace(base, split_k=1, split_reduce="grid")
    with pytest.raises(ValueError, match=r"it needs split_k > 1 or that loop"):  # a TMA loop, but not stream-K's
        Plan(128, 256, 64, 8, 1, 3, 8, 8, split_reduce="grid", loop=TmaWgmma())
    Plan(128, 256, 64, 8, 1, 3, 8, 8, split_reduce="grid", loop=TmaWgmma(persistent=True))  # stream-K's parts


@pytest.mark.parametrize("problem", KINDS, ids=KIND_IDS)
def test_wgrad_of_the_three_splitting_kinds_may_sum_in_the_kernel(problem):
    check_plan(grid(problem), problem, Pass.WGRAD, SM90, "float16")


def test_where_the_grid_reduction_is_refused():
    fprop = Plan(128, 64, 32, 2, 2, 3, 8, 8, split_k=2, split_reduce="grid")  # an im2col fprop may split K
    with pytest.raises(ValueError, match=r"wgrad's split-K or stream-K only"):
        check_plan(fprop, DENSE, Pass.FPROP, SM90, "float16")
    hip = Target("gfx942")
    with pytest.raises(ValueError, match=r"a CUDA target \(a cooperative launch\), not gfx942"):
        check_plan(grid(DENSE, hip), DENSE, Pass.WGRAD, hip, "float16")
    persistent = Plan(128, 128, 64, 8, 1, 3, 8, 8, split_reduce="grid", loop=TmaWgmma(persistent=True))
    with pytest.raises(ValueError, match=r"wgrad's split-K or stream-K only"):  # a persistent fprop has no parts
        check_plan(persistent, DENSE, Pass.FPROP, SM90, "float16")



def test_plan_dicts_name_the_grid_reduction_only_where_it_is_taken():
    """A plan summing in the kernel says so in its dict (the tuning database's format, and the
    spec key), and reads back the same; every other plan's dict keeps the keys it had."""
    g = grid(DENSE)
    d = g.as_dict()
    assert d["split_reduce"] == "grid" and Plan.from_dict(json.loads(json.dumps(d))) == g
    k = plan_for(DENSE, Pass.WGRAD, SM90)
    assert "split_reduce" not in k.as_dict() and Plan.from_dict(k.as_dict()) == k
    assert make_spec(DENSE, "wgrad", target=SM90, plan_=g).key != make_spec(DENSE, "wgrad", target=SM90, plan_=k).key
    assert g.brief() == k.brief().replace(f"k{k.split_k}", f"k{k.split_k}g")


# --------------------------------------------------------------------------- what is emitted


@pytest.mark.parametrize("db", [False, True], ids=["dw", "dw+db"])
@pytest.mark.parametrize("problem", KINDS, ids=KIND_IDS)
def test_one_cooperative_kernel_sums_its_own_slices(problem, db):
    g = grid(problem)
    k = dataclasses.replace(g, split_reduce="kernel")
    src = emit(make_spec(problem, "wgrad", target=SM90, epilogue=Epilogue(bias=db), plan_=g))
    two = emit(make_spec(problem, "wgrad", target=SM90, epilogue=Epilogue(bias=db), plan_=k))
    assert src.reduce is None and src.kernel_names == (src.main.kernel,)
    assert src.main.cooperative and not two.main.cooperative and two.reduce is not None
    assert src.main.args == two.main.args  # the same pointers: the outputs, and the workspace for the slices
    assert src.workspace_elems(problem.n) == two.workspace_elems(problem.n) > 0
    assert src.grid(problem.n) == two.grid(problem.n)
    body = src.source
    assert body.count("cooperative_groups::this_grid().sync();") == 1 and "_reduce(" not in body
    all_ = "_all" if problem.groups > 1 and not problem.depthwise else ""  # a group's pointers moved: every group's
    assert (f"reduce_slices<RED_DB_V, true>(db_workspace{all_}," in body) == db
    assert f"reduce_slices<RED_V, true>(workspace{all_}," in body
    assert "cooperative_groups" not in two.source
    entry = src.manifest_entry()["kernels"]
    assert len(entry) == 1 and entry[0]["cooperative"] is True
    assert "cooperative" not in two.manifest_entry()["kernels"][0]
    again = emit(make_spec(problem, "wgrad", target=SM90, epilogue=Epilogue(bias=db), plan_=g))
    assert again.source == body  # deterministic


def test_the_summing_warps_fit_the_block():
    """The reduction's rows are whole warps of the block, at most 8, and a TMA kernel's
    consumers only (its producer warpgroup gave its registers away)."""
    for problem in KINDS:
        g = grid(problem)
        src = emit(make_spec(problem, "wgrad", target=SM90, plan_=g))
        rows = int(src.source.split("constexpr int RED_ROWS = ")[1].split(",")[0])
        ways = int(src.source.split("RED_WAYS = ")[1].split(",")[0])
        summing = g.warps - g.loop.producer_warps
        assert 1 <= rows <= min(8, summing) and rows % ways == 0, (g.brief(), rows, ways)
        assert src.main.shared_mem >= rows * 32 * 4 * 4  # the rows' staging reuses the kernel's shared memory


# --------------------------------------------------------------------------- tuning and the runtime


@pytest.mark.parametrize("problem", [k for k in KINDS if not k.depthwise],
                         ids=[i for k, i in zip(KINDS, KIND_IDS) if not k.depthwise])
def test_tuning_offers_the_grid_reduction_where_it_was_timed(problem):
    """The default plan summing its slices in the kernel (with its slices, half of them, and as
    many as fit at 128 registers a thread), after every other candidate (but stream-K's, offered
    last for the same reason), so tuning on first use (the first few) leaves it to `convgen tune`
    until a GPU has timed it.  Never on HIP."""
    plans = candidates(problem, Pass.WGRAD, SM90)
    streamk = lambda p: p.tma and p.loop.flags().persistent  # noqa: E731  (its parts, not slices: tests/test_stream_k.py)
    grids = [i for i, p in enumerate(plans) if p.split_reduce == "grid" and not streamk(p)]
    base = plans[0]
    splits = [plans[i].split_k for i in grids]
    assert base.split_reduce == "kernel" and base.split_k in splits and base.split_k // 2 in splits
    assert len(set(splits)) == len(splits) and splits == sorted(splits, reverse=True)
    tail = len(plans) - sum(1 for p in plans if streamk(p))  # stream-K's come after
    assert grids == list(range(tail - len(grids), tail)) and min(grids) >= CANDIDATES
    assert all(dataclasses.replace(plans[i], split_reduce="kernel", split_k=base.split_k, reasons=())
               == dataclasses.replace(base, reasons=()) for i in grids)
    assert not any(p.split_reduce == "grid" for p in candidates(problem, Pass.WGRAD, Target("gfx942")))


@pytest.mark.parametrize("problem", [DEPTHWISE, ConvProblem(112, 112, 32, 32, 3, 3, 1, 1, 1, groups=32, n=128),
                                     ConvProblem(7, 7, 768, 768, 7, 7, 1, 3, 1, groups=768, n=64)],
                         ids=["dw144-56px", "dw32-112px", "dw768-7px"])
def test_depthwise_wgrad_sums_in_its_grid_where_it_fits_and_tuning_times_the_second_kernel_next(problem):
    """Depthwise wgrad's default on CUDA sums its slices in the kernel, with as many slices as
    the GPU holds at once at 128 registers a thread (at most those for WGRAD_BLOCKS_PER_SM blocks
    an SM); tuning on first use times next the same tile with those slices summed by a second
    kernel (the default it replaced, and the runtime's fallback), and last the grid twins that
    may not fit.  HIP keeps the second kernel."""
    from convgen import depthwise_wgrad
    from convgen.reduction import GRID_REDUCE_REGS

    plans = candidates(problem, Pass.WGRAD, SM90)
    base, summed = plans[0], plans[1]
    gx, gy, gz = emit(make_spec(problem, "wgrad", target=SM90, plan_=base)).grid(problem.n)
    per_sm = 65536 // (base.warps * 32 * GRID_REDUCE_REGS)
    assert base.split_reduce == "grid" and summed.split_reduce == "kernel" and CANDIDATES >= 2
    assert summed.split_k == depthwise_wgrad.wgrad_split(problem, SM90, base) >= base.split_k
    assert dataclasses.replace(summed, split_k=base.split_k, split_reduce="grid", reasons=()) == \
        dataclasses.replace(base, reasons=())
    assert gx * gy * gz <= SM90.sm_count * per_sm  # resident at once (the runtime checks the real count)
    if summed.split_k > base.split_k:  # fewer slices than the second kernel's: each slice a longer run of tiles
        assert gx * gy * min(summed.split_k, 2 * base.split_k) > SM90.sm_count * per_sm
    late = [p for p in plans if p.split_reduce == "grid" and p.split_k > base.split_k
            and dataclasses.replace(p, split_k=base.split_k, reasons=()) == dataclasses.replace(base, reasons=())]
    assert plans[len(plans) - len(late):] == late
    hip = plan_for(problem, Pass.WGRAD, Target("gfx942"))
    assert hip.split_reduce == "kernel" and hip.split_k > 1
    # the other tiles tuning times sum their slices as the default does (the slices' own variations
    # aside, of the default and, on 7x7, of the one-row plan its runs of two rows replaced)
    one_row = depthwise_wgrad.plan_wgrad(problem, SM90, "float16", [], row_runs=False)
    tiles = [p for p in plans[2:] if (p.loop, p.block_n) not in ((base.loop, base.block_n), (one_row.loop, one_row.block_n))]
    assert tiles and all(p.split_reduce == "grid" for p in tiles if p.split_k > 1), [p.brief() for p in tiles]
    assert all(p.split_reduce == "kernel" for p in candidates(problem, Pass.WGRAD, Target("gfx942")))


def test_the_runtime_refuses_a_grid_that_is_not_resident_at_once(monkeypatch):
    """A cooperative launch larger than the GPU holds would fail at the driver; the runtime
    says so when it loads the kernel, with the counts."""
    import convgen.compile as cc

    src = emit(make_spec(DENSE, "wgrad", target=SM90, plan_=grid(DENSE)))
    blocks = src.grid(DENSE.n)[0] * src.grid(DENSE.n)[1] * src.grid(DENSE.n)[2]
    seen = []
    monkeypatch.setattr(cc, "resident_blocks", lambda fn, threads, smem, dev: seen.append((threads, smem)) or blocks - 1)
    with pytest.raises(ValueError, match=rf"launches all {blocks} blocks .* this GPU holds {blocks - 1} of them"):
        rt._check_cooperative(src, object(), DENSE.n, 0)
    assert seen == [(src.main.block[0], src.main.shared_mem)]
    monkeypatch.setattr(cc, "resident_blocks", lambda fn, threads, smem, dev: blocks)
    rt._check_cooperative(src, object(), DENSE.n, 0)  # exactly resident: fine


def _fake_load(monkeypatch, holds: int):
    """The runtime's kernel loading without a GPU: every source "loads", and a cooperative
    grid larger than ``holds`` blocks is refused as the driver's occupancy would refuse it."""
    import contextlib
    import types

    import convgen.compile as cc

    loaded = []
    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda _i: contextlib.nullcontext()))
    monkeypatch.setattr(rt, "_cupy", lambda: fake_cupy)
    monkeypatch.setattr(rt, "_cache", {})
    monkeypatch.setattr(cc, "load_kernels", lambda source, names, arch: loaded.append(source) or {n: n for n in names})
    monkeypatch.setattr(cc, "set_max_dynamic_shared_memory", lambda fn, smem: None)
    monkeypatch.setattr(cc, "resident_blocks", lambda fn, threads, smem, dev: holds)
    return loaded


def test_a_tuned_grid_that_is_not_resident_falls_back_to_the_reduction_kernel(monkeypatch):
    """A tuned plan that sums its slices in the kernel (a database entry, or tuning on first use,
    timed where its grid fit) on a GPU that holds fewer blocks at once: the same plan with the
    slices summed by the reduction kernel, and a warning that names the counts; a hand plan
    still raises, since the caller chose it."""
    tuned = grid(DEPTHWISE)
    src = emit(make_spec(DEPTHWISE, "wgrad", target=SM90, plan_=tuned))
    blocks = math.prod(src.grid(DEPTHWISE.n))
    loaded = _fake_load(monkeypatch, holds=blocks - 1)
    monkeypatch.setattr(rt, "_planned_source", lambda *a, **k: src)
    with pytest.warns(RuntimeWarning, match=rf"launches all {blocks} blocks .* holds {blocks - 1} .* second kernel"):
        k = rt._kernel(DEPTHWISE, Pass.WGRAD, Epilogue(), "float16", 0, None, False)
    assert k.source.spec.plan == dataclasses.replace(tuned, split_reduce="kernel")
    assert not k.source.main.cooperative and k.source.reduce is not None and loaded == [src.source, k.source.source]
    loaded.clear()
    with pytest.raises(ValueError, match=f"this GPU holds {blocks - 1}"):
        rt._kernel(DEPTHWISE, Pass.WGRAD, Epilogue(), "float16", 0, tuned, False)
    _fake_load(monkeypatch, holds=blocks)  # resident: the grid-summed plan stands
    k = rt._kernel(DEPTHWISE, Pass.WGRAD, Epilogue(), "float16", 0, None, False)
    assert k.source is src and k.source.main.cooperative


# --------------------------------------------------------------------------- NVRTC


@pytest.mark.parametrize("db", [False, True], ids=["dw", "dw+db"])
@pytest.mark.parametrize("problem", KINDS, ids=KIND_IDS)
def test_nvrtc_compiles_the_grid_reduction(problem, db):
    pytest.importorskip("cupy", reason="NVRTC comes with CuPy")
    from convgen.compile import compile_binary

    src = emit(make_spec(problem, "wgrad", target=SM90, epilogue=Epilogue(bias=db), plan_=grid(problem)))
    binary = compile_binary(src.source, arch=src.compile_arch)
    assert binary[:4] == b"\x7fELF" and src.main.kernel.encode() in binary


# --------------------------------------------------------------------------- any layer


from hypothesis import given, strategies as st  # noqa: E402

from test_planner import problems  # noqa: E402


@given(problem=problems(), groups=st.sampled_from([1, 2, 4, "depthwise"]), db=st.booleans())
def test_any_split_wgrad_sums_in_the_kernel_with_the_same_workspace_and_grid(problem, groups, db):
    """Any layer whose planned wgrad splits K, dense, grouped or depthwise: its plan summing in the kernel
    passes the checker and emits one cooperative kernel that calls the grid-wide barrier once,
    with the reduction kernel variant's grid, workspace and arguments, its summing rows whole
    warps of the block (a TMA kernel's consumers only)."""
    import dataclasses as dc

    if groups == "depthwise":
        problem = dc.replace(problem, k=problem.c * (1 + problem.k % 3), groups=problem.c)
    elif groups > 1:  # channels that the groups divide
        problem = dc.replace(problem, c=problem.c * groups, k=problem.k * groups, groups=groups)
    try:
        base = plan_for(problem, Pass.WGRAD, SM90)
    except ValueError:  # a layer no wgrad plan runs (refused by name): nothing to sum
        return
    if base.split_k == 1:
        return
    g = dataclasses.replace(base, split_reduce="grid")  # depthwise's default already is
    base = dataclasses.replace(base, split_reduce="kernel")
    check_plan(g, problem, Pass.WGRAD, SM90, "float16")
    epi = Epilogue(bias=db)
    one = emit(make_spec(problem, "wgrad", target=SM90, epilogue=epi, plan_=g))
    two = emit(make_spec(problem, "wgrad", target=SM90, epilogue=epi, plan_=base))
    assert one.reduce is None and one.main.cooperative and two.reduce is not None
    assert one.main.args == two.main.args and one.grid(problem.n) == two.grid(problem.n)
    assert one.workspace_elems(problem.n) == two.workspace_elems(problem.n)
    assert one.source.count("cooperative_groups::this_grid().sync();") == 1
    rows = int(one.source.split("constexpr int RED_ROWS = ")[1].split(",")[0])
    assert 1 <= rows <= min(8, g.warps - g.loop.producer_warps)


def test_tuning_times_a_split_that_fills_the_sms_on_one_tile_wgrads():
    """UNet's 32 -> 1 head (one 16x32 tile of dW, 32,768 K-steps) stops at MAX_SPLIT = 512
    slices in the planner's plan: 512 two-warp blocks where 8 an SM fit.  Tuning on first use's
    few (autotune.CANDIDATES) include a split that fills the SMs' resident blocks, past
    MAX_SPLIT; ResNet-50's l4-3x3, whose many tiles fill the GPU with fewer slices, gets none past
    it; nor does fprop.  The planner's default is unchanged (not yet timed)."""
    from convgen.candidates import FILL_BLOCKS_PER_SM, MAX_SPLIT
    from convgen.suites import SUITES

    h200 = Target("sm_90", sm_count=132)
    head = next(l.problem for l in SUITES["unet"] if l.name == "head")
    plans = candidates(head, Pass.WGRAD, h200)
    assert plans[0].split_k <= MAX_SPLIT  # the default
    fill = [i for i, p in enumerate(plans) if p.split_k > MAX_SPLIT]
    assert fill and fill[0] < CANDIDATES, [p.brief() for p in plans]
    assert plans[fill[0]].split_k == FILL_BLOCKS_PER_SM * h200.sm_count  # one tile: a slice a resident block
    l4 = next(l.problem for l in SUITES["resnet50"] if l.name == "l4-3x3")
    assert all(p.split_k <= MAX_SPLIT for p in candidates(l4, Pass.WGRAD, h200))
    assert all(p.split_k <= MAX_SPLIT for p in candidates(head, Pass.FPROP, h200))


@given(problem=problems(), mult=st.integers(1, 3), target=st.sampled_from([SM90, Target("sm_80"), Target("gfx942")]))
def test_any_depthwise_wgrad_offers_only_plans_the_checker_takes(problem, mult, target):
    """Every depthwise wgrad candidate, its default summing the slices in the grid or not: the
    variations of a default with 2 slices once offered a grid-summed plan of 1 slice, which the
    Plan constructor refuses, and `convgen tune` raised instead of skipping it (thirty-eighth
    session, found on the GPU)."""
    problem = dataclasses.replace(problem, k=problem.c * mult, groups=problem.c)
    try:
        plan_for(problem, Pass.WGRAD, target)
    except ValueError:  # a layer no wgrad plan runs (refused by name): nothing to offer
        return
    for p in candidates(problem, Pass.WGRAD, target):
        check_plan(p, problem, Pass.WGRAD, target, "float16")
        assert p.split_reduce == "kernel" or (target.backend == "cuda" and p.split_k > 1)
