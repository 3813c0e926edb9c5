"""The planner's rules for layers of few output tiles, fitted to the tuning database.

The tuned winners on the H200 (the database shipped until 27682a8, kept as
`tests/data/h200-tuning-27682a8.json`: the CIFAR suites and
ResNet-50) beat the planner's older defaults by 1.2x to 2.1x on small layers in two ways
that are rules, not per-shape entries:

* **wgrad's split-K fills the SMs' resident slots, not just the SMs.**  The winners launch
  128 to 530 blocks: about as many as the SMs hold at once at the plan's occupancy (a 16x32
  tile of two warps fits many to an SM, a 128x128 one just one).  One block per SM had left
  a small-tile layer's SMs mostly idle.  fprop and dgrad keep one block per SM: their
  slices' partials are as large as their outputs.
* **Stride-1 fprop and dgrad with N <= 64 (or N of whole fragments up to MAX_EXACT_HALO_N, on a
  tile exactly N wide) that the TMA loop does not take run the halo path**
  (every input pixel of a tile staged once per K-step, each tap's fragments read in place;
  filters of up to MAX_HALO_TAPS taps, the 3x3 ones it was fitted on):
  every such tuned CIFAR layer's winner (images of 8-32 pixels) is a halo plan, 16 pixels
  wide (8 on 8-pixel images, the ldmatrix kind), 256 rows (128 on 8-pixel images), with
  several tiles a block where the reduction is one step.  The same rule on images of 128-256
  pixels (UNet's, VGG-16's and Darknet-53's stride-1 layers of 3-96 channels; tuning logs
  `benchmarks/results/tuning/nvidia-h200_2026-12-04_1c23207-tune-*`) picked the fastest
  candidate or one within 5% of it, 1.35-2.58x the im2col plan it replaces: an im2col block
  reads each input pixel once per tap, R*S times, where N is too narrow to pay for it.

Kept apart from the planner so that a new tuning run changes one module, and so that its
rules are read in one place.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

from .footprint import smem_bytes
from .ir import ConvProblem, DType, Pass, Target
from .spec import Plan, stages_whole_halo
from .mainloop import FRAG, HaloLdsm, HaloTile, StagedHalo, fit_tile

MAX_SPLIT = 512
# The halo rule's largest filter, in taps: the 3x3 filters it was fitted on.  A halo tile's
# registers grow with its taps: on sm_90 3x3 filters held 122-238 registers, 5x5 211-254 (and
# 4-32 local-memory accesses in bf16), 6x6 and 7x7 240-255, where fp16 dgrads of C = 3, K = 64
# (6x6) and C = K = 32 (7x7) spilled 82 and 30 (scripts/compile_fuzz.py).  Larger filters keep
# the im2col plan; no tuned winner had one.
MAX_HALO_TAPS = 9
# bf16 halo tiles hold more registers than fp16 ones: a warp of 8 fragments (a 256-row tile of
# 32 columns on 4 warps, or of 64 on 8) sat at 255 registers on sm_90 and spilled in 3x3 dgrads
# of C = 32 (8 local-memory accesses).  A bf16 halo plan takes 128-row tiles instead (4 fragments).
BF16_HALO_FRAGMENTS = 4
# Past 64 columns the rule takes a dgrad's N of whole fragments up to this, on a tile exactly N
# wide, where the reduction is one 32-channel step: UNet's dec1-cat96 dgrad (N = 96) ran its
# 96-wide halo tiles 1.63-1.72x the im2col default (H100 at d3f404f, all eight fastest
# candidates: tuning/nvidia-h100_2026-12-07_d3f404f-tune-unet-dec1-dec2-dgrad.json); wider N,
# longer reductions and narrow (8-pixel) images untimed.
MAX_EXACT_HALO_N = 96
# A pointwise wgrad whose M (filters) or N (channels) passes 128 by at most an eighth of a tile
# (128 < M or N <= 144) and whose other side is narrow: the power-of-two tiles (cap 128) cover it
# in two, the second at most an eighth used, and each re-reads all of the other operand over the
# layer's long pixel reduction.  One tile covering it won on both such layers of MobileNetV2, on
# both GPUs that tuned them (`convgen tune`, no db; benchmarks/NOTES.md, fifty-first session):
# pw56-24to144 (M = 144, N = 24) 256x32x32 on 4 warps at 264 slices 65.5 us on an H100 (4608fd8;
# the 128x32 default 79.3 in that run, 81.1 in the bench) and 74.0 on an H200 (5bf5603: 1.02x the best, the default 80.6);
# pw56-144to24 (M = 24, N = 144) 32x144x64 on 1x3 warps at 264 slices 65.2 (H100) and 56.2 us
# (H200: the best), where the 32x128 default ran 79.1 on the H200.  Where the second tile is half
# used or more (M = 192 or 240: pw28-32to192, pw28-40to240) two 128-row tiles ran as fast or
# faster, so the rule stops at an eighth.  Its K-steps, rings and split are the winners' (the
# 32x144 tile on 3 stages holds three blocks an SM, but split for three it is untimed).
ONE_TILE_OVERFLOW = 16  # rows or columns past 128: an eighth of a tile
ONE_TILE_OTHER = 32     # the other side's widest, as measured (24)
ONE_TILE_BLOCKS_PER_SM = 2  # both winners' split (264 slices of one tile on 132 SMs; 512 ran 1.09-1.24x slower)
BLOCKS_PER_SM_CAP = 8  # registers, not shared memory, bound small blocks past this
THREADS_PER_SM = 2048


class OneTile(NamedTuple):
    """The tile :func:`wgrad_one_tile` gives, as the tuning runs timed it."""
    block_m: int
    block_n: int
    warps_m: int
    warps_n: int
    block_k: int
    stages: int
    why: str


def wgrad_one_tile(problem: ConvProblem, pass_: Pass, target: Target) -> OneTile | None:
    """The one tile that covers a pointwise wgrad's M or N just past 128 (ONE_TILE_OVERFLOW),
    with the K-step and ring both timed winners ran; its split takes ONE_TILE_BLOCKS_PER_SM."""
    if pass_ is not Pass.WGRAD or problem.groups > 1 or (problem.r, problem.s) != (1, 1) or not target.info.cp_async:
        return None
    gemm = problem.gemm(pass_)
    why = ("one tile covers {dim}={n}: the power-of-two tiles (cap 128) need two, the second {used:.0%} used, each "
           "re-reading the other operand over the pixels; {ring}, split for {blocks} blocks an SM, as timed "
           "(1.09-1.41x on MobileNetV2's pw56 wgrads: small_layer_rules.ONE_TILE_OVERFLOW)")
    if 128 < gemm.m <= 128 + ONE_TILE_OVERFLOW and gemm.n <= ONE_TILE_OTHER:
        return OneTile(256, fit_tile(gemm.n, 128), 4, 1, 32, 4, why.format(
            dim="M", n=gemm.m, used=(gemm.m - 128) / 128, ring="K-step 32 on 4 stages", blocks=ONE_TILE_BLOCKS_PER_SM))
    if 128 < gemm.n <= 128 + ONE_TILE_OVERFLOW and gemm.m <= ONE_TILE_OTHER:
        exact = math.ceil(gemm.n / FRAG) * FRAG
        wn = max(d for d in (1, 2, 3, 4) if (exact // FRAG) % d == 0)
        return OneTile(fit_tile(gemm.m, 128), exact, 1, wn, 64, 3, why.format(
            dim="N", n=gemm.n, used=(gemm.n - 128) / 128, ring="K-step 64 on 3 stages", blocks=ONE_TILE_BLOCKS_PER_SM))
    return None


def split_k(plan: Plan, problem: ConvProblem, pass_: Pass, target: Target, smem: int,
            blocks_per_sm: int | None = None) -> tuple[int, str]:
    """(split-K, why) for an im2col plan whose block needs ``smem`` bytes: slices enough
    to fill the SMs' resident blocks (or ``blocks_per_sm`` of them, where a rule says) when the
    output has fewer than half as many tiles as SMs and the reduction is long, each slice
    keeping at least 4 K-steps."""
    gemm = problem.group_gemm(pass_)  # a grouped layer's groups tile side by side
    tiles = math.ceil(gemm.m / plan.block_m) * math.ceil(gemm.n / plan.block_n) * problem.groups if gemm.m else 0
    steps = math.ceil(gemm.k / plan.block_k) if gemm.k else 0
    occupancy = 1
    if pass_ is Pass.WGRAD:
        occupancy = max(1, min(BLOCKS_PER_SM_CAP, target.smem_limit // max(smem, 1),
                               THREADS_PER_SM // (plan.warps * target.warp_size), blocks_per_sm or BLOCKS_PER_SM_CAP))
    split = 1
    if tiles and tiles < target.sm_count // 2 and steps >= 8:
        split = max(1, min(math.ceil(target.sm_count * occupancy / tiles), steps // 4, MAX_SPLIT))
    why = (f"split-K {split}: {tiles} output tiles on {target.sm_count} SMs"
           + (f" x {occupancy} resident blocks each" if occupancy > 1 else "") + f", {steps} K-steps"
           + (" (slices reduced in fixed order: deterministic)" if split > 1 else ""))
    return split, why


def halo_default(problem: ConvProblem, pass_: Pass, target: Target, in_dtype: DType, base: Plan) -> Plan | None:
    """The halo plan the rule gives a narrow (N <= 64, or a dgrad's N up to MAX_EXACT_HALO_N on a
    tile exactly N wide) stride-1 fprop or dgrad, with its reasons, or
    None where the rule does not apply or its plan does not fit (the caller then keeps
    ``base``, the im2col plan).  A 3-channel fprop stages its whole halo and keeps
    ``base``'s gathers."""
    from .planner import check_plan, halo_eligible, halo_vec_b

    g = problem.geometry
    if pass_ is Pass.WGRAD or not 1 < g.r * g.s <= MAX_HALO_TAPS or g.stride != (1, 1) or not target.info.cp_async:
        return None
    if halo_eligible(g, pass_, in_dtype) is not None:
        return None
    out_h, out_w = (g.p, g.q) if pass_ is Pass.FPROP else (g.h, g.w)
    gemm = problem.gemm(pass_)
    red = g.c if pass_ is Pass.FPROP else g.k  # channels reduced per tap
    # a dgrad tile exactly N wide, on a one-step reduction (several tiles a block), as timed
    exact = pass_ is Pass.DGRAD and 64 < gemm.n <= MAX_EXACT_HALO_N and gemm.n % FRAG == 0 and red <= 32
    if gemm.n > 64 and not exact:
        return None
    staged = stages_whole_halo(g, pass_)
    narrow = out_w <= 8 and not staged
    if narrow and not (target.info.ldmatrix and target.info.mma_sync) or exact and (narrow or staged):
        return None
    bm, bn = (128, max(fit_tile(gemm.n, 64), 32)) if narrow else (256, gemm.n if exact else fit_tile(gemm.n, 64))
    wm, wn = 4, 1 if bn <= 32 or narrow else 2
    crowded = in_dtype == "bfloat16" and (bm // wm // 16) * (bn // wn // 16) > BF16_HALO_FRAGMENTS
    if crowded:
        bm = 128
    if staged:
        bk, stages, va, vb, tiles = 32, base.stages, base.vec_a, base.vec_b, 1
        loop = StagedHalo(16)
    else:
        bk = 16 if red <= 16 else 32
        stages = 2 if red <= bk else 3
        va, vb = 8, halo_vec_b(g, pass_)
        # a one-step reduction stages every tap's weights once: give a block up to 4 tiles
        tiles = max(1, min(4, out_h * out_w // bm)) if red <= bk else 1
        loop = HaloLdsm(8, tiles=tiles) if narrow else HaloTile(16, tiles=tiles)
    try:
        plan = Plan(bm, bn, bk, wm, wn, stages, va, vb, in_dtype, in_dtype, 1, loop=loop)  # 16-bit, read as is
        check_plan(plan, problem, pass_, target, in_dtype)
    except ValueError:
        return None
    # the base plan's reasons that still hold: the GEMM, why not TMA, and the staged halo's gathers' vectors
    kept = [r for r in base.reasons if r.startswith(("GEMM ", "not the TMA") + (("vec A",) if staged else ()))]
    kind = ("the staged halo (the whole input halo in shared memory, read by the im2col gathers: C is not a "
            "multiple of 8)" if staged else "8-pixel ldmatrix tiles" if narrow else "16-pixel tiles")
    reasons = kept + [
        f"halo path, {kind}: stride-1 {pass_.value} with N={gemm.n} <= {MAX_EXACT_HALO_N if exact else 64} off the "
        "TMA loop, where the tuned "
        "winners on the H200 (images of 8 to 256 pixels) are halo plans (small_layer_rules); each input pixel of a "
        "tile is staged once per K-step instead of once per tap",
        (f"block N {bn}: exactly N (small_layer_rules.MAX_EXACT_HALO_N)" if exact else
         f"block N {bn}: covers N={gemm.n} (cap 64" + (", at least 32 for the ldmatrix tiles)" if narrow else ")")),
        f"block M {bm}: a {bm // loop.tile_w}x{loop.tile_w} pixel tile" + (f", {tiles} tiles per block (a one-step "
                                                                            "reduction stages every tap's weights once)"
                                                                            if tiles > 1 else ""),
        f"K-step {bk}: " + ("every channel of the staged halo's gathers in two k16 MMAs" if staged else
                            f"{'one step covers' if red <= bk else 'steps over'} the {red} reduced channels"),
        f"{wm * wn} warps as {wm}x{wn}: warp tile {bm // wm}x{bn // wn}" + (
            " (bf16 fragments: a tile of 256 rows held 255 registers and spilled; BF16_HALO_FRAGMENTS)" if crowded else ""),
    ] + ([] if staged else [f"vec A {va}, vec B {vb}: the halo's 16-byte runs, the weights' widest divisor"]) + [
        f"{stages} stages: " + ("one step needs no deeper ring" if stages == 2 and red <= bk else "cp.async ring"),
        "split-K 1: a block reduces its tile's whole K",
        f"shared memory {smem_bytes(plan, pass_, target.warp_size, problem)} bytes",
    ]
    return dataclasses.replace(plan, reasons=tuple(reasons))
