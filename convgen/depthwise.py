"""Planning for the depthwise kind (:class:`~convgen.mainloop.Depthwise`): its tile, threads,
shared memory and the facts its templates read.

A depthwise layer (groups = C, K = m*C) reduces over R*S taps only, a few FLOPs per byte, so
it is bound by memory, not by MMAs: what matters is reading each input once from DRAM and
each staged value as few times as possible from shared memory.  fprop and dgrad therefore
stage a pixel tile's halo once per block and let a thread compute a run of ``cols``
neighbouring outputs of one row, so every staged column it loads serves each output the
filter row reaches from it; wgrad sums over the batch's pixels, split into slices whose
partial sums the split-K reduction adds in a fixed order (bit-reproducible).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .ir import ConvGeometry, ConvProblem, DType, Pass, Plan, Target
from .mainloop import Depthwise

PIX_PAD = 8  # halves of padding per staged pixel: a thread's next run starts in other banks
MAX_WGRAD_ACCS = 56  # fp32 sums a wgrad thread keeps (vec x m x its taps): 3-4 blocks of 256 an SM
THREADS = 256


def eligible(geometry: ConvGeometry, pass_: Pass, in_dtype: DType) -> str | None:
    """Why the depthwise kind cannot run this layer (None when it can)."""
    if not geometry.depthwise:
        return (f"groups={geometry.groups} with {geometry.cg} input channels per group: only depthwise layers "
                "(groups = C) have a kernel; grouped convolutions with several channels per group are not built yet")
    return None


def _floor_div(a: int, b: int) -> int:
    return a // b  # Python's floor division, spelled out where a C reader would expect truncation


@dataclass(frozen=True)
class DwFacts:
    """What the depthwise templates read: the tile, the thread layout and the staged halo."""

    tile_h: int
    tile_w: int
    cols: int  # outputs (fprop, dgrad) or pixels (wgrad) per thread
    vec: int  # channels a thread owns (of the input's C)
    mult: int  # K / C: filters per channel
    chunk: int  # input channels per block (block_n)
    ch_lanes: int  # threads side by side along the chunk's channels
    threads: int
    row_groups: int  # wgrad: threads groups, one per `rows` filter rows (1: a thread sums every row)
    halo_h: int  # staged rows: fprop input rows, dgrad dy rows (0 for wgrad)
    halo_w: int
    row0: int  # dgrad: the first staged dy row relative to h0 / SH (floor((PH - (R-1)*DH) / SH))
    col0: int
    pix_ld: int  # halves per staged pixel (its channels and PIX_PAD)
    in_cols: int  # staged columns one thread's run reads per filter row
    tiles_h: int  # tiles over the output (fprop: P x Q; dgrad: H x W)
    tiles_w: int
    tiles_pb: int  # tiles a block computes in turn (Depthwise.tiles); two halo buffers when > 1
    halo_halves: int  # the staged halo, rounded up to 16 bytes
    weight_floats: int  # the chunk's weights (fprop, dgrad) or wgrad's cross-warp sums


def facts(plan: Plan, g: ConvGeometry, pass_: Pass, warp_size: int = 32) -> DwFacts:
    loop = plan.loop
    assert isinstance(loop, Depthwise)
    (sh, sw), (ph, pw), (dh, dw) = g.stride, g.padding, g.dilation
    mult, vec, chunk = g.kg, plan.vec_a, plan.block_n
    tile_w, tile_h = loop.tile_w, plan.block_m // loop.tile_w
    ch_lanes = chunk // vec
    groups = row_groups(loop, g)
    threads = plan.block_m // loop.cols * ch_lanes * groups
    row0 = col0 = 0
    if pass_ is Pass.FPROP:
        halo_h, halo_w = (tile_h - 1) * sh + (g.r - 1) * dh + 1, (tile_w - 1) * sw + (g.s - 1) * dw + 1
        pix_ld = chunk + PIX_PAD
        in_cols = (loop.cols - 1) * sw + (g.s - 1) * dw + 1
        tiles = (math.ceil(g.p / tile_h), math.ceil(g.q / tile_w))
        weights = g.r * g.s * chunk * mult
    elif pass_ is Pass.DGRAD:
        row0, col0 = _floor_div(ph - (g.r - 1) * dh, sh), _floor_div(pw - (g.s - 1) * dw, sw)
        halo_h = _floor_div(tile_h - 1 + ph, sh) - row0 + 1
        halo_w = _floor_div(tile_w - 1 + pw, sw) - col0 + 1
        pix_ld = chunk * mult + PIX_PAD
        in_cols = _floor_div(loop.cols - 1 + pw, sw) - col0 + 1
        tiles = (math.ceil(g.h / tile_h), math.ceil(g.w / tile_w))
        weights = g.r * g.s * chunk * mult
    else:
        halo_h = halo_w = pix_ld = in_cols = 0
        tiles = (1, 1)
        # each warp's dw and db sums, added in warp order after the loop (bit-reproducible)
        weights = max(1, threads // groups // warp_size) * (g.r * g.s + 1) * chunk * mult
    halo = -(-halo_h * halo_w * pix_ld // 8) * 8
    return DwFacts(tile_h, tile_w, loop.cols, vec, mult, chunk, ch_lanes, threads, groups, halo_h, halo_w, row0, col0,
                   pix_ld, in_cols, tiles[0], tiles[1], loop.tiles, halo, weights)


def row_groups(loop: Depthwise, g: ConvGeometry) -> int:
    return g.r // loop.rows if loop.rows else 1


def smem_bytes(plan: Plan, g: ConvGeometry, pass_: Pass, warp_size: int = 32) -> int:
    f = facts(plan, g, pass_, warp_size)
    return f.halo_halves * 2 * (2 if f.tiles_pb > 1 else 1) + f.weight_floats * 4


def check(plan: Plan, g: ConvGeometry, pass_: Pass, target: Target, in_dtype: DType, elem: DType) -> None:
    """Reject a Depthwise plan this layer cannot run, naming what is wrong."""
    why = eligible(g, pass_, in_dtype)
    if why:
        raise ValueError(f"Depthwise: {why}")
    loop = plan.loop
    assert isinstance(loop, Depthwise)
    if g.c % plan.vec_a:
        raise ValueError(f"plan.vec_a={plan.vec_a} does not divide C={g.c}: a thread reads vec_a channels at once")
    want_b = plan.vec_a if pass_ is Pass.WGRAD else 1
    if plan.vec_b != want_b:
        raise ValueError(f"Depthwise {pass_.value} reads its second operand {want_b} element(s) at a time: "
                         f"plan.vec_b must be {want_b}, got {plan.vec_b}")
    for name, read in (("read_a", plan.read_a), ("read_b", plan.read_b)):
        if read != elem:
            raise ValueError(f"Depthwise reads {elem} operands (float32 inputs are cast once): plan.{name} must be "
                             f"{elem!r}, got {read!r}")
    if pass_ is not Pass.WGRAD and plan.split_k != 1:
        raise ValueError(f"Depthwise {pass_.value} has no reduction to split: plan.split_k must be 1")
    if pass_ is Pass.WGRAD and loop.tiles != 1:
        raise ValueError(f"Depthwise wgrad walks its pixel slice itself: Depthwise.tiles must be 1, got {loop.tiles}")
    if pass_ is Pass.WGRAD and loop.tile_w != plan.block_m:
        raise ValueError(f"Depthwise wgrad walks flat runs of block_m pixels: Depthwise.tile_w must be "
                         f"plan.block_m={plan.block_m}, got {loop.tile_w}")
    if pass_ is Pass.DGRAD:
        sh, sw = g.stride
        tile_h = plan.block_m // loop.tile_w
        if tile_h % sh or loop.tile_w % sw or loop.cols % sw:
            raise ValueError(f"Depthwise dgrad needs its tile ({tile_h}x{loop.tile_w}) and run (cols={loop.cols}) "
                             f"to be whole multiples of the stride {g.stride}: each thread's taps are then fixed "
                             "at compile time")
    if loop.rows and (pass_ is not Pass.WGRAD or g.r % loop.rows):
        raise ValueError(f"Depthwise.rows={loop.rows} splits wgrad's filter rows between threads: it needs wgrad "
                         f"and a divisor of R={g.r}")
    groups = row_groups(loop, g)
    threads = plan.block_m // loop.cols * (plan.block_n // plan.vec_a) * groups
    if threads != target.warp_size * plan.warps_m:
        raise ValueError(f"Depthwise runs a thread per {loop.cols} pixel(s), {plan.vec_a} channel(s) and "
                         f"{loop.rows or g.r} filter row(s): {plan.block_m} // {loop.cols} x {plan.block_n} // "
                         f"{plan.vec_a} x {groups} = {threads} threads, but plan.warps_m={plan.warps_m} gives "
                         f"{target.warp_size * plan.warps_m} on {target.arch}")
    if pass_ is Pass.WGRAD and (plan.block_m // loop.cols * (plan.block_n // plan.vec_a)) % target.warp_size:
        raise ValueError("Depthwise wgrad's warps each sum one group of filter rows: block_m // cols x "
                         f"block_n // vec_a must be a multiple of {target.warp_size}")
    if threads > 1024:
        raise ValueError(f"plan has {threads} threads; a block holds at most 1024")
    if plan.block_n // plan.vec_a > target.warp_size:
        raise ValueError(f"plan.block_n // plan.vec_a = {plan.block_n // plan.vec_a} channel lanes is more than a "
                         f"warp ({target.warp_size}): wgrad sums a channel's pixels within a warp first")
    sums = plan.vec_a * g.kg * (loop.rows or g.r) * g.s
    if pass_ is Pass.WGRAD and sums > 2 * MAX_WGRAD_ACCS:
        raise ValueError(f"Depthwise wgrad keeps vec_a x m x rows x S = {sums} fp32 sums a thread; at most "
                         f"{2 * MAX_WGRAD_ACCS} fit in registers: use a smaller vec_a or fewer rows")
    smem = smem_bytes(plan, g, pass_, target.warp_size)
    if smem > target.smem_limit:
        raise ValueError(f"Depthwise plan needs {smem} bytes of shared memory but {target.arch} allows "
                         f"{target.smem_limit}; use a smaller tile or channel chunk")


def _vec(c: int, per_channel: int, cap: int) -> int:
    """The widest channel vector (8, 4, 2 or 1) dividing C whose outputs (x m) fit ``cap``."""
    for v in (8, 4, 2, 1):
        if c % v == 0 and v * per_channel <= cap:
            return v
    return 1


def _chunk(c: int, vec: int, lanes_cap: int) -> int:
    """Channels per block: at most 64 (a 128-byte row of fp16 for the staging loads), at
    least one 16-wide step, no wider than C needs, and at most ``lanes_cap`` lanes of vec."""
    chunk = 16
    while chunk < min(64, c) and chunk * 2 // vec <= lanes_cap:
        chunk *= 2
    return max(chunk, vec)


def plan_depthwise(problem: ConvProblem, pass_: Pass, target: Target, elem: DType,
                   reasons: list[str]) -> Plan:
    """The default depthwise plan, with its reasons appended to ``reasons``."""
    g = problem
    m, taps = g.kg, g.r * g.s
    reasons.append(f"depthwise (groups = C = {g.c}, {m} filter(s) per channel): {taps} taps per output and no "
                   "channel reduction, so a CUDA-core stencil over a staged halo, not an MMA loop")
    if pass_ is Pass.WGRAD:
        # the widest vector, then the most filter rows a thread, whose sums fit MAX_WGRAD_ACCS
        vec, rows = next(((v, rw) for v in (8, 4, 2, 1) if g.c % v == 0
                          for rw in range(g.r, 0, -1) if g.r % rw == 0 and v * m * rw * g.s <= MAX_WGRAD_ACCS),
                         (1, 1))
        groups = g.r // rows
        chunk = _chunk(g.c, vec, 32)
        lanes = chunk // vec
        pix_lanes = max(target.warp_size // lanes, 1 << max(0, (THREADS // (groups * lanes)).bit_length() - 1))
        cols = max(1, -(-16 // pix_lanes))  # a block_m of at least one 16-pixel step
        block_m = pix_lanes * cols
        threads = pix_lanes * lanes * groups
        npq = g.n * g.p * g.q
        blocks = math.ceil(g.c / chunk)
        # enough slices for 8 blocks an SM, each at least 8 passes of its block_m pixels
        split = max(1, min(math.ceil(8 * target.sm_count / blocks), npq // (8 * block_m), 4096))
        reasons.append(f"vec {vec}, {rows} filter row(s) a thread: {vec} x {m} x {rows * g.s} = "
                       f"{vec * m * rows * g.s} fp32 sums a thread (at most {MAX_WGRAD_ACCS}: several blocks an SM)")
        reasons.append(f"{chunk} channels a block, {block_m} pixels a pass, split over {split} slice(s) of the "
                       f"{npq} pixels: {blocks * split} blocks, about 8 an SM; the slices' sums added in a fixed order")
        plan = Plan(block_m, chunk, 16, threads // target.warp_size, 1, 2, vec, vec, elem, elem, split,
                    Depthwise(block_m, cols, rows if groups > 1 else 0))
        return plan
    sh, sw = g.stride
    vec = _vec(g.c, m, 8)
    chunk = _chunk(g.c, vec, 8)
    lanes = chunk // vec
    dgrad = pass_ is Pass.DGRAD
    cols = 4 if not dgrad or 4 % sw == 0 else sw * math.ceil(4 / sw)
    out_h, out_w = (g.h, g.w) if dgrad else (g.p, g.q)
    unit_w = math.lcm(cols, sw) if dgrad else cols
    widest = 16 if dgrad or sw == 1 else 8  # a strided fprop's halo is sw times as wide as its tile
    tile_w = unit_w * max(1, math.ceil(min(out_w, widest) / unit_w))
    unit_h = sh if dgrad else 1
    tile_h = unit_h * max(1, math.ceil(min(out_h, 8) / unit_h))
    while (tile_h * tile_w) % 16 or (tile_h * tile_w // cols * lanes) % target.warp_size:
        tile_h += unit_h
    threads = tile_h * tile_w // cols * lanes
    blocks = g.n * math.ceil(out_h / tile_h) * math.ceil(out_w / tile_w) * math.ceil(g.c / chunk)
    tiles = max(1, min(4, blocks // (8 * target.sm_count)))  # keep 8 blocks an SM's worth of work
    reasons.append(f"vec {vec}: {vec * m} output channels a thread in one store; {chunk} channels a block "
                   f"({lanes} lanes)")
    if tiles > 1:
        reasons.append(f"{tiles} tiles a block in turn, the next halo copied while one is computed "
                       f"({blocks} tiles, {blocks // tiles} blocks)")
    reasons.append(f"tile {tile_h}x{tile_w} pixels, {cols} a thread along a row ({threads} threads): a staged "
                   "column serves every output of the run its filter row reaches")
    plan = Plan(tile_h * tile_w, chunk, 16, threads // target.warp_size, 1, 2, vec, 1, elem, elem, 1,
                Depthwise(tile_w, cols, 0, tiles))
    if smem_bytes(plan, g, pass_, target.warp_size) > target.smem_limit:  # two halos do not fit: one
        plan = dataclasses.replace(plan, loop=Depthwise(tile_w, cols))
    return plan
