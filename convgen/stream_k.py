"""Stream-K wgrad (:class:`~convgen.mainloop.TmaWgmma` with ``persistent=True`` in wgrad): what a
plan of it launches and occupies, which the emitter, the launcher and the tests ask.

Split-K gives every tile of dW the same number of slices, so the grid is tiles x slices blocks:
a last wave part-empty (ResNet-50's l4-3x3, 72 tiles of 128x256 on 132 SMs, runs one wave with
60 SMs idle) or, to fill the waves, many slices a tile, each a full fp32 partial tile written
and read back (VGG-16's conv4_2 at 8 slices: 150 MB of traffic).  Stream-K (as CUTLASS names
it) launches one wave of blocks and deals out the tiles' K-steps evenly, a contiguous run a
block: every SM finishes together, a tile is cut between at most a few blocks, and a tile a
block runs whole goes straight to dW.  The parts of the cut tiles go to workspace slots, straight
from the accumulators in their own order (``templates/parts/streamk_slots.j2``: whole sectors, no
staging through shared memory).  With ``split_reduce="grid"`` (the default's form), the block
that ran a cut tile's first part, the last of its run, keeps it in registers over a grid-wide
barrier and adds the other parts itself, in block order: no second launch, and only the later
parts cross L2 (CUTLASS's stream-K "fixup", here after one barrier rather than a flag a tile).
With ``split_reduce="kernel"`` a reduction kernel sums them in the same order (deterministic, as
split-K is; the same bits), which is what a GPU that cannot hold the whole grid at once gets.
On an H100 the grid form ran 1.09x the second kernel on ResNet-18's l4-3x3 once the slots took
the accumulators' order, having run 0.87-0.95x with the parts staged through shared memory
(forty-eighth and forty-ninth sessions, benchmarks/NOTES.md).  The walk is
``templates/parts/streamk.j2``; tests/test_stream_k.py runs its C++ on the host.

Its GPU tests, fuzz and sanitizers ran clean on the H200 (thirty-fifth session), but it ran
slower than the planner's split-K on all 12 of ResNet-50's wgrad rows, 0.56-1.00x (H100 at
2562d41, thirty-sixth session; benchmarks/NOTES.md), so it is a tuning candidate offered last,
and a default only where :func:`default_plan`'s rule, fitted to the large suite's tuning run,
says.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .footprint import resident_blocks, smem_bytes
from .ir import ConvGeometry, ConvProblem, Pass, Target
from .mainloop import TMA_BLOCK_K, TmaWgmma
from .spec import Plan
from .tma_rules import tma_stream_k_cost, tma_tiles

REDUCE_THREADS = 256  # a reduction block: one thread a run of outputs of dW


@dataclass(frozen=True)
class StreamK:
    """What a stream-K kernel and its reduction are built with."""

    blocks: int  # the grid: as many as one wave holds (footprint.resident_blocks)
    tiles: int  # dW's BM x BN tiles, whose steps the blocks share
    reduce_name: str
    threads: int  # a reduction block's: one thread a float4 of a tile's slots (parts/streamk_slots.j2)
    # plan.split_reduce "grid": no reduction kernel.  A cut tile's first part ends its block's
    # run, so that block holds it in registers over a grid-wide barrier (a cooperative launch)
    # and adds the later parts, which the blocks after it wrote to their slots.
    in_kernel: bool = False

    @property
    def slots(self) -> int:
        """Workspace slots the walk can fill: one per part of a cut tile, tile + block at most."""
        return self.tiles + self.blocks - 1


def applies(plan: Plan, pass_: Pass) -> bool:
    return pass_ is Pass.WGRAD and isinstance(plan.loop, TmaWgmma) and plan.loop.persistent


def layout(plan: Plan, geometry: ConvGeometry, target: Target, name: str) -> StreamK:
    """The blocks, tiles and reduction of a stream-K plan on a layer (``name``: its kernel's)."""
    n = geometry.r * geometry.s * geometry.c  # dW's columns
    return StreamK(blocks=target.sm_count * resident_blocks(plan, Pass.WGRAD, target, geometry),
                   tiles=math.ceil(geometry.k / plan.block_m) * math.ceil(n / plan.block_n),
                   reduce_name=name + "_reduce", threads=REDUCE_THREADS,
                   in_kernel=plan.split_reduce == "grid")


def offered(problem: ConvProblem, target: Target, in_dtype: str = "float16") -> list[tuple[float, Plan]]:
    """Each TMA tile's stream-K plan on the deepest ring that fits beside the epilogue's strips,
    with the cost model's microseconds (tma_rules.tma_stream_k_cost), fastest first: what the
    tuner offers (after its own checks) and what the default is taken from."""
    g = problem.geometry
    out = []
    for bm, bn, stages, rate in tma_tiles(problem.gemm(Pass.WGRAD).n):
        for ring in range(stages, 1, -1):
            plan = Plan(bm, bn, TMA_BLOCK_K, bm // 16, 1, ring, 8, 8, in_dtype, in_dtype, loop=TmaWgmma(persistent=True),
                        reasons=(f"tuning candidate {bm}x{bn}x{TMA_BLOCK_K}, stream-K TMA + wgmma, {ring} stages",))
            if smem_bytes(plan, Pass.WGRAD, target.warp_size, g) <= target.smem_limit:
                blocks = target.sm_count * resident_blocks(plan, Pass.WGRAD, target, g)
                out.append((tma_stream_k_cost(problem, target, bm, bn, rate, blocks), plan))
                break
    return sorted(out, key=lambda c: c[0])


# Stream-K's 128x256 tile is the default where dW's tiles of that size fill at least half the SMs
# and each tile's reduction is at least STREAM_K_MIN_STEPS K-steps long.  On an H100 it ran the
# fastest plan of all on every such layer tuned: the large suite's vgg-conv4_2 (72 tiles, 784
# K-steps, 1.43x the planner's split-K) and vgg-conv5 (72, 196: 1.10x) (thirty-ninth session,
# tuning/nvidia-h100_2026-12-06_9e97264-tune-large-wgrad.json); VGG-16's conv4_2 (72, 392:
# 1.04x) and conv5 (72, 98: 1.11x) and ResNet-18's l4-3x3 (72, 98: 1.11x) (fortieth session,
# tuning/nvidia-h100_2026-12-06_40d7cdc-tune-*-wgrad.json).  It lost with short reductions --
# ResNet-50's l4-3x3 (72 tiles, 49 K-steps, 0.67x; thirty-sixth session) and Darknet's down5
# (144, 64: 0.78x) -- so the bound sits between 64 and 98; and on every layer of 5 to 36 such
# tiles but one (0.52-0.87x; 1.09x on vgg-conv3_2, 18 tiles).  Many tiles let split-K fill the
# SMs only with a part-empty last wave or many fp32 slices; a long reduction pays for stream-K's
# cut tiles and its shallower ring.  Its cut tiles are summed in the kernel (split_reduce "grid"):
# once the parts went to their slots straight from the accumulators (forty-ninth session), that
# ran 1.09x the second kernel's sums on ResNet-18's l4-3x3 (61.7 -> 56.6 us), 1.05x on
# vgg-conv5 and 0.99x on vgg-conv4_2 (H100, s55); it had lost, 0.87-0.95x, with the parts
# staged through shared memory (s51).
STREAM_K_TILE = (128, 256)
STREAM_K_MIN_STEPS = 96


def default_plan(problem: ConvProblem, target: Target) -> tuple[Plan | None, str]:
    """The stream-K plan a wgrad's default takes (its 128x256 tile on the deepest ring that
    fits), or None where split-K stays; and why, for `convgen plan`."""
    gemm = problem.gemm(Pass.WGRAD)
    bm, bn = STREAM_K_TILE
    tiles = math.ceil(gemm.m / bm) * math.ceil(gemm.n / bn)
    steps = math.ceil(gemm.k / TMA_BLOCK_K)
    if problem.groups > 1 or not target.info.tma:
        return None, ""
    if 2 * tiles < target.sm_count or steps < STREAM_K_MIN_STEPS:
        return None, (f"split-K, not stream-K: {tiles} {bm}x{bn} tiles (stream-K needs half the {target.sm_count} "
                      f"SMs' worth) of {steps} K-steps (and at least {STREAM_K_MIN_STEPS}: stream_k.default_plan)")
    plan = next((p for _, p in offered(problem, target) if (p.block_m, p.block_n) == STREAM_K_TILE), None)
    if plan is None:
        return None, f"split-K, not stream-K: no {bm}x{bn} stream-K plan fits this part's shared memory"
    blocks = target.sm_count * resident_blocks(plan, Pass.WGRAD, target, problem.geometry)
    why = (f"stream-K {bm}x{bn} on {plan.stages} stages: {tiles} tiles of {steps} K-steps dealt out evenly to "
           f"{blocks} blocks, one wave, a cut tile's parts summed in this kernel after a grid-wide barrier "
           f"(stream_k.default_plan: 1.04-1.43x split-K on five 72-tile VGG and ResNet-18 wgrads on an H100, and "
           f"0.99-1.09x a second kernel's sums on three of them; split-K where tiles are fewer than half the SMs "
           f"or reductions shorter than {STREAM_K_MIN_STEPS} K-steps)")
    return dataclasses.replace(plan, split_reduce="grid"), why
