"""The planner: picks how one conv pass is computed on one target.

Deterministic and explainable: every choice is a small rule over the GEMM view
of the pass, and appends a one-line reason to ``Plan.reasons`` so that
``convgen plan`` can show why.  A hand-written :class:`Plan` goes through the
same feasibility check (:func:`check_plan`) as a planned one.
"""

from __future__ import annotations

import math

from .ir import (
    ConvGeometry,
    ConvProblem,
    DType,
    Epilogue,
    KernelSpec,
    Pass,
    Plan,
    Target,
    stages_whole_halo,
)
from .dtypes import MMA_DTYPES, mma_dtype_for
from .limits import check_index_limits
from . import depthwise
from .mainloop import (FRAG, Depthwise, FlatHalo, HaloLdsm, HaloTile, Im2col, StagedHalo, TmaWgmma, Wgmma,
                       fit_tile)
from .short_reduction_rules import exact_n_tile
from .small_layer_rules import halo_default, split_k
from .tma_plan import tma_plan
from .tma_rules import (MIN_POINTWISE_WGRAD_K, pointwise_wgrad, tma_eligible, tma_group_tile, tma_min_steps,
                        tma_short_persistent, tma_steps, tma_tail_fill)

# The kinds that stage BK channels of a halo per step and read each tap's fragments in
# place (the emitter's "taps" path); they alone can compute several tiles per block.
IN_PLACE_HALO = (HaloTile, HaloLdsm, FlatHalo)

SMEM_PAD = 8  # halves added to each staged row: 16 bytes, so ldmatrix rows fall in distinct banks
# The halo path stores each pixel's 16 channels of a slab in 24 halves (48 bytes): the 8 rows
# of an ldmatrix phase then start at distinct 16-byte bank groups whatever pixel a tap's
# fragment starts at (at 32 bytes, rows i and i + 4 shared banks: 2-way conflicts).
HALO_LD = FRAG + SMEM_PAD
EPI_PAD = 8  # floats added to each scratch row: rows 0-3 of a fragment store land in distinct banks
MAX_DRAIN_FRAGS = 4  # a strip of 4 fragments is 64 outputs: one 128-byte line of fp16 per row


def drain_group(plan: Plan, warp_size: int = 32) -> int:
    """Fragments the epilogue drains side by side (a 16 x 16*G strip of the warp tile).

    Wider strips let neighbouring lanes continue one output row, so a store instruction
    covers rows of 32*G bytes (fp16) instead of 32.  G divides the warp's fragment
    columns, and the lanes sharing a row (16*G / outputs per lane) must tile the warp
    and the strip's 16 rows evenly.
    """
    fn = plan.block_n // plan.warps_n // FRAG
    ept = FRAG * FRAG // warp_size
    for g in range(min(fn, MAX_DRAIN_FRAGS), 0, -1):
        lanes_per_row = FRAG * g // ept
        if fn % g == 0 and warp_size % lanes_per_row == 0 and FRAG % (warp_size // lanes_per_row) == 0:
            return g
    return 1


def gathered_channels(geometry: ConvGeometry, pass_: Pass) -> tuple[int, int]:
    """The contiguous run length each operand's gather reads, which bounds its vector width.

    fprop: A = im2col(x) runs over C channels, B = w rows over R*S*C.
    dgrad: A = dy over K, B = w over C.  wgrad: A = dy^T over K, B = im2col(x) over C.
    A grouped layer's runs are one group's channels (C/G, K/G).
    """
    g = geometry
    if pass_ is Pass.FPROP:
        return g.cg, g.r * g.s * g.cg
    if pass_ is Pass.DGRAD:
        return g.kg, g.cg
    return g.kg, g.cg


def a_is_col(pass_: Pass) -> bool:
    """wgrad stages dy as [k-step][m] and reads A = dy^T through a col-major fragment."""
    return pass_ is Pass.WGRAD


def b_is_col(pass_: Pass) -> bool:
    """fprop stages w as [n][k-step] (rows of KRSC are the reduction), a col-major B fragment."""
    return pass_ is Pass.FPROP


def halo_shape(plan: Plan, geometry: ConvGeometry, images: int = 1) -> tuple[int, int, int, int]:
    """(tile rows, tile columns, halo rows, halo columns) of a halo plan: the output-pixel
    tile and the input pixels its taps reach.  A tile of `images` stacked whole images
    (`halo_images`) has one halo per image, stacked the same way."""
    tw = plan.loop.tile_w  # a 2-D kind: HaloTile, HaloLdsm, StagedHalo
    th = plan.block_m // tw
    (sh, sw), (dh, dw) = geometry.stride, geometry.dilation
    return th, tw, images * ((th // images - 1) * sh + (geometry.r - 1) * dh + 1), (tw - 1) * sw + (geometry.s - 1) * dw + 1


def halo_images(plan: Plan, geometry: ConvGeometry, pass_: Pass) -> int:
    """Whole images one 8-pixel-wide ("ldsm") halo tile stacks: a tile at least as wide as the
    image and a whole number of images tall takes that many, one after another in its rows,
    so a block of 8x8 images stages every tap's weights once per 128 or 256 pixels instead of
    once per 64.  1 for every other tile."""
    if not isinstance(plan.loop, HaloLdsm) or plan.loop.tiles != 1:
        return 1
    _, (oh, ow), _ = halo_frame(geometry, pass_)
    th = plan.block_m // plan.loop.tile_w
    return th // oh if th > oh and th % oh == 0 and plan.loop.tile_w >= ow else 1


def halo_frame(geometry: ConvGeometry, pass_: Pass) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """((in rows, in cols), (out rows, out cols), (origin row, origin col)) of a stride-1 halo
    pass, seen as a plain correlation: output pixel (y, x) reads input (y + ORG_H + r*DH,
    x + ORG_W + s*DW) at tap (r, s).  dgrad is one over dy with the filter walked flipped."""
    g = geometry
    (ph, pw), (dh, dw) = g.padding, g.dilation
    if pass_ is Pass.DGRAD:
        return (g.p, g.q), (g.h, g.w), (ph - (g.r - 1) * dh, pw - (g.s - 1) * dw)
    return (g.h, g.w), (g.p, g.q), (-ph, -pw)


def flat_grid(geometry: ConvGeometry, pass_: Pass) -> tuple[int, int]:
    """(rows, columns) per image of a flat halo plan's grid.  Output pixel (n, y, x) sits at
    position (n*rows + y)*columns + x and reads position + r*DH*columns + s*DW at tap (r, s):
    grid column c stands for input column c + ORG_W (the gather maps each position it stages
    to its input pixel, or to zero outside the image).  A read past a row's end lands on the
    next row's first columns, and one past an image's last row on the next image's first rows;
    the pitch is wide (and tall) enough that those stand for input columns (rows) before the
    first, the padding, never data.  So a tap is a fixed shift of the tile's positions."""
    g = geometry
    _, (oh, ow), (org_h, org_w) = halo_frame(g, pass_)
    (dh, dw) = g.dilation

    def pitch(out: int, lead: int, reach: int) -> int:
        # lead = -ORG, the padding before the input; reach, the filter's extent less one.  A
        # read reaches column out - 1 + reach; wrapped, it stands for input column
        # out - 1 + reach - pitch - lead, which must be negative.
        return max(out, out + reach - lead)

    return pitch(oh, -org_h, (g.r - 1) * dh), pitch(ow, -org_w, (g.s - 1) * dw)


def halo_pixels(plan: Plan, geometry: ConvGeometry, pass_: Pass) -> int:
    """Pixels of one staged halo: the 2-D tile's halo rectangle, or the flat tile's block_m
    positions and the furthest tap's shift past them."""
    if isinstance(plan.loop, FlatHalo):
        _, gw = flat_grid(geometry, pass_)
        return plan.block_m + (geometry.r - 1) * geometry.dilation[0] * gw + (geometry.s - 1) * geometry.dilation[1]
    _, _, hh, hw = halo_shape(plan, geometry, halo_images(plan, geometry, pass_))
    return hh * hw


def halo_path(plan: Plan, geometry: ConvGeometry | None = None, pass_: Pass | None = None) -> str:
    """The emitter's name for how a kind gathers: "" (im2col from global memory: Im2col,
    Wgmma), "taps" (the halo of BK channels staged per step, each tap's fragments read in
    place: HaloTile, HaloLdsm, FlatHalo), or "im2col" (StagedHalo: the whole input halo
    staged once, the im2col gather reading that copy).  The kind alone decides; geometry
    and pass are accepted for the callers that still pass them."""
    if not plan.loop.halo:
        return ""
    return "im2col" if isinstance(plan.loop, StagedHalo) else "taps"


def staged_halo_halves(plan: Plan, geometry: ConvGeometry) -> int:
    """StagedHalo's input halo, every channel of every pixel, in halves; rounded
    up to 64 halves (128 bytes) so the pipeline stages after it stay aligned."""
    _, _, hh, hw = halo_shape(plan, geometry)
    return -(-hh * hw * geometry.c // 64) * 64


def halo_stage_halves(plan: Plan, geometry: ConvGeometry, pass_: Pass) -> tuple[int, int]:
    """Halves of one stage of the halo path: the halo tile, stored as BK/16 slabs of
    [pixels][HALO_LD] (16 channels and 8 of padding: any 16 neighbouring pixels are one WMMA
    fragment, whatever the pixel it starts at, read without bank conflicts); and every tap's
    weights, fprop [taps][BN][BK + pad], dgrad [taps][BK][BN + pad]."""
    taps = geometry.r * geometry.s
    a = halo_pixels(plan, geometry, pass_) * (plan.block_k // FRAG) * HALO_LD
    b = taps * plan.block_n * (plan.block_k + SMEM_PAD) if pass_ is Pass.FPROP else taps * plan.block_k * (plan.block_n + SMEM_PAD)
    return a, b


def reduction_steps(plan: Plan, pass_: Pass, geometry: ConvGeometry) -> int | None:
    """The most K-steps one block can run, when the shape fixes it: fprop and dgrad reduce
    over the filter and channels (a halo step covers every tap), wgrad over the batch's
    pixels, which only the launch knows (None)."""
    g = geometry
    if pass_ is Pass.WGRAD:
        return None
    red = g.c if pass_ is Pass.FPROP else g.k
    if not isinstance(plan.loop, IN_PLACE_HALO):
        red *= g.r * g.s
    return max(1, math.ceil(red / plan.block_k))


def ring_stages(plan: Plan, pass_: Pass, geometry: ConvGeometry | None) -> int:
    """Shared-memory stages the main loop's ring can touch: a block that runs n < stages
    K-steps only ever fills stages 0..n-1, so a one-step reduction needs one stage (more
    blocks then fit on an SM) and the plan's depth pays only where there is a loop."""
    steps = reduction_steps(plan, pass_, geometry) if geometry is not None else None
    return plan.stages if steps is None else min(plan.stages, steps)


def stage_pad(plan: Plan) -> int:
    """Halves of padding per staged row: WMMA's ldmatrix rows need it to miss each other's
    banks; wgmma's operands are dense 8x8 core matrices, which its descriptors describe."""
    return 0 if isinstance(plan.loop, (Wgmma, TmaWgmma)) else SMEM_PAD


# TmaWgmma's shared memory beyond its ring: each stage's two 8-byte mbarriers, ahead of the
# ring, and the 1024 bytes that may be lost aligning the ring to the swizzle's 1024-byte atoms.
TMA_ALIGN_SLACK = 1024
TMA_BARRIER_BYTES = 16


def smem_bytes(plan: Plan, pass_: Pass, warp_size: int = 32, geometry: ConvGeometry | None = None) -> int:
    """Dynamic shared memory of one block: the staged pipeline, or the epilogue scratch if larger.
    A halo plan's stages depend on the filter, so it needs the geometry; without one, an
    im2col plan is sized for all its stages (an upper bound)."""
    bm, bn, bk = plan.block_m, plan.block_n, plan.block_k
    if isinstance(plan.loop, Depthwise):
        if geometry is None:
            raise ValueError("a depthwise plan's shared memory depends on the filter: pass the geometry")
        return depthwise.smem_bytes(plan, geometry, pass_, warp_size)
    if plan.loop.halo and geometry is None:
        raise ValueError("a halo plan's shared memory depends on the filter: pass the geometry")
    if isinstance(plan.loop, IN_PLACE_HALO):
        a, b = halo_stage_halves(plan, geometry, pass_)  # type: ignore[arg-type]
    else:
        pad = stage_pad(plan)
        a = bk * (bm + pad) if a_is_col(pass_) else bm * (bk + pad)
        b = bn * (bk + pad) if b_is_col(pass_) else bk * (bn + pad)
    pipeline = ring_stages(plan, pass_, geometry) * (a + b) * 2
    if isinstance(plan.loop, StagedHalo):
        pipeline += staged_halo_halves(plan, geometry) * 2  # type: ignore[arg-type]
    if isinstance(plan.loop, TmaWgmma):  # the epilogue's strips reuse the (aligned) ring, or follow it; then barriers
        strips = plan.warps_m * FRAG * (FRAG * drain_group(plan, warp_size) + EPI_PAD) * 4
        pipeline = pipeline + strips if plan.loop.persistent else max(pipeline, strips)
        barriers = ring_stages(plan, pass_, geometry) * TMA_BARRIER_BYTES
        if pass_ is Pass.WGRAD or plan.loop.pingpong:  # and db's reader-done barrier, or ping-pong's two
            barriers += TMA_BARRIER_BYTES                  # issued barriers: 16 bytes
        return TMA_ALIGN_SLACK + pipeline + barriers
    # The drain's per-warp strips (slice 0's warps drain), and with sliced K the sums the
    # other slices park for slice 0 (mainloop), which use the same freed stages first.
    epilogue = plan.warps_m * plan.warps_n * FRAG * (FRAG * drain_group(plan, warp_size) + EPI_PAD) * 4
    if isinstance(plan.loop, Im2col):
        epilogue = max(epilogue, (plan.loop.warps_k - 1) * bm * bn * 4)
    if tiles_per_block(plan) > 1:  # [weights][halo slot 0][halo slot 1][epilogue scratch]: all live at once
        return (b + 2 * a) * 2 + epilogue
    return max(pipeline, epilogue)


def resident_blocks(plan: Plan, pass_: Pass, target: Target, geometry: ConvGeometry | None = None) -> int:
    """How many blocks of a persistent plan one SM holds at once, which sizes its grid: as
    many as its shared memory allows (each block also reserves 1 KB), at most one with two
    consumer warpgroups (384 threads at 168 registers fill the register file) and two with
    one."""
    per_block = smem_bytes(plan, pass_, target.warp_size, geometry) + 1024
    by_regs = 1 if plan.warps_m > 4 else 2
    return max(1, min(by_regs, (target.info.smem_limit + 1024) // per_block))


def tiles_per_block(plan: Plan) -> int:
    """Pixel tiles one block computes in turn: a halo kind's ``tiles``, else 1."""
    return plan.loop.tiles if isinstance(plan.loop, IN_PLACE_HALO) else 1


def vector_width(channels: int) -> int:
    """The widest access (elements of 8, 4, 2 or 1) that a run of this many channels allows."""
    for v in (8, 4, 2):
        if channels % v == 0:
            return v
    return 1


def _warp_grid(bm: int, bn: int, warps: int) -> tuple[int, int]:
    """Split `warps` over the block so each warp tile is as square as it can be (more reuse
    per fragment load), ties going to taller tiles; falls back to fewer warps when the
    block is too small to give each warp a fragment."""
    while warps > 1:
        options = [
            (wm, warps // wm)
            for wm in range(1, warps + 1)
            if warps % wm == 0 and bm % (FRAG * wm) == 0 and bn % (FRAG * (warps // wm)) == 0
        ]
        if options:
            return min(options, key=lambda o: (abs(math.log2((bm / o[0]) / (bn / o[1]))), o[1]))
        warps //= 2
    return (1, 1)


def plan(
    problem: ConvProblem,
    pass_: Pass | str,
    target: Target | None = None,
    in_dtype: DType = "float16",
    *,
    scalar: bool = False,
    mma_dtype: DType | None = None,
) -> Plan:
    """Choose a plan for ``problem`` (its batch size only sizes split-K and tiles).

    ``scalar=True`` renders the scalar staging path whatever the channel counts,
    so tests can compare it with the vector path on the same shape.  ``mma_dtype``: the
    MMA's 16-bit type (:mod:`convgen.dtypes`; None: in_dtype's); a target without it is refused.
    """
    pass_ = Pass.parse(pass_)
    target = target or Target()
    elem = mma_dtype_for(in_dtype, mma_dtype, target)
    gemm = problem.group_gemm(pass_)  # one group's: the GEMM a block tiles
    reasons: list[str] = [
        f"GEMM M={gemm.m} ({gemm.m_axis}) x N={gemm.n} ({gemm.n_axis}) x K={gemm.k} ({gemm.k_axis})"
        + (f", {problem.groups} of them side by side (one per group)" if problem.groups > 1 else "")
    ]
    if problem.depthwise:  # convgen/depthwise.py: a stencil, not a GEMM
        final = _replace(depthwise.plan_depthwise(problem, pass_, target, elem, reasons), reasons=tuple(reasons))
        check_plan(final, problem, pass_, target, in_dtype, mma_dtype=elem)
        return final
    if problem.groups > 1:
        reasons.append(f"groups={problem.groups}: one GEMM per group, side by side along the grid's y "
                       "(groups x N tiles)")

    if not scalar:
        why = tma_eligible(problem.geometry, pass_, target, in_dtype)
        # a block's K-steps (strided dgrad's heaviest residue class), read only where the loop runs
        steps = tma_steps(problem, pass_) if why is None else 0
        least, evidence = tma_min_steps(problem, pass_)
        if why is None and pass_ is Pass.WGRAD:
            if not pointwise_wgrad(problem, pass_) and gemm.m < 64:
                why = f"K={gemm.m} filters fill less than one 64-row consumer warpgroup"
            elif gemm.m < MIN_POINTWISE_WGRAD_K:
                why = (f"K={gemm.m} filters fill less than half a 64-row consumer warpgroup (a 1x1 layer's K = 24 "
                       "lost to the im2col loop, 32 and 40 won: tma_rules.POINTWISE_WGRAD_ROWS)")
        why = why or tma_tail_fill(problem, pass_)
        # A short reduction, or a 1x1 layer's long one, may take the persistent tile the roofline picks
        pointwise = problem.r * problem.s == 1 and pass_ is not Pass.WGRAD
        short, short_why = (tma_short_persistent(problem, pass_, target, steps)
                            if why is None and (steps < least or pointwise) else (None, ""))
        if why is None and (pass_ is Pass.WGRAD or steps >= least and gemm.n >= 64 or short is not None):
            if short is not None and steps < least:
                reasons.append(f"{steps} K-step(s), fewer than the TMA loop's {least}, through its persistent kernel: "
                               f"measured faster on such {'strided 3x3' if problem.stride != (1, 1) else '1x1'} layers "
                               "(tma_rules.tma_short_persistent)")
            return _replace(tma_plan(problem, pass_, target, reasons, steps, short_tile=short, short_why=short_why,
                                     short_first=steps < least),
                            read_a=elem, read_b=elem)
        if why is None or target.info.tma:  # on other targets the TMA loop is not a candidate worth naming
            reasons.append("not the TMA main loop: " + (
                why if why is not None else
                f"{steps} K-step(s) of 64 channels, fewer than {least}; its ring's fill and its epilogue would "
                f"not be amortised ({evidence}), and not its persistent kernel: {short_why}" if steps < least else
                f"N={gemm.n} is narrower than its narrowest tile (64)"))

    bn = fit_tile(gemm.n, 128)
    padding = 1 - gemm.n / (math.ceil(gemm.n / bn) * bn)
    reasons.append(f"block N {bn}: the smallest power-of-two tile of fragments covering N={gemm.n} (cap 128)"
                   + (f"; {padding:.0%} of the tiles' columns are padding" if padding >= 0.005 else ""))
    if pass_ is Pass.WGRAD:
        bm = fit_tile(gemm.m, 128)
        reasons.append(f"block M {bm}: covers wgrad's M=K={gemm.m} (cap 128)")
    else:
        bm = 128
        reasons.append(f"block M 128: M={gemm.m} pixels is the long axis")

    ca, cb = gathered_channels(problem, pass_)
    if scalar:
        va = vb = 1
    else:
        va, vb = vector_width(ca), vector_width(cb)
    big_k = gemm.k >= 1024 and min(va, vb) > 1
    bk = 64 if big_k else 32
    reasons.append(
        f"K-step {bk}: "
        + ("long reduction, fewer barriers per FLOP" if big_k else "two k16 MMAs per fragment per barrier"
           + (" (a scalar gather keeps the step short: fewer accesses in flight per thread)" if min(va, vb) == 1 else ""))
    )

    warps = 8 if bm * bn >= 128 * 128 else 4
    wm, wn = _warp_grid(bm, bn, warps)
    exact = None if scalar else exact_n_tile(problem, pass_)
    if exact is not None:
        bm, bn, wm, wn, why = exact
        reasons.append(why)
    reasons.append(
        f"{wm * wn} warps as {wm}x{wn}: warp tile {bm // wm}x{bn // wn} "
        f"= {(bm // wm // FRAG) * (bn // wn // FRAG)} fragments per warp"
    )

    if scalar:
        reasons.append("vec A/B 1/1: scalar staging forced by the caller")
    else:
        reasons.append(
            f"vec A {va} (run of {ca}), vec B {vb} (run of {cb}): "
            "8 fp16 = one 16-byte load when the run is a multiple of 8, else the widest divisor"
        )

    reads: list[DType] = []
    for name, v in (("A", va), ("B", vb)):
        direct = in_dtype == "float32" and v == 1
        reads.append("float32" if direct else elem)
        if in_dtype == "float32":
            reasons.append(
                f"read {name} as "
                + ("float32, cast in the scalar gather" if direct else f"{elem} after one cast pass (cheaper than a wide fp32 gather)")
            )

    cp_async = target.info.cp_async
    stages = 3 if cp_async else 2
    if cp_async and big_k:
        stages = 4
    reasons.append(
        f"{stages} stages: "
        + ("cp.async ring with zero-fill for the halo" if cp_async else "register-staged double buffer (no cp.async on this target)")
    )

    candidate = Plan(bm, bn, bk, wm, wn, stages, va, vb, reads[0], reads[1], 1)
    # Shrink until it fits: fewer stages first (least costly), then a shorter K-step.
    while smem_bytes(candidate, pass_, target.warp_size) > target.smem_limit:
        if candidate.stages > 2:
            candidate = _replace(candidate, stages=candidate.stages - 1)
        elif candidate.block_k > 32:
            candidate = _replace(candidate, block_k=32)
        else:  # pragma: no cover - 128x128x32x2 always fits the smallest target
            break
    if candidate.stages != stages or candidate.block_k != bk:
        reasons.append(
            f"shrunk to {candidate.stages} stages x K-step {candidate.block_k} to fit {target.smem_limit} bytes of shared memory"
        )
    split, why = split_k(candidate, problem, pass_, target, smem_bytes(candidate, pass_, target.warp_size, problem))
    candidate = _replace(candidate, split_k=split)
    reasons.append(why)
    reasons.append(
        f"strided dgrad: {problem.stride[0] * problem.stride[1]} residue classes of input pixels, each "
        "reducing over only the filter taps that reach it (no MMAs on zero-inserted positions)"
        if pass_ is Pass.DGRAD and problem.stride != (1, 1)
        else f"shared memory {smem_bytes(candidate, pass_, target.warp_size, problem)} bytes"
    )
    final = _replace(candidate, reasons=tuple(reasons))
    check_plan(final, problem, pass_, target, in_dtype, mma_dtype=elem)
    halo = None if scalar else halo_default(problem, pass_, target, in_dtype, final)
    if halo is not None:
        return halo
    return final


def _replace(p: Plan, **changes) -> Plan:
    import dataclasses

    return dataclasses.replace(p, **changes)


def check_plan(plan: Plan, geometry: ConvGeometry, pass_: Pass | str, target: Target, in_dtype: DType, *,
               mma_dtype: DType | None = None) -> None:
    """Reject a plan this kernel cannot run, naming what is wrong.  Used for hand plans too."""
    pass_ = Pass.parse(pass_)
    elem = mma_dtype_for(in_dtype, mma_dtype, target)
    if geometry.depthwise or isinstance(plan.loop, Depthwise):
        if not isinstance(plan.loop, Depthwise):
            raise ValueError(f"groups={geometry.groups}: a depthwise layer runs the Depthwise kind, not "
                             f"{type(plan.loop).__name__}")
        return depthwise.check(plan, geometry, pass_, target, in_dtype, elem)
    if geometry.groups > 1 and plan.loop.halo:
        raise ValueError(f"{type(plan.loop).__name__}: {halo_eligible(geometry, pass_, in_dtype)}; a grouped "
                         "layer runs the im2col loops (Im2col, Wgmma)")
    ca, cb = gathered_channels(geometry, pass_)
    for name, vec, run in (("vec_a", plan.vec_a, ca), ("vec_b", plan.vec_b, cb)):
        if run % vec:
            raise ValueError(
                f"plan.{name}={vec} does not divide the operand's contiguous run of {run} channels; use {vector_width(run)} or less"
            )
    for name, read in (("read_a", plan.read_a), ("read_b", plan.read_b)):
        if read == "float32" and in_dtype != "float32":
            raise ValueError(f"plan.{name}='float32' needs float32 inputs, but in_dtype is {in_dtype}")
        if read not in ("float32", elem):
            raise ValueError(f"plan.{name}={read!r}: a kernel with {elem} MMAs reads {elem} or float32")
    threads = plan.warps * target.warp_size
    if threads > 1024:
        raise ValueError(f"plan has {plan.warps} warps = {threads} threads; a block holds at most 1024")
    if plan.block_k % 16:
        raise ValueError(f"plan.block_k={plan.block_k} must be a multiple of 16")
    for name, tile in (("block_m", plan.block_m), ("block_n", plan.block_n), ("block_k", plan.block_k)):
        if tile > 256:
            raise ValueError(f"plan.{name}={tile} is larger than convgen's largest tile (256)")
    if plan.loop.halo:
        _check_halo(plan, geometry, pass_, target, in_dtype)
    if isinstance(plan.loop, Wgmma):
        _check_wgmma(plan, pass_, target)
    if isinstance(plan.loop, TmaWgmma):
        why = tma_eligible(geometry, pass_, target, in_dtype)
        if why is None and (plan.vec_a, plan.vec_b, plan.read_a, plan.read_b) != (8, 8, in_dtype, in_dtype):
            why = "copies fp16 operands as they are: vec_a = vec_b = 8, read_a = read_b = 'float16'"
        if why is None and pass_ is not Pass.FPROP and plan.block_n % 64:
            why = (f"stages {pass_.value}'s B as boxes of 64 channels (one 128-byte swizzle row, N-major): "
                   f"plan.block_n={plan.block_n} must be a multiple of 64")
        if why is None and pass_ is not Pass.WGRAD and plan.split_k != 1:
            why = f"reduces the whole of {pass_.value}'s K in one block: plan.split_k must be 1, got {plan.split_k}"
        if why is None and plan.loop.persistent and pass_ is Pass.WGRAD:
            why = "runs persistent (TmaWgmma(persistent=True)) in fprop and dgrad, not wgrad (its split-K slices)"
        if why is None:
            why = tma_group_tile(geometry, pass_, plan.block_m, plan.block_n)
        if why:
            raise ValueError(f"TmaWgmma: the TMA main loop {why}")
    tiles = tiles_per_block(plan)
    if tiles > 1 and reduction_steps(plan, pass_, geometry) != 1:
        raise ValueError(
            f"{type(plan.loop).__name__}.tiles={tiles}: several tiles per block need the halo path's one-step "
            f"reductions (stride 1, {'C' if pass_ is Pass.FPROP else 'K'} <= block_k = {plan.block_k}, channels in "
            "16-byte runs)"
        )
    smem = smem_bytes(plan, pass_, target.warp_size, geometry)
    if smem > target.smem_limit:
        raise ValueError(
            f"plan needs {smem} bytes of shared memory but {target.arch} allows {target.smem_limit}; "
            "use fewer stages or smaller tiles"
        )
    if plan.split_k > 65535:
        raise ValueError(f"plan.split_k={plan.split_k} exceeds the grid's z limit (65535)")


def _check_wgmma(plan: Plan, pass_: Pass, target: Target) -> None:
    why = (f"needs warpgroup MMAs, which {target.arch} does not have" if not target.info.wgmma
           else "computes fprop and dgrad only" if pass_ is Pass.WGRAD
           else "reads both operands as fp16 in 16-byte runs (vec_a = vec_b = 8, read fp16)"
           if (plan.vec_a, plan.vec_b) != (8, 8) or plan.read_a != plan.read_b or plan.read_a == "float32" else None)
    if why:
        raise ValueError(f"Wgmma: the wgmma main loop {why}")


# StagedHalo keeps its whole input halo in shared memory next to the pipeline.
MAX_STAGED_HALO_BYTES = 48 * 1024


def halo_eligible(geometry: ConvGeometry, pass_: Pass, in_dtype: DType = "float16") -> str | None:
    """Why no halo kind can run this pass (None when one can: StagedHalo where
    `stages_whole_halo`, else HaloTile, HaloLdsm and FlatHalo)."""
    if pass_ is Pass.WGRAD:
        return "the halo path computes fprop and dgrad only (wgrad reduces over pixels)"
    if geometry.groups > 1:
        return f"groups={geometry.groups}: the halo kinds stage every channel of a pixel, not one group's"
    if in_dtype not in MMA_DTYPES:
        return "the halo path reads fp16 inputs"
    if stages_whole_halo(geometry, pass_):
        return None  # StagedHalo: any stride
    if geometry.stride != (1, 1):
        return f"the halo path needs stride 1, got {geometry.stride}"
    ca, _ = gathered_channels(geometry, pass_)
    if ca % 8:
        return (f"the halo path stages 16-byte runs of the reduced channels: "
                f"{'C' if pass_ is Pass.FPROP else 'K'}={ca} is not a multiple of 8")
    return None


def _check_halo(plan: Plan, geometry: ConvGeometry, pass_: Pass, target: Target, in_dtype: DType) -> None:
    loop, name = plan.loop, repr(plan.loop)
    why = halo_eligible(geometry, pass_, in_dtype)
    staged_layer = stages_whole_halo(geometry, pass_)
    if why is None and staged_layer and isinstance(loop, (HaloTile, FlatHalo)):
        why = (f"reads each tap's fragments in place, which needs C in 16-byte runs (C={geometry.c}); "
               "StagedHalo stages this layer's whole halo for the im2col gather")
    if why is None and isinstance(loop, StagedHalo) and not staged_layer:
        why = ("stages the whole halo of fprop layers whose C is not a multiple of 8 only; this layer's taps "
               "are read in place: use HaloTile")
    if why:
        raise ValueError(f"{name}: {why}")
    if (plan.read_a, plan.read_b) != (in_dtype, in_dtype):
        raise ValueError(f"a halo plan ({name}) reads fp16 inputs as they are: read_a = read_b = 'float16'")
    if isinstance(loop, HaloLdsm) and (staged_layer or not (target.info.ldmatrix and target.info.mma_sync)):
        raise ValueError(f"{name}: tiles narrower than a 16-pixel fragment need ldmatrix and mma.sync.m16n8k16 "
                         f"({target.arch}: {'yes' if target.info.ldmatrix and target.info.mma_sync else 'no'}) and "
                         "the reduced channels read in place; use a HaloTile (a multiple of 16 pixels wide)")
    if isinstance(loop, StagedHalo):
        staged = staged_halo_halves(plan, geometry) * 2
        if staged > MAX_STAGED_HALO_BYTES:
            raise ValueError(f"{name}: the block's input halo takes {staged} bytes of shared "
                             f"memory (at most {MAX_STAGED_HALO_BYTES}); use a smaller tile")
        return
    vec_b = halo_vec_b(geometry, pass_)
    if (plan.vec_a, plan.vec_b) != (8, vec_b):
        raise ValueError(f"a halo plan ({name}) reads fp16 with vec_a = 8 and vec_b = {vec_b} for this shape")


def halo_vec_b(geometry: ConvGeometry, pass_: Pass) -> int:
    """The in-place halo kinds' weight access width: fprop's weight rows run over C (a multiple
    of 8 there); dgrad's over the C dx channels, which may be any count (C = 3 first layers)."""
    return 8 if pass_ is Pass.FPROP else vector_width(geometry.c)


def make_spec(
    problem: ConvProblem,
    pass_: Pass | str,
    *,
    target: Target | None = None,
    epilogue: Epilogue | None = None,
    in_dtype: DType = "float16",
    plan_: Plan | None = None,
    scalar: bool = False,
    mma_dtype: DType | None = None,
) -> KernelSpec:
    """The one way to build a :class:`KernelSpec`: plans it unless a plan is given, and checks a given plan."""
    pass_ = Pass.parse(pass_)
    target = target or Target()
    epilogue = epilogue or Epilogue()
    epilogue.check_pass(pass_)
    elem = mma_dtype_for(in_dtype, mma_dtype, target)
    if plan_ is None:
        plan_ = plan(problem, pass_, target, in_dtype, scalar=scalar, mma_dtype=elem)
    else:
        check_plan(plan_, problem, pass_, target, in_dtype, mma_dtype=elem)
    check_index_limits(problem, pass_, plan_)  # the kernels' 32-bit ints (convgen/limits.py)
    return KernelSpec(problem.geometry, pass_, epilogue, in_dtype, target, plan_, mma_dtype=elem)
