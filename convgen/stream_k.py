"""Stream-K wgrad (:class:`~convgen.mainloop.TmaWgmma` with ``persistent=True`` in wgrad): what a
plan of it launches and occupies, which the emitter, the launcher and the tests ask.

Split-K gives every tile of dW the same number of slices, so the grid is tiles x slices blocks:
a last wave part-empty (ResNet-50's l4-3x3, 72 tiles of 128x256 on 132 SMs, runs one wave with
60 SMs idle) or, to fill the waves, many slices a tile, each a full fp32 partial tile written
and read back (VGG-16's conv4_2 at 8 slices: 150 MB of traffic).  Stream-K (as CUTLASS names
it) launches one wave of blocks and deals out the tiles' K-steps evenly, a contiguous run a
block: every SM finishes together, a tile is cut between at most a few blocks, and a tile a
block runs whole goes straight to dW.  The parts of the cut tiles go to workspace slots that a
reduction kernel sums in block order (deterministic, as split-K is).  The walk is
``templates/parts/streamk.j2``; tests/test_stream_k.py runs its C++ on the host.

Its GPU tests, fuzz and sanitizers ran clean on the H200 (thirty-fifth session), but it ran
slower than the planner's split-K on all 12 of ResNet-50's wgrad rows, 0.56-1.00x (H100 at
2562d41, thirty-sixth session; benchmarks/NOTES.md), so it is a tuning candidate offered last,
never a default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .footprint import resident_blocks, smem_bytes
from .ir import ConvGeometry, ConvProblem, Pass, Target
from .mainloop import TMA_BLOCK_K, TmaWgmma
from .reduction import reduce_vec
from .spec import Plan
from .tma_rules import tma_stream_k_cost, tma_tiles

REDUCE_THREADS = 256  # a reduction block: one thread a run of outputs of dW


@dataclass(frozen=True)
class StreamK:
    """What a stream-K kernel and its reduction are built with."""

    blocks: int  # the grid: as many as one wave holds (footprint.resident_blocks)
    tiles: int  # dW's BM x BN tiles, whose steps the blocks share
    reduce_name: str
    vec: int  # outputs a reduction thread sums: 4 when runs of 4 stay within a row of dW
    threads: int  # a reduction block's

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
                   reduce_name=name + "_reduce", vec=reduce_vec(n), threads=REDUCE_THREADS)


def offered(problem: ConvProblem, target: Target, in_dtype: str = "float16") -> list[tuple[float, Plan]]:
    """Each TMA tile's stream-K plan on the deepest ring that fits beside the epilogue's strips,
    with the cost model's microseconds (tma_rules.tma_stream_k_cost), fastest first: what the
    tuner offers (after its own checks) and what `convgen plan` compares its split-K plan with."""
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
