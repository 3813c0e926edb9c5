"""Planning for the depthwise kind (:class:`~convgen.mainloop.Depthwise`): its tile, threads,
shared memory and the facts its templates read.

A depthwise layer (groups = C, K = m*C) reduces over R*S taps only, a few FLOPs per byte, so
it is bound by memory, not by MMAs: what matters is reading each input once from DRAM and
each staged value as few times as possible from shared memory.  fprop and dgrad therefore
stage a pixel tile's halo once per block and let a thread compute a run of ``cols``
neighbouring outputs of one row, so every staged column it loads serves each output the
filter row reaches from it; wgrad sums over the batch's pixels, split into slices whose
partial sums the split-K reduction adds in a fixed order (bit-reproducible).  wgrad stages
the same way: a block walks its slice's pixel tiles, staging each tile's dy and x halo while
the previous one is summed, and a thread's run of ``cols`` outputs of one row meets every
staged x column its filter rows reach once, for all its taps.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from dataclasses import dataclass

from .ir import ConvGeometry, ConvProblem, DType, Pass, Target
from .spec import Plan
from .mainloop import Depthwise
from .depthwise_forms import MMA_WEIGHT_PAIRS, check_held, check_mma, held_filters, held_halo_vec, mma_stride

PIX_PAD = 8  # halves of padding per staged pixel: a thread's next run starts in other banks
MAX_WGRAD_ACCS = 56  # fp32 sums a wgrad thread keeps (vec x m x its taps): 3-4 blocks of 256 an SM
MAX_WGRAD_HELD = 64  # fp32 sums plus the run's dy values a wgrad thread holds (cols x vec x m): <= ~96 registers
MAX_WGRAD_COLS = 16  # a wgrad run's length: the unrolled body grows as cols x in_cols x rows
WGRAD_PADS = (0, 8, 16, 24, 32, 40, 48, 56)  # halves of padding a wgrad staged pixel may take (16-byte steps)
# Registers a wgrad thread needs beyond its sums and its run's dy values (indices, addresses, the x
# column in flight). At 8-176 held values, 62-160 registers were used unconstrained on sm_90; a
# block whose threads cannot each have that many (65536 / threads) spilled: 7x7 filters of 2-16
# filters a channel on 896-thread blocks (72 registers), 5x5 on 960 (64): scripts/compile_fuzz.py.
WGRAD_REG_OVERHEAD = 32
# fprop's and dgrad's default block, fitted to `convgen tune` on both depthwise suites' fprop
# and dgrad (H200, e4aaee5; benchmarks/results/tuning/*-tune-*-dw-*.json): 8x8-pixel tiles, and
# 1, 2 or 4 of them a block in turn so that about 2 blocks an SM remain.  Its plans, measured in
# those runs, take 1.03-1.07x the best candidate's time (geometric mean per suite and pass),
# where 8x16 tiles with blocks for 8 an SM took 1.08-1.21x, and 1.15-1.40x on 7-28 pixel
# images, where that rule left one tile a block.
STENCIL_TILE = 8
STENCIL_BLOCKS_PER_SM = 2
# Halo buffers of a block that computes 3 or more tiles in turn.  3 would copy the next two tiles'
# halos while one is computed, so that a tile's copies have two tiles' compute to land in, not
# one, where the third halo costs no resident block.  It stays 2 until a GPU has timed it:
# benchmarks/probes/halo_ring_probe.py sets it (benchmarks/NOTES.md, twenty-ninth session), and
# tuning already times rings of 3.
STENCIL_RING = 2
MIN_RESIDENT = 512  # threads an SM a wgrad plan keeps where it can: 16 warps in flight hide the staging
STAGE_COST = 16  # thread instructions one staged access costs (its index, bounds test and copy): wgrad's model
TILE_COST = 24  # and one tile costs each thread (the waits, the barriers, the tile's decode)
THREADS = 256
WGRAD_CHUNKS = (16, 32, 64)  # wgrad's channel chunks: whole 16-channel steps, powers of two


def eligible(geometry: ConvGeometry, pass_: Pass, in_dtype: DType) -> str | None:
    """Why the depthwise kind cannot run this layer (None when it can)."""
    if not geometry.depthwise:
        return (f"groups={geometry.groups} with {geometry.cg} input channels per group: the Depthwise kind runs "
                "one channel per group; a grouped layer with several runs the im2col loops (Im2col, Wgmma)")
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
    threads: int  # the block's (fprop, dgrad: its runs' lanes and up to a warp less one past them)
    row_groups: int  # wgrad: threads groups, one per `rows` filter rows (1: a thread sums every row)
    halo_h: int  # staged rows: fprop input rows, dgrad dy rows (0 for wgrad)
    halo_w: int
    row0: int  # dgrad: the first staged dy row relative to h0 / SH (floor((PH - (R-1)*DH) / SH))
    col0: int
    pix_ld: int  # halves per staged pixel (its channels and PIX_PAD)
    in_cols: int  # staged columns one thread's run reads per filter row
    tiles_h: int  # tiles over the output (fprop: P x Q; dgrad: H x W)
    tiles_w: int
    tiles_pb: int  # tiles a block computes in turn (Depthwise.tiles)
    halo_bufs: int  # fprop, dgrad: the ring of halos (1 with one tile a block, else plan.stages)
    halo_halves: int  # the staged halo, rounded up to 16 bytes
    weight_floats: int  # the chunk's weights (fprop, dgrad) or wgrad's cross-warp sums
    dy_ld: int = 0  # wgrad: halves per staged dy pixel (the chunk's KROW filters and a pad)
    dy_halves: int = 0  # wgrad: the staged dy tile, rounded up to 16 bytes
    stage_vec: int = 0  # wgrad: halves per staging copy (as wide as C and the chunk allow, up to 16 bytes)
    interleave: bool = False  # fprop, dgrad: blocks ordered chunk first (Depthwise.interleave)
    out_rows: int = 1  # fprop: output rows a thread computes, its filter held in registers; wgrad: dy rows a run sums
    halo_vec: int = 0  # fprop, dgrad: halves per halo staging copy (the thread's vec, or 8 for a held filter)
    mma: bool = False  # fprop: the stencil on mma.sync (Depthwise.mma): pix_ld is then a channel plane's row
    plane: int = 0  # mma: halves a channel's plane (halo_halves: the chunk's planes; weight_floats: its B words)
    stage_ld: int = 0  # mma: halves a pixel of the halo staged as it lies in x (its chunk's channels), before
    stage_halves: int = 0  # the planes take it transposed; and that staged halo's halves


def facts(plan: Plan, g: ConvGeometry, pass_: Pass, warp_size: int = 32) -> DwFacts:
    loop = plan.loop
    assert isinstance(loop, Depthwise)
    (sh, sw), (ph, pw), (dh, dw) = g.stride, g.padding, g.dilation
    mult, vec, chunk = g.kg, plan.vec_a, plan.block_n
    tile_w, tile_h = loop.tile_w, plan.block_m // loop.tile_w
    ch_lanes = chunk // vec
    groups = row_groups(loop, g)
    halo_vec = held_halo_vec(g.c, chunk, vec) if loop.out_rows > 1 else vec
    threads = plan.warps_m * warp_size  # the block (a few past its runs' lanes, where they are not whole warps)
    row0 = col0 = 0
    if loop.mma:  # the halo staged as pixels, then a plane per channel (tile columns and the last A window's 8 more)
        tiles = (math.ceil(g.p / tile_h), math.ceil(g.q / tile_w))
        halo_h, halo_w = tile_h + g.r - 1, tile_w + 8
        ld, stage_ld = mma_stride(halo_w), mma_stride(chunk)
        plane = mma_stride(halo_h * ld)
        return DwFacts(tile_h, tile_w, loop.cols, vec, mult, chunk, ch_lanes, threads, groups, halo_h, halo_w, 0, 0,
                       ld, halo_w, tiles[0], tiles[1], loop.tiles, 1, chunk * plane, g.r * chunk * MMA_WEIGHT_PAIRS,
                       interleave=loop.interleave, halo_vec=8, mma=True, plane=plane, stage_ld=stage_ld,
                       stage_halves=halo_h * halo_w * stage_ld)
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
        return _wgrad_facts(plan, g, warp_size)
    halo = -(-halo_h * halo_w * pix_ld // 8) * 8
    return DwFacts(tile_h, tile_w, loop.cols, vec, mult, chunk, ch_lanes, threads, groups, halo_h, halo_w, row0, col0,
                   pix_ld, in_cols, tiles[0], tiles[1], loop.tiles, 1 if loop.tiles == 1 else plan.stages, halo, weights,
                   interleave=loop.interleave, out_rows=loop.out_rows, halo_vec=halo_vec)


def _round16(halves: int) -> int:
    return -(-halves // 8) * 8


def _wgrad_facts(plan: Plan, g: ConvGeometry, warp_size: int) -> DwFacts:
    """wgrad's tile of dy pixels and the x halo its taps reach, both staged (two buffers each);
    the pads make a warp's loads of its runs' first columns conflict-free where one allows it."""
    loop = plan.loop
    assert isinstance(loop, Depthwise)
    if loop.interleave:
        raise ValueError("Depthwise.interleave orders fprop's and dgrad's blocks; wgrad's grid already puts the "
                         "channel chunk first (blockIdx.x)")
    (sh, sw), (dh, dw) = g.stride, g.dilation
    mult, vec, chunk, cols = g.kg, plan.vec_a, plan.block_n, loop.cols
    tile_w, tile_h = loop.tile_w, plan.block_m // loop.tile_w
    lanes, groups, per_row, out_rows = chunk // vec, row_groups(loop, g), tile_w // cols, loop.out_rows
    threads = plan.block_m // (cols * out_rows) * lanes * groups
    halo_h, halo_w = (tile_h - 1) * sh + (g.r - 1) * dh + 1, (tile_w - 1) * sw + (g.s - 1) * dw + 1
    runs = range(min(tile_h // out_rows * per_row, max(1, warp_size // lanes)))  # the runs of a group's first warp
    x_pix = tuple(run // per_row * out_rows * sh * halo_w + run % per_row * cols * sw for run in runs)
    dy_pix = tuple(run // per_row * out_rows * tile_w + run % per_row * cols for run in runs)
    pix_ld = _conflict_free_ld(chunk, vec, lanes, x_pix, warp_size)
    dy_ld = _conflict_free_ld(chunk * mult, vec, lanes, dy_pix, warp_size, mult)
    stage_vec = next(v for v in (8, 4, 2, 1) if g.c % v == 0 and chunk % v == 0)
    # each warp's dw and db sums, added in warp order after the loop (bit-reproducible)
    sums = max(1, threads // groups // warp_size) * (g.r * g.s + 1) * chunk * mult
    return DwFacts(tile_h, tile_w, cols, vec, mult, chunk, lanes, threads, groups, halo_h, halo_w, 0, 0, pix_ld,
                   (cols - 1) * sw + (g.s - 1) * dw + 1, math.ceil(g.p / tile_h), math.ceil(g.q / tile_w), loop.tiles,
                   2, _round16(halo_h * halo_w * pix_ld), sums, dy_ld, _round16(tile_h * tile_w * dy_ld), stage_vec,
                   out_rows=out_rows)


def _bank_ways(ld: int, vec: int, lanes: int, pix: tuple[int, ...], warp_size: int, pieces: int = 1) -> int:
    """How many distinct 4-byte words the busiest bank serves in one wavefront when lane t of
    a warp loads ``vec`` halves at pix[t // lanes] * ld + (t % lanes) * vec * pieces (1: no
    conflict).  A wavefront moves 128 bytes: 8 lanes of 16-byte loads, 16 of 8, 32 of less."""
    size = 2 * vec
    per = 32 if size <= 4 else 128 // size
    worst = 1
    for first in range(0, min(warp_size, len(pix) * lanes), per):
        words = set()
        for t in range(first, min(first + per, len(pix) * lanes)):
            start = (pix[t // lanes] * ld + t % lanes * vec * pieces) * 2
            words.update(range(start // 4, (start + size - 1) // 4 + 1))
        worst = max(worst, max(collections.Counter(w % 32 for w in words).values()))
    return worst


@functools.lru_cache(maxsize=4096)
def _conflict_free_ld(base: int, vec: int, lanes: int, pix: tuple[int, ...], warp_size: int, pieces: int = 1) -> int:
    """The shortest staged pixel (``base`` halves and one of WGRAD_PADS) with the fewest bank conflicts.
    Cached: the wgrad planner weighs each of dozens of tiles under several blocks, and counting a
    warp's banks for every pad was nearly all of a depthwise wgrad's planning time (0.18 s a layer)."""
    return min((base + pad for pad in WGRAD_PADS), key=lambda ld: (_bank_ways(ld, vec, lanes, pix, warp_size, pieces), ld))


def row_groups(loop: Depthwise, g: ConvGeometry) -> int:
    return g.r // loop.rows if loop.rows else 1


def smem_bytes(plan: Plan, g: ConvGeometry, pass_: Pass, warp_size: int = 32) -> int:
    f = facts(plan, g, pass_, warp_size)
    if f.mma:  # the halo as pixels, the planes and the filter rows' B words
        return (f.stage_halves + f.halo_halves) * 2 + f.weight_floats * 4
    if pass_ is Pass.WGRAD:  # two x halos and two dy tiles; the sums reuse them once the last tile is done
        return max((f.halo_halves + f.dy_halves) * 2 * 2, f.weight_floats * 4)
    return f.halo_halves * 2 * f.halo_bufs + f.weight_floats * 4


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
    if pass_ is Pass.WGRAD and plan.stages != 2:
        raise ValueError(f"Depthwise wgrad stages two buffers of each operand: plan.stages must be 2, got {plan.stages}")
    if pass_ is Pass.WGRAD and loop.tiles != 1:
        raise ValueError(f"Depthwise wgrad's block walks every tile of its slice (plan.split_k slices of the batch's "
                         f"tiles), two buffers deep: Depthwise.tiles must be 1, got {loop.tiles}")
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
    if loop.mma:
        check_mma(plan, g, pass_, target)
        _check_smem(plan, g, pass_, target)
        return
    groups = row_groups(loop, g)
    threads = plan.block_m // (loop.cols * loop.out_rows) * (plan.block_n // plan.vec_a) * groups
    if loop.out_rows > 1 and pass_ is not Pass.WGRAD:  # (wgrad's runs of several rows: the held-values bound below)
        check_held(plan, g, pass_, threads)
    warps = -(-threads // target.warp_size)  # fprop, dgrad: the last warp's lanes past the runs repeat the last run
    if pass_ is Pass.WGRAD and threads != target.warp_size * plan.warps_m:
        raise ValueError(f"Depthwise runs a thread per {loop.cols * loop.out_rows} pixel(s), {plan.vec_a} channel(s) "
                         f"and {loop.rows or g.r} filter row(s): {plan.block_m} // {loop.cols * loop.out_rows} x "
                         f"{plan.block_n} // {plan.vec_a} x {groups} = {threads} threads, but "
                         f"plan.warps_m={plan.warps_m} gives {target.warp_size * plan.warps_m} on {target.arch}")
    if pass_ is not Pass.WGRAD and plan.warps_m != warps:
        raise ValueError(f"Depthwise runs a thread per {loop.cols * loop.out_rows} pixel(s) and {plan.vec_a} channel(s): "
                         f"{plan.block_m} // {loop.cols * loop.out_rows} x {plan.block_n} // {plan.vec_a} = {threads} threads, "
                         f"{warps} warp(s) of {target.warp_size} on {target.arch}, but plan.warps_m={plan.warps_m}")
    threads = plan.warps_m * target.warp_size
    if pass_ is Pass.WGRAD and (plan.block_m // (loop.cols * loop.out_rows) * (plan.block_n // plan.vec_a)) % target.warp_size:
        raise ValueError("Depthwise wgrad's warps each sum one group of filter rows: block_m // (cols x out_rows) x "
                         f"block_n // vec_a must be a multiple of {target.warp_size}")
    if threads > 1024:
        raise ValueError(f"plan has {threads} threads; a block holds at most 1024")
    if pass_ is Pass.WGRAD and plan.block_n // plan.vec_a > target.warp_size:
        raise ValueError(f"plan.block_n // plan.vec_a = {plan.block_n // plan.vec_a} channel lanes is more than a "
                         f"warp ({target.warp_size}): wgrad sums a channel's pixels within a warp first")
    sums = plan.vec_a * g.kg * (loop.rows or g.r) * g.s
    if pass_ is Pass.WGRAD and sums > 2 * MAX_WGRAD_ACCS:
        raise ValueError(f"Depthwise wgrad keeps vec_a x m x rows x S = {sums} fp32 sums a thread; at most "
                         f"{2 * MAX_WGRAD_ACCS} fit in registers: use a smaller vec_a or fewer rows")
    held = loop.out_rows * loop.cols * plan.vec_a * g.kg
    if pass_ is Pass.WGRAD and (held > 64 or loop.cols > 2 * MAX_WGRAD_COLS):
        raise ValueError(f"Depthwise wgrad holds its run's dy values, Depthwise.out_rows x cols x vec_a x m = {held} "
                         f"floats, and unrolls cols={loop.cols} outputs: at most 64 values and {2 * MAX_WGRAD_COLS} "
                         "cols")
    _check_smem(plan, g, pass_, target)


def _check_smem(plan: Plan, g: ConvGeometry, pass_: Pass, target: Target) -> None:
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
        from .depthwise_wgrad import plan_wgrad  # (it builds on this module's facts and limits)

        return plan_wgrad(g, target, elem, reasons)
    stencil = stencil_plan(g, pass_, target, elem, reasons)
    held = held_default(g, pass_, stencil, target)
    if held is None:
        return stencil
    reasons.append(f"then 4 x 4 outputs over {held.vec_a} channels a thread with its {g.r}x{g.s} filter held in "
                   "registers (depthwise_forms.held_filters), the same chunk and tiles a block: each staged value "
                   "read once for all the outputs and taps it feeds (HELD_DEFAULT_MIN_PX: 0.84-0.85x the "
                   "CUDA-core stencil's time on ConvNeXt's three 7x7 rows of 14-56 pixels, timed on an H100)")
    return held


def stencil_plan(g: ConvProblem, pass_: Pass, target: Target, elem: DType, reasons: list[str]) -> Plan:
    """fprop's and dgrad's CUDA-core stencil of one output row a thread, as the default takes it
    where no held filter does (and what tuning varies around), its reasons appended."""
    plan = _plan_stencil(g, pass_, target, elem, reasons)
    longer = long_run(g, pass_, plan) if g.s >= LONG_RUN_MIN_S else None
    if longer is None:
        return plan
    reasons.append(f"then runs of 8 outputs over 4 channels, not 4 over 8 (the same {plan.warps_m * target.warp_size} "
                   f"threads and 32 sums each): a {g.s}-wide filter row converts {8 + g.s - 1} staged columns for 8 "
                   f"outputs, not {4 + g.s - 1} for 4 (depthwise.LONG_RUN_MIN_S: 1.05-1.16x on every ConvNeXt 7x7 and "
                   "EfficientNet-B0 5x5 fprop and dgrad it takes, timed on an H100)")
    return longer


# 7x7 stride-1 fprop on outputs of at least this many pixels a side holds each thread's filter in
# registers (Depthwise.out_rows = 4, runs of 4 over 2 channels): `convgen tune` on ConvNeXt's fprop
# (H100, 360b732, tuning/nvidia-h100_2026-12-07_360b732-tune-convnext-dw-fprop.json) timed it
# fastest of 49 candidates on the 56-, 28- and 14-pixel rows, 0.84-0.85x the long run's time, and
# 1.20x slower on the 7-pixel row (an 8-row tile of 4-row threads over 7 rows).  5x5 filters gain
# 0.87-0.88x from held shapes that differ by layer (EfficientNet-B0's log): tuning picks those.
HELD_DEFAULT_MIN_PX = 14


def held_default(g: ConvProblem, pass_: Pass, base: Plan, target: Target) -> Plan | None:
    """The default's held-filter form where HELD_DEFAULT_MIN_PX says it pays: the first of
    depthwise_forms.held_filters on ``base``'s chunk and tiles, if it fits; else None."""
    if (pass_ is not Pass.FPROP or (g.r, g.s) != (7, 7) or g.stride != (1, 1) or g.dilation != (1, 1) or g.kg != 1
            or min(g.p, g.q) < HELD_DEFAULT_MIN_PX or target.backend != "cuda"):
        return None
    for plan in held_filters(g, base, target)[:1]:
        try:
            check(plan, g, pass_, target, base.read_a, base.read_a)
        except ValueError:
            return None
        return dataclasses.replace(plan, reasons=())
    return None


# Runs of 8 outputs over 4 channels, where a thread's run of 4 over 8 would convert more staged
# columns per output: (8 + S - 1) / 8 against (4 + S - 1) / 4, 1.75 against 2.5 a 7x7 output.
# Timed on an H100 (fortieth session, tuning/nvidia-h100_2026-12-06_40d7cdc-tune-convnext-dw-*):
# 1.05-1.13x the runs of 4 on all eight of ConvNeXt's fprop and dgrad rows and within 7% of each
# row's best (at 800069f, before the halo's walked copies, 1.01-1.06x on seven of eight).  3x3
# filters keep runs of 4 (1.5 against 1.25 conversions an output; the H200's MobileNetV2 tuning
# timed runs of 4 best nearly everywhere; EfficientNet-B0's two 3x3 rows on the H100 split one
# each way).  5x5 was predicted and then timed (tuning/nvidia-h100_2026-12-06_a40b87e-tune-efficientnet-
# b0-dw-*): 1.05-1.16x the runs of 4 on all eight EfficientNet-B0 fprop and dgrad rows it takes.
LONG_RUN_MIN_S = 5


def long_run(problem: ConvProblem, pass_: Pass, base: Plan, max_lanes: int | None = 32) -> Plan | None:
    """``base``'s block with runs of 8 outputs over half its channel vector (vec 8 -> 4): the
    same sums a thread from fewer staged-column bytes and conversions, and on sm_90 fewer
    registers.  None where ``base`` is not runs of 4 over 8 channels of one filter each, a
    dgrad run would not be whole strides, or the chunk would take more than ``max_lanes``
    lanes of 4 channels (a whole 144-channel pixel takes 36: such blocks, twice as many lanes
    along the pixel, have not been timed as defaults)."""
    loop = base.loop
    assert isinstance(loop, Depthwise)
    if problem.s < 3 or base.vec_a != 8 or problem.kg != 1 or loop.cols != 4 or loop.tile_w % 8:
        return None
    if (max_lanes and base.block_n // 4 > max_lanes) or (pass_ is Pass.DGRAD and 8 % problem.stride[1]):
        return None
    return dataclasses.replace(base, vec_a=4, loop=dataclasses.replace(loop, cols=8))


def _plan_stencil(g: ConvProblem, pass_: Pass, target: Target, elem: DType, reasons: list[str]) -> Plan:
    """fprop's and dgrad's stencil block with runs of 4 over 8 channels where they fit."""
    m = g.kg
    sh, sw = g.stride
    vec = _vec(g.c, m, 8)
    chunk = _chunk(g.c, vec, 8)
    dgrad = pass_ is Pass.DGRAD
    out_h, out_w = (g.h, g.w) if dgrad else (g.p, g.q)
    widest = STENCIL_TILE  # 8x8 pixels (a strided dgrad: whole strides), 128 threads of 64 channels
    unit_h = sh if dgrad else 1
    # runs of 4 outputs (dgrad: whole strides), shorter where a large multiplier's sums need the registers
    # (else, as before the register bound, the first tile of runs of 4 that fits: it may spill)
    runs = [4 if not dgrad or 4 % sw == 0 else sw * math.ceil(4 / sw)] + [c for c in (2, 1) if not dgrad or c % sw == 0]
    tries = [(cols, True) for cols in runs] + [(runs[0], False)]

    def fit(chunk: int) -> tuple[int, int, int, bool]:
        """(tile rows, tile columns, run, registers bound kept) of the first try that fits."""
        def attempt(cols: int, registers: bool) -> tuple[int, int, int, bool]:
            unit_w = math.lcm(cols, sw) if dgrad else cols
            tile_w = unit_w * max(1, math.ceil(min(out_w, widest) / unit_w))
            tile_h = unit_h * max(1, math.ceil(min(out_h, STENCIL_TILE) / unit_h))
            return (*_fit_tile(g, pass_, target, elem, (tile_h, unit_h), (tile_w, unit_w), cols, vec, chunk,
                               registers), cols, registers)

        for cols, registers in tries[:-1]:
            try:
                return attempt(cols, registers)
            except ValueError:
                pass
        return attempt(*tries[-1])  # the last try's refusal names the limit

    tile_h, tile_w, cols, registers = fit(chunk)
    whole = whole_pixel_chunk(g, vec, elem, chunk, target)
    if whole:  # the same runs over every channel, within 512 threads (what tuning timed; wave64 seldom fits)
        try:
            w_h, w_w, w_cols, w_registers = fit(whole)
        except ValueError:
            w_cols = 0
        if w_cols == cols and w_registers and w_h * w_w // w_cols * (whole // vec) <= 512:
            reasons.append(f"all {whole} channels a block: {chunk}-channel chunks would split each "
                           f"{pixel_bytes(whole, elem)}-byte pixel across {target.info.dram_granule}-byte DRAM "
                           "granules that every chunk's blocks read again (MobileNetV2's C = 144: 1.27-1.53x "
                           "slower, timed on an H100)")
            chunk, tile_h, tile_w = whole, w_h, w_w
    lanes = chunk // vec
    if not registers:
        reasons.append("no tile gives each thread the registers its sums need (depthwise.stencil_registers: at least "
                       f"{stencil_registers(cols, vec, m, 0)}): this one may spill")
    threads = tile_h * tile_w // cols * lanes
    blocks = g.n * math.ceil(out_h / tile_h) * math.ceil(out_w / tile_w) * math.ceil(g.c / chunk)
    # tiles a block (1, 2 or 4) that leave about STENCIL_BLOCKS_PER_SM blocks an SM
    tiles = next(t for t in (4, 2, 1) if t == 1 or blocks // (STENCIL_BLOCKS_PER_SM * target.sm_count) >= t)
    reasons.append(f"vec {vec}: {vec * m} output channels a thread in one store; {chunk} channels a block "
                   f"({lanes} lanes)")
    tile = (f"tile {tile_h}x{tile_w} pixels, {cols} a thread along a row ({threads} threads): a staged "
            "column serves every output of the run its filter row reaches")
    plan = Plan(tile_h * tile_w, chunk, 16, threads // target.warp_size, 1, 2, vec, 1, elem, elem, 1,
                Depthwise(tile_w, cols, 0, tiles))
    if tiles > 1 and smem_bytes(plan, g, pass_, target.warp_size) > target.smem_limit:  # two halos do not fit: one
        one = dataclasses.replace(plan, loop=Depthwise(tile_w, cols))
        reasons.append(f"one tile a block: two halos ({smem_bytes(plan, g, pass_, target.warp_size)} bytes of shared "
                       f"memory with the weights) would not fit the {target.smem_limit} bytes {target.arch} allows, "
                       f"one takes {smem_bytes(one, g, pass_, target.warp_size)}")
        reasons.append(tile)
        return one
    if tiles > 1:
        reasons.append(f"{tiles} tiles a block in turn, the next halo copied while one is computed "
                       f"({blocks} tiles, {math.ceil(blocks / tiles)} blocks: about {STENCIL_BLOCKS_PER_SM} an SM "
                       "or more, as the depthwise suites' tuning runs chose)")
    reasons.append(tile)
    if tiles >= 3 and STENCIL_RING > 2:
        ring = dataclasses.replace(plan, stages=STENCIL_RING)
        by_regs = 65536 // (stencil_registers(cols, vec, m, facts(plan, g, pass_).in_cols) * threads)
        held = min(by_regs, resident_blocks(plan, g, pass_, target))
        if resident_blocks(ring, g, pass_, target) >= held:
            reasons.append(f"a ring of {ring.stages} halos: the next {ring.stages - 1} tiles' copies in flight while "
                           f"one is computed, at no cost in resident blocks ({held} an SM)")
            return ring
    return plan


def resident_blocks(plan: Plan, g: ConvGeometry, pass_: Pass, target: Target) -> int:
    """Blocks of ``plan`` an SM's shared memory holds (each also reserves 1 KB)."""
    return (target.smem_limit + 1024) // (smem_bytes(plan, g, pass_, target.warp_size) + 1024)




def chunks_by_padding(c: int, vec: int, lanes_cap: int, sizes: tuple[int, ...] = (16, 32, 48, 64)) -> list[int]:
    """Channel chunks of ``sizes`` with at most ``lanes_cap`` lanes of ``vec``, those that pad C
    least first, then the widest (C = 144: 48 or 16, not 64 + 64 + 16 with lanes idle)."""
    fits = [ch for ch in sizes if ch % vec == 0 and ch // vec <= lanes_cap] or [max(sizes[0], vec)]
    return sorted(fits, key=lambda ch: (math.ceil(c / ch) * ch, -ch))


# DRAM is read in whole granules (Arch.dram_granule): a block that stages a chunk of each pixel
# whose bytes do not start and end on granule boundaries pays for the neighbouring chunks' bytes
# too (the other chunks' blocks run much later: blockIdx.y is the chunk).  MobileNetV2's C = 144
# (288-byte pixels) in chunks of 64, 64 and 16 channels moved 287 MB of DRAM in dw144-56px's
# fprop where cuDNN moved 217 (its floor 231; Nsight Compute on an H100, benchmarks/NOTES.md,
# thirty-sixth session), about what 64-byte granules predict (270 MB); C = 96 (three granules a
# pixel) moved what cuDNN moved.  A block that owns every channel reads each pixel as one run.
# (On GDDR parts, 32-byte granules, C = 144's pixels are whole granules: no change there.)


def pixel_bytes(c: int, elem: DType) -> int:
    """The bytes of a pixel of ``c`` channels read as ``elem``."""
    return c * (4 if elem == "float32" else 2)


def straddles_granules(c: int, elem: DType, target: Target) -> bool:
    """Whether a pixel of ``c`` channels is not whole DRAM granules of ``target``'s memory, so
    blocks that each read a chunk of it read some granules twice."""
    return pixel_bytes(c, elem) % target.info.dram_granule != 0


def whole_pixel_chunk(problem: ConvProblem, vec: int, elem: DType, chunk: int, target: Target) -> int | None:
    """C as a chunk, where ``chunk`` splits a pixel that straddles DRAM granules and C's lanes of
    ``vec`` stay within a block (32); else None."""
    c = problem.c
    if c <= chunk or not straddles_granules(c, elem, target) or c % vec or c // vec > 32:
        return None
    return c


def stencil_registers(cols: int, vec: int, m: int, in_cols: int) -> int:
    """An upper estimate of an fprop or dgrad thread's registers: its run's sums (cols x vec x m)
    and the staged columns its filter row reads (in_cols x vec).  On sm_90 this bounded every
    plan compiled (32-221 registers, m = 1-32, 3x3 and 7x7, strides 1 and 2); a block whose
    threads could not each have that many (65536 / threads) spilled: 512 threads of 32 filters
    a channel made 1,096-1,962 local-memory accesses (scripts/compile_fuzz.py)."""
    return math.ceil(24 + 1.75 * cols * vec * m + 0.5 * in_cols * vec)


def _fit_tile(g: ConvGeometry, pass_: Pass, target: Target, elem: DType, h: tuple[int, int], w: tuple[int, int],
              cols: int, vec: int, chunk: int, registers: bool = True) -> tuple[int, int]:
    """fprop's and dgrad's tile (rows, columns): the first of the preferred width ``w[0]``, then
    narrower by whole units ``w[1]``, whose rows (``h[0]`` and up by ``h[1]``, then down) make a
    block of whole fragments and whole warps, at most 1024 threads, whose one halo fits the
    part's shared memory and (with ``registers``) whose threads each have the registers
    :func:`stencil_registers` estimates.  The preferred tile nearly always does; a strided
    dgrad's units or a large channel multiplier's staged pixels and sums can push it past a limit."""
    lanes = chunk // vec
    for tile_w in range(w[0], 0, -w[1]):
        most_h = 1024 * cols // (tile_w * lanes)  # rows within 1024 threads
        for tile_h in [*range(h[0], most_h + 1, h[1]), *range(h[0] - h[1], 0, -h[1])]:
            pixels = tile_h * tile_w
            if pixels % 16 or (pixels // cols * lanes) % target.warp_size or pixels // cols * lanes > 1024:
                continue
            plan = Plan(pixels, chunk, 16, pixels // cols * lanes // target.warp_size, 1, 2, vec, 1, elem, elem, 1,
                        Depthwise(tile_w, cols))
            f = facts(plan, g, pass_, target.warp_size)
            if (smem_bytes(plan, g, pass_, target.warp_size) <= target.smem_limit
                    and (not registers or stencil_registers(cols, vec, g.kg, f.in_cols) * f.threads <= 65536)):
                return tile_h, tile_w
    raise ValueError(f"Depthwise {pass_.value}: no tile of whole warps within 1024 threads stages this layer's halo "
                     f"in {target.smem_limit} bytes of shared memory on {target.arch} (K/C = {g.kg} filters a channel, "
                     f"{g.r}x{g.s} filter, stride {g.stride}, dilation {g.dilation})")
