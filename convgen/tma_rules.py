"""The TMA main loop's rules, apart from the rest of the planner: where Hopper's copy
engine can run a layer, the tiles it runs with and the rate each sustained on the H200, and
the cost model the planner and the tuner's candidates choose a tile (and wgrad's split) by.

Kept in one place so that a new measurement changes one table, and so that what the loop
can run (:func:`tma_eligible`) is read by the planner, the plan checker and the candidates
alike.
"""

from __future__ import annotations

import heapq
import math

from .ir import ConvGeometry, ConvProblem, DType, Pass, Target
from .mainloop import TMA_BLOCK_K, fit_tile
from .residues import residue_classes


# The TMA main loop's tiles (block_m, block_n, stages) and the TFLOP/s each sustained on the
# H200 over many waves (VGG-16 conv4_2 at batch 64: 36 K-steps, 1,176 to 4,704 tiles;
# benchmarks/results/2026-12-01_h200_tma-probe_*.json).  The stages fill an H200 block's
# 227 KB.  The default takes the tile (and for wgrad the split) whose predicted time is
# least (tma_tile_cost), so a layer with few tiles trades the 128x256 tile's rate for waves.
# dgrad and wgrad use fprop's rates: their probes (2026-12-02_h200_tma-{dgrad,wgrad}-probe_*)
# put the planner's choice within 5% of the best TMA tile on 46 of the 48 layers where it
# takes the loop (resnet50's l2-3x3-down wgrad 6% and l4-1x1 wgrad 21% slower).
TMA_TILES: tuple[tuple[int, int, int, float], ...] = (
    (128, 256, 4, 704.0), (64, 256, 5, 647.0), (128, 128, 6, 625.0), (64, 128, 4, 525.0), (64, 64, 6, 349.0),
)  # (128x64 on 8 stages was measured too: slower than 64x64 on every layer with N = 64)
# The persistent kernels (TmaWgmma(persistent=True)), fprop and dgrad: the tile the cost model
# picks, as a grid of resident blocks that walk the tiles, the producer copying the next tile's
# stages while the consumers drain this one's through scratch of their own (so a stage fewer
# fits).  On the H200 (benchmarks/results/2026-12-02_h200_tma-persistent-probe_*): in fprop
# (12 layers) 128x128 on 5 stages and 128x256 on 3 ran 1.02-1.24x the one-block-per-tile
# kernel on every 3x3 layer with at least two tiles per SM, and 128x64 on 6 ran 1.28x and
# 1.32x the 64x64 tile on the N = 64 layers (VGG-16 conv1_2, UNet enc2b); in dgrad (13 layers)
# the same tiles ran 1.01-1.20x, and 128x64 1.13-1.21x the 64x64 tile.  ResNet-50's l3-1x1
# fprop (98 tiles, fewer than the SMs) lost 10% persistent: there is no next tile to overlap.
# Ping-pong (TmaWgmma(pingpong=True): each consumer warpgroup a whole 128-row tile, the two in
# turn, one draining while the other multiplies), probed on the same layers at 3c489f8
# (benchmarks/results/2026-12-02_h200_tma-pingpong-probe_3c489f8-*): in fprop 128x128 on 4
# stages ran 1.02-1.07x the cooperative 128x128 on all six 128-filter 3x3 layers and 128x64
# on 6 ran 1.04x and 1.08x on the N = 64 ones; 128x256 stayed faster cooperative (VGG-16
# conv4_2 4%).  In dgrad 128x64 on 6 ran 1.19x on UNet enc2b, while 128x128 ping-pong was
# within 4% of cooperative either way, so dgrad keeps its cooperative 128x128.
PERSISTENT_TILES: dict[tuple[Pass, int, int], tuple[int, int, int, bool]] = {
    (Pass.FPROP, 128, 256): (128, 256, 3, False), (Pass.FPROP, 128, 128): (128, 128, 4, True),
    (Pass.FPROP, 64, 64): (128, 64, 6, True),
    (Pass.DGRAD, 128, 256): (128, 256, 3, False), (Pass.DGRAD, 128, 128): (128, 128, 5, False),
    (Pass.DGRAD, 64, 64): (128, 64, 6, True),
}
MIN_PERSISTENT_TILES_PER_SM = 2
# Grouped layers, G GEMMs side by side on the TMA loop (ResNeXt-50's, packed into slabs of
# 64-channel groups: group_pack.TMA_SLAB): on an H100 (thirty-eighth session,
# tuning/nvidia-h100_2026-12-06_dd95543-tune-resnext50-grouped-fprop.json) fprop's persistent
# 128x64 ping-pong on 6 stages ran 1.06-1.43x the 64x64 tile on all six grouped layers, and was
# each one's best candidate.  Other grouped tiles and passes were not timed persistent.
GROUPED_PERSISTENT = {(Pass.FPROP, 64, 64)}
# Below this many 64-channel K-steps (1x1 layers with C < 512) the im2col loops were faster.
TMA_MIN_STEPS = 8
# Except through the persistent kernel, which overlaps one tile's drain with the next tile's
# copies: on ResNet-50's 1x1 layers with 1-4 full 64-channel steps and at least two tiles per
# SM, the tile tma_persistent picks ran 1.32-1.66x the im2col default in fprop (l1-1x1b 42.9
# against 64.4 us, l2-1x1 27.0/42.6, l1-1x1c 41.2/50.4) and 1.26-1.66x in dgrad (l1-1x1b
# 41.0/51.7, l1-1x1c 43.1/70.9, l3-1x1 20.7/34.4): H200 at 4931b53, benchmarks/results/
# 2026-12-03_h200_tma-short-probe_4931b53-*; in the bench at 2626a97 1.24-1.65x on those
# rows).  A 64-wide tile's single step lost (l1-1x1a, 64 -> 64 channels: fprop 26.9 against
# 20.8 us, dgrad 27.0 against 22.8): each tile is one copy and a drain, streaming that the
# im2col loop's four resident blocks hide better, so a tile needs steps x block N >= 128.
MIN_SHORT_STEP_COLUMNS = 128
# Short reductions take the persistent tile that tma_persistent_roofline predicts fastest, not
# the long-reduction cost model's: on the 28 pointwise layers of MobileNetV2 and EfficientNet-B0
# where the tuner timed several persistent tiles (H200 at f26ee2e, benchmarks/results/tuning/
# nvidia-h200_2026-12-04_f26ee2e-*), its pick ran within 3% of the fastest (geometric mean; worst
# 12%), where the cost model's tile had no persistent twin on most of them.  Those runs also bound
# what a short step may leave empty: dgrad's steps with K = 40, 80, 112 or 160 of 64-channel
# boxes (zeros past K) ran 1.2-1.5x the im2col default, K = 32 (half a box) lost to the im2col
# loop's exact tile (pw28-144to32 25.0 against 18.9 us); and the tile's columns: N = 32 on a
# 64-wide tile (half padding) still won 1.25x (pw28-192to32 fprop 21.0/27.2, pw28-32to192 dgrad
# 21.3/26.3), N = 16 and 24 (a quarter to 3/8 used) ran at half the im2col loop's speed.
MIN_SHORT_STEP_FILL = 0.5    # a step's channels over its 64: more than this
MIN_SHORT_COLUMN_FILL = 0.5  # N over the tiles' columns: at least this
MIN_ROOFLINE_TILES_PER_SM = 1.5  # 128x64 on 1.5-1.9 tiles an SM still won 1.2-1.3x (pw7-960to320 fprop)
# A 1x1 layer's long reduction (TMA_MIN_STEPS or more) takes the roofline's persistent tile only
# where the cost model's tile has no persistent kernel and leaves at least this share of its
# columns empty: there it won 1.15-1.3x (N = 80, 96, 112, 160, 192, 320 on 64x128, 64x256 or
# 128x256 tiles, at faa56ad); where the cost model's tile fits N (ResNet-50 l3-1x1 fprop, N =
# 256, and l4-1x1 dgrad, N = 512), 128x64 ping-pong ran 10% and 27% slower (H200 at d7fa86f).
MIN_LONG_PADDING = 0.1
# The persistent 128x64 tile's rate: 1.28-1.32x the 64x64 tile's on the N = 64 layers it was
# measured on (PERSISTENT_TILES' notes), where TMA_TILES has no 128x64 entry.
PERSISTENT_128X64_RATE = 1.3 * 349.0
# Strided dgrad needs twice TMA_MIN_STEPS in its heaviest residue class: at 8 such steps the
# TMA loop ran within 10% of the im2col loop either way on four real layers (ResNet-18 l2-3x3-down
# 1.05x, Darknet down2 1.10x, ResNet-50 l2-3x3-down 0.91x, ResNet-18 l4-proj 0.82x, H200 at
# 145e8e4 and 209e778), and from 16 on it won on all five (1.3-2.4x).
TMA_MIN_STEPS_STRIDED_DGRAD = 16
# ... through the one-block-per-tile kernel.  The persistent kernel, which overlaps one tile's
# drain with the next tile's copies, won at 8-15 steps on the three 3x3 layers tuned there:
# ResNet-50 l2-3x3-down 1.83x the im2col default with the roofline's tile (82.9 -> 45.2 us),
# ResNet-18 l2-3x3-down 1.60x (109.5 -> 68.3), Darknet-53 down2 1.59x (263.5 -> 165.4); at 4
# steps (Darknet down1) it tied (363.3 against 361.6).  H200 at 1c23207 and b41f285,
# benchmarks/results/tuning/nvidia-h200_2026-12-04_*-tune-*down*-dgrad.json.  Strided 1x1
# layers (ResNet's projections) were not timed on it and keep the im2col loop.
MIN_STRIDED_PERSISTENT_STEPS = 8


# dgrad's narrowest dy (K) through the TMA loop: K = 8 hung an H200 on a 4x1 layer whose K = 40
# twin ran (the strided-dgrad fuzz, thirteenth session); K = 32 ran (UNet dec1-cat96).
MIN_DGRAD_K = 32

# wgrad's split-K slices each write an fp32 partial of dW that the reduction reads back:
# their traffic, at the H200's measured bandwidth, is part of a split's cost.
HBM_BYTES_PER_US = 4.2e6
MAX_TMA_SPLIT = 64
# dgrad's kernel takes one 128-byte tensor map per stride residue class by value: 16 of
# them (stride 4 x 4) stay well inside a kernel's 4 KB of parameters.
MAX_DGRAD_CLASSES = 16


def tma_tail_fill(problem: ConvProblem, pass_: Pass) -> str | None:
    """Why an fprop of several taps, or a 1x1 wgrad, whose C is not a whole number of boxes
    stays off the TMA loop (None: it may take it): each tap's last step (wgrad: the last box of
    dW's columns) is part zeros, so it must be more than MIN_SHORT_STEP_FILL full, as the short
    reductions' steps must."""
    if pointwise_wgrad(problem, pass_):  # the channels are dW's columns: a box of x is C of 64 wide
        where = "each 64-channel box of x"
        evidence = "C = 32 lost to the im2col loop on the pointwise suites, C = 40 won"
    elif pass_ is Pass.FPROP and problem.r * problem.s > 1:
        where = "each tap's 64-channel steps"
        evidence = "half-empty steps lost to the im2col loop on the pointwise suites"
    else:
        return None
    fill = step_fill(problem.c)  # 1 for whole boxes
    if fill > MIN_SHORT_STEP_FILL:
        return None
    return f"its {problem.c} channels fill {fill:.0%} of {where}, no more than {MIN_SHORT_STEP_FILL:.0%} ({evidence})"


def tma_min_steps(problem: ConvProblem, pass_: Pass) -> tuple[int, str]:
    """The fewest :func:`tma_steps` for which the planner's default takes the loop, and the
    measurement behind the bound."""
    if pass_ is Pass.DGRAD and problem.stride != (1, 1):
        return TMA_MIN_STEPS_STRIDED_DGRAD, "measured no faster on strided dgrad's 8-step layers"
    return TMA_MIN_STEPS, "measured slower on ResNet-50's 1x1 layers"


def tma_short_persistent(problem: ConvProblem, pass_: Pass, target: Target,
                         steps: int) -> tuple[tuple[int, int, int, bool] | None, str]:
    """The persistent tile (block_m, block_n, stages, ping-pong) the roofline picks for a
    reduction of ``steps`` (:func:`tma_steps`: fewer than :func:`tma_min_steps`, or a 1x1
    layer's longer one), or None where no persistent tile fits the bounds measured in the notes
    at MIN_SHORT_STEP_COLUMNS; and why."""
    if pass_ is Pass.WGRAD:
        return None, "wgrad has no persistent kernel"
    if problem.groups > 1:
        return None, "the persistent kernel was not measured on grouped layers"
    if pass_ is Pass.DGRAD and problem.stride != (1, 1):
        if problem.r * problem.s == 1:
            return None, "strided 1x1 dgrad was not measured on the persistent kernel"
        if steps < MIN_STRIDED_PERSISTENT_STEPS:
            return None, (f"strided dgrad's {steps} K-steps in its heaviest class are fewer than "
                          f"{MIN_STRIDED_PERSISTENT_STEPS}, where the persistent kernel only tied the im2col "
                          "loop (Darknet-53 down1)")
    channels = problem.c if pass_ is Pass.FPROP else problem.k
    if channels % TMA_BLOCK_K and problem.r * problem.s > 1:
        return None, (f"its {channels} channels leave each of its {problem.r * problem.s} taps' last step part zeros, "
                      "which was measured on the persistent kernel for 1x1 layers only")
    fill = step_fill(channels)
    if fill <= MIN_SHORT_STEP_FILL:
        return None, (f"its {channels} channels fill {fill:.0%} of their 64-channel steps, no more than "
                      f"{MIN_SHORT_STEP_FILL:.0%}, which lost to the im2col loop (MobileNetV2 pw28-144to32 dgrad)")
    gemm = problem.gemm(pass_)
    fits, why = [], ""
    for tile in short_persistent_tiles(pass_, gemm.n):  # narrowest first: the first refusal is the reason
        bm, bn = tile[:2]
        columns = 1 - column_padding(gemm.n, bn)
        tiles = math.ceil(gemm.m / bm) * math.ceil(gemm.n / bn)
        if columns < MIN_SHORT_COLUMN_FILL:
            why = why or (f"N={gemm.n} fills {columns:.0%} of its {bm}x{bn} tiles' columns, under "
                          f"{MIN_SHORT_COLUMN_FILL:.0%}, which ran at half the im2col loop's speed "
                          "(MobileNetV2 pw112-16to96 dgrad)")
        elif tiles < MIN_ROOFLINE_TILES_PER_SM * target.sm_count:
            why = why or (f"its {tiles} {bm}x{bn} tiles are fewer than {MIN_ROOFLINE_TILES_PER_SM} per SM, too "
                          "few for a persistent block to overlap")
        elif steps * bn < MIN_SHORT_STEP_COLUMNS:
            why = why or (f"its {bm}x{bn} tile's {steps} step(s) are fewer than {MIN_SHORT_STEP_COLUMNS} "
                          "step-columns, which ran slower than the im2col loop (ResNet-50 l1-1x1a)")
        else:
            fits.append((tma_persistent_roofline(problem, pass_, target, bm, bn), tile, tiles))
    if not fits:
        return None, why
    us, tile, tiles = min(fits, key=lambda f: f[0])
    how = "ping-pong" if tile[3] else "cooperative"
    return tile, (f"persistent {tile[0]}x{tile[1]} tile ({how}): {tiles} tiles, {us:.0f} us predicted, the least over "
                  f"the persistent tiles with at least {MIN_ROOFLINE_TILES_PER_SM} per SM (a block's tiles x the "
                  "longer of each tile's MMAs at its rate and its bytes at an SM's share of HBM bandwidth: "
                  "tma_persistent_roofline)")


def step_fill(channels: int) -> float:
    """The share of a reduction's 64-channel steps (per tap) that its channels fill."""
    return channels / (math.ceil(channels / TMA_BLOCK_K) * TMA_BLOCK_K)


def column_padding(n: int, bn: int) -> float:
    """The share of ``bn``-wide tiles' columns that N leaves empty."""
    return 1 - n / (math.ceil(n / bn) * bn)


def short_persistent_tiles(pass_: Pass, n: int) -> list[tuple[int, int, int, bool]]:
    """The persistent tiles measured for this pass (PERSISTENT_TILES), none much wider than N,
    narrowest first."""
    widest = max(fit_tile(n, 256), 64)
    return sorted({t for (p, _, _), t in PERSISTENT_TILES.items() if p is pass_ and t[1] <= widest},
                  key=lambda t: (t[1], t[0], t[2]))


def tma_persistent_roofline(problem: ConvProblem, pass_: Pass, target: Target, bm: int, bn: int) -> float:
    """Predicted microseconds of a persistent ``bm`` x ``bn`` plan on a short (or 1x1) reduction: each
    block walks ceil(tiles / SMs) tiles, and a tile takes the longer of its MMAs (at the tile's
    measured rate, an SM's share) and its bytes at an SM's share of HBM bandwidth: A's and B's
    64-channel steps (B counted in full: its re-reads come from L2, which is not free either)
    and its output once.  A strided dgrad's tiles run each residue class's own taps: its waves
    take the classes' mean tile."""
    gemm = problem.gemm(pass_)
    rate = next((r for m, n, _, r in TMA_TILES if (m, n) == (bm, bn)), PERSISTENT_128X64_RATE)
    classes = (dgrad_class_tiles(problem, bm, bn) if pass_ is Pass.DGRAD else
               [(math.ceil(gemm.m / bm) * math.ceil(gemm.n / bn),
                 problem.r * problem.s * math.ceil((problem.c if pass_ is Pass.FPROP else problem.k) / TMA_BLOCK_K))])

    def tile_us(steps: int) -> float:
        mma_us = steps * 2 * bm * bn * TMA_BLOCK_K / (rate * 1e6 / target.sm_count)
        bytes_us = 2 * (steps * TMA_BLOCK_K * (bm + bn) + bm * bn) / (HBM_BYTES_PER_US / target.sm_count)
        return max(mma_us, bytes_us)

    tiles = sum(t for t, _ in classes)
    return math.ceil(tiles / target.sm_count) * sum(t * tile_us(s) for t, s in classes) / tiles


# A 1x1 layer's wgrad (M = K filters, N = C channels, a long pixel reduction) on 64-row tiles:
# on all 28 pointwise layers of mobilenetv2-pw and efficientnet-b0-pw the best 64-row TMA tile
# ran 1.2-3.2x the best 128-row one (dW with db, the tuner's timing; H200 at 5bf5603,
# benchmarks/results/tuning/nvidia-h200_2026-12-04_5bf5603-tune-*-wgrad.json), and beat the
# im2col default from K = 32 filters (half a warpgroup's rows) up; K = 24 lost.
POINTWISE_WGRAD_ROWS = 64
MIN_POINTWISE_WGRAD_K = 32


def pointwise_wgrad(problem: ConvProblem, pass_: Pass) -> bool:
    return pass_ is Pass.WGRAD and problem.r * problem.s == 1


def tma_cheapest_tile(problem: ConvProblem, pass_: Pass,
                      target: Target) -> tuple[tuple[int, int, float], int, int, int, float]:
    """((split-K, blocks, predicted us), block_m, block_n, stages, rate) of the TMA tile the
    cost model predicts fastest on this layer: the planner's tile before tma_persistent.  A
    1x1 layer's wgrad takes the 64-row tiles alone (POINTWISE_WGRAD_ROWS); a 64-row wgrad tile
    becomes 192 wide where that covers N exactly (tma_exact_tile)."""
    costed = [(tma_split(problem, pass_, target, bm, bn, rate), bm, bn, stages, rate)
              for bm, bn, stages, rate in tma_tiles(problem.gemm(pass_).n)
              if (not pointwise_wgrad(problem, pass_) or bm == POINTWISE_WGRAD_ROWS)
              and tma_group_tile(problem.geometry, pass_, bm, bn) is None]
    cheapest = min(costed, key=lambda c: c[0][2])
    bm = cheapest[1]
    if tma_exact_tile(problem, pass_, bm):
        rate = exact_tile_rate(bm)
        return tma_split(problem, pass_, target, bm, EXACT_TMA_BN, rate), bm, EXACT_TMA_BN, EXACT_TMA_STAGES[bm], rate
    return cheapest


# TMA tiles as wide as N where N's 64-column boxes come in threes: a 3x3 layer of 64 channels
# has N = 576 in wgrad, which 192 columns cover with no padding where 128 pads 64 and 256 pads
# 192 (one tile in 10 or 3 in 12 multiplying nothing).  Their rate is taken between their
# neighbours' in TMA_TILES (which holds rates measured on fprop), and sizes their split-K.
# Timed in wgrad on an H100 (thirty-eighth session, `convgen tune --no-bias`,
# tuning/nvidia-h100_2026-12-06_dc620aa-*-wgrad.json): on the 12 layers with 64 filters (a group)
# and N = 576 (ResNet-18's, ResNet-50's, UNet's and CIFAR's 64-channel 3x3 layers, VGG-16
# conv1_2, ResNeXt-50's seven), 64x192 on 6 stages ran 1.07x the 64x128 default as a geomean
# (0.94-1.28x, faster on 9); 128x192 ran 0.90-0.98x the 128x128 tile on all four 128-filter
# layers, so 128-row tiles keep theirs, and a 64-row tile of more than 64 filters (CIFAR-VGG's
# conv3) is untimed and keeps the cost model's.  Where 128 or 256 pad N by less than MIN_EXACT_SAVING
# more than 192 does (UNet's N = 1728: 4%), untimed: the cost model's tile stays.
EXACT_TMA_BN = 192
EXACT_TMA_STAGES = {64: 6, 128: 5}  # the deepest rings that fit (32 and 40 KB a stage)
# The persistent 128x192 tile (tma_exact_persistent; tuning offers it to fprop too): 4 stages
# beside its epilogue's scratch.
EXACT_PERSISTENT_STAGES = 4
EXACT_TMA_ROWS = 64  # the planner's; tuning offers 128 too
MIN_EXACT_SAVING = 1.10


def exact_tile_rate(bm: int) -> float:
    rates = {(m, n): r for m, n, _, r in TMA_TILES}
    return (rates[(bm, 128)] + rates[(bm, 256)]) / 2


def exact_tile_fits(n: int, saving: float = 1.0) -> bool:
    """Whether EXACT_TMA_BN covers N with ``saving`` times less padding than 128 and 256 both."""
    exact = math.ceil(n / EXACT_TMA_BN) * EXACT_TMA_BN
    nearest = min(math.ceil(n / bn) * bn for bn in (128, 256))
    return exact < nearest and nearest >= saving * exact


def tma_exact_tile(problem: ConvProblem, pass_: Pass, bm: int) -> bool:
    """Whether the planner's wgrad tile of ``bm`` rows becomes EXACT_TMA_BN wide (see above)."""
    gemm = problem.group_gemm(pass_)  # a group's: 64 filters is all that was timed
    return (pass_ is Pass.WGRAD and bm == EXACT_TMA_ROWS == gemm.m and not pointwise_wgrad(problem, pass_)
            and exact_tile_fits(gemm.n, MIN_EXACT_SAVING))


def tma_exact_persistent(problem: ConvProblem, pass_: Pass,
                         tile: tuple[int, int, int, bool]) -> tuple[int, int, int, bool] | None:
    """The persistent 128xEXACT_TMA_BN tile that replaces dgrad's persistent 128x256 where 192
    columns cover N with MIN_EXACT_SAVING less padding (None elsewhere).  UNet's dec2-cat192
    dgrad (N = C = 192) ran it 1.36x the 128x256 tile's time, the fastest of its candidates (H100
    at d3f404f, tuning/nvidia-h100_2026-12-07_d3f404f-tune-unet-dec1-dec2-dgrad.json); fprop's
    N = 192 layers and 1x1 filters were not timed on it."""
    if (pass_ is not Pass.DGRAD or tile[:2] != (128, 256) or problem.r * problem.s == 1
            or not exact_tile_fits(problem.gemm(pass_).n, MIN_EXACT_SAVING)):
        return None
    return 128, EXACT_TMA_BN, EXACT_PERSISTENT_STAGES, False


def tma_group_tile(geometry: ConvGeometry, pass_: Pass, block_m: int, block_n: int) -> str | None:
    """Why a grouped layer cannot take a TMA tile of ``block_m`` x ``block_n`` (None: it can):
    a tile's filters stay within one group (wgrad's M, fprop's N)."""
    if geometry.groups == 1:
        return None
    kg = geometry.k // geometry.groups
    if pass_ is Pass.WGRAD and kg % block_m:
        return f"a grouped wgrad's M tiles stay within one group: block_m={block_m} must divide K/G={kg}"
    if pass_ is Pass.FPROP and kg % block_n:
        return f"a grouped fprop's N tiles stay within one group: block_n={block_n} must divide K/G={kg}"
    return None


def tma_steps(problem: ConvProblem, pass_: Pass) -> int:
    """The reduction one block does before split-K, in 64-element steps of useful work (what
    TMA_MIN_STEPS is measured in): for dgrad its heaviest residue class's taps x K (all R*S
    taps with stride 1), else the GEMM's K.  (dgrad's kernel runs ceil(K / 64) steps a tap:
    with K < 64 each step is part zeros, which this count does not reward.)"""
    if pass_ is Pass.DGRAD:
        return math.ceil(max(c.taps for c in residue_classes(problem.geometry)) * problem.k / TMA_BLOCK_K)
    return math.ceil(problem.gemm(pass_).k / TMA_BLOCK_K)


def dgrad_class_tiles(problem: ConvProblem, bm: int, bn: int) -> list[tuple[int, int]]:
    """(tiles, 64-channel steps a tile) of each of dgrad's residue classes that has pixels, for
    ``bm`` x ``bn`` tiles: one class of every tap at stride 1."""
    n_tiles, k_steps = math.ceil(problem.c / bn), math.ceil(problem.k / TMA_BLOCK_K)
    return [(math.ceil(problem.n * c.pixels_per_image / bm) * n_tiles, c.taps * k_steps)
            for c in residue_classes(problem.geometry) if c.pixels_per_image]


# What a dgrad block costs besides its steps: its ring's fill and its tile's drain.  Fitted to the
# H200 tuning logs of every strided 3x3 layer on the TMA loop (Darknet-53's down3-5, ResNet-18's
# and ResNet-50's downsampling layers): from 1 to 3 us the one-block-per-tile tile the cost model
# picks is each log's fastest such tile; at 0, 64-row tiles took ResNet-18's l4 and Darknet's
# down5, which ran 2-3% slower there and 14% slower on an H100 (l4-3x3-down, 36.2 -> 41.2 us).
DGRAD_BLOCK_US = 1.5


def longest_first_us(work: list[tuple[int, int]], sms: int, step_us: float) -> float:
    """Microseconds until the last SM finishes when blocks of (count, steps) are handed out
    longest first, each to the SM that frees first: the block scheduler's order for dgrad's
    residue classes (launched longest first), each block its steps plus DGRAD_BLOCK_US.
    Counting whole waves of the heaviest block instead (ceil(work / (SMs x longest)) x longest)
    priced Darknet-53's down4 128x256 tile at 1.10x the 64x256 one's time, where the H200 ran
    it 1.16x faster (tuning/nvidia-h200_2026-12-04_1c23207-*).

    Once the SMs' finishing times lie within one block's cost, the next ``sms`` blocks of a class
    go one to each SM, so whole rounds are added at once: a layer of 10^5 blocks costs as many
    heap operations as SMs, not blocks."""
    free, last = [0.0] * sms, 0.0  # a heap of the SMs' finishing times, and the latest of them
    for count, steps in sorted(work, key=lambda w: -w[1]):
        if not steps:
            continue
        cost = steps * step_us + DGRAD_BLOCK_US
        while count and last - free[0] > cost:  # one at a time until the spread is within a block
            last = max(last, free[0] + cost)
            heapq.heapreplace(free, free[0] + cost)
            count -= 1
        rounds, count = divmod(count, sms)
        if rounds:  # an equal shift keeps the heap a heap
            free = [t + rounds * cost for t in free]
            last += rounds * cost
        for _ in range(count):
            last = max(last, free[0] + cost)
            heapq.heapreplace(free, free[0] + cost)
    return last


def tma_tile_cost(problem: ConvProblem, pass_: Pass, target: Target, bm: int, bn: int, rate: float,
                  split: int = 1, resident: int = 1) -> tuple[int, float]:
    """(blocks, predicted microseconds) of a TMA tile on this layer: waves of blocks, each
    reducing its share of K at the tile's measured rate (an SM's part of it), plus a split's
    workspace traffic.  dgrad's residue classes are blocks of unequal length, launched
    longest first, each to the SM that frees first (longest_first_us).

    ``resident`` > 1 prices fprop's and wgrad's waves as ``resident`` blocks an SM, each at that
    share of the SM's rate (the rate was measured with the SM full), so a wave short of
    ``resident`` blocks an SM runs its blocks no faster: the cost behind the tuner's
    co-resident twins (candidates._resident_twin), not yet the planner's."""
    gemm = problem.gemm(pass_)
    step_us = 2 * bm * bn * TMA_BLOCK_K / (rate * 1e6 / target.sm_count)
    n_tiles = math.ceil(gemm.n / bn)
    if pass_ is Pass.DGRAD:
        work = dgrad_class_tiles(problem, bm, bn)
        return sum(b for b, _ in work), longest_first_us(work, target.sm_count, step_us)
    blocks = math.ceil(gemm.m / bm) * n_tiles * split
    kernel_steps = (problem.r * problem.s * math.ceil(problem.c // problem.groups / TMA_BLOCK_K)  # a tap's tail
                    if pass_ is Pass.FPROP
                    else math.ceil(gemm.k / TMA_BLOCK_K))
    steps = math.ceil(kernel_steps / split)
    traffic = 2 * split * gemm.m * gemm.n * 4 / HBM_BYTES_PER_US if split > 1 else 0.0
    return blocks, math.ceil(blocks / (target.sm_count * resident)) * steps * step_us * resident + traffic


def tma_tiles(n: int) -> tuple[tuple[int, int, int, float], ...]:
    """The TMA tiles worth running on a GEMM N of ``n``: none much wider than N, whose
    extra columns would only multiply padding."""
    return tuple(t for t in TMA_TILES if t[1] <= max(fit_tile(n, 256), 64))


def tma_splits(problem: ConvProblem, pass_: Pass) -> tuple[int, ...]:
    """The split-K counts a TMA plan may take: 1 for fprop and dgrad (a block reduces its
    tile's whole K), powers of two and a few between for wgrad's long pixel reduction."""
    if pass_ is not Pass.WGRAD:
        return (1,)
    steps = math.ceil(problem.gemm(pass_).k / TMA_BLOCK_K)  # 0 for an empty batch, which one slice plans
    return tuple(s for s in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if s <= max(1, min(steps, MAX_TMA_SPLIT)))


def tma_split(problem: ConvProblem, pass_: Pass, target: Target, bm: int, bn: int,
              rate: float, resident: int = 1) -> tuple[int, int, float]:
    """(split-K, blocks, predicted microseconds) of a TMA tile at its cheapest split: what the
    planner's default and the tuner's candidates both run a tile with (``resident``: as
    tma_tile_cost prices it)."""
    costs = ((split, *tma_tile_cost(problem, pass_, target, bm, bn, rate, split, resident))
             for split in tma_splits(problem, pass_))
    return min(costs, key=lambda c: c[2])


def tma_stream_k_cost(problem: ConvProblem, target: Target, bm: int, bn: int, rate: float,
                      blocks: int) -> float:
    """Predicted microseconds of a stream-K wgrad plan (TmaWgmma(persistent=True)) on ``blocks``
    blocks: the tiles' steps dealt out evenly, each block's share at the tile's measured rate,
    plus the parts of the tiles the blocks cut (at most two a block boundary) written and read
    back in fp32.  Not yet a rule: no GPU has timed the kind (benchmarks/NOTES.md, thirty-third
    session); it orders the tuner's stream-K candidates."""
    gemm = problem.gemm(Pass.WGRAD)
    tiles = math.ceil(gemm.m / bm) * math.ceil(gemm.n / bn)
    steps = tiles * math.ceil(gemm.k / TMA_BLOCK_K)
    step_us = 2 * bm * bn * TMA_BLOCK_K / (rate * 1e6 / target.sm_count)
    parts = 2 * min(blocks - 1, steps)
    return math.ceil(steps / blocks) * step_us + 2 * parts * bm * bn * 4 / HBM_BYTES_PER_US


def tma_persistent(problem: ConvProblem, pass_: Pass, target: Target, bm: int,
                   bn: int) -> tuple[tuple[int, int, int, bool] | None, str]:
    """The persistent tile (block_m, block_n, stages, ping-pong) that replaces the cost
    model's ``bm`` x ``bn`` tile, or None where the one-block-per-tile kernel stays; and why."""
    if pass_ is Pass.WGRAD:
        return None, "one block per tile: wgrad's split-K slices are its blocks"
    if problem.groups > 1 and (pass_, bm, bn) not in GROUPED_PERSISTENT:
        return None, (f"one block per tile: the persistent walk was measured on grouped layers only for "
                      f"fprop's 64x64 tile, not {pass_.value}'s {bm}x{bn}")
    tile = PERSISTENT_TILES.get((pass_, bm, bn))
    if tile is None:
        return None, f"one block per tile: no persistent {bm}x{bn} kernel was measured faster"
    gemm = problem.gemm(pass_)
    exact = tma_exact_persistent(problem, pass_, tile)
    tile = exact or tile
    tiles = math.ceil(gemm.m / tile[0]) * math.ceil(gemm.n / tile[1])
    if tiles < MIN_PERSISTENT_TILES_PER_SM * target.sm_count:
        return None, (f"one block per tile: {tiles} {tile[0]}x{tile[1]} tiles are fewer than "
                      f"{MIN_PERSISTENT_TILES_PER_SM} per SM, too few for a persistent block to overlap")
    named = f"{tile[0]}x{tile[1]} tile" + (f" in place of the {bm}x{bn} tile" if tile[:2] != (bm, bn) else "") + (
        f" (exactly {math.ceil(gemm.n / EXACT_TMA_BN)} tiles of N={gemm.n}: tma_rules.tma_exact_persistent)"
        if exact else "")
    how = ("ping-pong: the two consumer warpgroups take whole tiles in turn, one draining while the other "
           "multiplies" if tile[3] else "the producer copying the next tile's stages while the consumers drain "
           "this one's")
    return tile, (f"persistent {named}: {tiles} tiles "
                  f"(at least {MIN_PERSISTENT_TILES_PER_SM} per SM) walked by the blocks the GPU holds at once, "
                  f"{how} (measured faster on such 3x3 layers: tma_rules." +
                  ("GROUPED_PERSISTENT, ResNeXt-50's grouped layers)" if problem.groups > 1 else "PERSISTENT_TILES)"))


def tma_eligible(geometry: ConvGeometry, pass_: Pass, target: Target, in_dtype: DType = "float16") -> str | None:
    """Why the TMA main loop cannot run this layer (None when it can).  The limits are the
    copy engine's: an im2col box's corners are signed 8-bit offsets from the image's edges
    (rank-4 tensors), its traversal stride is at most 8, and a tensor's rows are whole
    16-byte units.  wgrad stages 64 channels of one tap per box of x, so C is a whole number
    of boxes unless the filter is 1x1 (its last box reads zeros past C); fprop stages 64
    channels of one tap per step out of w's [K][R*S*C] rows, or, where C is not a whole number
    of boxes, out of w as a (C, R*S, K) tensor, whose boxes read zeros past C as x's do
    (tma.weight_map); fprop and wgrad take groups of whole boxes, G GEMMs side by side; dgrad
    reads w as a 3-D tensor whose far edge reads zeros, so any K in 16-byte runs will do, and
    walks dy one pixel per pixel of a stride residue class, through one map per class."""
    if not (target.info.tma and target.info.wgmma):
        return f"needs the tensor memory accelerator and warpgroup MMAs (sm_90a), which {target.arch} does not have"
    if in_dtype not in ("float16", "bfloat16"):
        return "copies fp16 inputs as they are (the copy engine cannot cast)"
    g = geometry
    if g.groups > 1:  # fprop, wgrad: a GEMM per group, side by side, its boxes at the group's channels
        cg, kg = g.c // g.groups, g.k // g.groups
        if pass_ is Pass.DGRAD:
            return (f"groups={g.groups}: its dgrad kernel boxes every channel of a pixel, not one group's "
                    "(a grouped layer runs the im2col loop, a GEMM per group; fprop's and wgrad's TMA kernels "
                    "take groups)")
        if cg % 64 or kg % 64:
            return (f"groups={g.groups}: a group's C/G={cg} and K/G={kg} must be whole 64-channel boxes, so that "
                    "no box spans two groups")
    (sh, sw), (ph, pw), (dh, dw) = g.stride, g.padding, g.dilation
    if pass_ is not Pass.DGRAD:
        if g.c % 64 and pass_ is Pass.WGRAD and g.r * g.s > 1:
            return (f"stages 64 channels of one tap per box of dW's columns: with {g.r}x{g.s} taps, C={g.c} must be "
                    "a multiple of 64 (a box past C would hold the next tap's channels)")
        if g.c % 64 and (g.c % 8 or g.c < MIN_DGRAD_K):  # a channel tail: read as dgrad reads dy's
            return (f"reads x in 64-channel boxes, past C as dgrad reads dy past K: C={g.c} must be a multiple of 8 "
                    f"and at least {MIN_DGRAD_K}, the narrowest such box that has run")
        if pass_ is Pass.WGRAD and g.k % 8:
            return f"copies dy's rows as whole 16-byte runs: K={g.k} is not a multiple of 8"
        if max(sh, sw) > 8:
            return f"walks the image at most 8 pixels per step: stride {g.stride} is larger"
        # the bounding box's corners: -padding and padding - reach
        corners = ((ph, (g.r - 1) * dh, "H"), (pw, (g.s - 1) * dw, "W"))
    else:
        if g.k % 8 or g.c % 8:
            return f"copies whole 16-byte runs: K={g.k} and C={g.c} must be multiples of 8"
        if g.k < MIN_DGRAD_K:
            return (f"reads dy in 64-channel boxes, which hung the copy engine on the H200 with K=8 (dy rows of "
                    f"16 bytes; benchmarks/probes/tma_dgrad_narrow.py): K={g.k} is under {MIN_DGRAD_K}, the "
                    "narrowest dy it has run")
        if sh * sw > MAX_DGRAD_CLASSES:
            return (f"takes one tensor map per stride residue class, at most {MAX_DGRAD_CLASSES}: stride {g.stride} "
                    f"has {sh * sw}")
        # each class's map: its flipped sub-filter's padding at the top left, and where its
        # pixel grid ends against dy's at the bottom right
        for cls in residue_classes(g):
            if cls.taps and cls.pixels_per_image:
                for lower, upper, axis in ((-cls.flip_h, cls.hc - g.p - cls.flip_h, "H"),
                                           (-cls.flip_w, cls.wc - g.q - cls.flip_w, "W")):
                    if not (-128 <= lower <= 127 and -128 <= upper <= 127):
                        return (f"needs the bounding box's corners within [-128, 127] of dy's edges: residue class "
                                f"({cls.ch}, {cls.cw}) along {axis} has corners {lower} and {upper}")
        return None
    for pad, reach, axis in corners:
        if not -127 <= pad <= 128 or not -128 <= pad - reach <= 127:
            return (f"needs the bounding box's corners within [-128, 127] of the image's edges: along {axis}, "
                    f"padding {pad} and filter reach {reach} are too far")
    return None
