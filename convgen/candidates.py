"""The plans worth timing for one shape and pass: the planner's default first, then its variations.

Library side of tuning, shared by `convgen tune` (``convgen.tools.tune``, which times them
all) and tuning on first use (:mod:`convgen.autotune`, which times the first few): it lives
in the library because the library may not import the tools.  Generation only; nothing here
compiles or times.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Callable

from . import depthwise_variations, depthwise_wgrad, stream_k, tma_halo
from .ir import ConvProblem, Pass, Target
from .spec import Plan, stages_whole_halo
from .mainloop import FRAG, TMA_BLOCK_K, FlatHalo, HaloLdsm, HaloTile, Im2col, MainLoop, StagedHalo, TmaWgmma, Wgmma, fit_tile
from .planner import check_plan, halo_eligible, halo_vec_b, plan as default_plan
from .footprint import halo_images, resident_blocks
from .reduction import resident_split
from .tma_rules import (EXACT_PERSISTENT_STAGES, EXACT_TMA_BN, EXACT_TMA_STAGES, PERSISTENT_TILES, exact_tile_fits,
                        exact_tile_rate, tma_eligible, tma_split, tma_tail_fill, tma_tiles)

# (block_m, block_n, warps_m, warps_n, block_k, stages): shapes worth timing.  Warp
# tiles range from 32x16 to 64x64; 2 to 8 warps; short and long K-steps.  The 64x64 warp
# tiles of 8 warps (256x128, 128x256) are CUTLASS's choice for large compute-bound GEMMs;
# 256x64 on 4 warps is what cuDNN ran for CIFAR-VGG conv3 and conv32 dgrad (ncu).
_SHAPES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (128, 128, 2, 2, 32, 4), (128, 128, 2, 4, 32, 3), (128, 128, 4, 2, 64, 3), (128, 128, 2, 2, 64, 3),
    (256, 128, 4, 2, 64, 3), (128, 256, 2, 4, 64, 3), (128, 256, 2, 4, 32, 4),
    (256, 128, 4, 2, 32, 3), (128, 64, 2, 2, 32, 4), (128, 64, 4, 1, 32, 3), (128, 64, 2, 2, 64, 3),
    (256, 64, 4, 2, 32, 3), (256, 64, 4, 1, 32, 3), (128, 64, 2, 1, 32, 4), (128, 64, 2, 1, 64, 3),
    (64, 128, 2, 2, 32, 4), (64, 64, 2, 2, 32, 4), (64, 64, 2, 2, 64, 3),
    (128, 32, 4, 1, 32, 3), (256, 32, 8, 1, 32, 3), (256, 32, 4, 1, 32, 4), (64, 32, 2, 1, 32, 4),
    (128, 16, 4, 1, 32, 3), (256, 16, 8, 1, 32, 3), (256, 16, 4, 1, 64, 3), (128, 16, 2, 1, 32, 4),
    (64, 16, 4, 1, 32, 4), (512, 16, 8, 1, 32, 3),
    (32, 128, 1, 4, 64, 3), (32, 128, 1, 2, 32, 4), (16, 128, 1, 4, 64, 3), (32, 64, 1, 2, 64, 3),
    (16, 64, 1, 2, 64, 3), (32, 32, 1, 2, 64, 3), (16, 32, 1, 2, 64, 3),
)


MAX_SPLIT = 512  # slices of one output tile; each still runs at least four K-steps
# A wgrad of one or two output tiles and a long reduction (UNet's 32 -> 1 head: one 16x32 tile,
# 32,768 K-steps) stops at MAX_SPLIT slices, 512 blocks of 2 warps where 8 an SM would be
# resident: about 4 an SM (55 us against cuDNN's 35 on the H200, 3.4x its floor).  Tuning also
# times the split that fills 8 blocks an SM, up to this many slices.  Timed on an H100
# (thirty-seventh session) it tied 512 slices (47.8 against 47.9 us, both 64-deep): the head's
# lever was the K-step (now the planner's, 57.4 -> 47.9), not the blocks in flight.
FILL_BLOCKS_PER_SM = 8
MAX_FILL_SPLIT = 2048
# Sliced-K candidates per layer (fprop and dgrad im2col plans with few blocks per SM), on top
# of `limit`.  The first im2col shapes that leave at most two blocks per SM get warps_k = 2.
SLICED_PER_LAYER = 6
# wgmma candidates (sm_90 fprop/dgrad with 16-byte fp16 gathers), on top of `limit`:
# (block_m, block_n, warps_m, block_k, stages), whole warpgroups over M.
_WGMMA_SHAPES: tuple[tuple[int, int, int, int, int], ...] = (
    (128, 128, 8, 64, 3), (128, 64, 4, 64, 3), (256, 128, 8, 64, 3), (128, 256, 8, 64, 3), (128, 128, 4, 64, 3),
    (256, 64, 8, 64, 3), (64, 64, 4, 64, 4), (128, 64, 8, 64, 4), (64, 128, 4, 64, 3), (128, 128, 8, 32, 4),
)
WGMMA_PER_LAYER = 10

# Halo-path shapes (block_m, block_n, warps_m, warps_n): tried with tiles 16 and 32 pixels
# wide and with flat tiles, for stride-1 fprop and dgrad with channel counts in multiples of 8.
# Warp tiles of 64 pixels come first: each staged fragment then feeds more MMAs, and the
# halo kernels are bound by shared-memory reads (ncu: L1 82% busy on CIFAR-VGG conv32 fprop).
_HALO_SHAPES: tuple[tuple[int, int, int, int], ...] = (
    (256, 32, 4, 1), (256, 64, 4, 2), (128, 32, 2, 1), (256, 32, 8, 1), (128, 32, 4, 1), (128, 64, 4, 1),
    (128, 64, 2, 2), (128, 128, 2, 4), (64, 64, 2, 2), (128, 16, 4, 1), (256, 16, 4, 1),
)
HALO_PER_LAYOUT = 8  # halo candidates per tile layout, placed right after the default plan
# Tiles 8 pixels wide (CUDA's ldmatrix halo MMAs) for images at most 8 pixels wide: one
# 8x8 tile per 64-row block, whole images of CIFAR's 8x8 and ResNet-50's 7x7 layers; and
# 128 or 256 rows where whole images stack in them (footprint.halo_images: 2 or 4 8x8 images
# per block, every tap's weights staged once for all).  16-channel steps (the stacked shapes
# below also take 32).
_NARROW_HALO_SHAPES: tuple[tuple[int, int, int, int], ...] = (
    (64, 32, 4, 1), (64, 64, 4, 1), (128, 64, 4, 1), (128, 64, 8, 1), (256, 64, 8, 1), (256, 64, 4, 1),
    (128, 64, 4, 2),
    (64, 32, 2, 1), (64, 16, 4, 1),
)
# Stacked-image blocks also take 32-channel steps (fewer, longer steps per staged stack: CIFAR-VGG
# conv3 dgrad 13.3 against 13.9 us at 16 on the H200, hand-timed at 6f2c3b8), and 256 rows with
# 64-pixel warp tiles (conv3 fprop 14.8 us).  64-row tiles keep 16-channel steps: with 32
# they spilled under NVRTC 13.
_STACKED_DEEP_SHAPES: tuple[tuple[int, int, int, int], ...] = (
    (128, 64, 4, 1), (256, 64, 4, 1), (128, 64, 8, 1), (256, 64, 8, 1),
)
MULTI_TILE_SHAPES = 2  # a layout's first shapes are also offered with several tiles per block


def candidates(problem: ConvProblem, pass_: Pass | str, target: Target, in_dtype: str = "float16",
               limit: int = 48, wgmma: bool = False, clusters: bool = False, tma_store: bool = False) -> list[Plan]:
    """The default plan first, then halo-path plans where they apply, then feasible
    variations of tile, warps, K-step, stages and split-K.  `limit` bounds the im2col plans
    (the default's among them); every halo plan is kept on top.  `wgmma` adds the warpgroup-MMA
    plans (sm_90): opt-in, since on the H200 they have so far run 1.1 to 2.2x slower than the
    WMMA plans on every suite layer (benchmarks/NOTES.md).  `clusters` adds the TMA plans in
    thread-block clusters of two (fprop, stride-1 dgrad): opt-in until a GPU has run them (a fault in their
    barrier protocol would hang the tuning run).  `tma_store` adds the TMA plans that store
    their output through the copy engine (fprop, stride-1 dgrad), opt-in for the same reason (a
    fault there would end the run's CUDA context)."""
    pass_ = Pass.parse(pass_)
    base = default_plan(problem, pass_, target, in_dtype)  # type: ignore[arg-type]
    if problem.depthwise:  # a stencil on the CUDA cores: its own knobs (convgen/depthwise_variations.py)
        out, seen = [base], {dataclasses.replace(base, reasons=())}
        # wgrad's default sums its slices in the kernel where the GPU holds them at once (CUDA):
        # next, the slices for WGRAD_BLOCKS_PER_SM blocks an SM summed by a second kernel, which
        # it replaced, and its other grid-summed twins; those that may not fit, last
        summed = base
        if base.split_reduce == "grid":
            summed = _feasible(problem, pass_, target, in_dtype, lambda: dataclasses.replace(
                base, split_reduce="kernel", split_k=depthwise_wgrad.wgrad_split(problem, target, base),
                reasons=("tuning candidate: the default's tile, its slices summed by a second kernel",))) or base
            _add_unique(summed, seen, out)
        fits, late = _grid_reduce_twins(problem, pass_, target, in_dtype, summed, seen)
        out += fits
        for make in depthwise_variations.variations(problem, pass_, target, base):
            p = _feasible(problem, pass_, target, in_dtype, make)
            if p is not None:
                _add_unique(p, seen, out)
            if len(out) > depthwise_variations.MAX_VARIATIONS:
                break
        return out + late
    gemm = problem.group_gemm(pass_)  # a grouped layer's blocks tile one group's GEMM, groups of them
    out: list[Plan] = [base]
    seen = {dataclasses.replace(base, reasons=())}
    halo_box = tma_halo.variations(problem, pass_, target, in_dtype)
    sliced_box = halo_box if tma_halo.slices(problem.geometry, pass_) > 1 else []  # untimed: offered last
    for p in ([] if sliced_box else halo_box) + _tma_candidates(problem, pass_, target, in_dtype) + \
            _halo_candidates(problem, pass_, target, in_dtype):
        _add_unique(p, seen, out)
    halo = len(out) - 1
    sliced: list[Plan] = []
    shapes = list(_SHAPES)
    exact_n = math.ceil(gemm.n / FRAG) * FRAG
    if exact_n <= 256 and exact_n & (exact_n - 1):  # not a power of two: a tile that fits N exactly
        frags = exact_n // FRAG
        wn = max(d for d in (1, 2, 3, 4) if frags % d == 0)
        for bm, wm in ((16, 1), (32, 1), (64, 2), (128, 2)):
            shapes.append((bm, exact_n, wm, wn, 64 if pass_ is Pass.WGRAD else 32, 3))
    for bm, bn, wm, wn, bk, stages in shapes:
        if pass_ is not Pass.WGRAD and bm < 64:
            continue  # fprop/dgrad M is the pixel count: short tiles only multiply launches
        if bn > max(fit_tile(gemm.n), FRAG) or bm > max(fit_tile(gemm.m), FRAG):
            continue  # a tile past the GEMM's extent only computes padding
        if bn < 64 and gemm.n > bn * 2:
            continue  # far too narrow: many re-reads of A for nothing
        tiles = math.ceil(gemm.m / bm) * math.ceil(gemm.n / bn) * problem.groups
        steps = math.ceil(gemm.k / bk)
        splits = {1}
        if tiles < 2 * target.sm_count and steps >= 8:  # one, two and four waves of slices
            for waves in (1, 2, 4):
                splits.add(max(1, min(math.ceil(waves * target.sm_count / tiles), steps // 4, MAX_SPLIT)))
            if pass_ is Pass.WGRAD and tiles * MAX_SPLIT < FILL_BLOCKS_PER_SM * target.sm_count:
                splits.add(min(math.ceil(FILL_BLOCKS_PER_SM * target.sm_count / tiles), steps // 4, MAX_FILL_SPLIT))
        if not target.info.cp_async:
            stages = 2
        for split in sorted(splits):
            p = _feasible(problem, pass_, target, in_dtype, lambda: Plan(
                bm, bn, bk, wm, wn, stages, base.vec_a, base.vec_b, base.read_a, base.read_b, split,
                reasons=(f"tuning candidate {bm}x{bn}x{bk}, {wm}x{wn} warps, {stages} stages, split-K {split}",)))
            if p is None:
                continue
            _add_unique(p, seen, out)
            # A block that owns a long reduction alone on its SM waits on its own loads: the
            # same tile with K sliced over twice the warps (at most 8) hides that latency.
            if (split == 1 and pass_ is not Pass.WGRAD and tiles <= 2 * target.sm_count and steps >= 4
                    and wm * wn <= 4 and bk >= 32):
                q = _feasible(problem, pass_, target, in_dtype, lambda: dataclasses.replace(
                    p, loop=Im2col(warps_k=2), reasons=(p.reasons[0] + ", K sliced 2 ways",)))
                if q is not None:
                    sliced.append(q)
    wgmma_plans = _wgmma_candidates(problem, pass_, target, in_dtype, base, seen) if wgmma else []
    pointwise = _pointwise_tile_candidates(problem, pass_, target, in_dtype)
    exact = _exact_tma_candidates(problem, pass_, target, in_dtype, seen)
    fits, late = _grid_reduce_twins(problem, pass_, target, in_dtype, base, seen)  # untimed here: last
    return (out[:limit + halo] + sliced[:SLICED_PER_LAYER] + wgmma_plans + pointwise + exact
            + late + fits  # the most slices first
            + (_tma_twins(problem, pass_, target, in_dtype, out, seen, {"cluster": 2},
                          "in clusters of 2 sharing the weights' tile (TMA multicast)") if clusters else [])
            + (_tma_twins(problem, pass_, target, in_dtype, out, seen, {"tma_store": True},
                          "output stored by the copy engine (TMA)") if tma_store else [])
            + sliced_box + _stream_k_candidates(problem, pass_, target, in_dtype, seen))


# TMA plans not yet run on a GPU: the twins of the default and of the first TMA candidates in
# thread-block clusters of two (TmaWgmma.cluster = 2, forty-second and forty-third sessions: two
# blocks side by side along M share each stage's weight tile by TMA multicast) or storing their
# output through the copy engine (TmaWgmma.tma_store, forty-third session), both in fprop and
# stride-1 dgrad.  Offered only when asked for (`convgen tune --clusters`, `--tma-store`), after
# the others, with only the untimed TMA halo slices behind them, so tuning on first use
# (autotune.CANDIDATES) never reaches them.
TWINS_PER_LAYER = 4


def _tma_twins(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: str, plans: list[Plan],
               seen: set[Plan], change: dict[str, Any], why: str) -> list[Plan]:
    out: list[Plan] = []
    for p in plans:
        if len(out) == TWINS_PER_LAYER:
            break
        if not isinstance(p.loop, TmaWgmma) or all(getattr(p.loop, k) == v for k, v in change.items()):
            continue  # (the planner's checks refuse a twin in a pass it does not run in)
        q = _feasible(problem, pass_, target, in_dtype, lambda: dataclasses.replace(
            p, loop=dataclasses.replace(p.loop, **change),
            reasons=(("the default plan" if p is plans[0] else p.reasons[0]) + ", " + why,)))
        if q is not None:
            _add_unique(q, seen, out)
    return out


def _exact_tma_candidates(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: str,
                          seen: set[Plan]) -> list[Plan]:
    if not _tma_offered(problem, pass_, target, in_dtype):
        return []
    gemm = problem.gemm(pass_)
    if not exact_tile_fits(gemm.n):  # tma_rules.EXACT_TMA_BN: the planner takes 64 rows where it saves enough
        return []
    out: list[Plan] = []
    for bm, stages in EXACT_TMA_STAGES.items():
        if bm > max(fit_tile(gemm.m), 64):
            continue
        rate = exact_tile_rate(bm)
        p = _feasible(problem, pass_, target, in_dtype, lambda: _tma_tile(
            problem, pass_, target, in_dtype, bm, EXACT_TMA_BN, stages, rate,
            f"exactly {gemm.n // EXACT_TMA_BN} tiles of N={gemm.n}"))
        if p is not None:
            _add_unique(p, seen, out)
    if pass_ is not Pass.WGRAD:  # and persistent, as the 128x256 tile the planner gives such layers runs
        p = _feasible(problem, pass_, target, in_dtype, lambda: _tma_persistent_tile(
            in_dtype, 128, EXACT_TMA_BN, EXACT_PERSISTENT_STAGES, False,
            f", exactly {gemm.n // EXACT_TMA_BN} tiles of N={gemm.n}"))
        if p is not None:
            _add_unique(p, seen, out)
    return out


def _grid_reduce_twins(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: str, base: Plan,
                       seen: set[Plan]) -> tuple[list[Plan], list[Plan]]:
    """The default split-K plan with its slices summed in the main kernel (split_reduce "grid":
    one launch, not two): with the default's slices, half of them, and as many as the GPU
    holds at once if each thread keeps GRID_REDUCE_REGS registers (the default's count comes
    from shared memory and threads, and a cooperative launch must fit: the runtime refuses one
    that does not, and tuning skips it).  Returned as those whose blocks fit that estimate and
    those that may not: the im2col kinds offer both last (tuning on first use, which times the
    first few, leaves them to `convgen tune`); depthwise wgrad, whose default already sums in its
    grid, offers those of its second-kernel twin that fit right after that twin."""
    from .emit import emit
    from .footprint import smem_bytes
    from .planner import make_spec

    fits: list[Plan] = []
    late: list[Plan] = []
    if base.split_k == 1 or _feasible(problem, pass_, target, in_dtype,
                                      lambda: dataclasses.replace(base, split_reduce="grid")) is None:
        return fits, late
    gx, gy, _ = emit(make_spec(problem, pass_, target=target, in_dtype=in_dtype, plan_=base)).grid(problem.n)
    fit = resident_split(target.sm_count, target.info.smem_limit, smem_bytes(base, pass_, target.warp_size, problem),
                         base.warps * target.warp_size, gx * gy)
    for split in sorted({base.split_k, base.split_k // 2, min(fit, base.split_k)}, reverse=True):
        if split < 2:
            continue
        p = _feasible(problem, pass_, target, in_dtype, lambda: dataclasses.replace(
            base, split_k=split, split_reduce="grid",
            reasons=(f"tuning candidate: the default plan, split-K {split} summed in the main kernel",)))
        if p is not None:
            _add_unique(p, seen, fits if split <= fit else late)
    return fits, late


def _feasible(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: str,
              make: Callable[[], Plan]) -> Plan | None:
    """The plan ``make`` builds, or None where its constructor or the checker refuses it."""
    try:
        p = make()
        check_plan(p, problem, pass_, target, in_dtype)  # type: ignore[arg-type]
    except ValueError:
        return None
    return p


def _add_unique(p: Plan, seen: set[Plan], out: list[Plan]) -> None:
    """Append p unless an equal plan (reasons aside) is already offered."""
    bare = dataclasses.replace(p, reasons=())
    if bare not in seen:
        seen.add(bare)
        out.append(p)


def _wgmma_candidates(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: str, base: Plan,
                      seen: set[Plan]) -> list[Plan]:
    """Warpgroup-MMA plans where they apply, with a one-wave split-K twin when the tiles
    leave most SMs idle."""
    if (not target.info.wgmma or pass_ is Pass.WGRAD or in_dtype not in ("float16", "bfloat16")
            or (base.vec_a, base.vec_b) != (8, 8)):
        return []
    gemm = problem.group_gemm(pass_)
    out: list[Plan] = []
    for bm, bn, wm, bk, stages in _WGMMA_SHAPES:
        if bn > max(fit_tile(gemm.n), FRAG) or bm > max(fit_tile(gemm.m), FRAG):
            continue
        tiles = math.ceil(gemm.m / bm) * math.ceil(gemm.n / bn) * problem.groups
        steps = math.ceil(gemm.k / bk)
        splits = [1] + ([min(math.ceil(target.sm_count / tiles), steps // 4)]
                        if tiles < target.sm_count // 2 and steps >= 8 else [])
        for split in splits:
            p = _feasible(problem, pass_, target, in_dtype, lambda: Plan(
                bm, bn, bk, wm, 1, stages, 8, 8, in_dtype, in_dtype, split_k=split, loop=Wgmma(),
                reasons=(f"tuning candidate {bm}x{bn}x{bk}, {wm // 4} warpgroup(s), wgmma, {stages} stages, "
                         f"split-K {split}",)))
            if p is not None:
                _add_unique(p, seen, out)
    return out[:WGMMA_PER_LAYER]


def _tma_offered(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: str) -> bool:
    """Whether TMA candidates are worth timing: the copy engine runs the layer
    (planner.tma_eligible), and its steps are not half empty."""
    return (tma_eligible(problem.geometry, pass_, target, in_dtype) is None  # type: ignore[arg-type]
            and tma_tail_fill(problem, pass_) is None)


def _tma_tile(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: str, bm: int, bn: int, stages: int,
              rate: float, detail: str) -> Plan:
    """A one-block-per-tile TMA plan of ``bm`` x ``bn`` at the planner's split for a tile of
    that ``rate`` (what the planner's default would run it with); ``detail`` names it in its reason."""
    split = tma_split(problem, pass_, target, bm, bn, rate)[0]
    return Plan(bm, bn, TMA_BLOCK_K, bm // 16, 1, stages, 8, 8, in_dtype, in_dtype, split_k=split, loop=TmaWgmma(),
                reasons=(f"tuning candidate {bm}x{bn}x{TMA_BLOCK_K}, TMA + wgmma, {detail}, {stages} stages, "
                         f"split-K {split}",))


def _tma_candidates(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: str) -> list[Plan]:
    """TMA main-loop plans where the copy engine can run the layer (planner.tma_eligible)."""
    if not _tma_offered(problem, pass_, target, in_dtype):
        return []
    out: list[Plan] = []
    for bm, bn, stages, rate in tma_tiles(problem.gemm(pass_).n):  # the planner's TMA tiles, every one timed
        p = _feasible(problem, pass_, target, in_dtype, lambda: _tma_tile(
            problem, pass_, target, in_dtype, bm, bn, stages, rate, f"{bm // 64} consumer warpgroup(s)"))
        if p is not None:
            out.append(p)
            twin = _resident_twin(problem, pass_, target, in_dtype, p, rate)
            if twin is not None:
                out.append(twin)
    if pass_ is not Pass.WGRAD:  # and each persistent tile no wider than N, whatever its tile count
        widest = max(bn for _, bn, _, _ in tma_tiles(problem.gemm(pass_).n))
        tiles = sorted(set(PERSISTENT_TILES.values()))  # both passes': the tuner times them all
        for bm, bn, stages, pingpong in (t for t in tiles if t[1] <= widest):
            p = _feasible(problem, pass_, target, in_dtype,
                          lambda: _tma_persistent_tile(in_dtype, bm, bn, stages, pingpong))
            if p is not None:
                out.append(p)
    return out


def _tma_persistent_tile(in_dtype: str, bm: int, bn: int, stages: int, pingpong: bool, detail: str = "") -> Plan:
    """A persistent TMA plan (fprop, dgrad): ping-pong's two consumer warpgroups take whole
    tiles (8 consumer warps whatever the rows), the cooperative kind's share each tile's rows."""
    return Plan(bm, bn, TMA_BLOCK_K, 8 if pingpong else bm // 16, 1, stages, 8, 8, in_dtype, in_dtype,
                loop=TmaWgmma(persistent=True, pingpong=pingpong),
                reasons=(f"tuning candidate {bm}x{bn}x{TMA_BLOCK_K}, persistent TMA + wgmma"
                         f"{', ping-pong' if pingpong else ''}{detail}, {stages} stages",))


# wgrad's co-resident twins: a 64-row TMA tile's plan (one consumer warpgroup, about 100 KB of
# ring) fits two blocks an SM, but the cost model's split counts waves of one block an SM, so
# where its blocks are fewer than the SMs' two slots, each SM runs one block alone.  The tuning
# logs say a lone block of such a tile runs well under the rate measured with the SM full
# (ResNet-50's l4-1x1: 64x128 on 128 blocks took 24.7 us where 64x64 on 256 blocks, two an SM,
# took 21.6 for the same work an SM; MobileNetV2's 7x7 pointwise wgrads ran 1.07-1.27x their
# best on 64x128 at 2-3 slices: H100 at 4608fd8 and d3f404f, benchmarks/NOTES.md, fifty-first
# session).  The twin takes the split tma_tile_cost picks when it prices each SM's blocks as
# sharing it (``resident``), which fills both slots.  A candidate, not the planner's default,
# until a tuning run has timed it.
def _resident_twin(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: str, p: Plan,
                   rate: float) -> Plan | None:
    resident = resident_blocks(p, pass_, target) if pass_ is Pass.WGRAD else 1
    if resident == 1:
        return None
    split = tma_split(problem, pass_, target, p.block_m, p.block_n, rate, resident)[0]
    if split == p.split_k:
        return None
    return _feasible(problem, pass_, target, in_dtype, lambda: dataclasses.replace(
        p, split_k=split, reasons=(f"tuning candidate {p.block_m}x{p.block_n}x{TMA_BLOCK_K}, TMA + wgmma, "
                                   f"{p.stages} stages, split-K {split}: {resident} blocks an SM (co-resident twin "
                                   f"of split-K {p.split_k})",)))


# Stream-K wgrad (TmaWgmma(persistent=True) in wgrad): the tiles' steps dealt out evenly to one
# wave of blocks.  Offered last, so tuning on first use (autotune.CANDIDATES) never reaches it:
# on the GPU it ran slower than the planner's split-K on all 12 ResNet-50 wgrad rows, 0.56-1.00x
# (H100 at 2562d41; benchmarks/NOTES.md, thirty-sixth session), l4-3x3 too, where the cost model
# had put it at 0.83x split-K's time.  `convgen tune` still times it, the tiles in the order of
# their predicted time, on the deepest ring that fits beside the epilogue's strips.
STREAM_K_PER_LAYER = 3


def _stream_k_candidates(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: str,
                         seen: set[Plan]) -> list[Plan]:
    if pass_ is not Pass.WGRAD or problem.groups > 1 or not _tma_offered(problem, pass_, target, in_dtype):
        return []
    out: list[Plan] = []
    for _, plan in stream_k.offered(problem, target, in_dtype):
        if len(out) == STREAM_K_PER_LAYER:
            break
        p = _feasible(problem, pass_, target, in_dtype, lambda: plan)
        if p is not None:
            _add_unique(p, seen, out)
    if out:  # the first one summed in the kernel (the default's form: 0.99-1.09x the second kernel, H100 s55)
        twin = dataclasses.replace(out[0], split_reduce="grid", reasons=out[0].reasons[:1] + (
            "its cut tiles summed in the kernel after a grid-wide barrier, not by a second kernel",))
        _add_unique(twin, seen, out)
    return out


# A 1x1 layer with a one-step reduction is bound by its pixels' bytes, not its MMAs; the im2col
# loop gives each block one tile, so a block's loads wait on its own prologue and drain.  The
# flat halo kind with several tiles per block stages the weights once and keeps the next
# tile's pixels in flight while this one is multiplied and drained.  Offered last, so that
# tuning on first use (autotune.CANDIDATES) does not run them before `convgen tune` has
# measured them on the pointwise suites (MobileNetV2's 112- and 56-pixel layers, at 1.5-1.8x
# the bandwidth floor against cuDNN's 1.2-1.3x, are what they are for).
POINTWISE_TILES = (2, 4, 8)
# A warp's accumulators past 12 fragments (256 rows of 240 or 256 columns) spilled under NVRTC 13.
POINTWISE_MAX_WARP_FRAGMENTS = 12


def _pointwise_tile_candidates(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: str) -> list[Plan]:
    """Flat multi-tile plans one tile exactly N wide (each pixel's row read once), 128 and 256
    rows on 4 x (up to 4) warps, 2, 4 and 8 tiles a block."""
    g = problem.geometry
    if (g.r * g.s != 1 or g.stride != (1, 1) or pass_ is Pass.WGRAD or not target.info.cp_async
            or halo_eligible(g, pass_, in_dtype) is not None):  # type: ignore[arg-type]
        return []
    red, n = problem.gemm(pass_).k, problem.gemm(pass_).n
    bn = math.ceil(n / FRAG) * FRAG
    if red > 64 or bn > 256:
        return []  # several tiles a block need a one-step reduction; one tile, all of N
    bk = 16 if red <= 16 else 32 if red <= 32 else 64
    frags = bn // FRAG
    wn = max(d for d in (1, 2, 3, 4) if frags % d == 0)
    out = []
    for bm, tiles in itertools.product((128, 256), POINTWISE_TILES):
        if bm // 4 // FRAG * frags // wn > POINTWISE_MAX_WARP_FRAGMENTS:
            continue
        p = _feasible(problem, pass_, target, in_dtype, lambda: Plan(
            bm, bn, bk, 4, wn, 2, 8, halo_vec_b(g, pass_), in_dtype, in_dtype, 1, loop=FlatHalo(tiles),
            reasons=(f"tuning candidate: pointwise flat tile, {bm}x{bn}x{bk}, 4x{wn} warps, {tiles} tiles per block",)))
        if p is not None:
            out.append(p)
    return out


def _exact_halo_shapes(n: int) -> tuple[tuple[int, int, int, int], ...]:
    """Halo shapes exactly N wide where N is whole fragments but no power of two (UNet's
    dec1-cat96 dgrad: N = 96, whose power-of-two tile of 128 drains a quarter padding and
    whose 32- and 64-wide tiles stage the whole halo two or three times per output pixel).
    Three fragment columns per warp at most, as the pointwise exact tiles hold theirs."""
    frags = n // FRAG
    if n % FRAG or n == fit_tile(n) or frags > 12:
        return ()
    wn = next(d for d in (frags // 3, frags // 2, frags) if d and frags % d == 0 and frags // d <= 3)
    return ((256, n, 4, wn), (128, n, 2, wn))


def _halo_candidates(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: str) -> list[Plan]:
    g = problem.geometry
    if halo_eligible(g, pass_, in_dtype) is not None or g.r * g.s == 1:  # type: ignore[arg-type]
        return []  # (a 1x1 filter's halo is its tile: nothing to share between taps)
    out_w = g.q if pass_ is Pass.FPROP else g.w
    n = problem.gemm(pass_).n
    staged = stages_whole_halo(g, pass_)
    if staged:  # StagedHalo: the default plan's gathers, fed from the staged halo
        base = default_plan(problem, pass_, target, in_dtype)  # type: ignore[arg-type]
        va, vb, steps = base.vec_a, base.vec_b, [(32, base.stages)]
    else:  # the in-place halo kinds
        red = g.c if pass_ is Pass.FPROP else g.k  # channels reduced per tap
        va, vb = 8, halo_vec_b(g, pass_)
        # (block_k, stages): one step needs no deeper ring.  dgrad over up to 64 channels
        # also gets a one-step reduction, which then stages every tap's weights once per
        # block and can take several tiles per block.  (fprop's 64-channel steps spill: its
        # weights are staged [tap][BN][BK], and a 64-deep K row holds twice the fragments.)
        # A multi-step halo reduction also gets 16-channel steps: a step stages every tap's
        # weights, 9 x BK x BN halves for a 3x3 filter, so at 32 channels and 3 stages a
        # 128x64 block holds 160 KB and one block fits per SM (CIFAR-VGG conv3 dgrad: 1.2 to
        # 1.9 waves); at 16, two or three do.
        one_step = pass_ is Pass.DGRAD and 32 < red <= 64
        bks = [16] if red <= 16 else [32] if red <= 32 else [32, 16] + ([64] if one_step else [])
        steps = [(bk, 2 if red <= bk or not target.info.cp_async else 3) for bk in bks]
    # The kinds: 2-D tiles 16 and 32 pixels wide (no wider than the image), staged whole
    # where the layer's channels cannot be read in place; the flat tile, whose fragments need
    # not start a row (images narrower than 16 pixels); and 8-pixel ldmatrix tiles.
    widths = [tw for tw in (16, 32) if tw <= max(16, fit_tile(out_w))]
    layouts: list[MainLoop] = ([StagedHalo(tw) for tw in widths] if staged
                               else [HaloTile(tw) for tw in widths] + [FlatHalo()])
    if out_w <= 8 and target.info.ldmatrix and target.info.mma_sync and not staged:
        layouts.append(HaloLdsm(8))
    out, multi = [], []
    for (bk, stages), layout in itertools.product(steps, layouts):
        mine = []
        narrow = isinstance(layout, HaloLdsm)
        if narrow and bk not in (16, 32):
            continue
        shapes = (_exact_halo_shapes(n) + _HALO_SHAPES if not narrow
                  else _NARROW_HALO_SHAPES if bk == 16 else _STACKED_DEEP_SHAPES)
        tile_w = 0 if isinstance(layout, FlatHalo) else layout.tile_w
        for bm, bn, wm, wn in shapes:
            if bn > max(fit_tile(n), FRAG) or bm % (tile_w or FRAG):
                continue
            tile = f"halo tile {bm // tile_w}x{tile_w}" if tile_w else "flat halo tile"
            try:
                p = Plan(bm, bn, bk, wm, wn, stages, va, vb, in_dtype, in_dtype, 1, loop=layout,
                         reasons=(f"tuning candidate: {tile}, {bm}x{bn}x{bk}, {wm}x{wn} warps, {stages} stages",))
                if narrow and bm > 64 and halo_images(p, g, pass_) == 1:
                    continue  # a tile taller than an image that does not stack whole images
                check_plan(p, problem, pass_, target, in_dtype)  # type: ignore[arg-type]
            except ValueError:
                continue
            mine.append(p)
        out += mine[:HALO_PER_LAYOUT]
        # A one-step reduction's block loads every tap's weights for a single tile: offer
        # blocks of 2 and 4 tiles (weights staged once, the next halo in flight) for the
        # layout's first shapes.
        for p in mine[:MULTI_TILE_SHAPES] if not staged else ():  # a staged halo is one tile per block
            for tiles in (2, 4):
                q = _feasible(problem, pass_, target, in_dtype, lambda: dataclasses.replace(
                    p, loop=dataclasses.replace(p.loop, tiles=tiles), reasons=(p.reasons[0] + f", {tiles} tiles per block",)))
                if q is not None:
                    multi.append(q)
    return out + multi
