"""The planner's TMA-loop plan and its reasons, once the planner has taken the loop.

The rules it applies (which tile, persistent or not, which split) are convgen/tma_rules.py's;
this module turns their answer into a Plan whose reasons say, one line per choice, why.  Kept
out of planner.py, which decides whether the loop runs at all.
"""

from __future__ import annotations

import dataclasses
import math

from . import stream_k
from .footprint import smem_bytes
from .ir import ConvProblem, Pass, Target
from .spec import Plan
from .mainloop import TMA_BLOCK_K, TmaWgmma
from .tma_rules import EXACT_TMA_BN, MIN_LONG_PADDING, column_padding, tma_cheapest_tile, tma_persistent


def tma_plan(problem: ConvProblem, pass_: Pass, target: Target, reasons: list[str], steps: int,
             short_tile: tuple[int, int, int, bool] | None = None, short_why: str = "",
             short_first: bool = True) -> Plan:
    """The TMA loop's plan: the cost model's tile, or the persistent kernel that replaces it.
    The roofline's persistent tile (``short_tile``, tma_short_persistent) replaces it outright
    on a short reduction (``short_first``), and on a 1x1 layer's long one where the cost
    model's tile has no persistent kernel and pads N (tma_rules.MIN_LONG_PADDING)."""
    gemm = problem.gemm(pass_)
    gather = {
        Pass.FPROP: "x's im2col: the copy engine gathers the taps and the padding",
        Pass.DGRAD: ("dy's im2col under the flipped filter, w read as stored (N-major B, wgmma transposes it)"
                     if problem.stride == (1, 1) else
                     f"{problem.stride[0] * problem.stride[1]} stride residue classes of dx's pixels, each dy's im2col "
                     "under its flipped sub-filter (one map per class, longest first), w read as stored (N-major B)"),
        Pass.WGRAD: "dy's tiles as A and x's im2col as B, both read transposed (M- and N-major)",
    }[pass_]
    loop = (f"TMA main loop (sm_90a): {gemm.k_axis}={gemm.k} in 64-element steps, {steps} K-steps"
            f"{' in the heaviest class' if pass_ is Pass.DGRAD and problem.stride != (1, 1) else ''}; {gather}; a "
            "producer warpgroup feeds the consumers' asynchronous wgmma")
    why_stream_k = ""
    if pass_ is Pass.WGRAD:  # many tiles, long reductions: stream-K's one wave (stream_k.default_plan)
        stream, why_stream_k = stream_k.default_plan(problem, target)
        if stream is not None:
            return dataclasses.replace(stream, reasons=tuple(reasons) + (
                loop, why_stream_k, f"shared memory {smem_bytes(stream, pass_, target.warp_size, problem)} bytes"))
    (split, blocks, us), bm, bn, stages, rate = tma_cheapest_tile(problem, pass_, target)
    waves = math.ceil(blocks / target.sm_count)
    modelled = bm, bn  # the cost model's tile, which a persistent kernel may replace
    persistent, why_persistent = (None, "") if short_first and short_tile else tma_persistent(problem, pass_, target, bm, bn)
    if persistent is None and short_tile is not None and (short_first or column_padding(gemm.n, bn) >= MIN_LONG_PADDING):
        persistent, why_persistent = short_tile, short_why
    else:
        short_tile = None  # the cost model's tile (or its persistent twin) stands
    pingpong = False
    if persistent:
        bm, bn, stages, pingpong = persistent
    chosen = Plan(bm, bn, TMA_BLOCK_K, 8 if pingpong else bm // 16, 1, stages, 8, 8, split_k=split,
                  loop=TmaWgmma(persistent is not None, pingpong))
    traffic = ", plus the slices' workspace traffic" if pass_ is Pass.WGRAD else ""
    reasons += [
        loop,
        (f"block N {bn}: the short reduction's persistent tile (below), not the long-reduction cost model's"
         if short_tile is not None else
         f"block N {bn}: N={gemm.n} in exactly {math.ceil(gemm.n / bn)} tiles where 128 and 256 columns pad it "
         f"(tma_rules.EXACT_TMA_BN: 1.07x the 64x128 tile over 12 such wgrad layers on an H100); split-K {split}, "
         f"{blocks} blocks at {rate:.0f} TFLOP/s (between its neighbours' rates), {us:.0f} us predicted"
         if bn == EXACT_TMA_BN else
         f"block N {modelled[1]}: with block M {modelled[0]}" + (f" and split-K {split}" if pass_ is Pass.WGRAD else "")
         + ", the least "
         f"predicted time over the TMA tiles{' and splits' if pass_ is Pass.WGRAD else ''} ("
         + ("the residue classes' blocks handed out longest first, each to the SM that frees first, at the tile's "
            "measured rate): " f"{blocks} blocks on {target.sm_count} SMs"
            if pass_ is Pass.DGRAD else
            f"waves x a block's share of K at the tile's measured rate{traffic}): "
            f"{blocks} blocks = {waves} wave(s) on {target.sm_count} SMs")
         + f" at {rate:.0f} TFLOP/s (rates measured on fprop), {us:.0f} us predicted"),
        f"block M {bm}: " + ("2 consumer warpgroups of a whole tile each" if pingpong else
                             f"{bm // 64} consumer warpgroup(s) of 64 rows"),
        f"K-step {TMA_BLOCK_K}: one 128-byte swizzle row of fp16 per pixel and tap",
        f"{chosen.warps} warps as {chosen.warps_m}x1 consumer warps and a producer warpgroup (one thread issues the copies)",
        "vec A 8, vec B 8: the copy engine moves whole 128-byte rows, no gather in the kernel",
        why_persistent,
        f"{stages} stages: the deepest ring of this tile that fits an H200 block's shared memory"
        + (" beside the epilogue's own scratch" if persistent else ""),
        (f"split-K {split}: the batch's pixels in {split} slices, reduced in fixed order (deterministic)"
         if split > 1 else "split-K 1: a block reduces its tile's whole K, the wgmma accumulators never leave registers"),
        why_stream_k,
        f"shared memory {smem_bytes(chosen, pass_, target.warp_size, problem)} bytes",
    ]
    return dataclasses.replace(chosen, reasons=tuple(r for r in reasons if r))

