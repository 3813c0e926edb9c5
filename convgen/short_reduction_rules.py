"""The im2col loop's block N for short reductions, fitted to tuning runs on the pointwise suites.

A short reduction (a 1x1 layer, or a filter over few channels) does a step or a few per tile,
so a block's time goes to reading its rows of A and storing its outputs, not to its MMAs.
The planner's general rule, the smallest power-of-two tile covering N (cap 128), then costs
twice over where N is not a power of two: the padding columns are multiplied and drained, and
where N passes 128, each row of A is read once per N tile.  On the H200 (`convgen tune` at
f26ee2e, `benchmarks/results/tuning/nvidia-h200_2026-12-04_f26ee2e-*`), a tile exactly N
wide, 64 rows on 2 x 3 or 2 x 4 warps, beat the power-of-two default on 13 of the 14 MobileNetV2
and EfficientNet-B0 layers it was timed on with N of 48, 96, 144, 192 or 240 and a reduction of
at most 384: 1.01-1.61x (MobileNetV2 pw56-144to24 dgrad 100.3 -> 70.7 us, pw112-16to96 fprop
205.3 -> 154.0), and 0.93x on EfficientNet-B0 pw14-240to80 dgrad.  Widths whose fragment count
has no factor of 3 or 4 (80, 112, 160) split into warp tiles of 5 or 7 fragments, which ran up
to 1.9x slower, and on a longer reduction (576: MobileNetV2 pw14-96to576 dgrad) the exact tile
gave nothing.  Every layer measured had stride 1, so strided layers keep the general rule (a
strided dgrad's tiles also run per residue class, a different loop).

Kept apart from the planner so that a new tuning run changes one module.
"""

from __future__ import annotations

import math

from .ir import ConvProblem, Pass
from .mainloop import FRAG, fit_tile

MAX_SHORT_REDUCTION = 384  # the longest reduction (R*S*C or R*S*K) the rule was measured on
EXACT_BLOCK_M = 64
EXACT_WARPS_M = 2


def exact_n_tile(problem: ConvProblem, pass_: Pass) -> tuple[int, int, int, int, str] | None:
    """(block_m, block_n, warps_m, warps_n, why) of an exactly-N-wide im2col tile for a short
    fprop or dgrad reduction, or None where the power-of-two tile stays."""
    if pass_ is Pass.WGRAD or problem.groups > 1 or problem.stride != (1, 1):
        return None  # (every layer it was measured on: stride 1, ungrouped)
    gemm = problem.gemm(pass_)
    if gemm.k > MAX_SHORT_REDUCTION:
        return None
    exact = math.ceil(gemm.n / FRAG) * FRAG
    pow2 = fit_tile(gemm.n, 128)
    columns = math.ceil(gemm.n / pow2) * pow2
    if exact > 256 or exact >= columns:
        return None
    frags = exact // FRAG
    wn = 4 if frags % 4 == 0 else 3 if frags % 3 == 0 else 0
    if not wn:
        return None
    return EXACT_BLOCK_M, exact, EXACT_WARPS_M, wn, (
        f"block {EXACT_BLOCK_M}x{exact}, {EXACT_WARPS_M}x{wn} warps: a reduction of {gemm.k} is short, so a tile "
        f"exactly N={gemm.n} wide replaces {columns // pow2} power-of-two tile(s) of {pow2} ({columns} columns): "
        "each row of A read once, no padding drained (measured 1.01-1.61x on the pointwise suites: "
        "short_reduction_rules)")


# A tile one fragment wide (N <= 16) streams its rows of A: a block's bytes in flight are A's
# stage, 8 KB on the general 128x16x32 tile.  On the H200 (f26ee2e) MobileNetV2's pw112-16to96
# dgrad (N = C = 16, a reduction of 96) ran 1.49x faster on 256x16x64 with 4 warps (103.5 us
# against the default's 154.0; cuDNN 99.8): 32 KB a stage, two steps instead of three, one
# block an SM holding two stages of copies in flight.  The only such layer the suites hold;
# pw112-32to16 fprop (N = 16, a reduction of 32) has nothing to gain from a 64-deep step.
NARROW_N = 16
NARROW_BLOCK = (256, 64)  # block_m, block_k
NARROW_MIN_REDUCTION = 64  # more than one 64-deep step's worth


def narrow_stream_tile(problem: ConvProblem, pass_: Pass) -> tuple[int, int, str] | None:
    """(block_m, block_k, why) of the deep-step tile for a one-fragment-wide pointwise fprop or
    dgrad whose short reduction is longer than one 64-channel step, or None.  (4 warps, 4 x 1:
    what the planner gives a 256 x 16 tile.)"""
    if pass_ is Pass.WGRAD or problem.groups > 1 or (problem.r, problem.s) != (1, 1) or problem.stride != (1, 1) \
            or problem.padding != (0, 0):
        return None
    gemm = problem.gemm(pass_)
    if gemm.n > NARROW_N or not NARROW_MIN_REDUCTION < gemm.k <= MAX_SHORT_REDUCTION:
        return None
    bm, bk = NARROW_BLOCK
    return bm, bk, (
        f"N={gemm.n} is one fragment wide, so a block streams its rows of A: a {bm}x{bk} stage keeps 4x a "
        f"128x32 one's bytes in flight, over {math.ceil(gemm.k / bk)} steps (measured 1.49x on MobileNetV2's "
        "pw112-16to96 dgrad: short_reduction_rules)")
