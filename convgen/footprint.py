"""A plan's footprint: the shared memory, halo frames and resident blocks it needs.

These are facts about a plan on a layer, not choices: the planner asks them while it
chooses (a tile that does not fit is not offered), the checker asks them of hand-made
plans, and the emitter writes the same numbers into the kernel, so each is computed in
one place and the three can never disagree.
"""

from __future__ import annotations

import math

from . import depthwise
from .ir import ConvGeometry, Pass, Target
from .spec import Plan
from .mainloop import FRAG, Depthwise, FlatHalo, HaloLdsm, HaloTile, Im2col, StagedHalo, TmaHalo, TmaWgmma, Wgmma

# The kinds that stage BK channels of a halo per step and read each tap's fragments in
# place (the emitter's "taps" path); they alone can compute several tiles per block.
IN_PLACE_HALO = (HaloTile, HaloLdsm, FlatHalo)

SMEM_PAD = 8  # halves added to each staged row: 16 bytes, so ldmatrix rows fall in distinct banks
# The halo path stores each pixel's 16 channels of a slab in 24 halves (48 bytes): the 8 rows
# of an ldmatrix phase then start at distinct 16-byte bank groups whatever pixel a tap's
# fragment starts at (at 32 bytes, rows i and i + 4 shared banks: 2-way conflicts).
HALO_LD = FRAG + SMEM_PAD
EPI_PAD = 8  # floats added to each scratch row: rows 0-3 of a fragment store land in distinct banks
# A TmaWgmma(tma_store=True) warp's shared memory for the copy engine's stores: two strips of
# 16 rows x 64 fp16 (or bf16) outputs, one filled while the engine reads the other, or one of fp32.
TMA_STORE_WARP_BYTES = 4096
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


# TmaHalo's shared memory: alignment slack and barriers (1024 bytes each), every tap's 64 x 64
# weights, the ring of halo boxes, each followed by 1024 bytes that a tile's last positions
# (never stored) read past the box, which also keeps the next box on a swizzle atom, and the
# consumers' drain strips past the ring (the producer refills it while they drain).
TMA_HALO_BARRIER_BYTES = 1024  # 2 * STAGES + 1 mbarriers, in a whole swizzle atom so the weights start on one
TMA_HALO_WEIGHT_BYTES = 9 * 64 * 64 * 2
TMA_HALO_TAIL_BYTES = 1024


def tma_halo_box_bytes(pitch: int) -> int:
    """One TmaHalo halo box: 64 channels x pitch columns x (128 / pitch + 2) rows, 16-bit."""
    return (128 // pitch + 2) * pitch * 64 * 2


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
    strips = plan.warps_m * FRAG * (FRAG * drain_group(plan, warp_size) + EPI_PAD) * 4  # the drain's, per warp
    if isinstance(plan.loop, TmaHalo):
        ring = plan.stages * (tma_halo_box_bytes(plan.loop.pitch) + TMA_HALO_TAIL_BYTES)
        return TMA_ALIGN_SLACK + TMA_HALO_BARRIER_BYTES + TMA_HALO_WEIGHT_BYTES + ring + strips
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
        if plan.loop.tma_store:  # and each warp's strips in the output's dtype, for the copy engine to store
            strips += plan.warps_m * TMA_STORE_WARP_BYTES
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
    if isinstance(plan.loop, TmaHalo):
        return 1  # 384 threads, and over half the SM's shared memory at any pitch
    per_block = smem_bytes(plan, pass_, target.warp_size, geometry) + 1024
    by_regs = 1 if plan.warps_m > 4 else 2
    return max(1, min(by_regs, (target.info.smem_limit + 1024) // per_block))


def tiles_per_block(plan: Plan) -> int:
    """Pixel tiles one block computes in turn: a halo kind's ``tiles``, else 1."""
    return plan.loop.tiles if isinstance(plan.loop, IN_PLACE_HALO) else 1
