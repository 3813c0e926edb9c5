"""Depthwise wgrad's default block: the filter rows and channel vector a thread keeps sums for,
the pixel tile a block stages (the least modelled cost per output pixel), and the slices of
the batch's tiles the blocks sum, in a second kernel or in the grid.  Apart from
convgen/depthwise.py (fprop's and dgrad's stencil, the facts and limits every pass shares),
on which it builds."""

from __future__ import annotations

import dataclasses
import math

from .depthwise import (MAX_WGRAD_ACCS, MAX_WGRAD_COLS, MAX_WGRAD_HELD, MIN_RESIDENT, STAGE_COST, THREADS, TILE_COST,
                        WGRAD_CHUNKS, WGRAD_REG_OVERHEAD, chunks_by_padding, smem_bytes)
from .ir import ConvGeometry, ConvProblem, DType, Pass, Target
from .mainloop import Depthwise
from .reduction import resident_split
from .spec import Plan


def wgrad_chunks(c: int, vec: int, warp_size: int) -> list[int]:
    """wgrad's channels a block, best first: 16, 32 or 64 (lanes of vec within a warp), those that
    pad C least first; of those the widest, except where a thread sums one channel (vec 1, as
    on 7x7 filters, whose 49 sums leave no room for two): the narrowest.  On an H100 `convgen
    tune` timed ConvNeXt's four wgrad rows fastest with 16-channel blocks, 1.01-1.25x the
    32-channel default's time (aee8f3a and 2d518f1, benchmarks/results/tuning/), at twice the
    blocks: a 7-pixel row's 768 channels then fill the GPU in 48 chunks, not 24."""
    order = chunks_by_padding(c, vec, warp_size, WGRAD_CHUNKS)
    if vec == 1:
        order.sort(key=lambda ch: (math.ceil(c / ch) * ch, ch))
    return order


def _wgrad_tile_cost(g: ConvGeometry, vec: int, rows: int, cols: int, tile_h: int, tile_w: int, chunk: int,
                     threads: int, stage_vec: int) -> float:
    """Thread instructions per output pixel inside the image (the model _plan_wgrad minimises):
    each thread's FMAs, shared loads and conversions of its run (every staged x column of each
    of its filter rows, its dy values once), the block's staging copies and per-tile costs,
    over the tile's pixels that are in the image on average (edge tiles idle partly)."""
    m, (sh, sw), (dh, dw) = g.kg, g.stride, g.dilation
    in_cols = (cols - 1) * sw + (g.s - 1) * dw + 1
    per_thread = rows * in_cols * (1 + vec) + cols * m * (1 + vec) + rows * cols * g.s * vec * m + TILE_COST
    halo = ((tile_h - 1) * sh + (g.r - 1) * dh + 1) * ((tile_w - 1) * sw + (g.s - 1) * dw + 1)
    staged = (halo * chunk + tile_h * tile_w * chunk * m) // stage_vec
    tiles = math.ceil(g.p / tile_h) * math.ceil(g.q / tile_w)
    return (threads * per_thread + staged * STAGE_COST) * tiles / (g.p * g.q)


def _wgrad_registers(held: int) -> int:
    """A wgrad thread's registers: its ``held`` floats and WGRAD_REG_OVERHEAD more, in 8s."""
    return -(-(held + WGRAD_REG_OVERHEAD) // 8) * 8


def _resident_threads(threads: int, smem: int, held: int, target: Target) -> int:
    """Threads an SM holds of a wgrad block: by shared memory (the part's per-block limit taken as
    the SM's), by 2048 threads, and by registers (:func:`_wgrad_registers`, of 64 K)."""
    return min(target.smem_limit // max(smem, 1), 2048 // threads, 65536 // (_wgrad_registers(held) * threads)) * threads


def wgrad_layout(g: ConvProblem) -> tuple[int, int]:
    """wgrad's filter rows a thread and channel vector: the most rows (a thread's dy, read and
    converted once, then serves all of their taps), then the widest vector, whose vec x m x
    rows x S sums fit MAX_WGRAD_ACCS; refused by name where not even one row of one channel fits."""
    m = g.kg
    rows, vec = next(((rw, v) for rw in range(g.r, 0, -1) if g.r % rw == 0 for v in (8, 4, 2, 1)
                      if g.c % v == 0 and v * m * rw * g.s <= MAX_WGRAD_ACCS), (1, 1))
    if vec * m * rows * g.s > 2 * MAX_WGRAD_ACCS:  # even one channel and one filter row a thread
        raise ValueError(f"Depthwise wgrad: K/C = {m} filters a channel over a filter {g.s} wide keep {m * g.s} fp32 "
                         f"sums a thread for one filter row, more than the {2 * MAX_WGRAD_ACCS} that fit in registers; "
                         f"this kind takes at most {2 * MAX_WGRAD_ACCS // g.s} filters a channel at this width")
    return rows, vec


def wgrad_tiles(g: ConvProblem, target: Target, elem: DType, rows: int, vec: int,
                 chunk: int) -> list[tuple[tuple, Plan, float, int]]:
    """Every wgrad tile of this chunk the search admits, as (key, plan, modelled cost, shared
    bytes), best first (unsplit): tile_h rows of per_row runs of cols outputs (block_m a
    multiple of 16), 64-256 threads (whole warps of one row group each; up to 1024 only where no
    smaller block has whole warps), staged buffers within a third of the part's shared memory,
    MIN_RESIDENT threads an SM where shared memory and registers allow, at the least modelled
    cost per output pixel.  Tiles whose threads cannot each have the registers
    :func:`_wgrad_registers` estimates (65536 a block) come only where no other tile exists,
    flagged by the key's first field: they may spill."""
    m, warp = g.kg, target.warp_size
    groups, lanes = g.r // rows, chunk // vec
    stage_vec = next(v for v in (8, 4, 2, 1) if g.c % v == 0 and chunk % v == 0)
    acc = vec * m * rows * g.s
    max_cols = max(1, min(MAX_WGRAD_COLS, (MAX_WGRAD_HELD - acc) // (vec * m)))
    budget = target.smem_limit // 3  # three blocks an SM where the part allows (227 KB on an H100 / H200)
    found: list[tuple[tuple, Plan, float, int]] = []
    crowded: list[tuple[tuple, Plan, float, int]] = []  # the first search stage's tiles past the registers
    # (a large channel multiplier's sums leave no room for a run's dy values under MAX_WGRAD_HELD;
    # then runs up to the checker's 64 held values, where 16 pixels of every row group fit 1024 threads)
    for most, longest in ((THREADS, max_cols), (1024, max_cols), (1024, max(max_cols, 64 // (vec * m)))):
        stage_crowded = []
        for cols in range(1, longest + 1):
            # (a tiny image still gets a block of whole warps: runs past its edge idle)
            for per_row in range(1, max(math.ceil(g.q / cols), 16) + 1):
                for tile_h in range(1, max(g.p, 8) + 1):
                    threads = tile_h * per_row * lanes * groups
                    if (threads > most or threads < min(64, most) or (tile_h * per_row * lanes) % warp
                            or (tile_h * cols * per_row) % 16):
                        continue
                    over = _wgrad_registers(acc + cols * vec * m) * threads > 65536  # one block's registers
                    tile_w = cols * per_row
                    plan = Plan(tile_h * tile_w, chunk, 16, threads // warp, 1, 2, vec, vec, elem, elem, 1,
                                Depthwise(tile_w, cols, rows if groups > 1 else 0))
                    smem = smem_bytes(plan, g, Pass.WGRAD, warp)
                    if smem > target.smem_limit:
                        continue
                    cost = _wgrad_tile_cost(g, vec, rows, cols, tile_h, tile_w, chunk, threads, stage_vec)
                    few = _resident_threads(threads, smem, acc + cols * vec * m, target) < MIN_RESIDENT
                    key = (over, smem > budget, smem if smem > budget else 0, few, round(cost, 3), -threads, tile_h,
                           cols)
                    (stage_crowded if over else found).append((key, plan, cost, smem))
        crowded = crowded or stage_crowded
        if found:
            break
    return sorted(found or crowded, key=lambda f: f[0])


def _past_registers(ranked: list[tuple[tuple, Plan, float, int]]) -> bool:
    """Whether :func:`wgrad_tiles`' best tile is past the register bound (its key's first field)."""
    return bool(ranked[0][0][0])


# Blocks an SM wgrad's slices aim at (blocks of fewer than MIN_RESIDENT / 4 threads: more).  Each
# block stages its next tile while it sums one, so a slice of few tiles pays the fill for little:
# on an H100 (thirty-seventh session) 4 an SM beat 8 on 12 of both depthwise suites' 14 wgrad rows
# (1.00-1.50x; 0.97 and 0.98 on the other two) and 16 lost on all.
WGRAD_BLOCKS_PER_SM = 4


def wgrad_split(g: ConvProblem, target: Target, plan: Plan) -> int:
    """Enough slices for WGRAD_BLOCKS_PER_SM blocks an SM, at most one a tile: each slice sums its own run of tiles."""
    loop = plan.loop
    assert isinstance(loop, Depthwise)
    tiles = g.n * math.ceil(g.p / (plan.block_m // loop.tile_w)) * math.ceil(g.q / loop.tile_w)
    per_sm = max(WGRAD_BLOCKS_PER_SM, math.ceil(MIN_RESIDENT / (plan.warps_m * target.warp_size)))
    return max(1, min(math.ceil(per_sm * target.sm_count / math.ceil(g.c / plan.block_n)), tiles, 4096))


def summed_in_grid(g: ConvProblem, target: Target, plan: Plan) -> Plan:
    """A wgrad plan's slices summed in its own kernel after a grid-wide barrier (CUDA's
    cooperative launch), as many as the GPU holds at once (reduction.resident_split) and at most
    ``plan``'s; ``plan`` itself where that leaves fewer than 2 or the target has no such launch."""
    whole = resident_split(target.sm_count, target.smem_limit, smem_bytes(plan, g, Pass.WGRAD, target.warp_size),
                           plan.warps_m * target.warp_size, math.ceil(g.c / plan.block_n))
    if target.backend != "cuda" or min(plan.split_k, whole) < 2:
        return plan
    return dataclasses.replace(plan, split_k=min(plan.split_k, whole), split_reduce="grid")


# wgrad runs of RUN_ROWS dy rows (Depthwise.out_rows): a thread sums its run's pixels over that
# many neighbouring rows of the tile, so each staged x row it reads serves every (dy row, filter
# row) pair it meets and is converted once for them all; a run of one row converts each staged
# value once per filter row (ConvNeXt's 7x7: 154 conversions and shared loads beside 686 FFMA a
# tile and thread, benchmarks/NOTES.md, forty-sixth session).  Tuning candidates on CUDA: the
# default's tile and chunk with its runs as long (half the threads) and half as long (the same
# threads).  The second is the default where a thread sums one channel of one filter (vec 1 and
# no multiplier, as timed; ROW_RUN_DEFAULT): on an H100 `convgen tune` (4997d9a) timed it at
# 0.84-1.00x the one-row plan's time on ConvNeXt's four wgrad rows (geomean 0.94x), where the
# first took 1.14-1.23x.
RUN_ROWS = 2
ROW_RUN_DEFAULT = True


def row_run(g: ConvProblem, target: Target, base: Plan, cols: int) -> Plan | None:
    """``base`` (runs of one dy row) with runs of RUN_ROWS rows of ``cols`` pixels, on its tile
    and chunk, each with its own slices; None where its tile rows or whole warps do not allow it,
    or where the rows share no staged x row (a dy row's filter rows span fewer rows than the
    stride, or the stride is no multiple of the dilation): there they would only hold more."""
    loop = base.loop
    assert isinstance(loop, Depthwise)
    (sh, _), (dh, _) = g.stride, g.dilation
    if cols < 1 or sh % dh or sh >= ((loop.rows or g.r) - 1) * dh + 1:
        return None
    threads = base.warps_m * target.warp_size
    runs = threads * loop.cols // (cols * RUN_ROWS)  # the same pixels over runs of RUN_ROWS x cols
    if (loop.out_rows != 1 or base.block_m // loop.tile_w % RUN_ROWS or loop.tile_w % cols
            or runs * cols * RUN_ROWS != threads * loop.cols or runs % target.warp_size or not runs):
        return None
    plan = dataclasses.replace(base, warps_m=runs // target.warp_size, split_k=1, split_reduce="kernel",
                               loop=dataclasses.replace(loop, cols=cols, out_rows=RUN_ROWS))
    sliced = summed_in_grid(g, target, dataclasses.replace(plan, split_k=wgrad_split(g, target, plan)))
    return dataclasses.replace(sliced, reasons=(
        f"tuning candidate: depthwise wgrad runs of {RUN_ROWS} x {cols} dy pixels a thread on the default's tile and "
        "chunk (each staged x row read and converted once for both rows)",))


def plan_wgrad(g: ConvProblem, target: Target, elem: DType, reasons: list[str], row_runs: bool = True) -> Plan:
    """wgrad: a block sums one channel chunk over a slice of the batch's pixel tiles; see the rules above
    (``row_runs=False``: without ROW_RUN_DEFAULT, the plan it replaces, which tuning times beside it)."""
    m, warp = g.kg, target.warp_size
    rows, vec = wgrad_layout(g)
    groups = g.r // rows
    acc = vec * m * rows * g.s
    # the chunk that pads C least, else the next whose tiles fit (a narrower chunk has fewer
    # lanes, so blocks small enough for a large multiplier's registers still have whole warps)
    by_chunk = [(ch, wgrad_tiles(g, target, elem, rows, vec, ch)) for ch in wgrad_chunks(g.c, vec, warp)]
    chunk, ranked = next(((ch, r) for ch, r in by_chunk if r and not _past_registers(r)),
                         next(((ch, r) for ch, r in by_chunk if r), (by_chunk[0][0], [])))
    lanes = chunk // vec
    if not ranked:
        raise ValueError(f"Depthwise wgrad: K/C = {m} filters a channel over a {g.r}x{g.s} filter keep {acc} fp32 sums "
                         f"a thread, and no tile of 16 pixels for each of its {groups} row group(s) has whole warps "
                         f"within 1024 threads and its buffers within {target.smem_limit} bytes of shared memory on "
                         f"{target.arch}")
    _, plan, cost, smem = ranked[0]
    loop = plan.loop
    assert isinstance(loop, Depthwise)
    tile_h, threads = plan.block_m // loop.tile_w, plan.warps_m * warp
    tiles = g.n * math.ceil(g.p / tile_h) * math.ceil(g.q / loop.tile_w)
    chunks = math.ceil(g.c / chunk)
    split = wgrad_split(g, target, plan)
    reasons.append(f"{rows} filter row(s) a thread ({groups} row group(s)), vec {vec}: {acc} fp32 sums a thread (at "
                   f"most {MAX_WGRAD_ACCS}); every staged value it reads serves up to {rows * g.s} taps")
    best = wgrad_chunks(g.c, vec, warp)[0]
    reasons.append(f"{chunk} channels a block ({lanes} lanes of {vec}): C = {g.c} in {chunks} chunk(s), " + (
        "the fewest idle channels" if chunk == best else
        f"not {best} (fewer idle channels), whose blocks of whole warps need more registers than 65536 a block"))
    reasons.append(f"tile {tile_h}x{loop.tile_w} dy pixels, runs of {loop.cols} outputs a thread ({threads} threads): "
                   f"the least modelled cost, {cost:.0f} thread instructions an output pixel; both buffers "
                   f"{smem} bytes of shared memory" + (
                       f"; no tile gives its threads the {_wgrad_registers(acc + loop.cols * vec * m)} registers "
                       "their sums need (WGRAD_REG_OVERHEAD): this one may spill" if _past_registers(ranked) else ""))
    summed = summed_in_grid(g, target, dataclasses.replace(plan, split_k=split))
    split = summed.split_k
    sliced = f"{tiles} tiles in {split} slice(s) of about {math.ceil(tiles / split)}: {chunks * split} blocks, "
    if summed.split_reduce == "grid":
        reasons.append(sliced + "as many as the GPU holds at once (reduction.resident_split); the next tile staged "
                       "while one is summed, then the slices' sums added in a fixed order by the same kernel after a "
                       "grid-wide barrier (a cooperative launch): one launch and no partials' round trip through "
                       "DRAM. On an H100 this beat the slices for WGRAD_BLOCKS_PER_SM blocks an SM summed by a "
                       "second kernel on 13 of both depthwise suites' 14 wgrad rows (geomean 1.08x, a tie on "
                       "the 14th); where the runtime finds the grid does not fit, it sums them in that second kernel")
    else:
        reasons.append(sliced + f"about {chunks * split / target.sm_count:.0f} an SM (WGRAD_BLOCKS_PER_SM); the next "
                       "tile staged while one is summed, the slices' sums added in a fixed order" + (
                           "" if split == 1 or target.backend == "cuda" else
                           f" by a second kernel ({target.arch} has no cooperative launch to sum them in this one)"))
    runs = row_run(g, target, summed, summed.loop.cols // 2) if (
        row_runs and ROW_RUN_DEFAULT and vec == 1 and m == 1 and target.backend == "cuda") else None
    if runs is None:
        return summed
    reasons.append(f"then runs of {RUN_ROWS} dy rows of {runs.loop.cols} pixels a thread, the same threads and tile "
                   f"({runs.split_k} slice(s)): a thread of one channel reads and converts each staged x row once for "
                   "both rows (ROW_RUN_DEFAULT: 0.94x the one-row plan's time on ConvNeXt's four wgrad rows, H100)")
    return runs
